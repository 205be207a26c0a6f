"""PagedFalconH1Runner: TII's Falcon-H1 (model_type falcon_h1: 0.5B-34B, Falcon-H1R) on the paged KV cache -- each
layer runs a Mamba2 mixer and attention side by side -- with the Mamba2 states rolled back at commit
(runners/paged_recurrent.py).

The math is transformers 5.24's FalconH1DecoderLayer (modeling_falcon_h1.py), eval mode:
    x = embed(ids) * embedding_multiplier
    per layer:  h = rms(x)
                x = x + mamba(h) * ssm_out_multiplier + attention(h * attention_in_multiplier) * attention_out_multiplier
                x = x + down(up(f) * silu(gate(f) * gate_multiplier)) * down_multiplier,   f = rms_ff(x)
    logits = lm_head(rms(x)) * lm_head_multiplier
with Llama's RMSNorm; the Mamba2 mixer is runners/mamba2.py's with Falcon-H1's variations (ssm_in_multiplier on
its input, mup_vector on its projection, its gated norm optional and before or after the gate); attention is
Llama's with RoPE, its keys times key_multiplier. Every layer has a KV cache and a Mamba2 state. Token trees: each
node from its parent's states (runners/paged_recurrent.py). Tensor parallelism: runners/paged_falcon_h1_tp.py. Not
timed on a GPU.
"""
import torch

from ._layer_math import fused_layer_math, linear_params, norm_params, rms_norm, rope_cos_sin
from ._linear import linear
from ._rotary import static_rope_reason
from ..kernels.llama_ops.reference import rotate_half_apply
from .mamba2 import Mamba2, mamba2_forward
from .paged_base import decoder_reason, head_dim_reason
from .paged_recurrent import PagedRecurrentRunner

FALCON_H1_TYPES = ("falcon_h1",)


def _projections(layer) -> tuple:
    """A layer's projection modules (for plain_projections_reason)."""
    attn, mlp = layer.self_attn, layer.feed_forward
    return (layer.mamba.in_proj, layer.mamba.out_proj, attn.q_proj, attn.k_proj, attn.v_proj, attn.o_proj,
            mlp.gate_proj, mlp.up_proj, mlp.down_proj)


def falcon_h1_unsupported_reason(model, max_tokens_per_row: int | None = None, backend=None) -> str | None:
    """Why PagedFalconH1Runner cannot run ``model``, or None when it can."""
    reason = decoder_reason(model, FALCON_H1_TYPES, "model.layers", "a FalconH1ForCausalLM", _projections)
    if reason is not None:
        return reason
    config = model.config
    if config.hidden_act != "silu":
        return f"hidden_act {config.hidden_act!r}: the Mamba2 convolution here takes silu"
    rotary = getattr(model.model, "rotary_emb", None)
    reason = static_rope_reason(getattr(rotary, "rope_type", None)) if rotary is not None else "no rotary_emb"
    return reason or head_dim_reason(model.model.layers[0].self_attn.head_dim, backend)


class _Layer:
    """One layer's tensors: the two norms (weight, eps), its Mamba2 mixer, attention's q / k / v / o (weight,
    bias), the MLP's gate / up / down (weight, bias) and activation."""

    kind = "both"  # a Mamba2 mixer and attention: PagedFalconH1Runner._index_layers

    def __init__(self, layer):
        self.ln_in, self.ln_ff = norm_params(layer.input_layernorm), norm_params(layer.pre_ff_layernorm)
        self.mixer = Mamba2(layer.mamba)
        attn, mlp = layer.self_attn, layer.feed_forward
        self.q, self.k, self.v, self.o = linear_params(attn.q_proj, attn.k_proj, attn.v_proj, attn.o_proj)
        self.gate, self.up, self.down = linear_params(mlp.gate_proj, mlp.up_proj, mlp.down_proj)
        self.act = mlp.act_fn


class PagedFalconH1Runner(PagedRecurrentRunner):
    """Runner (see runners/base.py) for a FalconH1ForCausalLM instance (weights shared); the arguments are
    PagedRunnerBase's. Token trees: each node from its parent's states (runners/paged_recurrent.py)."""

    unsupported_reason = staticmethod(falcon_h1_unsupported_reason)

    def _bind(self, model) -> None:
        inner, config = model.model, model.config
        self.embed = inner.embed_tokens.weight
        self.layers = [_Layer(layer) for layer in inner.layers]
        self.final_norm = norm_params(inner.final_layernorm)
        self.lm_head = model.get_output_embeddings().weight
        self._index_layers()
        self._bind_heads(config)
        self.head_dim = inner.layers[0].self_attn.head_dim
        self.scale = self.head_dim ** -0.5
        self.multipliers = dict(embedding=config.embedding_multiplier, lm_head=config.lm_head_multiplier,
                                key=config.key_multiplier, attention_in=config.attention_in_multiplier,
                                attention_out=config.attention_out_multiplier, ssm_out=config.ssm_out_multiplier)
        self.gate_multiplier, self.down_multiplier = config.mlp_multipliers
        rotary = inner.rotary_emb
        self.rope = (rotary.inv_freq.to(device=self.device, dtype=torch.float32), float(rotary.attention_scaling))

    def _index_layers(self) -> None:
        """Every layer has both: attention on KV layer i, a Mamba2 state i."""
        self._attention_index = self._recurrent_index = {i: i for i in range(len(self.layers))}
        self.recurrent_shapes = [layer.mixer.shapes for layer in self.layers]

    def _logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """The lm_head product times lm_head_multiplier (transformers' op, in the model dtype)."""
        return super()._logits(hidden) * self.multipliers["lm_head"]

    def _decode(self, flat, positions, cu, attn_lens, n) -> torch.Tensor:
        """Packed tokens [T] at positions [T] -> final-norm hidden states [T, H]."""
        total, heads, kv_heads, dim = flat.shape[0], self.num_heads, self.num_kv_heads, self.head_dim
        fused = fused_layer_math(self.dtype, self.device.type)
        rows = self._row_layout(cu, total, n)
        cos, sin = rope_cos_sin(positions, *self.rope, self.dtype)
        m = self.multipliers
        x = self._embed(flat) * m["embedding"]
        self._keep(0, x)
        for i, layer in enumerate(self.layers):
            h = rms_norm(x, *layer.ln_in, fused)
            ssm = mamba2_forward(layer.mixer, self.states[i], h, rows, self._prefilling) * m["ssm_out"]
            a = h * m["attention_in"]
            q = linear(a, *layer.q).view(total, heads, dim)
            k = linear(a, *layer.k).view(total, kv_heads, dim) * m["key"]
            v = linear(a, *layer.v).view(total, kv_heads, dim)
            q, k = rotate_half_apply(q, cos, sin), rotate_half_apply(k, cos, sin)
            o = self._attend(i, q, k, v, attn_lens, cu, n, self.scale)
            # (a tensor-parallel rank's partials of both branches summed by one all-reduce, then the MLP's)
            x = x + self._sum_partials(ssm + linear(o.reshape(total, -1), *layer.o) * m["attention_out"])
            f = rms_norm(x, *layer.ln_ff, fused)
            y = linear(f, *layer.up) * layer.act(linear(f, *layer.gate) * self.gate_multiplier)
            x = x + self._sum_partials(linear(y, *layer.down)) * self.down_multiplier
            if i + 1 < len(self.layers):
                self._keep(i + 1, x)
        out = rms_norm(x, *self.final_norm, fused)
        self._keep(len(self.layers), out)
        return out
