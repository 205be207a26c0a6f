"""PagedGPT2Runner: logits equal GPT2LMHeadModel's own forward; greedy generate() with the GPT-2
paged runner (checked to be the one built) equals model.generate token for token; the
unsupported variants fall back to HFRunner with a reason."""
import pytest
import torch

import specdec_fast
import specdec_fast.api as api
import specdec_fast.engine.engine as engine_module
from specdec_fast.runners import HFRunner
from specdec_fast.runners.paged_llama import PagedLlamaRunner
from specdec_fast.runners.registry import paged_runner_class, paged_unsupported_reason
from specdec_fast.runners.paged_gpt2 import PagedGPT2Runner, gpt2_unsupported_reason

from .runner_checks import assert_bf16_close_to_forward, assert_runner_matches_forward, hf_logits
from .models import eos_inside_a_block, left_padded_prompts, make_draft
from ..conftest import on_device

VOCAB = 96


def tiny_gpt2(*, seed: int = 0, layers: int = 2, n_positions: int = 128, attn: str = "sdpa", **overrides):
    """Random fp32 GPT-2, head_dim 16; biases and layer-norm affine params random (GPT-2's init
    zeroes the biases and sets LN to identity, which would leave those paths untested)."""
    import transformers as tf

    torch.manual_seed(seed)
    config = tf.GPT2Config(vocab_size=VOCAB, n_embd=64, n_layer=layers, n_head=4, n_positions=n_positions,
                           initializer_range=0.15, bos_token_id=1, eos_token_id=2, pad_token_id=0, **overrides)
    model = tf.AutoModelForCausalLM.from_config(config, attn_implementation=attn).float().eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                p.normal_(0, 0.1)
            elif name.endswith(("ln_1.weight", "ln_2.weight", "ln_f.weight")):
                p.normal_(1, 0.2)
    model.generation_config.eos_token_id = None
    return model



VARIANTS = {
    "default": {},
    "inverse_layer_idx_unscaled": dict(scale_attn_by_inverse_layer_idx=True, scale_attn_weights=False),
    "relu_n_inner": dict(activation_function="relu", n_inner=80),
    "reorder_upcast_eager": dict(reorder_and_upcast_attn=True, scale_attn_by_inverse_layer_idx=True, attn="eager"),
    "cross_attention_blocks": dict(add_cross_attention=True),
}


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_logits_equal_hf_forward(variant):
    model = tiny_gpt2(layers=3, **VARIANTS[variant])
    assert gpt2_unsupported_reason(model) is None
    runner = PagedGPT2Runner(model, max_new_tokens=8, num_draft_tokens=3, block_size=4)
    assert_runner_matches_forward(model, runner, VOCAB)


def test_weights_are_shared_not_copied():
    model = tiny_gpt2()
    runner = PagedGPT2Runner(model, max_new_tokens=4, num_draft_tokens=0)
    block, layer = model.transformer.h[1], runner.layers[1]
    assert runner.wte.data_ptr() == model.transformer.wte.weight.data_ptr()
    assert runner.wpe.data_ptr() == model.transformer.wpe.weight.data_ptr()
    assert runner.lm_head.data_ptr() == model.transformer.wte.weight.data_ptr()  # tied
    for ours, conv in ((layer.qkv, block.attn.c_attn), (layer.proj, block.attn.c_proj), (layer.fc, block.mlp.c_fc),
                       (layer.out, block.mlp.c_proj)):
        assert ours[0].data_ptr() == conv.weight.data_ptr() and ours[0].shape == conv.weight.t().shape
        assert ours[1].data_ptr() == conv.bias.data_ptr()
    assert layer.ln_1[0].data_ptr() == block.ln_1.weight.data_ptr()
    # An in-place update of the model is seen by the runner (same storage).
    ids = torch.tensor([[5, 6, 7]])
    with torch.no_grad():
        block.mlp.c_fc.weight.mul_(0.5)
    torch.testing.assert_close(runner.prefill(ids, None)[0], hf_logits(model, [5, 6, 7])[-1], atol=1e-4, rtol=1e-4)


def test_bfloat16_logits_close_to_hf_forward():
    model = tiny_gpt2().to(torch.bfloat16)
    runner = PagedGPT2Runner(model, max_new_tokens=4, num_draft_tokens=1)
    assert_bf16_close_to_forward(model, runner, VOCAB)


def test_too_many_tentative_tokens_raise():
    runner = PagedGPT2Runner(tiny_gpt2(), max_new_tokens=4, num_draft_tokens=2)
    runner.prefill(torch.tensor([[5, 6, 7]]), None)
    runner.score(torch.tensor([[3, 4]]))
    with pytest.raises(RuntimeError, match="tentative tokens .* PagedGPT2Runner"):
        runner.score(torch.tensor([[3, 4]]))


def test_runaway_row_past_n_positions_is_clamped_and_the_other_row_stays_exact():
    """n_positions = the reservation exactly; blocks of 8 round it up, so a row committing K+1 per
    call (a finished row) scores positions past the table: they are clamped, and its neighbour
    (one token per call) keeps exact logits."""
    k, new, prompt = 3, 12, 5
    budget = prompt + new + k + 1  # 21 -> 3 blocks of 8 = 24 slots
    model = tiny_gpt2(n_positions=budget)
    ids, mask = left_padded_prompts([prompt, prompt], vocab=VOCAB, seed=9)
    runner = PagedGPT2Runner(model, max_new_tokens=new, num_draft_tokens=k, block_size=8)
    runner.prefill(ids, mask)
    context = ids[0].tolist()
    gen = torch.Generator().manual_seed(4)
    for _ in range(new - 1):
        tokens = torch.randint(3, VOCAB, (2, k + 1), generator=gen)
        logits = runner.score(tokens)
        expected = hf_logits(model, context + tokens[0].tolist())[-(k + 1) :]
        torch.testing.assert_close(logits[0], expected, atol=1e-4, rtol=1e-4)
        runner.commit(torch.tensor([1, k + 1]))
        context.append(int(tokens[0, 0]))
    assert int(runner.cache.seq_lens[1]) == int(runner.caps[1]) == 24 - (k + 1)
    assert int(runner.caps[1]) + k + 1 > budget, "the runaway row did run past n_positions"
    too_long = PagedGPT2Runner(model, max_new_tokens=new + 1, num_draft_tokens=k)
    with pytest.raises(ValueError, match="exceed the model's 21 position embeddings"):
        too_long.prefill(ids, mask)


# -- generate() with the paged GPT-2 runner --------------------------------------------------
_PAIR = {}


def pair():
    if not _PAIR:
        target = tiny_gpt2(seed=5)
        _PAIR["pair"] = (target, make_draft(target, noise=0.03))
    return _PAIR["pair"]


@pytest.fixture
def built(monkeypatch):
    """The runners generate()'s engines build, in order (target first); engines cached by earlier
    tests are dropped first, so every engine the test uses is built under the spy."""
    runners = []
    original = engine_module.make_runner

    def spy(*args, **kwargs):
        runner = original(*args, **kwargs)
        runners.append(runner)
        return runner

    specdec_fast.release_engines()
    monkeypatch.setattr(engine_module, "make_runner", spy)
    return runners


MAX_NEW = 20
PROMPTS = {1: [6], 3: [4, 10, 7]}


@pytest.mark.parametrize("batch", [1, 3])
def test_greedy_equals_generate_with_the_paged_gpt2_runner(batch, built):
    target, draft = pair()
    ids, mask = left_padded_prompts(PROMPTS[batch], vocab=VOCAB, seed=batch)
    expected = target.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=MAX_NEW, pad_token_id=0)
    for k in (1, 3, 6):
        out, stats = api.generate(target, ids, mask, assistant_model=draft, num_assistant_tokens=k, do_sample=False,
                                  max_new_tokens=MAX_NEW, pad_token_id=0, return_stats=True)
        assert torch.equal(out, expected), k
        assert stats.alpha > 0.2, "the aligned draft should be accepted often (else the test proves little)"
    for k in (2, 5):
        out = api.generate(target, ids, mask, prompt_lookup_num_tokens=k, do_sample=False, max_new_tokens=MAX_NEW,
                           pad_token_id=0)
        assert torch.equal(out, expected), k
    out = api.generate(target, ids, mask, do_sample=False, max_new_tokens=MAX_NEW, pad_token_id=0)
    assert torch.equal(out, expected)
    # One engine per drafting (draft model: target + draft runners; prompt lookup and plain
    # decoding: the target's), built at its first call and again when a call needs more drafts.
    assert len(built) >= 2 + 1 + 1
    assert all(type(r) is PagedGPT2Runner for r in built), [type(r).__name__ for r in built]


def test_eos_inside_an_accepted_block(built):
    """Draft = target: every draft is accepted, so EOS lands inside a K=6 block; rows end exactly there."""
    target, _ = pair()
    ids, mask = left_padded_prompts(PROMPTS[3], vocab=VOCAB, seed=3)
    width = ids.shape[1]
    plain = target.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=MAX_NEW, pad_token_id=0)
    end, eos = eos_inside_a_block(plain, width, block=7)  # K = 6
    expected = target.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=MAX_NEW, pad_token_id=0,
                               eos_token_id=eos)
    out, stats = api.generate(target, ids, mask, assistant_model=target, num_assistant_tokens=6, do_sample=False,
                              max_new_tokens=MAX_NEW, pad_token_id=0, eos_token_id=eos, return_stats=True)
    assert torch.equal(out, expected)
    assert stats.alpha == 1.0
    assert (out[1, width + end + 1 :] == 0).all() and int(out[1, width + end]) == eos
    assert [type(r) for r in built] == [PagedGPT2Runner, PagedGPT2Runner]


def test_triton_kernels_on_the_test_device(built, device):
    """backend='triton' end to end: compiled on CUDA on a GPU machine, interpreted elsewhere."""
    target, draft = pair()
    ids, mask = left_padded_prompts([3, 5], vocab=VOCAB, seed=4)
    target, draft, ids, mask = on_device(device, target, draft, ids, mask)
    expected = target.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=5, pad_token_id=0)
    out = api.generate(target, ids, mask, assistant_model=draft, num_assistant_tokens=2, do_sample=False,
                       max_new_tokens=5, pad_token_id=0, backend="triton", runner="paged")
    assert torch.equal(out, expected)
    assert [type(r) for r in built] == [PagedGPT2Runner, PagedGPT2Runner]


# -- selection and unsupported variants ------------------------------------------------------
def test_selection_and_position_limit(built):
    model = tiny_gpt2(n_positions=40)
    assert paged_runner_class(model) is PagedGPT2Runner
    assert api.choose_runner(model, None, 40) == "paged"
    assert api.choose_runner(model, None, 41) == "hf"
    assert "n_positions 40" in paged_unsupported_reason(model, 41)
    ids = torch.tensor([[5, 6, 7]])
    # 3 + 36 = 39 positions fit for HF; with K + 1 = 3 the paged reservation needs 42.
    out = api.generate(model, ids, prompt_lookup_num_tokens=2, max_new_tokens=36, do_sample=False, pad_token_id=0)
    assert type(built[-1]) is HFRunner
    assert torch.equal(out, model.generate(ids, do_sample=False, max_new_tokens=36, pad_token_id=0))
    with pytest.raises(ValueError, match="runner='paged' cannot run GPT2LMHeadModel: a row needs up to 42 positions"):
        api.generate(model, ids, prompt_lookup_num_tokens=2, max_new_tokens=36, do_sample=False, runner="paged")


def test_unsupported_variants_have_reasons():
    import transformers as tf

    from specdec_fast.runners.paged_base import PagedRunnerBase

    assert issubclass(PagedGPT2Runner, PagedRunnerBase) and issubclass(PagedLlamaRunner, PagedRunnerBase)
    # head_dim 12: every kernel takes it (triton's attention pads it to 16); > 512 triton refuses.
    odd = tf.AutoModelForCausalLM.from_config(tf.GPT2Config(vocab_size=VOCAB, n_embd=48, n_head=4, n_layer=1)).eval()
    assert paged_unsupported_reason(odd) is None and paged_unsupported_reason(odd, 10, backend="triton") is None
    assert api.choose_runner(odd, None, 10, backend="triton") == "paged"
    wide = tf.AutoModelForCausalLM.from_config(tf.GPT2Config(vocab_size=VOCAB, n_embd=520, n_head=1, n_layer=1)).eval()
    assert "head_dim <= 512" in paged_unsupported_reason(wide, 10, backend="triton")
    assert api.choose_runner(wide, None, 10, backend="triton") == "hf"

    half = tiny_gpt2(reorder_and_upcast_attn=True, attn="eager").to(torch.bfloat16)
    assert "reorder_and_upcast_attn with eager attention in torch.bfloat16" in paged_unsupported_reason(half)
    assert paged_unsupported_reason(tiny_gpt2(reorder_and_upcast_attn=True).to(torch.bfloat16)) is None  # sdpa ignores it

    class Wrapped(type(odd.transformer.h[0].mlp.c_fc)):  # like an adapter / quantized Conv1D: its own forward
        def forward(self, x):
            return super().forward(x) * 1.0

    wrapped = tiny_gpt2()
    old = wrapped.transformer.h[1].mlp.c_fc
    wrapped.transformer.h[1].mlp.c_fc = Wrapped(old.nf, old.nx)
    assert "block 1" in paged_unsupported_reason(wrapped)
    assert api.choose_runner(wrapped, None, 50) == "hf"
    with pytest.raises(ValueError, match="PagedGPT2Runner cannot run this model: block 1"):
        PagedGPT2Runner(wrapped, max_new_tokens=3, num_draft_tokens=0)

    llama = tf.AutoModelForCausalLM.from_config(tf.LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64,
                                                               num_hidden_layers=1, num_attention_heads=2)).eval()
    assert paged_runner_class(llama) is PagedLlamaRunner
    with pytest.raises(ValueError, match="PagedGPT2Runner cannot run this model: model_type 'llama' is not 'gpt2'"):
        PagedGPT2Runner(llama, max_new_tokens=3, num_draft_tokens=0)
    with pytest.raises(ValueError, match="PagedLlamaRunner cannot run this model: model_type 'gpt2'"):
        PagedLlamaRunner(tiny_gpt2(), max_new_tokens=3, num_draft_tokens=0)
    gptj = tf.AutoModelForCausalLM.from_config(tf.GPTJConfig(vocab_size=VOCAB, n_embd=32, n_layer=1, n_head=2,
                                                             rotary_dim=8)).eval()  # no paged runner (GPT-NeoX has one)
    reason = paged_unsupported_reason(gptj)
    assert "model_type 'gptj'" in reason and "'gpt2'" in reason
    assert api.choose_runner(gptj, None, 10) == "hf"
