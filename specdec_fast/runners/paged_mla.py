"""PagedMlaRunner: a decoder with multi-head latent attention (MLA) -- DeepSeek-V3 / R1 and the
checkpoints that reuse its layer (model_type deepseek_v3), GLM-4.7-Flash (glm4_moe_lite), DeepSeek-V2
/ V2-Lite / Coder-V2 (deepseek_v2: its RoPE on complex pairs in float32, softmax routing),
DeepSeek-V3.2 (deepseek_v32) and GLM-5 (glm_moe_dsa) with their sparse attention (below) -- run
layer by layer over a PagedKVCache that holds each token's latent, not its keys and values.

The math is transformers 5.24's DeepseekV3Attention (modeling_deepseek_v3.py; Glm4MoeLiteAttention
is the same code), eval mode, per token x (Hq heads; r = kv_lora_rank, dn / dr = the non-rotated /
rotated query-key dims, dv = v_head_dim):
    q = q_b(q_a_norm(q_a(x)))  (or q_proj(x) without q_lora_rank)    [Hq, dn + dr] -> q_nope, q_rot
    c, k_rot = kv_a(x)          c = kv_a_norm(c) [r], k_rot [dr] (one for every head)
    q_rot, k_rot = RoPE         interleaved pairs where config.rope_interleave (DeepSeek's layout)
    k_h = [W_UK_h c, k_rot], v_h = W_UV_h c        (kv_b = [W_UK_h; W_UV_h] per head: [dn + dv, r])
    out_h = softmax(q_h . k_h * scaling) v_h  ->  o_proj
transformers caches (c, k_rot) and expands every cached latent through kv_b at every step. Here the
projections are absorbed instead (as vLLM, SGLang and FlashMLA decode): q_h . k_h = [W_UK_h^T
q_nope_h, q_rot_h] . [c, k_rot], and out_h = W_UV_h (softmax(...) c). So attention is multi-query
attention over one cached entry per token, [c, k_rot] of r + dr dims, that is also the value (its
first r dims are c): the paged kernels run it unchanged with Hkv = 1 and head_dim r + dr, and the
cache keeps one plane per layer (PagedRunnerBase.kv_latent): 576 values a token a layer for
DeepSeek-V3 instead of the 2 x 128 x 192 = 49152 of its expanded K and V. The output's last dr
dims (softmax times k_rot) are dropped. Absorption reorders the products, so logits differ from
transformers' by rounding (fp32: ~1e-6), not more. A long prefill (expand_prefill_min columns) caches the
latents the same way but runs its own attention expanded (per-head keys and values, SDPA), which takes
fewer multiplies per (query, key) pair; decode and verify calls read the latents absorbed.

The MLP is the Llama runner's: a dense SwiGLU on the first layers (first_k_dense_replace /
mlp_layer_types), then runners/_moe.py's grouped sigmoid routing with the shared MLP (GLM-4.5's;
DeepSeek-V2's softmax routing).

Kernels: one path for every backend (norms, RoPE and the absorbed products as torch ops -- the C++
RMSNorm / SwiGLU on CPU float32), the entry's append through paged_base's dispatch, the attention
through the MLA Triton kernel on the Triton path (kernels/attention/triton_mla.py: each entry chunk
loaded once as keys and values for 16 (query, head) rows; r <= 512, dr <= 128; not yet timed on a
GPU), else paged_base's C++ / torch attention with the plane as K and V (its output's last dr dims
dropped). DeepSeek-V3's own MTP layer drafts on this runner too (runners/paged_mtp.py). Tensor
parallelism: runners/paged_mla_tp.py (heads split, the latent whole on every rank).

DeepSeek Sparse Attention (DSA: DeepSeek-V3.2, GLM-5; transformers 5.24's DeepseekV32Attention and
GlmMoeDsaAttention, whose MLA is V3's with interleaved RoPE always): a layer's indexer scores every
visible key of a query and the query attends to the top min(index_topk, T) of them only. A query at
position p sees p + 1 keys, so while p + 1 <= index_topk (2048 in both checkpoints) every visible key
is chosen, whatever the scores and however they tie, and the layer is V3's dense MLA. So a pool whose
rows fit index_topk (dense_positions) runs this runner's dense path unchanged, and one whose rows may
pass it runs every call sparse (runners/sparse_mla.py: the indexer keys in caches of their own, the
top-k choice, attention over the chosen latents; one mode per pool, so captured graphs never meet the
other). The indexer key caches are allocated for DSA models either way (Di = 128 values a token a layer
beside the latent's 576: 22% more pool).
"""
import math

import torch
import torch.nn.functional as F

from ..kernels._backend import resolve_backend
from ..kernels.llama_ops.reference import rotate_half_apply
from ._layer_math import fused_layer_math, gated_act, linear_params, norm_params, rms_norm, rope_cos_sin
from ._linear import linear
from ._moe import SHARED, is_moe, moe_or_gated_mlp, layers_moe_reason
from ._rotary import rope_tables_reason
from .paged_base import PagedRunnerBase, _transformers_class, decoder_reason
from .sliding_window import AsFullAttention, windows_per_layer
from .sparse_mla import Indexer, choose, chosen_attention, indexer_key, indexer_rope, row_slots

# DeepSeek Sparse Attention's families (module docstring): dense MLA within index_topk, sparse_mla.py past it
DSA_MODEL_TYPES = ("deepseek_v32", "glm_moe_dsa")
# youtu: Youtu-LLM (2B), DeepSeek-V3's latent attention in dense Llama layers (its SwiGLU MLP, a tied embedding);
# axk1: A.X-K1 (SK Telecom), DeepSeek-V3's layer with its MoE block's output normed (post_mlp_layernorm)
MLA_MODEL_TYPES = ("deepseek_v2", "deepseek_v3", "glm4_moe_lite", "youtu", "axk1") + DSA_MODEL_TYPES


def mla_projection_modules(layer) -> tuple:
    """An MLA decoder layer's projection modules: q_proj (or q_a_proj, q_b_proj), kv_a_proj_with_mqa,
    kv_b_proj, o_proj, and the MLP's gate / up / down (a MoE layer's shared MLP)."""
    attn, mlp = layer.self_attn, layer.mlp
    # DeepSeek-V3.2's attention has no q_proj attribute (a query rank always)
    q = (attn.q_proj,) if getattr(attn, "q_proj", None) is not None else (attn.q_a_proj, attn.q_b_proj)
    dense = next((getattr(mlp, name) for name in SHARED if getattr(mlp, name, None) is not None), None) \
        if is_moe(mlp) else mlp
    return (*q, attn.kv_a_proj_with_mqa, attn.kv_b_proj, attn.o_proj) + (
        () if dense is None else (dense.gate_proj, dense.up_proj, dense.down_proj))


def _latent_dims(config) -> int:
    """r + dr: the width of one cached entry (and of the absorbed query)."""
    return int(config.kv_lora_rank) + int(config.qk_rope_head_dim)


def dense_positions(config) -> int | None:
    """The most positions a row of a DeepSeek Sparse Attention model (DSA_MODEL_TYPES) may take for its
    attention to be dense: its index_topk, within which every visible key is chosen (module docstring);
    None for the other MLA families (always dense)."""
    if getattr(config, "model_type", None) not in DSA_MODEL_TYPES:
        return None
    return int(config.index_topk)


def attention_config(config):
    """The config whose attention checks this runner passes (the Llama runner's, the sliding-window
    rule): a DSA model's indexed layers read as full attention (sliding_window.AsFullAttention: no window;
    their choice of keys is this runner's, sparse_mla.py past dense_positions); any other config as it is."""
    if getattr(config, "model_type", None) in DSA_MODEL_TYPES:
        return AsFullAttention(config)
    return config


def mla_unsupported_reason(model, max_tokens_per_row: int | None = None, backend=None) -> str | None:
    """Why PagedMlaRunner cannot run ``model`` with rows of up to max_tokens_per_row tokens and kernel
    ``backend`` (None: the device's, as the runner would resolve it), or None when it can."""
    reason = decoder_reason(model, MLA_MODEL_TYPES, "model.layers", "a DeepseekV3ForCausalLM", mla_projection_modules)
    if reason is not None:
        return reason
    config = model.config
    reason = layers_moe_reason([layer.mlp for layer in model.model.layers], config) or rope_tables_reason(
        model, max_tokens_per_row, backend, config=attention_config(config))
    if reason is not None:
        return reason
    rotated = 2 * model.model.rotary_emb.inv_freq.numel()
    if rotated != config.qk_rope_head_dim:
        return f"a rotary embedding of {rotated} dims for qk_rope_head_dim {config.qk_rope_head_dim}"
    return latent_reason(config, resolve_backend(backend, model.get_input_embeddings().weight.device, "paged_attention"))


def latent_reason(config, kernels: str) -> str | None:
    """Why the attention kernels ``kernels`` (resolved: "triton", "cpp", "torch") cannot take the
    config's latent (the MLA Triton kernel's limits: kernels/attention/triton_mla.py), or None."""
    if kernels != "triton":
        return None
    from ..kernels.attention.triton_mla import MAX_RANK, MAX_ROPE

    if config.kv_lora_rank > MAX_RANK or config.qk_rope_head_dim > MAX_ROPE:
        return (f"the MLA Triton kernel takes kv_lora_rank <= {MAX_RANK} and qk_rope_head_dim <= {MAX_ROPE}, got "
                f"{config.kv_lora_rank} and {config.qk_rope_head_dim}")
    return None


def rope_form(config) -> str:
    """How q_rot / k_rot turn (PagedMlaRunner._rotate): DeepSeek-V2 as complex pairs in float32
    ("complex"); V3 as interleaved pairs where config.rope_interleave ("interleaved") or halves
    ("half"), in the model dtype; DeepSeek-V3.2's and GLM-5's always interleaved (their configs have no
    rope_interleave)."""
    if config.model_type == "deepseek_v2":
        return "complex"
    if config.model_type in DSA_MODEL_TYPES:
        return "interleaved"
    return "interleaved" if getattr(config, "rope_interleave", False) else "half"


def mla_scale(config) -> float:
    """The softmax scale of transformers' MLA attention (DeepseekV3Attention.scaling):
    qk_head_dim^-0.5, times mscale^2 under a RoPE scaling with mscale_all_dim (YaRN's), mscale =
    0.1 mscale_all_dim ln(factor) + 1 for factor > 1 (yarn_get_mscale)."""
    scale = (config.qk_nope_head_dim + config.qk_rope_head_dim) ** -0.5
    rope = getattr(config, "rope_parameters", None) or {}
    if rope.get("rope_type", "default") != "default" and rope.get("mscale_all_dim", 0):
        factor = rope["factor"]
        mscale = 1.0 if factor <= 1 else 0.1 * rope["mscale_all_dim"] * math.log(factor) + 1.0
        scale = scale * mscale * mscale
    return scale


def rotate_interleaved(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """transformers' apply_rotary_pos_emb_interleave for one tensor: x [T, H, dr] holds its rotated
    pairs interleaved ((x0, x1), (x2, x3), ...); cos / sin [T, dr] = cat(freqs, freqs). Returns
    [rotated evens | rotated odds] (the de-interleaved layout: q and k alike, so their products are
    unchanged), with the same ops in the same order."""
    half = cos.shape[-1] // 2
    c, s = cos[:, None, :half], sin[:, None, :half]
    x1, x2 = x[..., 0::2], x[..., 1::2]
    return torch.cat([x1 * c - x2 * s, x2 * c + x1 * s], dim=-1)


class _MlaLayer:
    """One MLA decoder layer's parameters (references to the model's tensors and views of them: no
    copies). w_uk [Hq, dn, r] and w_uv [Hq, dv, r]: kv_b_proj's rows per head."""

    def __init__(self, layer, config, kernels: str):
        attn, mlp = layer.self_attn, layer.mlp
        self.ln_in, self.ln_post = norm_params(layer.input_layernorm), norm_params(layer.post_attention_layernorm)
        if getattr(attn, "q_proj", None) is not None:
            (self.q,), self.q_a = linear_params(attn.q_proj), None
        else:
            (self.q_a, self.q), self.q_a_norm = linear_params(attn.q_a_proj, attn.q_b_proj), norm_params(attn.q_a_layernorm)
        (self.kv_a, self.o), self.kv_a_norm = linear_params(attn.kv_a_proj_with_mqa, attn.o_proj), norm_params(attn.kv_a_layernorm)
        heads, dn, dv = config.num_attention_heads, config.qk_nope_head_dim, config.v_head_dim
        per_head = attn.kv_b_proj.weight.view(heads, dn + dv, config.kv_lora_rank)
        self.w_uk, self.w_uv = per_head[:, :dn], per_head[:, dn:]
        self.indexer = Indexer.of(attn)  # DeepSeek Sparse Attention's (runners/sparse_mla.py), or None
        self.moe, dense, self.act = moe_or_gated_mlp(mlp, config, kernels)
        self.gate, self.up, self.down = dense or (None, None, None)
        # A.X-K1: an RMSNorm of its MoE block's output (routed + shared experts), (weight, eps); None elsewhere
        self.moe_out_norm = norm_params(getattr(mlp, "post_mlp_layernorm", None)) if self.moe is not None else None


def latent_triton_attention(runner, i: int, q, attn_lens, cu, max_query_len: int, scale: float) -> torch.Tensor:
    """The MLA Triton kernel (kernels/attention/triton_mla.py) of the absorbed queries q [T, Hq, R + DR] over a
    runner's KV layer i, whose K plane holds the latents [c | k_rot] -> [T, Hq, R]; its launch plan cached per call
    shape (static: graph capture), as paged_base._plan. runner: a paged runner with ``rank`` (R) and ``num_heads``
    (PagedMlaRunner, PagedKimiLinearRunner)."""
    from ..kernels.attention.triton_mla import mla_attention_triton, plan_mla

    table = runner._tables[i]
    key = ("mla", table.shape[0], max_query_len)
    plan = runner._plans.get(key)
    if plan is None:
        plan = runner._plans[key] = plan_mla(runner.device, table.shape[0], runner.num_heads, runner.rank, max_query_len,
                                             table.shape[1] * runner.block_size, dtype=runner.dtype)
    return mla_attention_triton(q, runner.k_caches[i], table, attn_lens, cu, rank=runner.rank,
                                max_query_len=max_query_len, tree_mask=runner._tree_mask, scale=scale, plan=plan)


class PagedMlaRunner(PagedRunnerBase):
    """Runner (see runners/base.py) for a DeepseekV3ForCausalLM / Glm4MoeLiteForCausalLM instance
    (weights shared); the arguments are PagedRunnerBase's. The pool holds one latent entry per token
    and layer (kv_latent)."""

    unsupported_reason = staticmethod(mla_unsupported_reason)
    kv_latent = True
    # A prefill of at least this many columns expands the latents into per-head keys and values for its
    # attention (_expanded_attention: the call's own tokens, a fresh row), as vLLM's MLA prefill does: per
    # (query, key) pair and head it multiplies dn + dr + dv numbers (320 for DeepSeek-V3) where the absorbed
    # form multiplies r + dr + r (1088), at r (dn + dv) more per token (the expansion) and none of the
    # absorbed query's r dn. On this CPU (bench/bench_mla_prefill.py, DeepSeek-V3's attention widths over 16
    # heads, fp32, 1 thread, mla_prefill_cpu.json) expanded took 0.89 / 0.89 / 0.66 of the absorbed prefill's
    # time at 64 / 256 / 1024 tokens (predicted slower at 64: the shared projections dominate short prompts
    # both ways). Not measured on a GPU (where SDPA's flash path needs Dk = Dv, so another backend serves it).
    # Decode and verify calls stay absorbed (their few queries read a long cache: the latent is what to read).
    expand_prefill_min = 64

    def _bind(self, model) -> None:
        inner = model.model
        self._bind_parts(model.config, inner.embed_tokens.weight, inner.layers, inner.norm,
                         model.get_output_embeddings().weight, inner.rotary_emb)

    def _bind_parts(self, config, embed: torch.Tensor, layers, norm, lm_head: torch.Tensor, rotary) -> None:
        """The decoder's parts: embedding [V, H], decoder layer modules, final norm module, LM head
        [V, H], rotary module (a target's MTP layer binds its own: runners/paged_mtp.py)."""
        self.embed, self.lm_head = embed, lm_head
        self.layers = [_MlaLayer(layer, config, self.kernels) for layer in layers]
        self.final_norm = norm_params(norm)
        self.num_heads, self.num_kv_heads, self.head_dim = config.num_attention_heads, 1, _latent_dims(config)
        self.rank, self.nope_dims = int(config.kv_lora_rank), int(config.qk_nope_head_dim)
        # the module's own scaling: qk_head_dim^-0.5, times YaRN's mscale^2 where set (mla_scale: the same
        # from the config alone, for the tensor-parallel runner, which has no module)
        self.scale = float(layers[0].self_attn.scaling)
        self.rope_form = rope_form(config)
        self.inv_freq = rotary.inv_freq.to(device=self.device, dtype=torch.float32)
        self.rope_scaling = float(rotary.attention_scaling)
        self.silu = config.hidden_act == "silu"
        self._bind_indexers(config)

    def _bind_indexers(self, config) -> None:
        """A DSA model's indexers (module docstring): index_topk, the indexer's rotation, and which layers
        have one: layer i's keys on KV layer _indexer_kv[i] (past the decoder's); its chosen keys reused by
        the layers after it that have none (GLM-5's "shared")."""
        self.index_topk = dense_positions(config)
        self.index_rope = indexer_rope(config.model_type) if self.index_topk is not None else None
        with_indexer = [i for i, layer in enumerate(self.layers) if getattr(layer, "indexer", None) is not None]
        self._indexer_kv = {i: len(self.layers) + j for j, i in enumerate(with_indexer)}
        self._sparse = False  # set per pool (_allocate)

    @property
    def kv_layer_count(self) -> int:
        """The decoder's layers, then (a DSA model) one per indexer: its keys' cache."""
        return len(self.layers) + len(self._indexer_kv)

    def kv_shape(self, i: int) -> tuple:
        """The latent entry (1, r + dr) of the decoder's layers; an indexer's keys (1, Di) past them."""
        if i < len(self.layers):
            return self.num_kv_heads, self.head_dim
        return 1, int(self.config.index_head_dim)

    def _allocate(self, max_batch: int, max_tokens_per_row: int, num_blocks: int | None) -> None:
        # one mode per pool (module docstring): sparse where its rows may pass index_topk
        self._sparse = self.index_topk is not None and max_tokens_per_row > self.index_topk
        super()._allocate(max_batch, max_tokens_per_row, num_blocks)

    def score(self, tokens, num_valid=None, *, tree=None, rows=None):
        if tree is not None and self._sparse:  # an UnsupportedModelError: patch_generate hands such a call to transformers
            from .hf import UnsupportedModelError

            raise UnsupportedModelError("token trees are not supported past DeepSeek Sparse Attention's index_topk (a "
                                        "node's chosen keys would be its ancestors' only): use a chain (tree=None)")
        return super().score(tokens, num_valid, tree=tree, rows=rows)

    def _layer_windows(self, model) -> tuple:
        """Each layer's sliding window by the one rule, on attention_config (a DSA model's indexed layers: full)."""
        return windows_per_layer(attention_config(self.config), len(self.layers), _transformers_class(model))

    def _attention(self, i: int, q, attn_lens, cu, max_query_len: int, scale: float, causal: bool = True,
                   pdl: bool = False) -> torch.Tensor:
        """Attention of the absorbed queries q [T, Hq, R + DR] over layer i's latent plane -> [T, Hq, R]:
        the MLA Triton kernel (kernels/attention/triton_mla.py) on the Triton path, else paged_base's
        dispatch with the plane as K and V, its output's first R dims (the value is the latent)."""
        if self.kernels != "triton":
            return super()._attention(i, q, attn_lens, cu, max_query_len, scale, causal, pdl)[..., :self.rank]
        return latent_triton_attention(self, i, q, attn_lens, cu, max_query_len, scale)

    def _rows(self, cu: torch.Tensor, total: int, n: int) -> tuple:
        """A prefill's rows [B, n] again (each row's tokens last, as the prompt gave them): (packed index
        [B, n] (total where padding), [B, 1, n, n] bool: query i sees key j <= i of its row's tokens, and a
        padded query itself alone)."""
        index, real = self._row_index(cu, total, n)
        causal = torch.ones(n, n, dtype=torch.bool, device=self.device).tril()
        sees = (causal & real[:, None, :]) | torch.eye(n, dtype=torch.bool, device=self.device)
        return index, sees[:, None]

    def _expanded_attention(self, layer, q_nope, q_rot, c, k_rot, rows) -> torch.Tensor:
        """A prefill's attention with the latents expanded (expand_prefill_min): keys [W_UK_h c, k_rot] and
        values W_UV_h c per head, over each row's own tokens (causal; the row's cache starts empty), with
        torch's SDPA -- transformers' own form. q_nope [T, Hq, dn], q_rot [T, Hq, dr], c [T, r], k_rot
        [T, 1, dr] -> [T, Hq, dv]."""
        index, sees = rows
        batch, n = index.shape
        total, heads = c.shape[0], q_nope.shape[1]
        k_nope = torch.matmul(c, layer.w_uk.transpose(1, 2)).transpose(0, 1)  # [T, Hq, dn]
        v = torch.matmul(c, layer.w_uv.transpose(1, 2)).transpose(0, 1)  # [T, Hq, dv]
        k = torch.cat((k_nope, k_rot.expand(-1, heads, -1)), dim=-1)
        q = torch.cat((q_nope, q_rot), dim=-1)

        def by_row(t):  # [T, Hq, D] -> [B, Hq, n, D] (padding: zeros)
            return torch.cat((t, t.new_zeros(1, *t.shape[1:])))[index].transpose(1, 2)

        out = F.scaled_dot_product_attention(by_row(q), by_row(k), by_row(v), attn_mask=sees, scale=self.scale)
        packed = out.new_zeros(total + 1, heads, v.shape[-1])
        packed.index_copy_(0, index.reshape(-1), out.transpose(1, 2).reshape(batch * n, heads, -1))
        return packed[:total]

    def _rotation(self, positions: torch.Tensor) -> tuple:
        """One forward's rotation tables for _rotate: (cos, sin) [T, dr] in the model dtype, or for
        DeepSeek-V2 (freqs_cis [T, dr / 2] complex64,) as its rotary module makes it."""
        if self.rope_form == "complex":
            freqs = positions.to(torch.float32)[:, None] * self.inv_freq[None, :]
            return (torch.polar(torch.ones_like(freqs), freqs) * self.rope_scaling,)
        return rope_cos_sin(positions, self.inv_freq, self.rope_scaling, self.dtype)

    def _rotate(self, x: torch.Tensor, rotation: tuple) -> torch.Tensor:
        """x [T, H, dr] rotated by _rotation's tables (transformers' ops of the family)."""
        if self.rope_form == "complex":  # DeepSeek-V2's apply_rotary_emb: pairs as complex numbers, float32
            pairs = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2))
            return torch.view_as_real(pairs * rotation[0][:, None, :]).flatten(-2).type_as(x)
        return rotate_interleaved(x, *rotation) if self.rope_form == "interleaved" else rotate_half_apply(x, *rotation)

    def _choose(self, i: int, indexer, h, q_resid, rotation, cu, rows, positions, slots_of) -> tuple:
        """Layer i's indexer keys appended to their cache, then its chosen keys (sparse_mla.choose); slots_of(KV
        layer) -> its rows' slots [B, S] (sparse_mla.row_slots, once a cache per call)."""
        kv = self._indexer_kv[i]
        self._append(kv, *(indexer_key(indexer, h, rotation, self.index_rope),) * 2, cu)
        return choose(indexer, h, q_resid, rotation, self.index_rope, self.k_caches[kv], slots_of(kv), rows, positions,
                      self.index_topk)

    def _decode(self, flat, positions, cu, attn_lens, n) -> torch.Tensor:
        """Packed tokens [T] at positions [T] -> final-norm hidden states [T, H]."""
        total, heads, rank, dn = flat.shape[0], self.num_heads, self.rank, self.nope_dims
        fused = fused_layer_math(self.dtype, self.device.type)  # C++ RMSNorm / SwiGLU (CPU float32)
        rotation = self._rotation(positions)  # once per call
        sum_ = self._sum_partials
        rows = self._rows(cu, total, n) if self._prefilling and n >= self.expand_prefill_min and not self._sparse \
            else None
        sparse = self._row_index(cu, total, n) if self._sparse else None  # DSA past index_topk: sparse_mla.py
        chosen, slots = None, {}

        def slots_of(i: int) -> torch.Tensor:  # KV layer i's rows as slots [B, S]: once a cache per call (its layers
            c = self._layer_cache[i][0]        # share one block table)
            if c not in slots:
                slots[c] = row_slots(self._tables[i], self.block_size)
            return slots[c]

        x = self._embed(flat)
        self._keep(0, x)
        for i, layer in enumerate(self.layers):
            h = rms_norm(x, *layer.ln_in, fused)
            q_resid = h if layer.q_a is None else rms_norm(linear(h, *layer.q_a), *layer.q_a_norm, fused)
            q = linear(q_resid, *layer.q).view(total, heads, -1)  # [T, Hq, dn + dr]
            latent = linear(h, *layer.kv_a)  # [T, r + dr]: c, then k_rot
            c = rms_norm(latent[:, :rank].contiguous(), *layer.kv_a_norm, fused)
            q_rot, k_rot = self._rotate(q[..., dn:], rotation), self._rotate(latent[:, None, rank:], rotation)
            entry = torch.cat((c[:, None], k_rot), dim=-1)  # [T, 1, r + dr]: the key, and (its first r dims) the value
            if rows is not None:  # a long prefill: the latents cached, the attention over them expanded
                self._append(i, entry, entry, cu)
                o = self._expanded_attention(layer, q[..., :dn], q_rot, c, k_rot, rows)  # [T, Hq, dv]
            else:
                q_lat = torch.bmm(q[..., :dn].transpose(0, 1), layer.w_uk).transpose(0, 1)  # [T, Hq, r] = W_UK^T q_nope
                q_abs = torch.cat((q_lat, q_rot), dim=-1)
                if sparse is not None:  # the chosen keys (this layer's indexer, or the last one's), attention over them
                    if layer.indexer is not None:
                        chosen = self._choose(i, layer.indexer, h, q_resid, rotation, cu, sparse, positions, slots_of)
                    self._append(i, entry, entry, cu)
                    o = chosen_attention(q_abs, self.k_caches[i], slots_of(i), sparse, chosen, self.scale, rank)
                else:
                    o = self._attend(i, q_abs, entry, entry, attn_lens, cu, n, self.scale)
                o = torch.bmm(o.transpose(0, 1), layer.w_uv.transpose(1, 2)).transpose(0, 1)  # [T, Hq, dv] = W_UV (p c)
            x = x + sum_(linear(o.reshape(total, -1), *layer.o))
            h = rms_norm(x, *layer.ln_post, fused)
            if layer.moe is not None:
                delta = sum_(layer.moe(h, self._prefilling))  # (the norm after the ranks' partials are summed)
                x = x + (delta if layer.moe_out_norm is None else rms_norm(delta, *layer.moe_out_norm, fused))
            else:
                x = x + sum_(linear(gated_act(linear(h, *layer.gate), linear(h, *layer.up), layer.act, self.silu, fused),
                                    *layer.down))
            if i + 1 < len(self.layers):
                self._keep(i + 1, x)
        out = rms_norm(x, *self.final_norm, fused)
        self._keep(len(self.layers), out)
        return out
