"""PagedLlamaRunner: logits equal the transformers model's own forward; greedy generate(runner="paged")
equals model.generate token for token; runner selection and errors."""
import pytest
import torch

import specdec_fast.api as api
from specdec_fast.engine.cached import cached_engines, release_engines
from specdec_fast.runners.paged_llama import PagedLlamaRunner
from specdec_fast.runners.registry import paged_unsupported_reason

from .runner_checks import assert_bf16_close_to_forward, assert_runner_matches_forward, hf_logits
from .models import eos_inside_a_block, left_padded_prompts, make_draft, make_model
from ..conftest import backend_device, on_device

VOCAB = 96


def tiny(kind: str, *, seed: int = 0, layers: int = 2):
    """Random fp32 model; head_dim 16."""
    import transformers as tf

    torch.manual_seed(seed)
    common = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=layers, num_attention_heads=4,
                  max_position_embeddings=256, initializer_range=0.15, bos_token_id=1, eos_token_id=2, pad_token_id=0)
    if kind == "llama":
        config = tf.LlamaConfig(num_key_value_heads=4, rope_parameters={"rope_type": "default", "rope_theta": 500.0}, **common)
    elif kind == "qwen2":  # q/k/v bias, GQA 4:2
        config = tf.Qwen2Config(num_key_value_heads=2, **common)
    elif kind == "qwen3":  # q/k norm, GQA 4:1, head_dim set explicitly
        config = tf.Qwen3Config(num_key_value_heads=1, head_dim=16, **common)
    elif kind == "phi3":  # fused qkv_proj (GQA 4:2) and gate_up_proj
        config = tf.Phi3Config(num_key_value_heads=2, rope_parameters={"rope_type": "default", "rope_theta": 800.0},
                               **common)
    elif kind == "smollm3":  # a NoPE layer every second layer (SmolLM3-3B: every fourth), tied embeddings
        config = tf.SmolLM3Config(num_key_value_heads=2, no_rope_layer_interval=2, tie_word_embeddings=True,
                                  rope_parameters={"rope_type": "default", "rope_theta": 900.0}, **common)
    elif kind == "seed_oss":  # biases on q/k/v, o and the MLP (randomised below)
        config = tf.SeedOssConfig(num_key_value_heads=2, attention_bias=True, attention_out_bias=True, mlp_bias=True,
                                  **common)
    elif kind == "ministral":  # sliding_attention layers (layer_types) whose window the tests' rows stay inside
        config = tf.MinistralConfig(num_key_value_heads=2, head_dim=16, sliding_window=200, **common)
    elif kind == "ministral3":  # the query temperature past original_max_position_embeddings 4, a window of 6
        config = tf.Ministral3Config(num_key_value_heads=2, head_dim=16, sliding_window=6, rope_parameters={
            "rope_type": "default", "rope_theta": 700.0, "llama_4_scaling_beta": 0.5,
            "original_max_position_embeddings": 4}, **common)
    elif kind == "cwm":  # CWM: a full layer, then a sliding one whose window of 4 the tests' rows pass
        config = tf.CwmConfig(num_key_value_heads=2, head_dim=16, sliding_window=4,
                              layer_types=(["full_attention", "sliding_attention"] * layers)[:layers],
                              rope_parameters={"rope_type": "default", "rope_theta": 700.0}, **common)
    elif kind == "ernie4_5":  # RoPE on interleaved pairs (head_dim 16), biases on every projection (randomised below)
        config = tf.Ernie4_5Config(num_key_value_heads=2, head_dim=16, use_bias=True, **common)
    elif kind == "glm":  # GLM-4: half of each head rotated in interleaved pairs, q/k/v biases (randomised below), fused
        # gate_up_proj
        config = tf.GlmConfig(num_key_value_heads=2, head_dim=16, **common)
    elif kind == "glm4":  # GLM-4-0414: GLM's layer, each branch's output normed before its add (weights randomised)
        config = tf.Glm4Config(num_key_value_heads=2, head_dim=16, **common)
    elif kind == "apertus":  # Apertus: Qwen3's q/k norms, an ungated MLP with xIELU (its parameters randomised below),
        # norms named attention_ / feedforward_layernorm
        config = tf.ApertusConfig(num_key_value_heads=2, head_dim=16, **common)
    elif kind == "arcee":  # Arcee AFM: Llama's layer with an ungated ReLU² MLP
        config = tf.ArceeConfig(num_key_value_heads=2, head_dim=16, **common)
    elif kind == "hunyuan_v1_dense":  # HunYuan: per-head q/k norms after the rotation (weights randomised below)
        config = tf.HunYuanDenseV1Config(num_key_value_heads=2, head_dim=16, **common)
    elif kind == "granite":  # Llama with four scalars that are not identities
        config = tf.GraniteConfig(num_key_value_heads=2, embedding_multiplier=3.0, residual_multiplier=0.4,
                                  attention_multiplier=0.1, logits_scaling=2.5, **common)
    elif kind == "granitemoehybrid":  # Granite 4.0's dense transformer: Granite's scalars, shared_mlp's fused input_linear
        config = tf.GraniteMoeHybridConfig(num_key_value_heads=2, embedding_multiplier=3.0, residual_multiplier=0.4,
                                           attention_multiplier=0.1, logits_scaling=2.5, num_local_experts=0,
                                           layer_types=["attention"] * layers, position_embedding_type="rope",
                                           shared_intermediate_size=common["intermediate_size"], mamba_n_heads=4, **common)
    elif kind == "helium":  # Helium: RoPE on interleaved pairs, q/k/v and MLP biases (randomised below), o_proj without
        config = tf.HeliumConfig(num_key_value_heads=2, head_dim=16, attention_bias=True, mlp_bias=True,
                                 rope_parameters={"rope_type": "default", "rope_theta": 500.0}, **common)
    elif kind == "granite_swa":  # Granite SWA: Granite's scalars, a NoPE full layer, sliding layers (a window of 4 the
        # tests' rows pass) on two RoPE bases, attention sinks (randomised below: zeros at init)
        config = tf.GraniteSWAConfig(num_key_value_heads=2, embedding_multiplier=3.0, residual_multiplier=0.4,
                                     attention_multiplier=0.1, logits_scaling=2.5, sliding_window=4,
                                     layer_types=(["full_attention"] + ["sliding_attention"] * 2 + ["full_attention"])[:layers],
                                     layer_rope_theta=[0.0, 500.0, 900.0, 500.0][:layers], **common)
    else:
        raise ValueError(kind)
    # transformers' Granite SWA has no sdpa path (its sinks)
    attn = "eager" if kind == "granite_swa" else "sdpa"
    model = tf.AutoModelForCausalLM.from_config(config, attn_implementation=attn).float().eval()
    if kind in ("qwen2", "seed_oss", "ernie4_5", "helium"):  # random (non-zero) biases, so they are really tested
        with torch.no_grad():
            for layer in model.model.layers:
                attn, mlp = layer.self_attn, layer.mlp
                for proj in (attn.q_proj, attn.k_proj, attn.v_proj, attn.o_proj, mlp.gate_proj, mlp.up_proj, mlp.down_proj):
                    if proj.bias is not None:
                        proj.bias.normal_(0, 0.3)
        if kind == "seed_oss":
            assert model.model.layers[0].self_attn.o_proj.bias is not None and model.model.layers[0].mlp.down_proj.bias is not None
    if kind == "granite_swa":
        with torch.no_grad():
            for layer in model.model.layers:
                layer.self_attn.sinks.normal_(0, 1.0)
    if kind == "apertus":  # xIELU's alpha_p / alpha_n away from their inits
        with torch.no_grad():
            for name, param in model.named_parameters():
                if "act_fn.alpha" in name:
                    param.add_(torch.randn_like(param) * 0.5)
    if kind in ("glm", "glm4", "hunyuan_v1_dense"):  # q/k/v biases, GLM-4-0414's post-branch norms and HunYuan's q/k
        # norms away from their inits
        with torch.no_grad():
            for name, param in model.named_parameters():
                if name.endswith("_proj.bias") or "post_self_attn" in name or "post_mlp" in name or "y_layernorm" in name:
                    param.normal_(1.0 if "layernorm" in name else 0.0, 0.3)
    model.generation_config.eos_token_id = None
    return model



@pytest.mark.parametrize("kind", ["llama", "qwen2", "qwen3", "phi3", "granite", "smollm3", "seed_oss", "ministral",
                                  "cwm", "ministral3", "ernie4_5", "glm", "glm4", "hunyuan_v1_dense", "apertus", "arcee",
                                  "granitemoehybrid", "granite_swa", "helium"])
def test_logits_equal_hf_forward(kind):
    model = tiny(kind, layers=4 if kind == "granite_swa" else 2)
    runner = PagedLlamaRunner(model, max_new_tokens=8, num_draft_tokens=3, block_size=4)
    contexts = assert_runner_matches_forward(model, runner, VOCAB)
    k_cache, _ = runner.cache.gather(0, 1)
    assert k_cache.shape[0] == len(contexts[1])


def test_weights_are_shared_not_copied():
    model = tiny("qwen2")
    runner = PagedLlamaRunner(model, max_new_tokens=4, num_draft_tokens=0)
    assert runner.layers[0].q[0].data_ptr() == model.model.layers[0].self_attn.q_proj.weight.data_ptr()
    assert runner.lm_head.data_ptr() == model.lm_head.weight.data_ptr()


@pytest.mark.parametrize("fuse", [False, True])
def test_phi3_reads_its_fused_projections_in_place(fuse):
    """Phi-3's qkv_proj / gate_up_proj: the runner's q / k / v and gate / up are row views of them
    and, fused, the whole weights themselves (no copy, nothing re-pointed)."""
    model = tiny("phi3")
    attn, mlp = model.model.layers[1].self_attn, model.model.layers[1].mlp
    qkv, gate_up = attn.qkv_proj.weight, mlp.gate_up_proj.weight
    before = (qkv.data_ptr(), gate_up.data_ptr())
    layer = PagedLlamaRunner(model, max_new_tokens=4, num_draft_tokens=0, fuse_projections=fuse).layers[1]
    assert (qkv.data_ptr(), gate_up.data_ptr()) == before
    rows = [t[0].shape[0] for t in (layer.q, layer.k, layer.v, layer.gate, layer.up)]
    assert rows == [64, 32, 32, 96, 96]
    assert torch.equal(torch.cat([layer.q[0], layer.k[0], layer.v[0]]), qkv)
    assert torch.equal(torch.cat([layer.gate[0], layer.up[0]]), gate_up)
    assert layer.q[0].data_ptr() == qkv.data_ptr() and layer.gate[0].data_ptr() == gate_up.data_ptr()
    if fuse:
        assert layer.w_qkv.data_ptr() == qkv.data_ptr() and layer.w_qkv.shape == qkv.shape
        assert layer.w_gate_up.data_ptr() == gate_up.data_ptr() and layer.w_gate_up.shape == gate_up.shape


@pytest.mark.parametrize("backend", ["cpp", "torch", "triton"])
def test_a_partial_rotary_embedding_runs_paged(backend, device):
    """A partial rotary embedding (Phi-3's config with partial_rotary_factor 0.75: 12 of 16 dims of
    each head rotated, the rest passed) runs on the paged runner and gives the model's logits on
    every backend; rotating whole heads does not (the control)."""
    import transformers as tf

    from ..conftest import backend_device

    device = backend_device(backend, device)
    config = tf.Phi3Config(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                           num_attention_heads=4, num_key_value_heads=2, pad_token_id=0,
                           rope_parameters={"rope_type": "default", "rope_theta": 800.0, "partial_rotary_factor": 0.75})
    torch.manual_seed(0)
    model = tf.AutoModelForCausalLM.from_config(config).float().eval().to(device)
    assert paged_unsupported_reason(model) is None and api.choose_runner(model, None, 20) == "paged"
    runner = PagedLlamaRunner(model, max_new_tokens=8, num_draft_tokens=3, block_size=4, backend=backend)
    assert runner.inv_freq.numel() == 6  # 12 rotated dims
    assert_runner_matches_forward(model, runner, VOCAB)
    whole = PagedLlamaRunner(model, max_new_tokens=8, num_draft_tokens=3, block_size=4, backend=backend)
    whole.inv_freq = torch.cat((whole.inv_freq, whole.inv_freq[-2:]))  # 16 dims rotated: other pairs
    with pytest.raises(AssertionError):
        assert_runner_matches_forward(model, whole, VOCAB)


def _length_dependent_rope(kind: str):
    """A tiny Phi-3 with longrope (its long factors past 40 positions) or Llama with dynamic NTK
    scaling (rescaled past max_position_embeddings 40), after a forward of 80 tokens: transformers
    has rewritten the rotary module's inv_freq in place (long factors / rescaled)."""
    import transformers as tf

    common = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, pad_token_id=0, bos_token_id=1, eos_token_id=2, initializer_range=0.15)
    if kind == "longrope":
        factors = dict(short_factor=[1.0 + 0.3 * i for i in range(8)], long_factor=[2.0 + 0.5 * i for i in range(8)])
        config = tf.Phi3Config(max_position_embeddings=256, original_max_position_embeddings=40, rope_parameters=dict(
            rope_type="longrope", rope_theta=10000.0, original_max_position_embeddings=40, **factors), **common)
    else:
        config = tf.LlamaConfig(max_position_embeddings=40, rope_parameters=dict(rope_type="dynamic", rope_theta=10000.0,
                                                                                 factor=2.0), **common)
    torch.manual_seed(0)
    model = tf.AutoModelForCausalLM.from_config(config).float().eval()
    model.generation_config.eos_token_id = None
    with torch.no_grad():
        model(torch.randint(3, VOCAB, (1, 80)))
    return model


@pytest.mark.parametrize("kind", ["longrope", "dynamic"])
def test_a_length_dependent_rope_runs_paged_within_its_first_frequencies(kind):
    """longrope / dynamic RoPE keep their first frequencies (original_inv_freq) while a forward's
    positions stay under 40: rows within it run paged and give the model's logits and
    model.generate's tokens; a call whose rows pass it takes the hf runner; the runner refuses
    longer rows; a runner on the rewritten inv_freq does not give the logits (the control)."""
    model = _length_dependent_rope(kind)
    assert paged_unsupported_reason(model) is None and api.choose_runner(model, None, 30) == "paged"
    assert paged_unsupported_reason(model, 60) == (f"rope_type {kind!r} changes its frequencies past 40 positions "
                                                   "and a row needs up to 60")
    assert api.choose_runner(model, None, 60) == "hf"
    rotary = model.model.rotary_emb
    rewritten_freq = rotary.inv_freq.clone()  # a short forward of the model restores it (the checks below run some)
    assert not torch.equal(rewritten_freq, rotary.original_inv_freq)
    runner = PagedLlamaRunner(model, max_new_tokens=8, num_draft_tokens=3, block_size=4)
    assert runner.max_positions == 40
    assert_runner_matches_forward(model, runner, VOCAB)
    with pytest.raises(ValueError, match="would exceed the model's 40 positions of its first RoPE frequencies"):
        runner.allocate(1, 41)
    rewritten = PagedLlamaRunner(model, max_new_tokens=8, num_draft_tokens=3, block_size=4)
    rewritten.inv_freq = rewritten_freq.float()
    with pytest.raises(AssertionError):
        assert_runner_matches_forward(model, rewritten, VOCAB)
    ids, mask = left_padded_prompts([6, 9], vocab=VOCAB, seed=1)
    kw = dict(do_sample=False, max_new_tokens=12, pad_token_id=0)
    draft = make_draft(model, noise=0.05)  # held: the engine cache keeps an engine while its draft lives
    out = api.generate(model, ids, mask, assistant_model=draft, num_assistant_tokens=3, **kw)
    assert torch.equal(out, model.generate(ids, attention_mask=mask, **kw))
    assert [isinstance(e.target_runner, PagedLlamaRunner) for e in cached_engines(model)] == [True]
    release_engines(model)


@pytest.mark.parametrize("kind", ["granite", "granitemoehybrid", "granite_swa"])
@pytest.mark.parametrize("attribute", ["embedding_multiplier", "residual_multiplier", "scale", "logits_scaling"])
def test_each_granite_scalar_is_read(kind, attribute):
    """The control of the granite rows above (Granite 4.0's too): a runner that leaves out any one of Granite's
    four scalars (its attribute back at Llama's value) no longer gives the model's logits."""
    model = tiny(kind)
    runner = PagedLlamaRunner(model, max_new_tokens=8, num_draft_tokens=3, block_size=4)
    assert runner.scale == 0.1 and runner.logits_scaling == 2.5
    setattr(runner, attribute, runner.head_dim**-0.5 if attribute == "scale" else 1.0)
    with pytest.raises(AssertionError):
        assert_runner_matches_forward(model, runner, VOCAB)


def test_granite4_hybrids_and_experts_take_their_own_runner():
    """Granite 4.0's hybrids (Mamba2 layers: the H models) and a granitemoehybrid with experts are the Llama
    runner's refusals by name, and the registry gives them their own runner (tests/engine/
    test_paged_granite_hybrid.py); the dense one's MLP is read from shared_mlp's input_linear [gate | up] rows."""
    import transformers as tf

    from specdec_fast.runners.paged_llama import llama_unsupported_reason
    from specdec_fast.runners.paged_granite_hybrid import PagedGraniteHybridRunner
    from specdec_fast.runners.registry import paged_runner_class, paged_unsupported_reason

    model = tiny("granitemoehybrid")
    layer = PagedLlamaRunner(model, max_new_tokens=4, num_draft_tokens=0).layers[0]
    fused = model.model.layers[0].shared_mlp.input_linear.weight
    assert torch.equal(torch.cat([layer.gate[0], layer.up[0]]), fused) and layer.gate[0].data_ptr() == fused.data_ptr()
    common = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, position_embedding_type="rope", shared_intermediate_size=96, mamba_n_heads=4)
    hybrid = tf.AutoModelForCausalLM.from_config(tf.GraniteMoeHybridConfig(
        layer_types=["mamba", "attention"], num_local_experts=0, **common))
    assert "Granite 4.0's Mamba2 layers" in llama_unsupported_reason(hybrid)
    experts = tf.AutoModelForCausalLM.from_config(tf.GraniteMoeHybridConfig(
        layer_types=["attention", "attention"], num_local_experts=4, **common))
    assert "Granite 4.0's experts" in llama_unsupported_reason(experts)
    for model in (hybrid, experts):
        assert paged_runner_class(model) is PagedGraniteHybridRunner and paged_unsupported_reason(model) is None


@pytest.mark.parametrize("backend", ["torch", pytest.param("triton", marks=pytest.mark.slow)])
def test_smollm3_nope_layers_are_not_rotated(backend, device):
    """SmolLM3's layer 1 has no RoPE (use_rope 0), layer 0 has; the control: a runner that rotates
    every layer no longer gives the model's logits."""
    if backend == "triton":
        pytest.importorskip("triton")
    model = on_device(backend_device(backend, device), tiny("smollm3"))
    assert [layer.self_attn.use_rope for layer in model.model.layers] == [1, 0]
    runner = PagedLlamaRunner(model, max_new_tokens=8, num_draft_tokens=3, block_size=4, backend=backend)
    assert [layer.rope for layer in runner.layers] == [True, False]
    assert_runner_matches_forward(model, runner, VOCAB)
    rotates_all = PagedLlamaRunner(model, max_new_tokens=8, num_draft_tokens=3, block_size=4, backend=backend)
    rotates_all.layers[1].rope = True
    with pytest.raises(AssertionError):
        assert_runner_matches_forward(model, rotates_all, VOCAB)


@pytest.mark.parametrize("model_type", ["exaone", "internlm3", "iquestcoder"])
def test_llama_under_other_model_types(model_type):
    """EXAONE 3.x, InternLM3 and IQuest-Coder are transformers' LlamaForCausalLM under their own
    model_type: the Llama runner takes them by that name and gives the model's logits."""
    import transformers as tf

    config = tf.AutoConfig.for_model(model_type, vocab_size=VOCAB, hidden_size=64, intermediate_size=96,
                                     num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                                     max_position_embeddings=256, pad_token_id=0, initializer_range=0.15)
    torch.manual_seed(0)
    model = tf.AutoModelForCausalLM.from_config(config).float().eval()
    assert type(model) is tf.LlamaForCausalLM and model.config.model_type == model_type
    assert api.choose_runner(model, None, 20) == "paged"
    assert_runner_matches_forward(model, PagedLlamaRunner(model, max_new_tokens=8, num_draft_tokens=3, block_size=4),
                                  VOCAB)


def test_too_many_tentative_tokens_raise():
    runner = PagedLlamaRunner(tiny("llama"), max_new_tokens=4, num_draft_tokens=2)
    runner.prefill(torch.tensor([[5, 6, 7]]), None)
    runner.score(torch.tensor([[3, 4]]))
    with pytest.raises(RuntimeError, match="tentative"):
        runner.score(torch.tensor([[3, 4]]))


_PAIRS = {}


def pair(kind):
    if kind not in _PAIRS:
        target = tiny(kind, seed=5)
        _PAIRS[kind] = (target, make_draft(target, noise=0.03))
    return _PAIRS[kind]


MAX_NEW = 20
PROMPTS = {1: [6], 3: [4, 10, 7]}


@pytest.mark.parametrize("kind", ["llama", "qwen3", "phi3", "granite", "smollm3", "seed_oss", "ministral", "cwm",
                                  "ministral3", "ernie4_5", "glm4", "hunyuan_v1_dense", "apertus", "arcee",
                                  "granitemoehybrid", "granite_swa", "helium"])
@pytest.mark.parametrize("batch", [1, 3])
def test_greedy_paged_equals_generate(kind, batch):
    target, draft = pair(kind)
    ids, mask = left_padded_prompts(PROMPTS[batch], vocab=VOCAB, seed=batch)
    expected = target.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=MAX_NEW, pad_token_id=0)
    for k in (1, 3, 6):
        out, stats = api.generate(target, ids, mask, assistant_model=draft, num_assistant_tokens=k, do_sample=False,
                                  max_new_tokens=MAX_NEW, pad_token_id=0, return_stats=True, runner="paged")
        assert torch.equal(out, expected), k
        assert stats.alpha > 0.2, "the aligned draft should be accepted often (else the test proves little)"
    for k in (2, 5):
        out = api.generate(target, ids, mask, prompt_lookup_num_tokens=k, do_sample=False, max_new_tokens=MAX_NEW,
                           pad_token_id=0, runner="paged")
        assert torch.equal(out, expected), k
    out = api.generate(target, ids, mask, do_sample=False, max_new_tokens=MAX_NEW, pad_token_id=0, runner="paged")
    assert torch.equal(out, expected)


def test_eos_inside_an_accepted_block_paged():
    """Draft = target: every draft is accepted, so EOS lands inside a K=6 block; rows end exactly there."""
    target, _ = pair("llama")
    ids, mask = left_padded_prompts(PROMPTS[3], vocab=VOCAB, seed=3)
    width = ids.shape[1]
    plain = target.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=MAX_NEW, pad_token_id=0)
    end, eos = eos_inside_a_block(plain, width, block=7)  # K = 6
    expected = target.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=MAX_NEW, pad_token_id=0,
                               eos_token_id=eos)
    out, stats = api.generate(target, ids, mask, assistant_model=target, num_assistant_tokens=6, do_sample=False,
                              max_new_tokens=MAX_NEW, pad_token_id=0, eos_token_id=eos, return_stats=True, runner="paged")
    assert torch.equal(out, expected)
    assert stats.alpha == 1.0
    assert (out[1, width + end + 1 :] == 0).all() and int(out[1, width + end]) == eos


def test_triton_kernels_on_the_test_device(device):
    """backend='triton' end to end: compiled on CUDA on a GPU machine, interpreted elsewhere."""
    target, draft = pair("llama")
    ids, mask = left_padded_prompts([3, 5], vocab=VOCAB, seed=4)
    target, draft, ids, mask = on_device(device, target, draft, ids, mask)
    expected = target.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=5, pad_token_id=0)
    out = api.generate(target, ids, mask, assistant_model=draft, num_assistant_tokens=2, do_sample=False,
                       max_new_tokens=5, pad_token_id=0, backend="triton", runner="paged")
    assert torch.equal(out, expected)


def test_runner_choice_and_errors():
    llama, gpt2 = tiny("llama"), make_model("gpt2", vocab=VOCAB)
    assert api.choose_runner(llama, None, 100) == "paged"
    assert api.choose_runner(llama, "hf", 100) == "hf"
    assert api.choose_runner(gpt2, None, 100) == "paged"  # the GPT-2 runner (tests/engine/test_paged_gpt2.py)
    assert api.choose_runner(gpt2, None, 257) == "hf"  # past its n_positions 256
    ids = torch.tensor([[5, 6, 7]])
    with pytest.raises(ValueError, match="runner='paged' cannot run GPT2LMHeadModel: a row needs up to 257 positions"):
        api.generate(gpt2, ids, max_new_tokens=253, do_sample=False, runner="paged")
    with pytest.raises(ValueError, match="runner must be"):
        api.generate(llama, ids, max_new_tokens=3, do_sample=False, runner="vllm")
    with pytest.raises(ValueError, match="PagedLlamaRunner cannot run"):
        PagedLlamaRunner(gpt2, max_new_tokens=3, num_draft_tokens=0)
    # head_dim 12: every kernel takes it (triton pads it to 16 inside; tests/engine/test_paged_runner_triton.py)
    odd = make_model("llama", vocab=VOCAB)
    assert paged_unsupported_reason(odd) is None and paged_unsupported_reason(odd, backend="triton") is None
    assert api.choose_runner(odd, None, 100, backend="triton") == "paged"


def test_a_sliding_window_is_applied_only_where_rows_reach_it():
    """No refusal for a window (the kernels slide); the runner's pool passes a layer's window to
    the kernels only when its rows can reach it (a row of L tokens spans q - k <= L - 1)."""
    import transformers as tf

    config = tf.MistralConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=1,
                              num_attention_heads=4, num_key_value_heads=2, sliding_window=32)
    model = tf.AutoModelForCausalLM.from_config(config).eval()
    assert paged_unsupported_reason(model, 33) is None and paged_unsupported_reason(model, 10**4) is None
    assert api.choose_runner(model, None, 40) == "paged"
    runner = PagedLlamaRunner(model)
    assert runner.layer_windows == (32,)
    runner.allocate(2, 32)
    assert runner._windows == (None,)
    runner.allocate(2, 33)
    assert runner._windows == (32,)
    qwen = tiny("qwen2")  # use_sliding_window defaults to False
    assert PagedLlamaRunner(qwen).layer_windows == (None,) * len(qwen.model.layers)


def test_rows_past_a_sliding_window_run_paged():
    """generate() runs a sliding-window model on the paged runner whether its rows fit the window
    or pass it, greedy equal to model.generate (until 2026-11-30 the engine was sized no wider than
    the window so that short rows ran paged, and longer ones went to the hf runner)."""
    import transformers as tf

    config = tf.MistralConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                              num_attention_heads=4, num_key_value_heads=2, sliding_window=40,
                              max_position_embeddings=512)
    torch.manual_seed(0)
    model = tf.AutoModelForCausalLM.from_config(config).eval()
    model.generation_config.eos_token_id = None
    ids, mask = left_padded_prompts([6, 9], vocab=VOCAB, seed=3)
    for new in (20, 60):
        kw = dict(max_new_tokens=new, do_sample=False, pad_token_id=0)
        assert torch.equal(api.generate(model, ids, mask, **kw), model.generate(ids, attention_mask=mask, **kw))
        engine = max(cached_engines(model), key=lambda e: e.max_seq_len)
        assert isinstance(engine.target_runner, PagedLlamaRunner), (new, engine.max_seq_len)
    release_engines(model)


def test_wrapped_projection_falls_back_to_hf():
    class Wrapped(torch.nn.Linear):  # like an adapter / quantized linear: its own forward
        def forward(self, x):
            return super().forward(x) * 1.0

    model = tiny("llama")
    old = model.model.layers[1].mlp.up_proj
    model.model.layers[1].mlp.up_proj = Wrapped(old.in_features, old.out_features, bias=False)
    assert "layer 1" in paged_unsupported_reason(model)
    assert api.choose_runner(model, None, 50) == "hf"


def test_bfloat16_logits_close_to_hf_forward():
    """bf16 weights and cache: the cast path of the norms; HF's own bf16 forward as the reference."""
    model = tiny("qwen3").to(torch.bfloat16)
    runner = PagedLlamaRunner(model, max_new_tokens=4, num_draft_tokens=1)
    assert_bf16_close_to_forward(model, runner, VOCAB)


def test_finished_rows_stay_inside_their_reservation():
    """Row 1 hits EOS at its 2nd token while row 0 decodes 30 tokens with a weak draft: the engine
    keeps scoring row 1, and commit caps its length at reservation - (K+1) (no write past its blocks)."""
    from specdec_fast.drafters import ModelDrafter
    from specdec_fast.engine import SpeculativeDecoder
    from specdec_fast.kernels.sampling_params import make_sampling_tensors

    target = tiny("llama", seed=5)
    draft = make_draft(target, noise=0.6, seed=3)
    ids, mask = left_padded_prompts([6, 4], vocab=VOCAB, seed=8)
    width, k, new = ids.shape[1], 3, 30
    plain = target.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=new, pad_token_id=0)
    eos = int(plain[1, width + 1])
    if eos in plain[0, width:].tolist():
        pytest.skip("the chosen EOS also occurs in row 0")
    expected = target.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=new, pad_token_id=0, eos_token_id=eos)
    runners = [PagedLlamaRunner(target, max_new_tokens=new, num_draft_tokens=k, block_size=4),
               PagedLlamaRunner(draft, max_new_tokens=new, num_draft_tokens=k, block_size=4)]
    params = make_sampling_tensors(2, "cpu", temperature=0.0, seed=0)
    decoder = SpeculativeDecoder(runners[0], ModelDrafter(runners[1]), k=k, params=params, max_new_tokens=new,
                                 eos_token_ids=[eos], pad_token_id=0)
    out = decoder.generate(ids, mask)
    assert torch.equal(out, expected)
    assert decoder.stats.result.iterations > 12, "row 1 must stay finished for many iterations"
    for runner in runners:
        reserved = len(runner.cache.blocks_of(1)) * runner.block_size
        assert int(runner.caps[1]) == reserved - (k + 1)
        assert int(runner.cache.seq_lens[1]) <= int(runner.caps[1])


def test_commit_caps_a_runaway_row_and_the_other_row_stays_exact():
    """A row that commits K+1 tokens per call (a finished row with every draft accepted) stops at
    reservation - (K+1); the row next to it, committing one token per call, keeps exact logits."""
    model = tiny("qwen2")
    k, new = 3, 12
    ids, mask = left_padded_prompts([5, 5], vocab=VOCAB, seed=9)
    runner = PagedLlamaRunner(model, max_new_tokens=new, num_draft_tokens=k, block_size=4)
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
    assert int(runner.cache.seq_lens[1]) == int(runner.caps[1]) == len(runner.cache.blocks_of(1)) * 4 - (k + 1)
    assert int(runner.cache.seq_lens[0]) == len(context)


def test_control_ministral3s_query_temperature_is_needed():
    """Ministral 3's query scale (1 + beta log(1 + floor(pos / 4)) here) past position 4: a runner
    without it no longer gives the model's logits."""
    model = tiny("ministral3")
    runner = PagedLlamaRunner(model, max_new_tokens=8, num_draft_tokens=3, block_size=4)
    assert runner.query_temperature == (0.5, 4) and runner.layer_windows == (6, 6)
    runner.query_temperature = None
    with pytest.raises(AssertionError):
        assert_runner_matches_forward(model, runner, VOCAB)


@pytest.mark.parametrize("kind", ["ernie4_5", "helium"])
def test_controls_ernie_reads_its_pairs_as_halves(kind):
    """ERNIE 4.5 (and Helium) rotate interleaved pairs: the runner reorders each head's q / k columns (evens, then odds)
    and rotates halves; without the reordering the logits are not the model's."""
    model = tiny(kind)
    runner = PagedLlamaRunner(model, max_new_tokens=8, num_draft_tokens=3, block_size=4)
    assert runner.layers[0].rope_order is not None and runner.layers[0].rope_order[0][:9].tolist() == [
        0, 2, 4, 6, 8, 10, 12, 14, 1]
    for layer in runner.layers:
        layer.rope_order = None
    with pytest.raises(AssertionError):
        assert_runner_matches_forward(model, runner, VOCAB)


@pytest.mark.parametrize("backend", ["torch", "triton"])
@pytest.mark.parametrize("kind", ["glm", "glm4", "hunyuan_v1_dense", "apertus", "arcee", "granite_swa", "helium"])
def test_glm_hunyuan_on_the_other_backends(kind, backend, device):
    """GLM-4 / GLM-4-0414 on the torch reference and the Triton path (the post-branch norms through the
    Triton RMSNorm launch, the half rotation in rope_append_kv), HunYuan there too (its norms after the
    rotation: torch's rotation and norms, then the append and attention kernels), Apertus' and Arcee's ungated
    MLPs on both, Granite SWA's RoPE tables (a NoPE layer, two bases), sinks and windows: the forward's logits."""
    device = backend_device(backend, device)
    model = tiny(kind, layers=4 if kind == "granite_swa" else 2).to(device)
    runner = PagedLlamaRunner(model, max_new_tokens=8, num_draft_tokens=3, block_size=4, backend=backend)
    assert_runner_matches_forward(model, runner, VOCAB)


def test_controls_granite_swa_rope_bases_and_sinks():
    """Granite SWA's layer 0 is NoPE, layers 1 and 3 rotate with base 500 and layer 2 with 900 (each layer's index
    into the runner's tables); one table for every rotated layer, or no sinks, and the logits are not the model's."""
    model = tiny("granite_swa", layers=4)
    runner = PagedLlamaRunner(model, max_new_tokens=8, num_draft_tokens=3, block_size=4)
    assert [layer.rope for layer in runner.layers] == [0, 1, 2, 1]
    assert [inv_freq[1].item() for inv_freq, _ in runner.layer_rope_freqs] == pytest.approx(
        [500.0 ** (-2 / 16), 900.0 ** (-2 / 16)])
    runner.layer_rope_freqs = runner.layer_rope_freqs[:1] * 2
    with pytest.raises(AssertionError):
        assert_runner_matches_forward(model, runner, VOCAB)
    runner = PagedLlamaRunner(model, max_new_tokens=8, num_draft_tokens=3, block_size=4)
    assert len(runner.attn_sinks) == 4
    runner.attn_sinks = ()
    with pytest.raises(AssertionError):
        assert_runner_matches_forward(model, runner, VOCAB)


def test_controls_glm_half_rotation_and_post_branch_norms():
    """GLM rotates the interleaved pairs of each head's first half: the reordering moves those 8 of 16 dims and
    keeps the rest; without it the logits are not the model's. GLM-4-0414's norms of each branch's output are
    read (layer.post_attn_norm / post_mlp_norm) and needed."""
    glm = tiny("glm")
    runner = PagedLlamaRunner(glm, max_new_tokens=8, num_draft_tokens=3, block_size=4)
    assert runner.layers[0].rope_order[0][:16].tolist() == [0, 2, 4, 6, 1, 3, 5, 7, 8, 9, 10, 11, 12, 13, 14, 15]
    for layer in runner.layers:
        layer.rope_order = None
    with pytest.raises(AssertionError):
        assert_runner_matches_forward(glm, runner, VOCAB)
    glm4 = tiny("glm4")
    runner = PagedLlamaRunner(glm4, max_new_tokens=8, num_draft_tokens=3, block_size=4)
    assert runner.post_branch_norms and all(layer.post_mlp_norm is not None for layer in runner.layers)
    for layer in runner.layers:
        layer.post_attn_norm = None
    with pytest.raises(AssertionError):
        assert_runner_matches_forward(glm4, runner, VOCAB)


def test_control_hunyuan_norms_after_the_rotation():
    """HunYuan norms q / k per head after the rotation; with weights that are not ones the orders differ, and the
    runner's Qwen3 order (norm, then rotate) is not the model's."""
    model = tiny("hunyuan_v1_dense")
    runner = PagedLlamaRunner(model, max_new_tokens=8, num_draft_tokens=3, block_size=4)
    assert all(layer.qk_norm_after_rope and layer.qk_norm is not None for layer in runner.layers)
    for layer in runner.layers:
        layer.qk_norm_after_rope = False
    with pytest.raises(AssertionError):
        assert_runner_matches_forward(model, runner, VOCAB)
