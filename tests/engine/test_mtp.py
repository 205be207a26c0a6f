"""generate(use_mtp=True): the target's own MTP layer drafts (heads/mtp.py, runners/paged_mtp.py,
drafters/eagle3.py), for a GLM-4.5 target, a DeepSeek-V3 one (its MLA layer on the MLA runner) and a
Qwen3-Next one (mtp.*, read by heads/mtp_checkpoint.py: transformers has no MtpModel for it; its
reference is transformers' MtpLayer around transformers' Qwen3-Next layer, and the reading of vLLM's
names is checked against the checkpoint's tensors). The paged layer equals that reference on every backend; the
drafts are transformers' MTP drafts over the context so far (K = 1, its own, and K = 3, the layer
chained on its normed output); greedy decoding equals model.generate(use_mtp=True) and the
target's greedy decoding (batches, left padding, the static graph twin, trees, the adaptive
schedule); sampled tokens follow the target (chi-square); refusals name their reason."""
import copy

import pytest
import torch

import specdec_fast
from specdec_fast.drafters import Eagle3Drafter
from specdec_fast.engine import SpeculativeDecoder
from specdec_fast.heads import MtpHead
from specdec_fast.kernels import make_sampling_tensors
from specdec_fast.runners.hf import UnsupportedModelError
from specdec_fast.runners.paged_mtp import PagedMlaMtpRunner, PagedMtpRunner, PagedQwen3NextMtpRunner, mtp_runner
from specdec_fast.runners.registry import paged_runner_class

from ..conftest import backend_device, on_device
from tests.kernels.stats import P_VALUE_THRESHOLD

from .heads import proposals_per_iteration, verify_sees_uniform_rows
from .models import VOCAB, left_padded_prompts, make_model
from .mtp_models import LAYERS, QWEN_KINDS, glm_with_mtp, mtp_reference
from .test_sampling_exact import first_tokens_pvalues


RUNNERS = {"glm4_moe": PagedMtpRunner, "deepseek_v3": PagedMlaMtpRunner, "qwen3_next": PagedQwen3NextMtpRunner}


@pytest.fixture(scope="module", params=list(RUNNERS))
def target(request, tmp_path_factory):
    """A GLM-4.5 target (its layer on the Llama runner), a DeepSeek-V3 one (an MLA layer: PagedMlaMtpRunner),
    a Qwen3-Next one (a gated attention layer: PagedQwen3NextMtpRunner)."""
    return glm_with_mtp(tmp_path_factory.mktemp(request.param), kind=request.param)


@pytest.fixture(scope="module")
def mtp_model(target):
    """The reference: transformers' own MtpModel of the target (Qwen's: mtp_models.mtp_reference)."""
    return mtp_reference(target)


def _qwen(target) -> bool:
    return target.config.model_type in QWEN_KINDS


def _reference(mtp_model, tokens, features, positions):
    """transformers' MTP layer over one row's entries (causal, no cache): tokens [T], features
    [T, H], positions [T] -> (logits [T, V], normed output [T, H])."""
    with torch.no_grad():
        out = mtp_model.forward_layer(0, features[None], positions[None], None, input_ids=tokens[None])
        return mtp_model._project_to_logits(out)[0], out[0]


def _weights(target):
    return target.get_input_embeddings().weight, target.get_output_embeddings().weight


@pytest.mark.parametrize("backend", ["torch", "cpp", "triton"])
def test_paged_mtp_layer_equals_transformers(target, mtp_model, backend, device):
    """prefill_pairs (left padding) + score_pairs with num_valid, then a draft step fed the layer's
    own output: logits and outputs equal MtpModel.forward_layer over each row's entries (entry t
    at position t + 1, as transformers feeds them)."""
    device = backend_device(backend, device)
    target, reference = on_device(device, target, mtp_model)
    head = MtpHead(reference)
    gen = torch.Generator().manual_seed(5)
    lengths = [5, 1, 3]
    ids, mask = on_device(device, *left_padded_prompts(lengths, vocab=VOCAB, seed=6))
    hidden = target.config.hidden_size
    feats = torch.randn(3, ids.shape[1], hidden, generator=gen).to(device)
    runner = mtp_runner(head, *_weights(target), num_draft_tokens=3, block_size=4, backend=backend)
    assert type(runner) is RUNNERS[target.config.model_type]
    runner.prefill_pairs(ids, feats, mask, budgets=[16, 16, 16], num_draft_tokens=3)
    new_ids = torch.randint(0, VOCAB, (3, 4), generator=gen).to(device)
    new_feats = torch.randn(3, 4, hidden, generator=gen).to(device)
    valid = torch.tensor([2, 4, 1], device=device)
    logits, out = runner.score_pairs(new_ids, new_feats, valid, project=True)
    runner.commit(valid)
    step_ids = torch.randint(0, VOCAB, (3, 1), generator=gen).to(device)
    step_logits, _ = runner.score_pairs(step_ids, out[:, -1:], None, project=False)
    for b in range(3):
        real, n = mask[b].bool(), int(valid[b])
        tokens = torch.cat([ids[b, real], new_ids[b, 4 - n:], step_ids[b]])
        features = torch.cat([feats[b, real], new_feats[b, 4 - n:], out[b, -1:]])
        positions = torch.arange(1, tokens.numel() + 1, device=device)
        ref_logits, ref_out = _reference(reference, tokens, features, positions)
        span = slice(lengths[b], lengths[b] + n)
        torch.testing.assert_close(logits[b, 4 - n:], ref_logits[span], atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(out[b, 4 - n:], ref_out[span], atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(step_logits[b, 0], ref_logits[-1], atol=1e-4, rtol=1e-4)


def _reference_drafts(mtp_model, target, context: list, k: int) -> list:
    """transformers' greedy MTP drafts after ``context`` (x_0 .. x_c), recomputed densely: entries
    (x_e+1, h_e) for e < c with h the target's final-norm states, then each draft step appends
    (d_i, the layer's normed output) at the next position."""
    with torch.no_grad():
        states = target(input_ids=torch.tensor([context]), output_hidden_states=True).hidden_states[-1][0, :-1]
    tokens, features, drafts = torch.tensor(context[1:]), states, []
    for _ in range(k):
        logits, out = _reference(mtp_model, tokens, features, torch.arange(1, tokens.numel() + 1))
        drafts.append(int(logits[-1].argmax()))
        tokens = torch.cat([tokens, torch.tensor([drafts[-1]])])
        features = torch.cat([features, out[-1:]])
    return drafts


@pytest.mark.parametrize("k", [1, 3])
def test_drafts_equal_transformers_mtp_drafts(target, mtp_model, k):
    """Every iteration's greedy drafts equal transformers' MTP layer's over the context so far: the
    pending entries carry the target's final-norm states and the tokens after every accept / reject."""
    ids, mask = left_padded_prompts([4, 6], vocab=VOCAB, seed=8)
    runner = paged_runner_class(target)(target, max_new_tokens=16, num_draft_tokens=k)
    head = MtpHead.for_target(target)
    runner.capture_hidden_states(head.hidden_indices(LAYERS))
    drafter = Eagle3Drafter(mtp_runner(head, *_weights(target), num_draft_tokens=k), runner, None)
    decoder = SpeculativeDecoder(runner, drafter, k=k, params=make_sampling_tensors(2, "cpu", temperature=0.0, seed=0),
                                 max_new_tokens=16)
    seen = proposals_per_iteration(drafter, decoder, ids, mask)
    assert len(seen) >= 4 and sum(decoder.stats.result.accepted_hist[1:]) > 0, "the test needs accepted drafts"
    for iteration in seen:
        for context, drafts in iteration:
            assert drafts == _reference_drafts(mtp_model, target, context, len(drafts))


def test_greedy_equals_transformers_use_mtp(target):
    """One row, as transformers' assisted generation takes: model.generate(use_mtp=True)'s tokens."""
    if _qwen(target):
        pytest.skip("transformers has no use_mtp for Qwen3-Next (test_greedy_equals_target_greedy compares its tokens)")
    ids = torch.randint(3, VOCAB, (1, 6), generator=torch.Generator().manual_seed(3))
    expected = target.generate(ids, do_sample=False, max_new_tokens=16, use_mtp=True, pad_token_id=0)
    assert torch.equal(expected, target.generate(ids, do_sample=False, max_new_tokens=16, pad_token_id=0))
    out, stats = specdec_fast.generate(target, ids, do_sample=False, max_new_tokens=16, use_mtp=True, pad_token_id=0,
                                       return_stats=True)
    assert torch.equal(out, expected)
    assert stats.k == 1 and stats.alpha > 0  # transformers' K: one token per MTP layer


@pytest.mark.parametrize("backend, k, graphs", [("torch", 1, False), ("cpp", 3, False), ("cpp", 3, "static"),
                                                ("triton", 2, False)])
def test_greedy_equals_target_greedy(target, backend, k, graphs, device):
    device = backend_device(backend, device)
    target = on_device(device, target)
    ids, mask = on_device(device, *left_padded_prompts([5, 1, 8], vocab=VOCAB, seed=2))
    expected = target.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=14, pad_token_id=0)
    out, stats = specdec_fast.generate(target, ids, mask, use_mtp=True, num_assistant_tokens=k, do_sample=False,
                                       max_new_tokens=14, pad_token_id=0, backend=backend, cuda_graphs=graphs,
                                       return_stats=True)
    assert torch.equal(out, expected)
    assert stats.alpha > 0


def test_trees_and_the_adaptive_schedule_run_exactly(target, chaos):
    ids, mask = left_padded_prompts([5, 2], vocab=VOCAB, seed=4)
    expected = target.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=14, pad_token_id=0)
    # (Qwen3-Next's recurrent layers too: each node from its parent's states)
    out = specdec_fast.generate(target, ids, mask, use_mtp=True, tree="static", do_sample=False, max_new_tokens=14,
                                pad_token_id=0)
    assert torch.equal(out, expected)
    chosen = chaos([3, 1, 2, 4])
    out, stats = specdec_fast.generate(target, ids, mask, use_mtp=True, num_assistant_tokens_schedule="adaptive",
                                       do_sample=False, max_new_tokens=14, pad_token_id=0, return_stats=True)
    assert torch.equal(out, expected) and len(set(chosen)) >= 3


SMALL_VOCAB = 12
PROMPT = torch.tensor([[3, 7, 5, 9]])
SETTINGS = dict(temperature=0.9, top_k=0, top_p=1.0, min_p=0.0)


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    """A target of 12 tokens (joint laws of two tokens fit a chi-square of 3000 rows)."""
    model = glm_with_mtp(tmp_path_factory.mktemp("glm_mtp_small"), vocab=SMALL_VOCAB, seed=3)
    model.generation_config.eos_token_id = None
    return model


def _pvalues(target, rows: int = 3000):
    """(stats, p-value of tokens 1-2 jointly, p-value of token 3) of use_mtp sampling with K = 2:
    tokens 2 and 3 come from the first speculative block (accepts, residuals and bonus tokens)."""
    out, stats = specdec_fast.generate(target, PROMPT.expand(rows, -1), use_mtp=True, num_assistant_tokens=2,
                                       do_sample=True, max_new_tokens=3, seed=123, return_stats=True,
                                       temperature=SETTINGS["temperature"], top_k=0)
    return stats, *first_tokens_pvalues(target, PROMPT, out[:, PROMPT.shape[1]:], SMALL_VOCAB, SETTINGS)


def test_sampled_tokens_follow_the_target(small):
    stats, p12, p3 = _pvalues(small)
    assert 0.1 < stats.alpha < 0.95, f"alpha {stats.alpha}: the test needs both accepts and rejects"
    assert p12 > P_VALUE_THRESHOLD and p3 > P_VALUE_THRESHOLD, (p12, p3)


def test_control_a_verify_that_sees_another_draft_law_fails(small, monkeypatch):
    """The drafts drawn from the MTP layer's rows, the verify handed uniform rows instead: the
    tokens no longer follow the target, and the test above would see it."""
    verify_sees_uniform_rows(monkeypatch)
    try:
        _, p12, p3 = _pvalues(small)
    finally:
        specdec_fast.release_engines()
    assert min(p12, p3) < P_VALUE_THRESHOLD, (p12, p3)


def test_refusals_name_their_reason(target, tmp_path):
    ids = torch.randint(3, VOCAB, (1, 4), generator=torch.Generator().manual_seed(1))
    llama = make_model("llama", seed=1)
    with pytest.raises(UnsupportedModelError, match="model_type 'llama'"):
        specdec_fast.generate(llama, ids, use_mtp=True, max_new_tokens=3)
    with pytest.raises(ValueError, match="give one drafter .* assistant_model and use_mtp"):
        specdec_fast.generate(target, ids, use_mtp=True, assistant_model=target, max_new_tokens=3)
    with pytest.raises(ValueError, match="use_mtp"):
        specdec_fast.generate(target, ids, use_mtp="yes", max_new_tokens=3)
    in_memory = type(target)(copy.deepcopy(target.config)).eval()  # no checkpoint to read the layer from
    in_memory.config.name_or_path = ""
    with pytest.raises(UnsupportedModelError, match="not loaded from one"):
        specdec_fast.generate(in_memory, ids, use_mtp=True, max_new_tokens=3)
    in_memory.config.name_or_path = str(tmp_path)  # a directory without the MTP weights
    with pytest.raises(UnsupportedModelError, match="no MTP layer could be read"):
        specdec_fast.generate(in_memory, ids, use_mtp=True, max_new_tokens=3)
    # use_mtp=False names no drafter: plain decoding, as transformers
    plain = target.generate(ids, do_sample=False, max_new_tokens=5, pad_token_id=0)
    out, stats = specdec_fast.generate(target, ids, use_mtp=False, do_sample=False, max_new_tokens=5, pad_token_id=0,
                                       return_stats=True)
    assert torch.equal(out, plain) and stats.k == 0


def test_a_patched_generate_speculates_with_use_mtp(target):
    """Code that calls model.generate(use_mtp=True) runs on the engine once the model is patched."""
    ids = torch.randint(3, VOCAB, (1, 5), generator=torch.Generator().manual_seed(2))
    expected = target.generate(ids, do_sample=False, max_new_tokens=10, pad_token_id=0)
    patch = specdec_fast.patch_generate(target)
    try:
        out = target.generate(ids, do_sample=False, max_new_tokens=10, pad_token_id=0, use_mtp=True)
    finally:
        patch.restore()
    assert torch.equal(out, expected)
    assert patch.last_stats is not None and patch.last_stats.k == 1 and patch.last_stats.alpha > 0


def test_an_mtp_model_drafts_as_a_draft_head(target, mtp_model):
    """transformers' MtpModel itself as draft_head= (load_draft_head wraps its layer, once per module)."""
    ids, mask = left_padded_prompts([4, 6], vocab=VOCAB, seed=12)
    expected = target.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=10, pad_token_id=0)
    out, stats = specdec_fast.generate(target, ids, mask, draft_head=mtp_model, do_sample=False, max_new_tokens=10,
                                       pad_token_id=0, return_stats=True)
    assert torch.equal(out, expected) and stats.k == 1 and stats.alpha > 0
    assert specdec_fast.load_draft_head(mtp_model) is specdec_fast.load_draft_head(mtp_model)
    with pytest.raises(ValueError, match="no layout of its own"):
        specdec_fast.save_draft_head(specdec_fast.load_draft_head(mtp_model), "/nonexistent")


def test_the_cli_drafts_with_mtp(target, capsys, monkeypatch, tmp_path):
    """specdec-fast generate --mtp on the checkpoint directory, with a word-level tokenizer of its ids."""
    import transformers as tf
    from tokenizers import Tokenizer, models, pre_tokenizers

    from specdec_fast import cli

    words = ["<pad>", "<s>", "</s>"] + [f"w{i}" for i in range(3, VOCAB)]
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<pad>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tf.PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="</s>").save_pretrained(tmp_path)
    if not _qwen(target):  # transformers finds MTP weights by the class's patterns (the real layers: GLM-4.5's 46 / 92,
        # DeepSeek-V3's 61): this checkpoint's layer
        monkeypatch.setattr(type(target), "_keys_to_ignore_on_load_unexpected", [rf"model\.layers\.{LAYERS}\..*"])
    argv = ["generate", "--target", target.config.name_or_path, "--tokenizer", str(tmp_path), "--prompt", "w5 w9 w5 w9"]
    assert cli.main([*argv, "--mtp", "--max-new-tokens", "8"]) == 0
    out = capsys.readouterr().out
    assert "--- stats" in out and "K=1" in out.replace(" ", ""), out
    assert cli.main([*argv, "--mtp", "--prompt-lookup", "3"]) == 2
    assert "give one of" in capsys.readouterr().err


def test_a_checkpoints_processors_apply_to_the_mtp_drafts(target):
    """A generation_config's repetition_penalty (Qwen2.5 Instruct ships 1.05) and no_repeat_ngram_size:
    greedy equals model.generate with them; sampled, the static graph twin draws the eager tokens."""
    ids, mask = left_padded_prompts([5, 3], vocab=VOCAB, seed=7)
    options = dict(repetition_penalty=1.3, no_repeat_ngram_size=3, max_new_tokens=12, pad_token_id=0)
    expected = target.generate(ids, attention_mask=mask, do_sample=False, **options)
    out = specdec_fast.generate(target, ids, mask, use_mtp=True, num_assistant_tokens=2, do_sample=False, **options)
    assert torch.equal(out, expected)
    sampled = dict(options, use_mtp=True, num_assistant_tokens=2, do_sample=True, seed=4, temperature=0.8)
    eager = specdec_fast.generate(target, ids, mask, cuda_graphs=False, **sampled)
    assert torch.equal(specdec_fast.generate(target, ids, mask, cuda_graphs="static", **sampled), eager)


@pytest.fixture(scope="module")
def qwen(tmp_path_factory):
    return glm_with_mtp(tmp_path_factory.mktemp("qwen3_next_mtp"), kind="qwen3_next")


def test_qwen_mtp_reads_vllms_names_and_formula(qwen):
    """The layer read from Qwen3-Next's mtp.* is vLLM's Qwen3NextMultiTokenPredictor, written out here from
    the checkpoint's own tensors: x0 = fc(cat(pre_fc_norm_embedding(e), pre_fc_norm_hidden(h))), each norm
    x (1 + w); the block's tensors (the experts fused) are mtp.layers.0's; the post norm is mtp.norm."""
    from safetensors.torch import load_file

    raw = load_file(f"{qwen.config.name_or_path}/model.safetensors")
    head = MtpHead.for_target(qwen)
    layer = head.layer
    assert torch.equal(layer.post_norm.weight, raw["mtp.norm.weight"])
    assert torch.equal(layer.mtp_block.self_attn.q_proj.weight, raw["mtp.layers.0.self_attn.q_proj.weight"])
    experts = layer.mtp_block.mlp.experts
    assert torch.equal(experts.down_proj[3], raw["mtp.layers.0.mlp.experts.3.down_proj.weight"])
    assert torch.equal(experts.gate_up_proj[5], torch.cat([raw["mtp.layers.0.mlp.experts.5.gate_proj.weight"],
                                                           raw["mtp.layers.0.mlp.experts.5.up_proj.weight"]]))

    def norm(x, weight):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + qwen.config.rms_norm_eps) * (1 + weight)

    gen = torch.Generator().manual_seed(9)
    e, h = torch.randn(5, 48, generator=gen), torch.randn(5, 48, generator=gen)
    expected = torch.cat([norm(e, raw["mtp.pre_fc_norm_embedding.weight"]), norm(h, raw["mtp.pre_fc_norm_hidden.weight"])],
                         -1) @ raw["mtp.fc.weight"].T
    with torch.no_grad():
        seen = layer.eh_proj(torch.cat([layer.enorm(e), layer.hnorm(h)], -1))
    torch.testing.assert_close(seen, expected, atol=1e-5, rtol=1e-5)
    assert head.hidden_first is False and MtpHead.for_target(qwen) is head  # cat(embedding, hidden); loaded once


@pytest.mark.parametrize("kind, mlp", [("qwen3_5_text", "Qwen3_5MLP"), ("qwen3_5_moe_text", "Qwen3_5MoeSparseMoeBlock")])
def test_qwen35_mtp_greedy_equals_target_greedy(tmp_path, kind, mlp):
    """Qwen3.5's text decoders: the MTP layer's dense MLP, or its experts, read and run the same way."""
    target = glm_with_mtp(tmp_path, kind=kind)
    ids, mask = left_padded_prompts([4, 7], vocab=VOCAB, seed=5)
    expected = target.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=12, pad_token_id=0)
    out, stats = specdec_fast.generate(target, ids, mask, use_mtp=True, num_assistant_tokens=2, do_sample=False,
                                       max_new_tokens=12, pad_token_id=0, return_stats=True)
    assert torch.equal(out, expected) and stats.alpha > 0
    assert type(MtpHead.for_target(target).layer.mtp_block.mlp).__name__ == mlp


def test_qwen_mtp_refusals_name_their_reason(qwen, tmp_path):
    ids = torch.randint(3, VOCAB, (1, 4), generator=torch.Generator().manual_seed(1))
    config = copy.deepcopy(qwen.config)
    del config.mtp_num_hidden_layers
    with pytest.raises(UnsupportedModelError, match="mtp_num_hidden_layers is 0 or missing"):
        specdec_fast.generate(type(qwen)(config).eval(), ids, use_mtp=True, max_new_tokens=3)
    config.mtp_num_hidden_layers, config.mtp_use_dedicated_embeddings = 1, True
    with pytest.raises(UnsupportedModelError, match="embeddings of its own"):
        specdec_fast.generate(type(qwen)(config).eval(), ids, use_mtp=True, max_new_tokens=3)
    config.mtp_use_dedicated_embeddings = False
    qwen.save_pretrained(tmp_path)  # transformers' Qwen3-Next drops mtp.* on loading: a checkpoint without the layer
    config.name_or_path = str(tmp_path)
    with pytest.raises(UnsupportedModelError, match="no MTP layer could be read.*no MTP layer"):
        specdec_fast.generate(type(qwen)(config).eval(), ids, use_mtp=True, max_new_tokens=3)
