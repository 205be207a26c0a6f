"""PagedGraniteHybridRunner: IBM's Granite 4.0 hybrids (model_type granitemoehybrid with Mamba2 layers or experts:
Granite 4.0-H Micro / Tiny / Small) and Bamba (bamba: Bamba-9B, the same layer without experts and scalars, its MLP
and norms under other names) on the paged KV cache, the Mamba2 states rolled back at commit
(runners/paged_recurrent.py). Granite 4.0's dense transformers (attention layers only, no experts) stay on the
Llama runner with its fused layer kernels (runners/registry.py chooses by the config: granite_is_hybrid).

The math is transformers 5.24's GraniteMoeHybridDecoderLayer (modeling_granitemoehybrid.py), eval mode:
    x = embed(ids) * embedding_multiplier
    per layer:  x = x + mixer(rms(x)) * residual_multiplier       mixer: Mamba2 (runners/mamba2.py) or attention
                x = x + (moe(h) + shared(h)) * residual_multiplier,  h = rms(x)   (shared(h) alone without experts)
    logits = lm_head(rms(x)) / logits_scaling
with Llama's RMSNorm; attention q/k/v/o (attention_bias), RoPE only where position_embedding_type is "rope"
(Granite 4.0-H: none; Bamba: always, on its partial_rotary_factor), attention_multiplier as the softmax scale
(Bamba: head_dim^-0.5, and its scalars 1); the shared MLP's input_linear [gate | up] rows (read as views) and
output_linear (SwiGLU; Bamba's feed_forward gate / up / down); the experts (runners/_moe.py: softmax over the top-k float32 router logits, cast to
the model dtype; gated experts through the MoE kernels). Token trees: each node from its parent's states (runners/paged_recurrent.py).
Not timed on a GPU.
"""
import torch

from ._layer_math import fused_layer_math, linear_params, norm_params, rms_norm, rope_cos_sin
from ._linear import linear
from ._moe import MoE, moe_reason
from ._rotary import static_rope_reason
from ..kernels.llama_ops.reference import rotate_half_apply
from .mamba2 import Mamba2, mamba2_forward
from .paged_base import decoder_reason, head_dim_reason
from .paged_recurrent import PagedRecurrentRunner, layer_kinds_reason

GRANITE_HYBRID_TYPES = ("granitemoehybrid", "bamba")
LAYER_KINDS = ("linear_attention", "full_attention")


def granite_is_hybrid(config) -> bool:
    """Whether a granitemoehybrid config has Mamba2 layers or experts (this runner's), not attention layers alone
    (the Llama runner's: Granite 4.0 Micro, the Nano 350M / 1B)."""
    kinds = getattr(config, "layer_types", None) or ()
    return any(kind != "full_attention" for kind in kinds) or (getattr(config, "num_local_experts", 0) or 0) > 0


def _projections(layer) -> tuple:
    """A layer's projection modules (for plain_projections_reason): the mixer's, the (shared) MLP's."""
    mixer = (layer.mamba.in_proj, layer.mamba.out_proj) if layer.block_type == "linear_attention" else \
        (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj, layer.self_attn.o_proj)
    mlp = getattr(layer, "shared_mlp", None)
    if mlp is not None:
        return mixer + (mlp.input_linear, mlp.output_linear)
    return mixer + (layer.feed_forward.gate_proj, layer.feed_forward.up_proj, layer.feed_forward.down_proj)


def granite_hybrid_unsupported_reason(model, max_tokens_per_row: int | None = None, backend=None) -> str | None:
    """Why PagedGraniteHybridRunner cannot run ``model``, or None when it can."""
    config = getattr(model, "config", None)
    kinds = set(getattr(config, "layer_types", None) or ())
    reason = layer_kinds_reason(config, LAYER_KINDS) or decoder_reason(
        model, GRANITE_HYBRID_TYPES, "model.layers", "a GraniteMoeHybridForCausalLM or BambaForCausalLM", _projections)
    if reason is not None:
        return reason
    for i, layer in enumerate(model.model.layers):
        moe = layer.block_sparse_moe if getattr(layer, "has_experts", False) else None
        reason = None if moe is None else moe_reason(moe, config)
        if reason is not None:
            return f"layer {i}: {reason}"
    if config.hidden_act != "silu":
        return f"hidden_act {config.hidden_act!r}: the Mamba2 convolution here takes silu"
    if "full_attention" not in kinds:
        return None
    rotary = getattr(model.model, "rotary_emb", None)
    reason = static_rope_reason(getattr(rotary, "rope_type", None)) if rotary is not None else None
    return reason or head_dim_reason(getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads,
                                     backend)


class _Layer:
    """One layer's tensors: its kind, the two norms (weight, eps), the mixer's (a Mamba2, or attention's q / k /
    v / o (weight, bias)), the (shared) MLP's gate / up / down (weight, bias: Granite's fused input_linear rows as
    views) and activation, its MoE or None."""

    def __init__(self, layer, config, kernels: str):
        self.kind = layer.block_type
        post = getattr(layer, "post_attention_layernorm", None) or layer.pre_ff_layernorm  # Granite's / Bamba's name
        self.ln_in, self.ln_post = norm_params(layer.input_layernorm), norm_params(post)
        if self.kind == "linear_attention":
            self.mixer = Mamba2(layer.mamba)
        else:
            attn = layer.self_attn
            self.q, self.k, self.v, self.o = linear_params(attn.q_proj, attn.k_proj, attn.v_proj, attn.o_proj)
        mlp = getattr(layer, "shared_mlp", None)
        if mlp is not None:  # Granite: input_linear's [gate | up] rows
            fused, width = mlp.input_linear.weight, mlp.input_linear.weight.shape[0] // 2
            self.gate, self.up = (fused[:width], None), (fused[width:], None)
            (self.down,), self.act = linear_params(mlp.output_linear), mlp.activation
        else:  # Bamba's feed_forward
            mlp = layer.feed_forward
            (self.gate, self.up, self.down), self.act = linear_params(mlp.gate_proj, mlp.up_proj, mlp.down_proj), mlp.act_fn
        self.moe = MoE(layer.block_sparse_moe, config, kernels) if getattr(layer, "has_experts", False) else None


class PagedGraniteHybridRunner(PagedRecurrentRunner):
    """Runner (see runners/base.py) for a GraniteMoeHybridForCausalLM with Mamba2 layers or experts, or a
    BambaForCausalLM (weights shared); the arguments are PagedRunnerBase's. Token trees: each node from
    its parent's states."""

    unsupported_reason = staticmethod(granite_hybrid_unsupported_reason)

    def _bind(self, model) -> None:
        inner, config = model.model, model.config
        self.embed = inner.embed_tokens.weight
        self.layers = [_Layer(layer, config, self.kernels) for layer in inner.layers]
        self.final_norm = norm_params(getattr(inner, "norm", None) or inner.final_layernorm)  # Granite's / Bamba's
        self.lm_head = model.get_output_embeddings().weight
        self._index_layers()
        self._bind_heads(config)
        self.scale = float(getattr(config, "attention_multiplier", self.scale))  # Bamba: head_dim^-0.5 (_bind_heads')
        # Granite's four scalars (Bamba has none: 1)
        self.embedding_multiplier = getattr(config, "embedding_multiplier", 1.0)
        self.residual_multiplier = getattr(config, "residual_multiplier", 1.0)
        self.logits_scaling = getattr(config, "logits_scaling", 1.0)
        rotary = getattr(inner, "rotary_emb", None)  # None without RoPE (Granite 4.0-H's position_embedding_type)
        self.rope = None if rotary is None else (rotary.inv_freq.to(device=self.device, dtype=torch.float32),
                                                 float(rotary.attention_scaling))

    def _embed(self, flat: torch.Tensor) -> torch.Tensor:
        """The embedding times Granite's embedding_multiplier (a tensor-parallel rank's: TensorParallelRunner's)."""
        return super()._embed(flat) * self.embedding_multiplier

    def _logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """The lm_head product divided by logits_scaling (transformers' op, in the model dtype)."""
        return super()._logits(hidden) / self.logits_scaling

    def _decode(self, flat, positions, cu, attn_lens, n) -> torch.Tensor:
        """Packed tokens [T] at positions [T] -> final-norm hidden states [T, H]."""
        total, heads, kv_heads, dim = flat.shape[0], self.num_heads, self.num_kv_heads, self.head_dim
        fused = fused_layer_math(self.dtype, self.device.type)
        rows = self._row_layout(cu, total, n)
        rotation = None if self.rope is None else rope_cos_sin(positions, *self.rope, self.dtype)
        x = self._embed(flat)
        self._keep(0, x)
        for i, layer in enumerate(self.layers):
            h = rms_norm(x, *layer.ln_in, fused)
            if layer.kind == "linear_attention":
                out = mamba2_forward(layer.mixer, self.states[self._recurrent_index[i]], h, rows, self._prefilling)
            else:
                q = linear(h, *layer.q).view(total, heads, dim)
                k, v = (linear(h, *p).view(total, kv_heads, dim) for p in (layer.k, layer.v))
                if rotation is not None:
                    q, k = rotate_half_apply(q, *rotation), rotate_half_apply(k, *rotation)
                o = self._attend(self._attention_index[i], q, k, v, attn_lens, cu, n, self.scale)
                out = linear(o.reshape(total, -1), *layer.o)
            x = x + self._sum_partials(out) * self.residual_multiplier  # (a tensor-parallel rank's partials summed)
            h = rms_norm(x, *layer.ln_post, fused)
            out = linear(layer.act(linear(h, *layer.gate)) * linear(h, *layer.up), *layer.down)
            if layer.moe is not None:
                out = layer.moe(h, self._prefilling) + out
            x = x + self._sum_partials(out) * self.residual_multiplier
            if i + 1 < len(self.layers):
                self._keep(i + 1, x)
        out = rms_norm(x, *self.final_norm, fused)
        self._keep(len(self.layers), out)
        return out
