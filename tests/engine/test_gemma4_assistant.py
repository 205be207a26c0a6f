"""Gemma 4's assistant (heads/gemma4_assistant.py, runners/paged_gemma4_assistant.py) drafting over the paged Gemma 4
target's caches: generate(assistant_model=<the assistant>) drafts with it as a head; each iteration's greedy drafts
equal transformers' Gemma4AssistantForCausalLM fed the target's committed K/V (shared_kv_states of positions
0 .. p - 1), the target's final-norm state before the token at p and that token, at position p throughout (its
candidate generator's loop; it also reads the K/V of a draft the target rejected at p, which this package's does
not); greedy decoding equals the target's on every backend, batched and left padded; the static graph twin draws
the eager tokens; sampled tokens follow the target (chi-square, with a control); the checkpoint's
num_assistant_tokens is the default K; refusals name their reason."""
import copy

import pytest
import torch
import transformers as tf

import specdec_fast
from specdec_fast.drafters import Eagle3Drafter
from specdec_fast.engine import SpeculativeDecoder
from specdec_fast.heads import load_draft_head
from specdec_fast.kernels import make_sampling_tensors
from specdec_fast.runners.paged_gemma4 import PagedGemma4Runner
from specdec_fast.runners.hf import UnsupportedModelError
from specdec_fast.runners.paged_gemma4_assistant import PagedGemma4AssistantRunner

from ..conftest import backend_device, on_device
from .heads import proposals_per_iteration, verify_sees_uniform_rows
from .models import left_padded_prompts
from .test_paged_gemma4 import V, _config
from .test_sampling_exact import first_tokens_pvalues
from tests.kernels.stats import P_VALUE_THRESHOLD

LAYERS = ["sliding_attention", "full_attention"]


def _pair(ordered: bool = False, vocab: int = V, init: float = 0.3):
    """A Gemma 4 target (per-layer inputs, KV-sharing layers, windows of 4) and an assistant for it whose
    pre_projection passes the token's embedding and whose lm_head is the target's embedding, so it drafts near "the
    same token again" -- drafts the target accepts at times -- while every weight still shapes its logits.
    ordered: the assistant's ordered embedding (use_ordered_embeddings: 8 centroids, 2 kept)."""
    torch.manual_seed(0)
    target = tf.Gemma4ForCausalLM(_config("ple_shared", initializer_range=init, vocab_size=vocab,
                                          vocab_size_per_layer_input=vocab)).float().eval()
    target.generation_config.eos_token_id = None
    text = tf.Gemma4TextConfig(vocab_size=vocab, hidden_size=48, intermediate_size=64, num_hidden_layers=2,
                               num_attention_heads=4, num_key_value_heads=2, head_dim=12, global_head_dim=16,
                               sliding_window=4, vocab_size_per_layer_input=0, hidden_size_per_layer_input=0,
                               num_kv_shared_layers=2, layer_types=LAYERS, max_position_embeddings=256)
    config = tf.Gemma4AssistantConfig(text_config=text.to_dict(), backbone_hidden_size=48,
                                      use_ordered_embeddings=ordered, num_centroids=8, centroid_intermediate_top_k=2)
    assistant = tf.Gemma4AssistantForCausalLM(config).float().eval()
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, param in assistant.named_parameters():
            param.copy_((1.0 if "norm" in name else 0.0) + 0.05 * torch.randn(param.shape, generator=gen))
        assistant.pre_projection.weight[:, :48] += torch.eye(48)
        assistant.lm_head.weight.copy_(target.model.embed_tokens.weight)
        if ordered:
            assistant.masked_embedding.token_ordering.copy_(torch.randperm(vocab, generator=gen))
        for layer in assistant.model.layers:
            layer.layer_scalar.fill_(1.0)
    assistant.generation_config.num_assistant_tokens = 3
    return target, assistant


def _reference_drafts(target, assistant, context: list, k: int) -> list:
    """transformers' assistant drafting after ``context`` (x_0 .. x_p): the target's forward over x_0 .. x_{p-1} gives
    the K/V of its store layers and h_{p-1}; then k steps at position p, each fed the token and the last output. Its
    sliding layers read the last W keys there: transformers' bidirectional sliding mask keeps the last W + 1 entries of
    what it is given, in its generation the W real ones before p and the entry at p (a rejected draft's, which this
    package's assistant does not read), so the reference is given W - 1."""
    assistant = copy.deepcopy(assistant)
    assistant.config.get_text_config().sliding_window -= 1
    with torch.no_grad():
        out = target(torch.tensor([context[:-1]]), output_hidden_states=True, return_shared_kv_states=True)
        hidden, token, drafts = out.hidden_states[-1][:, -1:], torch.tensor([[context[-1]]]), []
        position = torch.tensor([[len(context) - 1]])
        for _ in range(k):
            embeds = torch.cat([target.model.embed_tokens(token), hidden], -1)
            step = assistant(inputs_embeds=embeds, position_ids=position, shared_kv_states=out.shared_kv_states)
            token, hidden = step.logits.argmax(-1), step.last_hidden_state
            drafts.append(int(token))
    return drafts


@pytest.mark.parametrize("ordered", [False, True])
def test_drafts_equal_transformers_assistant(ordered):
    """Every iteration's greedy drafts (K = 3: steps 2 and 3 fed the assistant's own output) equal the reference's
    over the context so far, two left-padded rows; accepts and rejects both happen (the lm_head's: the pending
    entries after every accept)."""
    target, assistant = _pair(ordered)
    ids, mask = left_padded_prompts([4, 7], vocab=V, seed=8)
    runner = PagedGemma4Runner(target, max_new_tokens=16, num_draft_tokens=3)
    head = load_draft_head(assistant)
    runner.capture_hidden_states(head.hidden_indices(len(runner.layers)))
    drafter = Eagle3Drafter(PagedGemma4AssistantRunner(head, runner), runner, None)
    decoder = SpeculativeDecoder(runner, drafter, k=3, params=make_sampling_tensors(2, "cpu", temperature=0.0, seed=0),
                                 max_new_tokens=16)
    seen = proposals_per_iteration(drafter, decoder, ids, mask)
    for iteration in seen:
        for context, drafts in iteration:
            assert drafts == _reference_drafts(target, assistant, context, len(drafts)), context
    hist = decoder.stats.result.accepted_hist
    assert len(seen) >= 4 and hist[0] > 0, hist
    if not ordered:  # (the ordered embedding's clusters rarely hold the token again: its drafts are rejected)
        assert sum(hist[1:]) > 0, f"the test needs accepted drafts too: {hist}"


@pytest.mark.parametrize("backend", ["torch", "cpp", "triton"])
def test_greedy_equals_the_targets(backend, device):
    """generate(assistant_model=<the assistant>) drafts with it (the checkpoint's num_assistant_tokens, 3, as K),
    three left-padded rows past the window; transformers' own assisted generation gives the same tokens."""
    device = backend_device(backend, device)
    target, assistant = on_device(device, *_pair())
    ids, mask = on_device(device, *left_padded_prompts([6, 11, 2], vocab=V, seed=21))
    kw = dict(max_new_tokens=20, do_sample=False, pad_token_id=0)
    expected = target.generate(ids, attention_mask=mask, **kw)
    out, stats = specdec_fast.generate(target, ids, mask, assistant_model=assistant, backend=backend,
                                       return_stats=True, **kw)
    assert torch.equal(out, expected)
    assert stats.k == 3 and stats.alpha > 0
    row = ids[1:2, mask[1].bool()]
    assert torch.equal(target.generate(row, assistant_model=assistant, **kw), target.generate(row, **kw))


def test_the_static_twin_draws_the_eager_tokens():
    """Sampled, K = 2: the captured graphs' tokens are the eager loop's (no host read in the assistant's step)."""
    target, assistant = _pair()
    ids, mask = left_padded_prompts([5, 3], vocab=V, seed=7)
    kw = dict(max_new_tokens=12, do_sample=True, temperature=0.8, seed=4, num_assistant_tokens=2, pad_token_id=0)
    eager = specdec_fast.generate(target, ids, mask, assistant_model=assistant, cuda_graphs=False, **kw)
    static = specdec_fast.generate(target, ids, mask, assistant_model=assistant, cuda_graphs="static", **kw)
    assert torch.equal(static, eager)


def test_refusals_name_their_reason():
    target, assistant = _pair()
    ids = torch.randint(3, V, (1, 5), generator=torch.Generator().manual_seed(2))
    with pytest.raises(ValueError, match="draft_head needs a paged target runner .* got HFRunner"):
        specdec_fast.generate(target, ids, assistant_model=assistant, runner="hf", max_new_tokens=4)
    with pytest.raises(ValueError, match="tree=... with a Gemma 4 assistant"):
        specdec_fast.generate(target, ids, assistant_model=assistant, tree="static", max_new_tokens=4)
    with pytest.raises(UnsupportedModelError, match=r"a Gemma 4 assistant \(Gemma4AssistantForCausalLM\)"):
        specdec_fast.SpeculativeEngine(target, assistant)  # as a draft model
    assert specdec_fast.SpeculativeEngine(target, draft_head=assistant).draft_head.kind == "gemma4_assistant"


SMALL_VOCAB, PROMPT = 12, torch.tensor([[3, 7, 5, 9]])


@pytest.fixture(scope="module")
def small():
    """A pair of 12 tokens: joint laws of two tokens fit a chi-square of 3000 rows (the target's weights smaller:
    at 0.3 it is so peaked that nearly every draft is accepted; 0.1: alpha ~0.63)."""
    return _pair(vocab=SMALL_VOCAB, init=0.1)


def _pvalues(target, assistant, rows: int = 3000):
    """(stats, p-value of tokens 1-2 jointly, p-value of token 3) of sampling at T = 0.9 with K = 2: tokens 2 and 3
    come from the first speculative block (accepts, residuals and bonus tokens)."""
    settings = dict(temperature=0.9, top_k=0, top_p=1.0, min_p=0.0)
    out, stats = specdec_fast.generate(target, PROMPT.expand(rows, -1), assistant_model=assistant,
                                       num_assistant_tokens=2, do_sample=True, max_new_tokens=3, seed=123,
                                       return_stats=True, temperature=0.9, top_k=0, pad_token_id=0)
    return stats, *first_tokens_pvalues(target, PROMPT, out[:, PROMPT.shape[1]:], SMALL_VOCAB, settings)


def test_sampled_tokens_follow_the_target(small):
    stats, p12, p3 = _pvalues(*small)
    assert 0.1 < stats.alpha < 0.95, f"alpha {stats.alpha}: the test needs both accepts and rejects"
    assert p12 > P_VALUE_THRESHOLD and p3 > P_VALUE_THRESHOLD, (p12, p3)


def test_control_a_verify_that_sees_another_draft_law_fails(small, monkeypatch):
    """The drafts drawn from the assistant's rows, the verify handed uniform rows instead: the tokens no longer
    follow the target, and the test above would see it."""
    verify_sees_uniform_rows(monkeypatch)
    try:
        _, p12, p3 = _pvalues(*small)
    finally:
        specdec_fast.release_engines()
    assert min(p12, p3) < P_VALUE_THRESHOLD, (p12, p3)


def test_the_cli_drafts_with_the_assistant(tmp_path, capsys):
    """specdec-fast generate --target <a Gemma 4 checkpoint> --draft <its assistant's>, as transformers' checkpoints
    are passed: the assistant drafts as a head (K = its num_assistant_tokens, 3)."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    from specdec_fast import cli

    target, assistant = _pair()
    target.save_pretrained(tmp_path / "target")
    assistant.save_pretrained(tmp_path / "assistant")
    words = ["<pad>", "<s>", "</s>"] + [f"w{i}" for i in range(3, V)]
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<pad>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tf.PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="</s>").save_pretrained(tmp_path / "tok")
    assert cli.main(["generate", "--target", str(tmp_path / "target"), "--draft", str(tmp_path / "assistant"),
                     "--tokenizer", str(tmp_path / "tok"), "--prompt", "w5 w9 w5 w9", "--max-new-tokens", "8"]) == 0
    out = capsys.readouterr().out
    assert "--- stats" in out and "K=3" in out.replace(" ", ""), out
