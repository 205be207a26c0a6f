"""PagedLlamaRunner: a Llama-family decoder (Llama, Mistral, Qwen2, Qwen3, Phi-3 / Phi-4, Granite,
SmolLM3; LLAMA_MODEL_TYPES) run layer by layer over a PagedKVCache with the project's append_kv /
paged_attention kernels.

Weights are the transformers model's own parameters (no copy): embed_tokens, each layer's
input_layernorm, self_attn.{q,k,v,o}_proj (+ bias when present: Qwen2), q_norm / k_norm
(Qwen3), post_attention_layernorm, mlp.{gate,up,down}_proj, model.norm, lm_head. Phi-3 holds
q/k/v in one self_attn.qkv_proj and gate/up in one mlp.gate_up_proj (gate rows first): the same
math, read through row views of those weights (_projections). Granite is Llama's layer with
four scalars of its config (GRANITE_SCALARS): the embeddings times embedding_multiplier, each
residual branch times residual_multiplier before its add, attention_multiplier as the softmax
scale, the logits divided by logits_scaling -- each as its own op in the model dtype, as
transformers computes it. SmolLM3's NoPE layers (self_attn.use_rope 0: every fourth layer)
skip the rotation (the Triton path's rope_append_kv rotates them by cos 1 / sin 0, which leaves
every finite value as it is: x * 1 + y * 0 = x). RoPE uses the
model's rotary module's inv_freq and attention_scaling with the same float32 math as
transformers 5.x (``position * inv_freq``, cat(freqs, freqs), cos/sin * scaling, cast to
the model dtype), so any rope_type with static frequencies (default, linear, llama3, yarn)
matches; dynamic and longrope (frequencies that change with the length) run within the positions
that keep their first frequencies (max_positions; longer rows: the hf runner). A partial
rotary embedding (partial_rotary_factor < 1: GLM-4.5's half) rotates the first R dims of each
head as transformers does (its cos / sin are [T, R]: every rope kernel rotates those and passes
the rest).

The cache, packing, prefill / score / commit / compact and the kernel dispatch are shared with
the GPT-2 runner (runners/paged_base.py); this file holds the Llama-family math. Which
model_types it serves: runners/registry.py.
"""
import functools

import torch
import torch.nn.functional as F

from ._fused_weights import concat_parameters
from ._layer_math import fused_layer_math, gated_act, linear_params, norm_params, rms_norm, rope_cos_sin, rotate_qk
from ._linear import layer_linears
from .paged_base import PagedRunnerBase, decoder_reason, head_dim_reason
from ._moe import SHARED, MoE, is_moe, moe_reason
from ._rotary import layer_theta_tables, rotary_dims, static_rope_limit, static_rope_reason
from .sliding_window import windows_per_layer

LLAMA_MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3", "phi3", "granite", "smollm3",
                     # transformers' LlamaForCausalLM under another model_type (EXAONE 3.x, InternLM3, IQuest-Coder)
                     "exaone", "internlm3", "iquestcoder",
                     # Llama's layer by another class: Ministral (Qwen2's layer without biases, its window by
                     # layer_types), Seed-OSS (biases on q/k/v, o and the MLP), CWM (Meta's Code World
                     # Model: sliding layers by layer_types, llama3 RoPE)
                     "ministral", "seed_oss", "cwm",
                     # Ministral 3: Ministral's layer, its query scaled by position (QUERY_TEMPERATURE)
                     "ministral3",
                     # the same attention with a sparse MoE MLP (runners/_moe.py): Mixtral (Mistral's),
                     # Qwen2-MoE (Qwen2's, a gated shared expert), Qwen3-MoE (Qwen3's), GPT-OSS (biases,
                     # attention sinks, sliding layers of 128), GLM-4.5 (q/k/v biases, half of each head
                     # rotated, grouped sigmoid routing, a shared MLP, dense first layers), EXAONE MoE
                     # (GLM-4.5's routing, Qwen3's q/k norms, NoPE full layers: NOPE_UNLESS_SLIDING),
                     # Solar Open (GLM-4.5's routing, Llama's attention)
                     "mixtral", "qwen2_moe", "qwen3_moe", "gpt_oss", "glm4_moe", "exaone_moe", "solar_open",
                     # OLMoE: Llama's layer with q/k RMSNorms over the whole projection (_whole_projection_math), an
                     # optional clamp of q / k / v (clip_qkv), Qwen3-MoE's routing
                     "olmoe",
                     # MiniMax-M2: those whole-projection q/k norms, a partial rotary embedding, sigmoid top-k routing
                     # with the block's correction bias (runners/_moe.py)
                     "minimax_m2",
                     # ERNIE 4.5 (dense, and MoE: softmax routing chosen with a correction bias, shared experts):
                     # RoPE on interleaved pairs (INTERLEAVED_ROPE), optional biases
                     "ernie4_5", "ernie4_5_moe",
                     # GLM-4 (glm: GLM-4-9B; glm4: GLM-4-0414 9B / 32B, GLM-Z1): half of each head rotated in
                     # interleaved pairs, q/k/v biases, Phi-3's fused gate_up_proj; GLM-4-0414 also norms each
                     # branch's output before its residual add (POST_BRANCH_NORMS)
                     "glm", "glm4",
                     # HunYuan (hunyuan_v1_dense: Hunyuan-0.5B-7B; hunyuan_v1_moe: Hunyuan-A13B): per-head q/k norms
                     # after the rotation (QK_NORM_AFTER_ROPE); the MoE's softmax routing and an ungated shared MLP
                     "hunyuan_v1_dense", "hunyuan_v1_moe",
                     # dots.llm1 (dots1): Qwen3's attention (per-head q/k norms, sliding layers by layer_types), GLM-4.5's
                     # grouped sigmoid routing with shared experts, dense first layers
                     "dots1",
                     # Apertus (apertus: 8B / 70B): Qwen3's q/k norms, an ungated MLP (down(act(up(x))): UNGATED) with
                     # the xIELU activation (a module with its own parameters), its norms named attention_ /
                     # feedforward_layernorm
                     "apertus",
                     # Arcee AFM (arcee: AFM-4.5B): Llama's layer with an ungated ReLU² MLP, down(relu²(up(x)))
                     "arcee",
                     # Granite 4.0's dense transformers (granitemoehybrid with attention layers only and no experts:
                     # granite-4.0-micro, the Nano 350M / 1B): Granite's scalars, the MLP as shared_mlp's fused
                     # input_linear [gate | up] and output_linear (GraniteMlp); its hybrids' Mamba2 layers are refused
                     "granitemoehybrid",
                     # Granite 3.0 / 3.1 MoE (granitemoe: 1B-A400M, 3B-A800M): Granite's scalars, Mixtral's experts
                     # routed as Granite 4.0-H's (softmax over the top-k float32 logits)
                     "granitemoe",
                     # Hy3 (hy_v3: tencent/Hy3-preview): Qwen3's attention, dense first layers (mlp_layer_types), then
                     # 192 experts chosen by sigmoid + the block's correction bias and scaled (runners/_moe.py), a
                     # shared MLP
                     "hy_v3",
                     # Granite SWA (granite_swa: ibm-granite/granite-swash-2b): Granite's scalars, sliding layers by
                     # layer_types, attention sinks (sigmoid(logsumexp - sink) times the output: GPT-OSS's sink
                     # logit), a RoPE base a layer (LAYER_ROPE_THETA: 0 is NoPE)
                     "granite_swa",
                     # Kolibri-1 (Aleph Alpha): EXAONE 4.0's attention (per-head q/k norms, NoPE full layers:
                     # NOPE_UNLESS_SLIDING), GLM-4-0414's norms of each branch's output, every layer's MoE chosen by
                     # logit + correction bias with shared experts (runners/_moe.py); Flint: Qwen3-MoE's attention
                     # with GPT-OSS's sinks, RoPE on the sliding layers alone, dense first layers, sigmoid top-k routing
                     # without a bias and a shared expert without a gate
                     "kolibri1", "flint",
                     # Granite MoE with a shared MLP (granitemoeshared: Granite 3 MoE's layer with the layer's
                     # shared_mlp added to the experts' sum), and its Granite SWA attention (granitemoe_swa)
                     "granitemoeshared", "granitemoe_swa",
                     # Helium (kyutai/helium-1-2b): Llama's layer with RoPE on interleaved pairs (INTERLEAVED_ROPE),
                     # optional q/k/v and MLP biases; its RMSNorms weigh in float32 before the cast (OLMo 2's order:
                     # exact in float32, within the bf16 bound otherwise)
                     "helium")
# The families with Granite's four scalars (GRANITE_SCALARS)
GRANITE_TYPES = ("granite", "granitemoehybrid", "granitemoe", "granite_swa", "granitemoeshared", "granitemoe_swa")
# Families that rotate interleaved pairs (x_2i, x_2i+1) by frequency i: the same rotation as rotate-half's
# on the head's dims reordered evens first, odds last, applied to q and k alike (their products, hence the
# scores, unchanged): each layer reads its q / k projections' columns in that order (_Layer.rope_order)
# and every RoPE path stays the rotate-half one
INTERLEAVED_ROPE = ("ernie4_5", "ernie4_5_moe", "glm", "glm4", "helium")
# Families whose per-head q / k norms (query_layernorm / key_layernorm) run after the rotation, not before
# (Qwen3's): the norm's weights make the two orders differ. rope_append_kv norms before it rotates, so those
# layers rotate and norm in torch ops, then append and attend through the kernels (_attend)
QK_NORM_AFTER_ROPE = ("hunyuan_v1_dense", "hunyuan_v1_moe")
# Each layer's RMSNorms of a branch's output before its residual add (GLM-4-0414's sandwich norms: the
# attention's output, the MLP's): the module names, (after attention, after the MLP)
POST_BRANCH_NORMS = ("post_self_attn_layernorm", "post_mlp_layernorm")
# Families that rotate only their sliding layers where the config sets a window (full layers are
# NoPE): transformers' ExaoneMoeAttention, `if self.sliding_window is None or self.is_sliding`
# (EXAONE 4.0's Exaone4Attention and Kolibri-1's read the same rule; Flint rotates its sliding layers alone, and its
# config always sets a window)
NOPE_UNLESS_SLIDING = ("exaone_moe", "exaone4", "kolibri1", "flint")
# Families whose config lists each layer's RoPE (no_rope_layers: 1 RoPE, 0 NoPE)
NO_ROPE_LAYERS = ("smollm3", "llama4_text")
# Families whose config lists each layer's RoPE base (layer_rope_theta: 0 NoPE), a rotary module a distinct
# base in model.model.rotary_embs (_rotary.layer_theta_tables)
LAYER_ROPE_THETA = ("granite_swa", "granitemoe_swa")


def rotates(config, index: int) -> bool:
    """Whether layer ``index`` applies RoPE by the config: NOPE_UNLESS_SLIDING; SmolLM3's and Llama 4's
    no_rope_layers (1: RoPE, 0: NoPE, transformers' *Attention.use_rope, which the single-process
    runner also reads from the module); Granite SWA's layer_rope_theta (0: NoPE)."""
    if config.model_type in NOPE_UNLESS_SLIDING and getattr(config, "sliding_window", None) is not None:
        return config.layer_types[index] == "sliding_attention"
    if config.model_type in LAYER_ROPE_THETA:
        return bool(config.layer_rope_theta[index])
    no_rope = getattr(config, "no_rope_layers", None)
    return bool(no_rope[index]) if config.model_type in NO_ROPE_LAYERS and no_rope is not None else True
# Ministral 3's query temperature (transformers' get_llama_4_attn_scale): after RoPE the query is
# multiplied by 1 + beta * log(1 + floor(position / original_max_position_embeddings)), in the
# model dtype; the rope_parameters fields it reads, per model_type
QUERY_TEMPERATURE = {"ministral3": ("llama_4_scaling_beta", "original_max_position_embeddings")}
# Granite's config fields and the runner attributes they set (identities for the other families)
GRANITE_SCALARS = {"embedding_multiplier": "embedding_multiplier", "residual_multiplier": "residual_multiplier",
                   "logits_scaling": "logits_scaling", "attention_multiplier": "scale"}
# The GEMV layer (_decode_gemv): a decode step's four products per layer and the lm_head as
# Triton skinny-linear launches (kernels/linear/triton.py) with the RMSNorms, SwiGLU and residual
# adds fused into them: 6-7 launches a layer instead of 9 plus cuBLAS's split-K reduces. Off: on an
# H200 (bench/profile_step.py, 8B-shaped, bf16, CUDA graphs, context 128) the step took 5.17 ms
# against cuBLAS's 4.66 at B = 1, 10.03 against 4.95 with 5 tokens a row, 10.10 against 4.73 at B = 8
# (bench/bench_gemv.py: its lm_head 272 us against cuBLAS's 238 at one row). runner.set_gemv_layer(True)
# turns it on for one runner.
GEMV_LAYER = False
# The GEMV layer's launches as programmatic dependent launches (sm_90+): each product prefetches
# its first weight tile into L2 and then waits for the kernel before it (kernels/linear/triton.py
# PDL); rope_append_kv and attention wait at their first line. Every kernel of a layer lets the
# next start at once, so the ~200 kernel boundaries of a step overlap the weight stream, and the
# o product's prefetch overlaps the attention. Compiled and checked for sm_90a (no global load
# before griddepcontrol.wait: tests/kernels/aot_compile_layer_ops.py, aot_compile_attention.py). Ran
# on an H200 (profile_step "gemv_layer_pdl"): 5.06 ms a step against 5.17 without PDL at B = 1, no
# gain at 5 tokens a row or B = 8 -- and the GEMV layer itself is slower than cuBLAS. Off.
# runner.set_gemv_layer(True, pdl=True).
GEMV_PDL = False
GEMV_MAX_ROWS = 16  # token rows of a forward up to which the GEMV layer runs (kernels/linear/triton.py MAX_ROWS)
# Rows up to which SwiGLU is fused into the down product's load. Above, silu_mul runs apart: on the
# tl.dot path the fused silu is computed in the dot operand's layout, replicated over the 4 warps
# and the 16 padded rows -- 128 exp per thread per step at sm_90a against 4 on the one-row path
# (bench/gemv_ptx.py), ~4 exp per weight value, more than the SFUs can keep up with at HBM speed
# (a prediction: bench/bench_gemv.py times "triton fused silu_mul" beside "triton + separate").
SILU_FUSED_MAX_ROWS = 1
_DYNAMIC_ROPE = ("dynamic", "longrope")


def llama_unsupported_reason(model, max_tokens_per_row: int | None = None, backend=None) -> str | None:
    """Why PagedLlamaRunner cannot run ``model`` with kernel ``backend``, or None when it can."""
    reason = _granite4_reason(model) or decoder_reason(model, LLAMA_MODEL_TYPES, "model.layers", "a *ForCausalLM",
                                                       projection_modules)
    if reason is not None:
        return reason
    for i, layer in enumerate(model.model.layers):
        mlp = mlp_of(layer)
        reason = moe_reason(mlp, model.config) if is_moe(mlp) else None
        if reason is not None:
            return f"layer {i}: {reason}"
    config, rotary = model.config, getattr(model.model, "rotary_emb", None)
    if rotary is None or not hasattr(rotary, "inv_freq"):
        return "the model has no rotary_emb with inv_freq"
    if static_rope_limit(config, getattr(rotary, "rope_type", None)) is not None and not hasattr(rotary, "original_inv_freq"):
        return f"its rotary_emb ({getattr(rotary, 'rope_type', None)}) keeps no original_inv_freq"
    if config.model_type in LAYER_ROPE_THETA:  # a table a base: static frequencies only
        tables = layer_theta_tables(model)
        if tables is None:
            return "layer_rope_theta without a rotary module for each base (model.rotary_embs)"
        reason = next(filter(None, (static_rope_reason(rope_type) for _, _, rope_type in tables[0])), None)
        if reason is not None:
            return reason
    return llama_config_reason(config, getattr(rotary, "rope_type", None), max_tokens_per_row, backend,
                               rotary_dims=2 * rotary.inv_freq.numel(), static_window=True)


def _granite4_reason(model) -> str | None:
    """Why a Granite 4.0 model (granitemoehybrid) is not one of its dense transformers, which run here: a Mamba2
    layer (the H hybrids) or experts (the block_sparse_moe beside shared_mlp); None otherwise."""
    layers = getattr(getattr(model, "model", None), "layers", None)
    if getattr(getattr(model, "config", None), "model_type", None) != "granitemoehybrid" or layers is None:
        return None
    for i, layer in enumerate(layers):
        for name, what in (("mamba", "Mamba2 layers"), ("block_sparse_moe", "experts")):
            if getattr(layer, name, None) is not None:
                return (f"layer {i}: Granite 4.0's {what} (its dense attention-only checkpoints run here; the hybrids "
                        f"on runners/paged_granite_hybrid.py's runner)")
    return None


def _layer_types_reason(config) -> str | None:
    """Why the config's layers are not all full or sliding attention (a chunked or recurrent
    layer: the kernels apply a causal, tree or block mask with an optional window), or None."""
    kinds = set(getattr(config, "layer_types", None) or ())
    if kinds - {"full_attention", "sliding_attention"}:
        return f"layer_types {sorted(kinds)}: the paged kernels take full and sliding attention layers"
    try:
        windows_per_layer(config, 0)
    except ValueError as error:  # a sliding layer without an int window
        return str(error)
    return None


def llama_config_reason(config, rope_type, max_tokens_per_row: int | None = None, backend=None,
                        rotary_dims: int | None = None, static_window: bool = False) -> str | None:
    """The checks of llama_unsupported_reason that read only the config, the RoPE type and the
    rotated dimensions (2 x the rotary module's inv_freq; None: not checked) -- shared with the
    tensor-parallel runner, which has no whole model: runners/paged_llama_tp.py. A sliding
    window is no refusal: the kernels apply it (runners/sliding_window.py). static_window: a RoPE
    whose frequencies change with the length (dynamic, longrope) is taken for rows within the
    positions where it keeps its first frequencies (_rotary.static_rope_limit; the runner reads
    original_inv_freq and refuses longer rows: max_positions); else refused."""
    reason = _layer_types_reason(config)
    if reason is not None:
        return reason
    if not isinstance(rope_type, str):
        return f"rope_type {rope_type!r} is not a RoPE type"
    if any(name in rope_type for name in _DYNAMIC_ROPE):
        limit = static_rope_limit(config, rope_type) if static_window else None
        if limit is None:
            return f"rope_type {rope_type!r} changes its frequencies with the length"
        if max_tokens_per_row is not None and max_tokens_per_row > limit:
            return (f"rope_type {rope_type!r} changes its frequencies past {limit} positions and a row needs up to "
                    f"{max_tokens_per_row}")
    if getattr(config, "pretraining_tp", 1) not in (None, 1):
        return "pretraining_tp > 1"
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    if rotary_dims is not None and (rotary_dims > head_dim or rotary_dims % 2 or rotary_dims == 0):
        return f"a rotary embedding of {rotary_dims} dims for head_dim {head_dim}"
    return head_dim_reason(head_dim, backend)


class GraniteMlp:
    """Granite 4.0's dense MLP (GraniteMoeHybridMLP, a layer's shared_mlp: input_linear's [gate | up] rows,
    chunked in that order, and output_linear) under Phi-3's names: gate_up_proj, down_proj, act_fn (its modules)."""

    def __init__(self, shared_mlp):
        self.gate_up_proj, self.down_proj, self.act_fn = shared_mlp.input_linear, shared_mlp.output_linear, \
            shared_mlp.activation


def mlp_of(layer):
    """A decoder layer's MLP module: ``mlp``, Granite 3 MoE's ``block_sparse_moe``, Llama 4's ``feed_forward``, or
    Granite 4.0's ``shared_mlp`` (as GraniteMlp)."""
    mlp = getattr(layer, "mlp", None)
    if mlp is not None:
        return mlp
    moe = getattr(layer, "block_sparse_moe", None)  # Granite 3's MoE (granitemoe: its decoder layer holds no mlp)
    if moe is not None:
        return moe
    shared = getattr(layer, "shared_mlp", None)
    return GraniteMlp(shared) if shared is not None else layer.feed_forward


def projection_modules(layer) -> tuple:
    """A decoder layer's projection modules: q/k/v/o and gate/up/down apart (Llama, Qwen), or
    Phi-3's fused qkv_proj and gate_up_proj with o_proj and down_proj; a MoE layer's MLP
    (runners/_moe.py) contributes its shared expert's and that expert's gate (its experts are
    3-D tensors, checked by moe_reason)."""
    attn, mlp = layer.self_attn, mlp_of(layer)
    qkv = (attn.qkv_proj,) if hasattr(attn, "qkv_proj") else (attn.q_proj, attn.k_proj, attn.v_proj)
    if is_moe(mlp):
        shared = next((getattr(mlp, name) for name in SHARED if getattr(mlp, name, None) is not None), None)
        gate = getattr(mlp, "shared_expert_gate", None)
        beside = getattr(layer, "shared_mlp", None)  # Granite MoE's shared MLP on the layer (granitemoeshared)
        return (*qkv, attn.o_proj) + (() if shared is None else (shared.gate_proj, shared.up_proj, shared.down_proj)) + (
            () if gate is None else (gate,)) + (() if beside is None else (beside.input_linear, beside.output_linear))
    gate_up = (mlp.gate_up_proj,) if hasattr(mlp, "gate_up_proj") else \
        (mlp.up_proj,) if getattr(mlp, "gate_proj", None) is None else (mlp.gate_proj, mlp.up_proj)  # Apertus: up only
    return (*qkv, attn.o_proj, *gate_up, mlp.down_proj)


def _row_views(linear, sizes) -> list:
    """(weight, bias) row blocks of one nn.Linear, of ``sizes`` rows each, in order (views: no copy)."""
    starts = [sum(sizes[:i]) for i in range(len(sizes))]
    bias = linear.bias
    return [(linear.weight[s:s + n], None if bias is None else bias[s:s + n]) for s, n in zip(starts, sizes)]


def _projections(layer, config) -> tuple:
    """(q, k, v, gate, up): (weight, bias) pairs of a decoder layer, the modules' own tensors, or
    row views of Phi-3's qkv_proj ([q | k | v] rows, as its attention slices the product) and
    gate_up_proj ([gate | up] rows, as its MLP chunks it)."""
    attn, mlp = layer.self_attn, mlp_of(layer)
    if hasattr(attn, "qkv_proj"):
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        kv_rows = config.num_key_value_heads * head_dim
        qkv = _row_views(attn.qkv_proj, [config.num_attention_heads * head_dim, kv_rows, kv_rows])
    else:
        qkv = list(linear_params(attn.q_proj, attn.k_proj, attn.v_proj))
    if is_moe(mlp):
        gate_up = [(None, None), (None, None)]  # the experts' (runners/_moe.py)
    elif hasattr(mlp, "gate_up_proj"):
        inter = mlp.gate_up_proj.weight.shape[0] // 2
        gate_up = _row_views(mlp.gate_up_proj, [inter, inter])
    elif getattr(mlp, "gate_proj", None) is None:  # Apertus: an ungated MLP, down(act(up(x)))
        gate_up = [(None, None), *linear_params(mlp.up_proj)]
    else:
        gate_up = list(linear_params(mlp.gate_proj, mlp.up_proj))
    return (*qkv, *gate_up)


def _qk_norms(attn, head_dim: int):
    """(per-head q/k norms, whole-projection q/k norms): each (q weight, q eps, k weight, k eps) or
    None. Qwen3's norms weigh one head's dims ([D]) and run per head (in rope_append_kv on the
    Triton path); OLMoE's weigh the whole projection ([Hq * D], [Hkv * D]) and run over it before
    the heads are split (a norm of their own on every path)."""
    q_norm = getattr(attn, "q_norm", None) or getattr(attn, "query_layernorm", None)  # HunYuan's names
    k_norm = getattr(attn, "k_norm", None) or getattr(attn, "key_layernorm", None)
    if q_norm is None:
        return None, None
    norms = (q_norm.weight, q_norm.variance_epsilon, k_norm.weight, k_norm.variance_epsilon)
    return (norms, None) if q_norm.weight.numel() == head_dim else (None, norms)


class _Layer:
    """One decoder layer's parameters (references to the model's tensors, not copies). With
    fuse=True, q/k/v and gate/up are also held as one concatenated weight each (w_qkv, w_gate_up;
    biases likewise), the model's parameters re-pointed into it (runners/_fused_weights.py). A MoE
    layer's MLP is `moe` (runners/_moe.py; gate / up / down None), else moe is None."""

    scaled_query = True  # whether the runner's query temperature (if any) scales this layer's queries
    gated = True  # whether the MLP is gated (act(gate) * up); Apertus': act(up)

    def __init__(self, layer, config, fuse: bool, kernels: str = "torch"):
        attn, mlp = layer.self_attn, mlp_of(layer)
        # the norms before each branch (Apertus names them attention_layernorm / feedforward_layernorm)
        self.ln_in, self.eps_in = norm_params(getattr(layer, "input_layernorm", None) or layer.attention_layernorm)
        self.ln_post, self.eps_post = norm_params(getattr(layer, "post_attention_layernorm", None)
                                                  or layer.feedforward_layernorm)
        self.w_qkv = self.b_qkv = self.w_gate_up = self.b_gate_up = None
        self.moe = MoE(mlp, config, kernels) if is_moe(mlp) else None
        beside = getattr(layer, "shared_mlp", None)
        if self.moe is not None and beside is not None:  # granitemoeshared: the layer's shared MLP joins the experts'
            width = beside.input_linear.weight.shape[0] // 2  # sum ([gate | up] rows of input_linear, as it chunks)
            self.moe.shared = ([*_row_views(beside.input_linear, [width, width]), *linear_params(beside.output_linear)],
                               beside.activation, None)
        if fuse:  # before the references below are taken: they then point into the fused tensors
            q, k, v, gate, up = _projections(layer, config)
            self.w_qkv, self.b_qkv = _fuse((q, k, v))
            if self.moe is None and gate[0] is not None:  # (an ungated MLP has nothing to fuse there)
                self.w_gate_up, self.b_gate_up = _fuse((gate, up))
        self.q, self.k, self.v, self.gate, self.up = _projections(layer, config)
        (self.o,) = linear_params(attn.o_proj)
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        self.qk_norm, self.qk_norm_full = _qk_norms(attn, head_dim)
        self.qk_norm_after_rope = config.model_type in QK_NORM_AFTER_ROPE  # HunYuan's: rotate, then norm
        self.clip_qkv = getattr(config, "clip_qkv", None)  # OLMoE: q / k / v clamped to [-c, c] after the norms
        self.rope_order = interleaved_order(self.q[0].shape[0], self.k[0].shape[0], head_dim, self.q[0].device,
                                            rotary_dims(config, head_dim)) if config.model_type in INTERLEAVED_ROPE else None
        # GLM-4-0414: (weight, eps) of the norms of each branch's output (POST_BRANCH_NORMS), else None
        self.post_attn_norm, self.post_mlp_norm = (norm_params(getattr(layer, name, None)) for name in POST_BRANCH_NORMS)
        self.qkv = ([self.q[0], self.k[0], self.v[0]], [self.q[1], self.k[1], self.v[1]])  # one call each
        self.q_cols, self.kv_cols = self.q[0].shape[0], self.k[0].shape[0]
        if self.moe is None:
            (self.down,) = linear_params(mlp.down_proj)
            self.gate_up = ([self.gate[0], self.up[0]], [self.gate[1], self.up[1]])
            self.gated = self.gate[0] is not None  # Apertus: down(act(up(x)))
            self.inter = self.up[0].shape[0]
            self.act = mlp.act_fn if hasattr(mlp, "act_fn") else mlp.activation_fn  # Phi-3: activation_fn
        else:
            self.down = self.gate_up = self.inter = self.act = None
        # SmolLM3's NoPE layers (use_rope False), EXAONE MoE's full layers (rotates)
        self.rope = bool(getattr(attn, "use_rope", True)) and rotates(config, attn.layer_idx)
        sinks = getattr(attn, "sinks", None)  # GPT-OSS: [Hq] logits, float32 for the kernels (a copy of Hq values)
        self.sinks = None if sinks is None else sinks.detach().float().contiguous()


def interleaved_order(q_cols: int, k_cols: int, head_dim: int, device, rotary: int | None = None) -> tuple:
    """(q's, k's) column orders [q_cols], [k_cols] that put each head's even dims of its first ``rotary`` (None:
    all) first and their odd dims next, the unrotated rest after them as they are (INTERLEAVED_ROPE; GLM
    rotates half of each head)."""
    rotary = head_dim if rotary is None else rotary
    within = torch.cat((torch.arange(0, rotary, 2), torch.arange(1, rotary, 2), torch.arange(rotary, head_dim)))
    return tuple((torch.arange(cols // head_dim)[:, None] * head_dim + within).reshape(-1).to(device)
                 for cols in (q_cols, k_cols))


def _whole_projection_math(layer, q, k, v, fused: bool, norm=None):
    """OLMoE's and MiniMax-M2's RMSNorms over the whole q / k projections [T, Hq * D] / [T, Hkv * D] and
    OLMoE's clamp of q, k and v to [-clip_qkv, clip_qkv], as transformers' attention orders them (before
    the heads are split and rotated); q, k, v unchanged for the other families. norm(x, weight, eps):
    the RMSNorm (default rms_norm; a tensor-parallel rank's over every rank's slice of the projection)."""
    if layer.qk_norm_full is not None:
        q_weight, q_eps, k_weight, k_eps = layer.qk_norm_full
        norm = norm or (lambda x, weight, eps: rms_norm(x, weight, eps, fused))
        q, k = norm(q.contiguous(), q_weight, q_eps), norm(k.contiguous(), k_weight, k_eps)
    if layer.clip_qkv is not None:
        c = layer.clip_qkv
        q, k, v = q.clamp(-c, c), k.clamp(-c, c), v.clamp(-c, c)
    if getattr(layer, "rope_order", None) is not None:  # ERNIE 4.5: interleaved pairs read as halves
        q, k = q.index_select(-1, layer.rope_order[0]), k.index_select(-1, layer.rope_order[1])
    return q, k, v


def _norm_qk(q, k, norms, fused: bool):
    """q [T, Hq, D], k [T, Hkv, D] through their per-head RMSNorms (q weight, q eps, k weight, k eps)."""
    return rms_norm(q, norms[0], norms[1], fused), rms_norm(k, norms[2], norms[3], fused)


def _split_qkv(layer, qkv):
    """One fused q/k/v product [T, q + 2 kv] -> its q, k, v column views."""
    q, kv = qkv[:, :layer.q_cols], qkv[:, layer.q_cols:]
    return q, kv[:, :layer.kv_cols], kv[:, layer.kv_cols:]


def _fuse(pairs):
    """(weight, bias) pairs concatenated (bias None when none has one; when only some have one,
    nothing is fused: (None, None)). Row views that are already adjacent (Phi-3's qkv_proj) come
    back as the view spanning them, without a copy (concat_parameters)."""
    biases = [b for _, b in pairs]
    if any(b is None for b in biases) and any(b is not None for b in biases):
        return None, None
    weight = concat_parameters([w for w, _ in pairs])
    return weight, None if biases[0] is None else concat_parameters(biases)


class PagedLlamaRunner(PagedRunnerBase):
    """Runner (see runners/base.py) for a Llama-family *ForCausalLM instance (weights shared).

    max_new_tokens and num_draft_tokens (K; 0 for plain decoding) size each row's reservation:
    prompt width + max_new_tokens + K + 1. backend: kernel backend (None = automatic).
    fuse_projections: see PagedRunnerBase (None = on with the Triton kernels, i.e. on CUDA).

    Layer math per backend: Triton (CUDA; backend='triton' under the interpreter) runs each
    layer in 9 launches -- qkv GEMM, rope_append_kv (RoPE + q/k norm + KV append), attention,
    o GEMM, add_rms_norm, gate_up GEMM, silu_mul, down GEMM, add_rms_norm (the next layer's or the
    final norm) -- instead of 39 (bf16, measured by bench/launch_count.py). CPU float32: the
    C++ fused ops (measured fast there); other CPU dtypes: torch with transformers' op order.
    """

    unsupported_reason = staticmethod(llama_unsupported_reason)

    gemv_layer = False  # decode steps through _decode_gemv (set in _bind from GEMV_LAYER; set_gemv_layer)
    gemv_pdl = False  # its products as programmatic dependent launches (GEMV_PDL; set_gemv_layer)
    # Granite's scalars (GRANITE_SCALARS; the softmax scale is self.scale); the other families' identities
    embedding_multiplier = residual_multiplier = logits_scaling = 1.0
    post_branch_norms = False  # whether some layer norms a branch's output before its add (POST_BRANCH_NORMS)
    # [(inv_freq, attention_scaling)] a RoPE base where the layers take several (LAYER_ROPE_THETA), each
    # layer's `rope` then its 1-based index into them (0: NoPE); None: the one table (inv_freq, rope_scaling)
    layer_rope_freqs = None
    query_temperature = None  # Ministral 3's (beta, original_max_position_embeddings): QUERY_TEMPERATURE
    layer_class = _Layer  # one decoder layer's parameters (Llama 4's: runners/paged_llama4.py)

    def _bind(self, model) -> None:
        inner = model.model
        self._bind_parts(model.config, inner.embed_tokens.weight, inner.layers, inner.norm,
                         model.get_output_embeddings().weight, inner.rotary_emb)
        self.lm_head_bias = model.get_output_embeddings().bias  # ERNIE 4.5's use_bias; None elsewhere
        if model.config.model_type in LAYER_ROPE_THETA:
            tables, indices = layer_theta_tables(model)
            self.layer_rope_freqs = [(inv_freq.to(device=self.device, dtype=torch.float32), float(scaling))
                                     for inv_freq, scaling, _ in tables]
            for layer, index in zip(self.layers, indices):
                layer.rope = index

    def _rope_freqs(self) -> list:
        """[(inv_freq, attention_scaling)] of each RoPE table, indexed by layer.rope - 1."""
        return self.layer_rope_freqs or [(self.inv_freq, self.rope_scaling)]

    def _bind_parts(self, config, embed: torch.Tensor, layers, norm, lm_head: torch.Tensor, rotary) -> None:
        """The decoder's parts: embedding [V, H], decoder layer modules, final norm module, LM head
        [V, H], rotary module (a target's MTP layer binds its own: runners/paged_mtp.py)."""
        self.embed = embed
        self.layers = [self.layer_class(layer, config, self.fuse_projections, self.kernels) for layer in layers]
        self.post_branch_norms = any(layer.post_attn_norm is not None for layer in self.layers)
        if any(layer.sinks is not None for layer in self.layers):
            self.attn_sinks = tuple(layer.sinks for layer in self.layers)
        self.final_norm, self.final_eps = norm_params(norm)
        self.lm_head = lm_head
        self._bind_heads(config)
        if config.model_type in GRANITE_TYPES:
            for field, attribute in GRANITE_SCALARS.items():
                setattr(self, attribute, float(getattr(config, field)))
        self._bind_query_temperature(config)
        # dynamic / longrope: the first frequencies (original_inv_freq: a long forward of the model
        # rewrites inv_freq in place), for rows up to the positions that keep them (max_positions)
        self.max_positions = static_rope_limit(config, getattr(rotary, "rope_type", None))
        self.positions_limit = "positions of its first RoPE frequencies"
        inv_freq = rotary.inv_freq if self.max_positions is None else rotary.original_inv_freq
        self.inv_freq = inv_freq.to(device=self.device, dtype=torch.float32)
        self.rope_scaling = float(rotary.attention_scaling)
        self.silu = config.hidden_act == "silu"  # F.silu directly: skips a module call per layer
        if self.kernels == "triton":  # imported here: triton is optional on CPU machines
            from ..kernels.cache_ops.triton_rope import rope_append_kv_triton
            from ..kernels.llama_ops.triton import add_rms_norm_triton, silu_mul_triton

            self._ops = (add_rms_norm_triton, rope_append_kv_triton, silu_mul_triton)
            # (weight, eps) of the norm that follows each layer: the next layer's input norm, then the final norm
            self._next_norm = [(nxt.ln_in, nxt.eps_in) for nxt in self.layers[1:]] + [(self.final_norm, self.final_eps)]
        self.gemv_layer = GEMV_LAYER and self.gemv_layer_reason() is None
        self.gemv_pdl = GEMV_PDL

    def gemv_layer_reason(self) -> str | None:
        """Why this runner cannot take the GEMV layer (GEMV_LAYER), or None when it can."""
        if self.kernels != "triton":
            return f"the GEMV layer is a Triton path (this runner's kernels: {self.kernels!r})"
        if type(self)._sum_partials is not PagedLlamaRunner._sum_partials:
            return "a tensor-parallel runner sums partial products across ranks (the fused residual add would repeat)"
        if any(layer.moe is not None for layer in self.layers):
            return "the GEMV layer has no mixture-of-experts MLP"
        if any(layer.qk_norm_full is not None or layer.clip_qkv is not None or layer.rope_order is not None
               or layer.qk_norm_after_rope for layer in self.layers) or self.post_branch_norms:
            return ("the GEMV layer has no whole-projection q/k norms, clip_qkv (OLMoE), interleaved RoPE (ERNIE 4.5, GLM), "
                    "norms of a branch's output (GLM-4-0414) or q/k norms after the rotation (HunYuan)")
        if any(layer.w_qkv is None or layer.w_gate_up is None for layer in self.layers):
            return "the q/k/v and gate/up projections are not fused (fuse_projections=False, or biases on some only)"
        if not self.silu:
            return f"the GEMV layer fuses SiLU; this model's hidden_act is {self.config.hidden_act!r}"
        if self.residual_multiplier != 1.0:
            return f"the GEMV layer's fused residual adds take no residual_multiplier ({self.residual_multiplier})"
        return None

    def set_gemv_layer(self, on: bool, pdl: bool | None = None) -> None:
        """Decode steps of at most GEMV_MAX_ROWS token rows through the GEMV layer (on) or the
        cuBLAS layer (off); pdl (None: unchanged) launches its products as programmatic dependent
        launches on CUDA (GEMV_PDL). Raises ValueError, with gemv_layer_reason(), where it cannot run."""
        reason = self.gemv_layer_reason() if on else None
        if reason is not None:
            raise ValueError(reason)
        self.gemv_layer = bool(on)
        if pdl is not None:
            self.gemv_pdl = bool(pdl)

    def _linears(self, rows: int, x: torch.Tensor):
        """(linear, linears) for a forward over ``rows`` token rows like x: decided once per row
        count (runners/_linear.layer_linears: the raw C++ ops when they take every weight)."""
        cache = self.__dict__.setdefault("_linear_fns", {})
        if rows not in cache:
            weights = [p for layer in self.layers for p in (layer.q, layer.k, layer.v, layer.o, layer.gate, layer.up, layer.down)
                       if p is not None and p[0] is not None]
            cache[rows] = layer_linears(rows, x, [w for w, _ in weights], [b for _, b in weights])
        return cache[rows]

    # The three places a tensor-parallel runner (paged_llama_tp.py) differs; one rank: no-ops.
    _carries_residual = True  # whether this rank's o / down partials add the residual stream

    def _embed(self, flat: torch.Tensor) -> torch.Tensor:
        """ids [T] (-1 pads) -> embeddings [T, H] (times Granite's embedding_multiplier)."""
        x = F.embedding(flat.clamp(min=0), self.embed)
        return x if self.embedding_multiplier == 1.0 else x * self.embedding_multiplier

    _projection_norm = None  # the whole-projection q/k norm (None: rms_norm; tensor parallelism: over every rank's slice)

    def _branch(self, delta: torch.Tensor) -> torch.Tensor:
        """A residual branch's output as added to the stream: times Granite's residual_multiplier."""
        return delta if self.residual_multiplier == 1.0 else delta * self.residual_multiplier

    def _decode(self, flat, positions, cu, attn_lens, n) -> torch.Tensor:
        """Packed tokens [T] at positions [T] -> final-norm hidden states [T, H]."""
        if self.kernels == "triton":
            if self.gemv_layer and flat.shape[0] <= GEMV_MAX_ROWS:
                return self._decode_gemv(flat, positions, cu, attn_lens, n)
            return self._decode_triton(flat, positions, cu, attn_lens, n)
        total = flat.shape[0]
        fused = fused_layer_math(self.dtype, self.device.type)  # C++ RMSNorm / RoPE / SwiGLU (CPU float32)
        # [None (NoPE), (cos, sin) [T, D] a RoPE table], indexed by layer.rope: once per call
        tables = [None] + [rope_cos_sin(positions, inv_freq, scaling, self.dtype, fused)
                           for inv_freq, scaling in self._rope_freqs()]
        q_scales = self._query_scales(positions)
        x = self._embed(flat)
        self._keep(0, x)
        heads, kv_heads, dim = self.num_heads, self.num_kv_heads, self.head_dim
        lin, lins = self._linears(total, x)
        # The o / down products add the residual themselves (in the product on one process, in rank 0's
        # partial under tensor parallelism: `owns`) unless a multiplier scales the branch first (Granite):
        # `carried` says whether the (summed) product holds the residual, the same on every rank.
        carried, sum_ = self.residual_multiplier == 1.0 and not self.post_branch_norms, self._sum_partials
        owns = carried and self._carries_residual
        for i, layer in enumerate(self.layers):
            h = rms_norm(x, layer.ln_in, layer.eps_in, fused)
            q, k, v = _whole_projection_math(layer, *lins(h, *layer.qkv), fused, self._projection_norm)
            q, k, v = q.view(total, heads, dim), k.view(total, kv_heads, dim), v.view(total, kv_heads, dim)
            if layer.qk_norm is not None and not layer.qk_norm_after_rope:
                q, k = _norm_qk(q, k, layer.qk_norm, fused)
            if layer.rope:
                q, k = rotate_qk(q, k, *tables[layer.rope], fused)
            if layer.qk_norm is not None and layer.qk_norm_after_rope:
                q, k = _norm_qk(q, k, layer.qk_norm, fused)
            if q_scales is not None and layer.scaled_query:
                q = (q * q_scales).to(q.dtype)
            o = self._attend(i, q, k, v, attn_lens, cu, n, self.scale)
            x = self._add(x, sum_(lin(o.reshape(total, heads * dim), *layer.o, x if owns else None)), carried,
                          layer.post_attn_norm, fused)
            h = rms_norm(x, layer.ln_post, layer.eps_post, fused)
            if layer.moe is not None:  # the residual joins the carrying rank's partial, as the down product's does
                delta = layer.moe(h, self._prefilling)
                x = self._add(x, sum_(x + delta if owns else delta), carried, layer.post_mlp_norm, fused)
            else:
                if layer.gated:
                    act = gated_act(*lins(h, *layer.gate_up), layer.act, self.silu, fused)
                else:  # Apertus' ungated MLP
                    act = layer.act(lin(h, *layer.up))
                x = self._add(x, sum_(lin(act, *layer.down, x if owns else None)), carried, layer.post_mlp_norm, fused)
            if i + 1 < len(self.layers):
                self._keep(i + 1, x)
        out = rms_norm(x, self.final_norm, self.final_eps, fused)
        self._keep(len(self.layers), out)
        return out

    def _bind_query_temperature(self, config) -> None:
        """Ministral 3's (beta, original_max_position_embeddings) from its rope_parameters
        (QUERY_TEMPERATURE); None for the other families (both _binds: the tensor-parallel one too)."""
        if config.model_type in QUERY_TEMPERATURE:
            rope = config.rope_parameters
            beta, original = (rope.get(field) for field in QUERY_TEMPERATURE[config.model_type])
            self.query_temperature = None if beta is None else (float(beta), int(original))

    def _query_scales(self, positions: torch.Tensor) -> torch.Tensor | None:
        """[T, 1, 1] in the model dtype (float32: the product then rounded, Llama 4's): each query's
        temperature (QUERY_TEMPERATURE), for the layers whose scaled_query is set, or None."""
        if self.query_temperature is None:
            return None
        beta, original = self.query_temperature
        scale = 1 + beta * torch.log(1 + torch.floor(positions.to(torch.float32) / original))
        return scale.to(self.dtype)[:, None, None]

    def _add(self, x: torch.Tensor, out: torch.Tensor, carried: bool, norm=None, fused: bool = False) -> torch.Tensor:
        """The stream after a branch whose (summed) product is out: out itself when it already holds
        x (carried: the product added it, on one process or in rank 0's partial), else x + the
        branch (normed first by ``norm`` (weight, eps): GLM-4-0414's; times Granite's
        residual_multiplier), on every rank."""
        if carried:
            return out
        return x + self._branch(out if norm is None else rms_norm(out, norm[0], norm[1], fused))

    def _rotate_append_attend(self, i, layer, q, k, v, cos, sin, cu, attn_lens, n, pdl=False,
                              q_scales=None) -> torch.Tensor:
        """Layer i's q [T, Hq * D], k / v [T, Hk * D] (views of one product allowed) -> attention
        output [T, Hq * D]: RoPE (+ Qwen3's q/k norms) and the KV append in one launch
        (rope_append_kv), then attention (both layer forms on the Triton path); pdl: both as
        programmatic dependent launches (the GEMV layer's chain, GEMV_PDL)."""
        total, heads, kv_heads, dim = q.shape[0], self.num_heads, self.num_kv_heads, self.head_dim
        q = q.view(total, heads, dim)
        self._ops[1](q, k.view(total, kv_heads, dim), v.view(total, kv_heads, dim), cos, sin, self.k_caches[i],
                     self.v_caches[i], self._tables[i], self.length, cu, layer.qk_norm, pdl=pdl,
                     q_scale=None if q_scales is None else q_scales.view(total))  # Ministral 3's temperature
        return self._attention(i, q, attn_lens, cu, n, self.scale, pdl=pdl).view(total, heads * dim)

    def _rotations(self, positions: torch.Tensor) -> list:
        """[(cos, sin) of the NoPE layers, (cos, sin) of each RoPE table], indexed by layer.rope, for
        one forward's positions [T] (rope_append_kv's tables): RoPE's [T, D] in the model dtype, and
        where some layer is NoPE (SmolLM3) ones / zeros like them, the identity rotation."""
        tables = [rope_cos_sin(positions, inv_freq, scaling, self.dtype) for inv_freq, scaling in self._rope_freqs()]
        cos, sin = tables[0]
        nope = None if all(layer.rope for layer in self.layers) else (torch.ones_like(cos), torch.zeros_like(sin))
        return [nope, *tables]

    def _decode_triton(self, flat, positions, cu, attn_lens, n) -> torch.Tensor:
        """The Triton path (see the class doc): 9 launches per layer. The residual stream x stays
        in the model dtype (transformers' order); each add_rms_norm returns (x + delta, its norm)."""
        add_rms_norm, _, silu_mul = self._ops
        rotations = self._rotations(positions)  # once per call
        q_scales = self._query_scales(positions)
        x = self._embed(flat)
        self._keep(0, x)
        first = self.layers[0]
        h = add_rms_norm(x, None, first.ln_in, first.eps_in)[1]
        sum_ = self._sum_partials
        for i, layer in enumerate(self.layers):
            if layer.w_qkv is not None:
                q, k, v = _split_qkv(layer, F.linear(h, layer.w_qkv, layer.b_qkv))
            else:
                q, k, v = (F.linear(h, w, b) for w, b in (layer.q, layer.k, layer.v))
            q, k, v = _whole_projection_math(layer, q, k, v, False, self._projection_norm)
            if layer.qk_norm is not None and layer.qk_norm_after_rope:  # HunYuan: torch's rotation, then the norms
                total = q.shape[0]
                q, k = q.reshape(total, self.num_heads, self.head_dim), k.reshape(total, self.num_kv_heads, self.head_dim)
                if layer.rope:
                    q, k = rotate_qk(q, k, *rotations[layer.rope], False)
                q, k = _norm_qk(q, k, layer.qk_norm, False)
                o = self._attend(i, q, k, v.reshape(total, self.num_kv_heads, self.head_dim), attn_lens, cu, n,
                                 self.scale).view(total, -1)
            else:
                o = self._rotate_append_attend(i, layer, q, k, v, *rotations[layer.rope], cu, attn_lens, n,
                                               q_scales=q_scales if layer.scaled_query else None)
            delta = sum_(F.linear(o, *layer.o))
            if layer.post_attn_norm is not None:  # GLM-4-0414: the branch's output normed before its add
                delta = add_rms_norm(delta, None, *layer.post_attn_norm)[1]
            x, h = add_rms_norm(x, self._branch(delta), layer.ln_post, layer.eps_post)
            if layer.moe is not None:
                delta = layer.moe(h, self._prefilling)
            else:
                if layer.w_gate_up is not None:
                    gate_up = F.linear(h, layer.w_gate_up, layer.b_gate_up)
                    gate, up = gate_up[:, :layer.inter], gate_up[:, layer.inter:]
                elif layer.gated:
                    gate, up = F.linear(h, *layer.gate), F.linear(h, *layer.up)
                else:  # Apertus' ungated MLP
                    gate, up = None, F.linear(h, *layer.up)
                act = layer.act(up) if gate is None else silu_mul(gate, up) if self.silu else layer.act(gate) * up
                delta = F.linear(act, *layer.down)
            weight, eps = self._next_norm[i]
            delta = sum_(delta)
            if layer.post_mlp_norm is not None:
                delta = add_rms_norm(delta, None, *layer.post_mlp_norm)[1]
            x, h = add_rms_norm(x, self._branch(delta), weight, eps, write_residual=i + 1 < len(self.layers))
            self._keep(i + 1, x if i + 1 < len(self.layers) else h)  # j = L: the final norm's output
        return h

    def _decode_gemv(self, flat, positions, cu, attn_lens, n) -> torch.Tensor:
        """The GEMV layer (GEMV_LAYER): per layer qkv (input RMSNorm fused in), rope_append_kv,
        attention, o (+ residual), gate_up (post-attention RMSNorm fused in), down (SwiGLU fused in
        up to SILU_FUSED_MAX_ROWS rows, else silu_mul apart; + residual): 6 launches (7), no normed
        activation written to memory; then the final norm. The residual stream x stays in the model
        dtype (each product rounded, then the residual add rounded, as transformers'); the fused
        norms differ from transformers' by the rounding kernels/linear/triton.py describes."""
        from ..kernels.linear.triton import skinny_linear_triton

        gemv = functools.partial(skinny_linear_triton, pdl=self.gemv_pdl)
        add_rms_norm, _, silu_mul = self._ops
        total = flat.shape[0]
        rotations = self._rotations(positions)  # once per call
        q_scales = self._query_scales(positions)
        x = self._embed(flat)
        self._keep(0, x)
        for i, layer in enumerate(self.layers):
            qkv = gemv(x, layer.w_qkv, layer.b_qkv, prologue="rms_norm", norm_weight=layer.ln_in, eps=layer.eps_in)
            o = self._rotate_append_attend(i, layer, *_split_qkv(layer, qkv), *rotations[layer.rope], cu, attn_lens,
                                           n, pdl=self.gemv_pdl, q_scales=q_scales if layer.scaled_query else None)
            x = gemv(o, *layer.o, residual=x)
            gate_up = gemv(x, layer.w_gate_up, layer.b_gate_up, prologue="rms_norm", norm_weight=layer.ln_post,
                           eps=layer.eps_post)
            if total <= SILU_FUSED_MAX_ROWS:
                x = gemv(gate_up, *layer.down, residual=x, prologue="silu_mul")
            else:
                x = gemv(silu_mul(gate_up[:, :layer.inter], gate_up[:, layer.inter:]), *layer.down, residual=x)
            if i + 1 < len(self.layers):
                self._keep(i + 1, x)
        h = add_rms_norm(x, None, self.final_norm, self.final_eps)[1]
        self._keep(len(self.layers), h)
        return h

    def _logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """The lm_head product (divided by Granite's logits_scaling); through the Triton skinny
        linear with the GEMV layer (decode steps)."""
        rows = hidden.numel() // hidden.shape[-1]
        if not (self.gemv_layer and rows <= GEMV_MAX_ROWS):
            logits = super()._logits(hidden)
        else:
            from ..kernels.linear.triton import skinny_linear_triton

            flat = hidden.reshape(rows, hidden.shape[-1])
            logits = skinny_linear_triton(flat, self.lm_head, pdl=self.gemv_pdl).view(*hidden.shape[:-1],
                                                                                      self.lm_head.shape[0])
            if self.lm_head_bias is not None:
                logits = logits + self.lm_head_bias
        return logits if self.logits_scaling == 1.0 else logits / self.logits_scaling
