"""Gemma 4 on its paged runner (runners/paged_gemma4.py): logits equal transformers' forward on every backend for
its variants -- per-layer inputs with KV-sharing layers (E2B / E4B's layout), full layers whose value is their key
with fewer KV heads (attention_k_eq_v, num_global_key_value_heads), a MoE block beside a double-wide MLP, and the
plain layout -- each with sliding and full layers of two head widths on caches of their own; the multimodal model
runs its text decoder; greedy decoding equals model.generate (a draft model, prompt lookup, batches, left padding,
rows past the window; on the hf runner and the static graph twin too); controls show each piece is needed; the refusals name their reason.
Rings of its windowed layers: test_ring_windows.py."""
import copy

import pytest
import torch
import transformers as tf

import specdec_fast
from specdec_fast.runners.paged_gemma4 import PagedGemma4Runner, gemma4_norm
from specdec_fast.runners.registry import paged_runner_class, paged_unsupported_reason

from ..conftest import backend_device, on_device
from .models import left_padded_prompts, make_draft
from .runner_checks import assert_runner_matches_forward

V = 128
VARIANTS = {
    "ple_shared": {},  # per-layer inputs, the last two layers reading the first two's K/V (E2B / E4B)
    "k_eq_v": dict(attention_k_eq_v=True, num_global_key_value_heads=1, hidden_size_per_layer_input=0,
                   num_kv_shared_layers=0),
    "moe": dict(enable_moe_block=True, num_experts=4, top_k_experts=2, moe_intermediate_size=24,
                use_double_wide_mlp=True),
    "plain": dict(hidden_size_per_layer_input=0, num_kv_shared_layers=0),
}
_MODELS = {}


def _config(variant: str, **over):
    """A tiny Gemma4TextConfig of ``variant`` (windows of 4, heads of 12 on the sliding layers and 16 on the full
    ones, a final soft-cap), ``over`` its fields changed."""
    layers = over.pop("num_hidden_layers", 4)
    return tf.Gemma4TextConfig(**{**dict(
        vocab_size=V, hidden_size=48, intermediate_size=96, num_hidden_layers=layers, num_attention_heads=4,
        num_key_value_heads=2, head_dim=12, global_head_dim=16, sliding_window=4, vocab_size_per_layer_input=V,
        hidden_size_per_layer_input=8, num_kv_shared_layers=2, max_position_embeddings=256,
        layer_types=["sliding_attention", "full_attention"] * (layers // 2), initializer_range=0.1, pad_token_id=0,
        bos_token_id=1, eos_token_id=None, final_logit_softcapping=30.0), **VARIANTS[variant], **over})


def _away_from_inits(model) -> None:
    """A tiny Gemma 4 decoder's norms and scales around 1 (not their inits), its layer scalars 0.9, no EOS."""
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" in name or "scale" in name:
                param.normal_(1.0, 0.2)
        for layer in model.model.layers:
            layer.layer_scalar.fill_(0.9)
    model.generation_config.eos_token_id = None


def gemma4(variant: str = "ple_shared", **over):
    """A tiny Gemma4ForCausalLM of _config(variant, **over), its norms, scales and layer scalars away from their
    inits (cached by variant where over is empty)."""
    key = variant if not over else None
    if key not in _MODELS or key is None:
        torch.manual_seed(0)
        model = tf.Gemma4ForCausalLM(_config(variant, **over)).float().eval()
        _away_from_inits(model)
        if key is None:
            return model
        _MODELS[key] = model
    return _MODELS[key]


@pytest.mark.parametrize("backend", ["torch", "cpp", "triton"])
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_logits_equal_the_forward(variant, backend, device):
    device = backend_device(backend, device)
    model = on_device(device, gemma4(variant))
    runner = paged_runner_class(model)(model, max_new_tokens=8, num_draft_tokens=3, block_size=4, backend=backend)
    assert type(runner) is PagedGemma4Runner
    assert_runner_matches_forward(model, runner, V)
    shapes = {runner.kv_shape(i) for i in range(runner.kv_layer_count)}
    assert len(shapes) == 2 and {(c.num_kv_heads, c.head_dim) for c in runner.caches} == shapes  # a cache a width
    shared = VARIANTS[variant].get("num_kv_shared_layers", 2)
    assert runner.kv_layer_count == 4 - shared and runner.kv_of == ([0, 1, 0, 1] if shared else [0, 1, 2, 3])


def test_the_multimodal_model_runs_its_text_decoder():
    """Gemma4ForConditionalGeneration (what AutoModelForCausalLM loads from a Gemma 4 checkpoint): its text
    decoder's runner gives the whole model's logits on text prompts."""
    text = gemma4()
    config = tf.Gemma4Config(text_config=text.config.to_dict(), vision_config=tf.Gemma4VisionConfig(
        hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2).to_dict(), audio_config=None)
    model = tf.Gemma4ForConditionalGeneration(config).float().eval()
    model.model.language_model.load_state_dict(text.model.state_dict())
    model.lm_head.weight = model.model.language_model.embed_tokens.weight
    runner = paged_runner_class(model)(model, max_new_tokens=8, num_draft_tokens=3, block_size=4, backend="cpp")
    assert type(runner) is PagedGemma4Runner
    assert_runner_matches_forward(model, runner, V)


def unified(multimodal: bool = False):
    """A tiny Gemma4UnifiedForCausalLM (the unified decoder: Gemma 4's layers without per-layer inputs or the MoE block,
    use_bidirectional_attention "vision" as its config defaults), the last two layers reading the first two's K/V with
    double-wide MLPs, the full layers' value its key; its norms, scales and layer scalars away from their inits. With
    multimodal: Gemma4UnifiedForConditionalGeneration (what AutoModelForCausalLM loads from such a checkpoint) holding
    that text decoder."""
    if "unified" not in _MODELS:
        torch.manual_seed(0)
        config = tf.Gemma4UnifiedTextConfig(
            vocab_size=V, hidden_size=48, intermediate_size=96, num_hidden_layers=4, num_attention_heads=4,
            num_key_value_heads=2, head_dim=12, global_head_dim=16, sliding_window=4, num_kv_shared_layers=2,
            use_double_wide_mlp=True, attention_k_eq_v=True, num_global_key_value_heads=1, max_position_embeddings=256,
            layer_types=["sliding_attention", "full_attention"] * 2, initializer_range=0.1, pad_token_id=0,
            bos_token_id=1, eos_token_id=None, final_logit_softcapping=30.0)
        model = tf.Gemma4UnifiedForCausalLM(config).float().eval()
        _away_from_inits(model)
        _MODELS["unified"] = model
    text = _MODELS["unified"]
    assert text.config.use_bidirectional_attention == "vision"
    if not multimodal:
        return text
    config = tf.Gemma4UnifiedConfig(text_config=text.config.to_dict(), vision_config=None, audio_config=None)
    model = tf.AutoModelForCausalLM.from_config(config).float().eval()
    model.model.language_model.load_state_dict(text.model.state_dict())
    model.lm_head.weight = model.model.language_model.embed_tokens.weight
    model.generation_config.eos_token_id = None
    return model


@pytest.mark.parametrize("backend", ["torch", "cpp", "triton"])
def test_the_unified_decoder_logits_equal_the_forward(backend, device):
    """gemma4_unified_text on Gemma 4's runner: KV-sharing layers, a full layer's value its key over one KV head,
    double-wide MLPs, two head widths; "vision" bidirectionality is causal over a text prompt."""
    device = backend_device(backend, device)
    model = on_device(device, unified())
    runner = paged_runner_class(model)(model, max_new_tokens=8, num_draft_tokens=3, block_size=4, backend=backend)
    assert type(runner) is PagedGemma4Runner and runner.ple is None
    assert runner.kv_of == [0, 1, 0, 1] and {runner.kv_shape(i) for i in range(2)} == {(2, 12), (1, 16)}
    assert_runner_matches_forward(model, runner, V)


def test_the_unified_multimodal_model_runs_its_text_decoder():
    """Gemma4UnifiedForConditionalGeneration: its text decoder's runner gives the whole model's logits, and greedy
    decoding (a draft model, past the window) equals the model's generate."""
    model = unified(multimodal=True)
    assert type(model).__name__ == "Gemma4UnifiedForConditionalGeneration"
    runner = paged_runner_class(model)(model, max_new_tokens=8, num_draft_tokens=3, block_size=4, backend="cpp")
    assert type(runner) is PagedGemma4Runner
    assert_runner_matches_forward(model, runner, V)
    ids, mask = left_padded_prompts([6, 11, 2], vocab=V, seed=21)
    kw = dict(max_new_tokens=20, do_sample=False, pad_token_id=0)
    expected = model.generate(ids, attention_mask=mask, **kw)
    out, stats = specdec_fast.generate(model, ids, mask, assistant_model=make_draft(unified(), noise=0.1),
                                       num_assistant_tokens=3, return_stats=True, runner="paged", **kw)
    assert torch.equal(out, expected) and stats.alpha > 0


@pytest.mark.parametrize("backend", ["torch", "cpp"])
@pytest.mark.parametrize("variant", ["ple_shared", "moe"])
def test_greedy_equals_generate(variant, backend):
    """Past the window (rows of up to 37 tokens, windows of 4): a draft model at K = 1 and 3 and prompt lookup,
    three left-padded rows; the hf runner too."""
    model = gemma4(variant)
    draft = make_draft(model, noise=0.1)
    ids, mask = left_padded_prompts([6, 11, 2], vocab=V, seed=21)
    kw = dict(max_new_tokens=26, do_sample=False, pad_token_id=0)
    expected = model.generate(ids, attention_mask=mask, **kw)
    for k in (1, 3):
        out, stats = specdec_fast.generate(model, ids, mask, assistant_model=draft, num_assistant_tokens=k,
                                           backend=backend, return_stats=True, **kw)
        assert torch.equal(out, expected), k
        assert stats.accepted_hist[0] > 0 and sum(stats.accepted_hist[1:]) > 0, "rejections and accepts both"
    assert torch.equal(specdec_fast.generate(model, ids, mask, prompt_lookup_num_tokens=3, backend=backend, **kw),
                       expected)
    if backend == "torch":  # the hf runner; the static graph twin (the MoE block's experts wait on no host value)
        assert torch.equal(specdec_fast.generate(model, ids, mask, prompt_lookup_num_tokens=3, runner="hf", **kw),
                           expected)
        assert torch.equal(specdec_fast.generate(model, ids, mask, assistant_model=draft, num_assistant_tokens=3,
                                                 cuda_graphs="static", **kw), expected)


def _spoilt(model, spoil) -> None:
    runner = PagedGemma4Runner(model, max_new_tokens=8, num_draft_tokens=3, block_size=4)
    spoil(runner)
    with pytest.raises(AssertionError):
        assert_runner_matches_forward(model, runner, V)


def test_controls_each_piece_is_needed():
    """A KV-shared layer that reads the first earlier layer of its type (not the last, kv_sharing_modes' "store"
    layer), the per-layer inputs left out, the layer scalar ignored, Llama's softmax scale,
    or the experts without their per-expert scale: other logits. The norm is Gemma 4's x * w (not Gemma 3's 1 + w)."""
    six = gemma4(num_hidden_layers=6)  # writers s f s f, then s f reading layers 2 and 3
    runner = PagedGemma4Runner(six, max_new_tokens=8, num_draft_tokens=3, block_size=4)
    assert runner.kv_of == [0, 1, 2, 3, 2, 3]
    assert_runner_matches_forward(six, runner, V)
    _spoilt(six, lambda r: setattr(r, "kv_of", [0, 1, 2, 3, 0, 1]))
    model = gemma4()
    _spoilt(model, lambda r: [setattr(layer, "ple", None) for layer in r.layers])
    _spoilt(model, lambda r: [setattr(layer, "scalar", torch.ones(1)) for layer in r.layers])
    _spoilt(model, lambda r: setattr(r, "scale", 12 ** -0.5))
    moe = gemma4("moe")
    moe.model.layers[0].router.per_expert_scale.data.normal_(1.0, 0.5)
    _spoilt(moe, lambda r: [layer.moe.update(expert_scale=torch.ones(4)) for layer in r.layers])
    moe.model.layers[0].router.per_expert_scale.data.fill_(1.0)
    norm = model.model.layers[0].post_feedforward_layernorm.to(torch.bfloat16)
    x = torch.randn(8, 48, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
    assert torch.equal(gemma4_norm(x, norm.weight, norm.eps), norm(x))


@pytest.mark.parametrize("backend", ["triton", "cpp"])
def test_the_published_head_widths(backend, device):
    """The published checkpoints' widths: sliding heads of 256, full ones of 512 (the Triton attention's 16-row tiles
    there), one full layer's KV head: logits equal the forward."""
    device = backend_device(backend, device)
    torch.manual_seed(0)
    model = on_device(device, tf.Gemma4ForCausalLM(_config("k_eq_v", head_dim=256, global_head_dim=512, hidden_size=64,
                                                           initializer_range=0.05)).float().eval())
    runner = PagedGemma4Runner(model, max_new_tokens=8, num_draft_tokens=3, block_size=4, backend=backend)
    assert {runner.kv_shape(i) for i in range(runner.kv_layer_count)} == {(2, 256), (1, 512)}
    assert_runner_matches_forward(model, runner, V)


def test_refusals_name_their_reason():
    """Bidirectional attention over the whole prompt ("all"; "vision", over image tokens only, is causal over text:
    the unified decoder's test above runs it); the Triton kernel's head dims past 512."""
    model = gemma4("plain")
    assert paged_unsupported_reason(model) is None
    wide = tf.Gemma4ForCausalLM(_config("plain", global_head_dim=1024)).eval()
    assert "head_dim <= 512, got 1024" in paged_unsupported_reason(wide, backend="triton")
    assert paged_unsupported_reason(wide, backend="cpp") is None
    model.config.use_bidirectional_attention = "all"
    try:
        assert "use_bidirectional_attention 'all'" in paged_unsupported_reason(model)
        model.config.use_bidirectional_attention = "vision"
        assert paged_unsupported_reason(model) is None
    finally:
        model.config.use_bidirectional_attention = None


def test_early_exit_drafts_on_the_plain_layout_and_is_refused_on_e2bs():
    """assistant_early_exit=1 (the target's first layer drafts) gives model.generate's tokens on the plain layout;
    per-layer inputs or KV-sharing layers (E2B / E4B) make the first layers no model of their own: refused by name
    (an UnsupportedModelError: patch_generate hands such calls to transformers) where transformers' config raised."""
    from specdec_fast.runners.hf import UnsupportedModelError

    ids, mask = left_padded_prompts([6, 3], vocab=V, seed=3)
    kw = dict(max_new_tokens=10, do_sample=False, pad_token_id=0)
    plain = gemma4("plain")
    out, stats = specdec_fast.generate(plain, ids, mask, assistant_early_exit=1, return_stats=True, **kw)
    assert torch.equal(out, plain.generate(ids, attention_mask=mask, **kw)) and stats.alpha > 0
    with pytest.raises(UnsupportedModelError, match="per-layer inputs"):
        specdec_fast.generate(gemma4(), ids, mask, assistant_early_exit=1, **kw)
    with pytest.raises(UnsupportedModelError, match="KV-sharing layers"):
        specdec_fast.generate(gemma4("moe", hidden_size_per_layer_input=0), ids, mask, assistant_early_exit=1, **kw)


@pytest.mark.parametrize("variant", ["ple_shared", "moe"])
def test_bf16_close_to_the_forward(variant):
    """bf16 weights and caches (the casts of per-layer inputs, experts, layer scalars) within 3% of the logits' scale
    of transformers' own bf16 forward. (The k_eq_v layout's tiny logits (scale 2.2) move 3.7% between transformers'
    own bf16 and fp32 forwards, ours 4.1%: beyond this test's bound for both, so it is left out.)"""
    from .runner_checks import assert_bf16_close_to_forward

    model = copy.deepcopy(gemma4(variant)).to(torch.bfloat16)
    assert_bf16_close_to_forward(model, PagedGemma4Runner(model, max_new_tokens=8, num_draft_tokens=3, block_size=4), V)
