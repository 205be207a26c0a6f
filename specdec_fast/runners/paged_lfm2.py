"""PagedLfm2Runner: Liquid AI's LFM2 (model_type lfm2: LFM2-350M / 700M / 1.2B / 2.6B; lfm2_moe; lfm3) -- gated
short-convolution layers with a few attention layers between them -- on the paged KV cache, with speculative decoding's
rollback of the convolutions' states (runners/paged_recurrent.py: a convolution layer is its recurrent kind, whose state is the
convolution's last L - 1 inputs alone).

The math is transformers 5.24's Lfm2DecoderLayer (modeling_lfm2.py), eval mode; every RMSNorm Llama's:
    x = x + mixer(operator_norm x);  x = x + w2(silu(w1 h) * w3 h), h = ffn_norm x
    "conv"            Lfm2ShortConv: B, C, x = in_proj(h) in thirds; y = C * conv(B * x); out_proj y -- conv a causal
                      depthwise convolution of kernel conv_L_cache (3) over the row, no activation
    "full_attention"  q / k normed per head (q_layernorm / k_layernorm), RoPE, paged attention, out_proj
    logits = lm_head(embedding_norm x)            (the final norm's name)
LFM2-MoE (lfm2_moe: LFM2-8B-A1B) has the same layers with MoE blocks after its num_dense_layers: sigmoid scores of
the model-dtype router product, the top k by score + the block's expert_bias (where use_expert_bias), over their
sum + 1e-6 where norm_topk_prob, times routed_scaling_factor (runners/_moe.py SIGMOID_TOPK_VARIANTS).
LFM3 (lfm3: LFM3-1.7B; transformers 5.24's Lfm3DecoderLayer) adds, where its config asks:
    sandwich norms         each branch's output RMS-normed before the residual (post_operator_norm, post_ffn_norm)
    an attention gate      each head's output times sigmoid(g_proj h) (one gate a head) before o_proj
    sliding layers         "sliding_attention" layers see their last sliding_window keys (the paged kernels' window)
    a RoPE per layer type  the sliding layers' and the full layers' own tables (the full ones' "proportional": half
                           of each head rotated, its other frequencies zero) (runners/_rotary.py rope_tables)
and a convolution of kernel 7.
A score call's tokens read each row's window of its last L - 1 inputs (committed, or the last snapshot) and write a
snapshot after each; a prefill runs the convolution over each row at once. Left padding: transformers zeroes a
padded position's input, so B * x is zero there without a conv bias (the checkpoints' conv_bias False; a bias is
refused); here padded positions do not reach the convolution at all. Token trees: each node's window along its
ancestors (RecurrentStates.conv_steps). No tensor-parallel runner. Not timed on a GPU.
"""
import torch
import torch.nn.functional as F

from ..kernels.llama_ops.reference import rotate_half_apply
from ._layer_math import linear_params, norm_params
from ._linear import linear
from ._moe import MoE, is_moe, layers_moe_reason
from ._rotary import rope_tables, rotations, static_rope_reason
from .paged_base import decoder_reason, head_dim_reason
from .paged_olmo2 import llama_rms_norm
from .paged_recurrent import PagedRecurrentRunner, layer_kinds_reason, padded_bias_reason, prefill_conv

LFM2_TYPES = ("lfm2", "lfm2_moe", "lfm3")  # LFM2-MoE (LFM2-8B-A1B): LFM2's layers, MoE blocks after num_dense_layers
LAYER_KINDS = ("conv", "full_attention", "sliding_attention")  # sliding: LFM3's


def _projections(layer) -> tuple:
    """A layer's projection modules (for plain_projections_reason; a MoE block's experts are 3-D tensors, its router
    checked by moe_reason)."""
    ff = layer.feed_forward
    mlp = () if is_moe(ff) else (ff.w1, ff.w3, ff.w2)
    if layer.is_attention_layer:
        attn = layer.self_attn
        gate = (attn.g_proj,) if getattr(attn, "g_proj", None) is not None else ()
        return (attn.q_proj, attn.k_proj, attn.v_proj, _out_proj(attn)) + gate + mlp
    return (layer.conv.in_proj, layer.conv.out_proj) + mlp


def _out_proj(attn):
    """The attention's output projection: LFM2's out_proj, LFM3's o_proj (Qwen3's attention)."""
    return attn.out_proj if hasattr(attn, "out_proj") else attn.o_proj


def lfm2_unsupported_reason(model, max_tokens_per_row: int | None = None, backend=None) -> str | None:
    """Why PagedLfm2Runner cannot run ``model`` (an Lfm2ForCausalLM or Lfm2MoeForCausalLM), or None when it can."""
    config = getattr(model, "config", None)
    reason = layer_kinds_reason(config, LAYER_KINDS) or decoder_reason(
        model, LFM2_TYPES, "model.layers", "an Lfm2ForCausalLM or Lfm2MoeForCausalLM", _projections)
    if reason is not None:
        return reason
    reason = padded_bias_reason(config, "conv_bias") or layers_moe_reason(
        [layer.feed_forward for layer in model.model.layers], config)
    if reason is not None:
        return reason
    if getattr(config, "attention_bias", False):
        return "attention_bias: the attention's projection biases are not read by this runner"
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    for _, _, rope_type in _rope(model)[0].values():
        reason = static_rope_reason(rope_type)
        if reason is not None:
            return reason
    return head_dim_reason(head_dim, backend)


def _rope(model) -> tuple:
    """({key: (inv_freq, scaling, rope_type)}, each layer's key): LFM3's table per layer type (rope_tables), or
    LFM2's one (its rotary_emb, LFM2-MoE's pos_emb) under None."""
    tables = rope_tables(model)
    if tables is not None:
        return tables
    rotary = _rotary(model.model)
    return {None: (rotary.inv_freq, rotary.attention_scaling, getattr(rotary, "rope_type", None))}, \
        [None] * len(model.model.layers)


def _rotary(inner):
    """The decoder's rotary module: LFM2's rotary_emb, LFM2-MoE's pos_emb."""
    rotary = getattr(inner, "rotary_emb", None)
    return rotary if rotary is not None else inner.pos_emb


class _ShortConv:
    """A gated short convolution's tensors (references): in_proj / out_proj (weight, bias), the convolution's weight
    [C, L] and bias; its state shapes (the window (C, L - 1); a 1-wide recurrent slot: it has none)."""

    def __init__(self, module):
        self.in_proj, self.out_proj = linear_params(module.in_proj, module.out_proj)
        self.weight, self.bias = module.conv.weight[:, 0], module.conv.bias
        self.channels, self.kernel = self.weight.shape

    @property
    def shapes(self) -> tuple:
        return (self.channels, self.kernel - 1), (1,)


class _Layer:
    """One layer's kind (a convolution layer is the recurrent kind, "linear_attention", for _index_layers), its
    mixer's tensors, norms and MLP (references)."""

    def __init__(self, layer, config, kernels: str):
        self.kind = "full_attention" if layer.is_attention_layer else "linear_attention"  # sliding ones too
        if layer.is_attention_layer:
            attn = layer.self_attn
            self.q, self.k, self.v, self.o = linear_params(attn.q_proj, attn.k_proj, attn.v_proj, _out_proj(attn))
            self.q_norm = norm_params(getattr(attn, "q_layernorm", None) or attn.q_norm)  # LFM3's: Qwen3's names
            self.k_norm = norm_params(getattr(attn, "k_layernorm", None) or attn.k_norm)
            gate = getattr(attn, "g_proj", None)  # LFM3's attention gate: one a head
            self.gate = None if gate is None else linear_params(gate)[0]
        else:
            self.mixer = _ShortConv(layer.conv)
        self.operator_norm, self.ffn_norm = norm_params(layer.operator_norm), norm_params(layer.ffn_norm)
        # LFM3's sandwich norms (nn.Identity where use_sandwich_norm is off: no weight)
        self.post_operator_norm, self.post_ffn_norm = (
            norm_params(norm) if hasattr(norm, "weight") else None
            for norm in (getattr(layer, "post_operator_norm", None), getattr(layer, "post_ffn_norm", None)))
        mlp = layer.feed_forward
        self.moe = MoE(mlp, config, kernels) if is_moe(mlp) else None  # LFM2-MoE's blocks
        if self.moe is None:
            self.w1, self.w3, self.w2 = linear_params(mlp.w1, mlp.w3, mlp.w2)


class PagedLfm2Runner(PagedRecurrentRunner):
    """Runner (see runners/base.py) for an Lfm2ForCausalLM instance (weights shared); the arguments are
    PagedRunnerBase's. Token trees: each node's window along its ancestors."""

    unsupported_reason = staticmethod(lfm2_unsupported_reason)

    def _bind(self, model) -> None:
        config, inner = model.config, model.model
        self.embed = inner.embed_tokens.weight
        self.layers = [_Layer(layer, config, self.kernels) for layer in inner.layers]
        self._index_layers()
        self.final_norm = norm_params(inner.embedding_norm)
        self.lm_head = model.get_output_embeddings().weight
        self._bind_heads(config)
        tables, self.rope_keys = _rope(model)
        self.rope_tables = {key: (inv_freq.to(device=self.device, dtype=torch.float32), float(scaling))
                            for key, (inv_freq, scaling, _) in tables.items()}

    def _layer_windows(self, model) -> tuple:
        """Each attention layer's window in KV-layer order: LFM3's sliding_attention layers' sliding_window (as its
        Qwen3 attention reads it), None for a full one."""
        kinds = model.config.layer_types
        window = getattr(model.config, "sliding_window", None)
        return tuple(window if kinds[i] == "sliding_attention" else None
                     for i, layer in enumerate(self.layers) if layer.kind == "full_attention") or (None,)

    def _decode(self, flat, positions, cu, attn_lens, n) -> torch.Tensor:
        """Packed tokens [T] at positions [T] -> final-norm hidden states [T, H]."""
        total, heads, kv_heads, dim = flat.shape[0], self.num_heads, self.num_kv_heads, self.head_dim
        tables = rotations(self.rope_tables, positions, self.dtype)  # [T, D] cos / sin a layer type, once per call
        rows = self._row_layout(cu, total, n)
        x = self._embed(flat)
        self._keep(0, x)
        for i, layer in enumerate(self.layers):
            h = llama_rms_norm(x, layer.operator_norm)
            if layer.kind == "full_attention":
                q = llama_rms_norm(linear(h, *layer.q).view(total, heads, dim), layer.q_norm)
                k = llama_rms_norm(linear(h, *layer.k).view(total, kv_heads, dim), layer.k_norm)
                v = linear(h, *layer.v).view(total, kv_heads, dim)
                cos, sin = tables[self.rope_keys[i]]
                q, k = rotate_half_apply(q, cos, sin), rotate_half_apply(k, cos, sin)
                o = self._attend(self._attention_index[i], q, k, v, attn_lens, cu, n, self.scale)
                if layer.gate is not None:  # LFM3: each head's output times sigmoid(g_proj h)
                    o = o * torch.sigmoid(linear(h, *layer.gate))[..., None]
                branch = linear(o.reshape(total, -1), *layer.o)
            else:
                branch = self._short_conv(layer.mixer, self.states[self._recurrent_index[i]], h, rows)
            x = x + (branch if layer.post_operator_norm is None else llama_rms_norm(branch, layer.post_operator_norm))
            h = llama_rms_norm(x, layer.ffn_norm)
            if layer.moe is not None:
                branch = layer.moe(h, self._prefilling)
            else:
                branch = linear(F.silu(linear(h, *layer.w1)) * linear(h, *layer.w3), *layer.w2)
            x = x + (branch if layer.post_ffn_norm is None else llama_rms_norm(branch, layer.post_ffn_norm))
            if i + 1 < len(self.layers):
                self._keep(i + 1, x)
        out = llama_rms_norm(x, self.final_norm)
        self._keep(len(self.layers), out)
        return out

    def _short_conv(self, conv: _ShortConv, st, h: torch.Tensor, rows: tuple) -> torch.Tensor:
        """One gated short convolution over the call's tokens h [T, H] -> its output [T, H]: a prefill over each
        row at once (the last L - 1 inputs committed); a score call from each row's window (committed, or the last
        snapshot), a snapshot written after each token."""
        index, real, slot, start, _ = rows
        batch, n = index.shape
        total = h.shape[0]
        b, c, x = linear(h, *conv.in_proj).chunk(3, dim=-1)
        bx = b * x
        by_row = torch.cat((bx, torch.zeros_like(bx[:1])))[index]  # [B, n, C]: each row's tokens last, padding zeros
        if self._prefilling:
            y, last = prefill_conv(by_row.transpose(1, 2), conv.weight, conv.bias, conv.kernel)  # [B, C, n]
            st.conv[:batch].copy_(last)
            y = y.transpose(1, 2)
        else:  # each row's windows, a snapshot after each token (along its ancestors in a tree)
            y = st.conv_steps(by_row, conv.weight, conv.bias, rows, silu=False)  # [B, n, C]
        packed = torch.zeros(total + 1, conv.channels, dtype=h.dtype, device=h.device)
        packed.index_copy_(0, index.reshape(-1), y.to(h.dtype).reshape(batch * n, conv.channels))
        return linear(c * packed[:total], *conv.out_proj)
