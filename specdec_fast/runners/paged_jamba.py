"""PagedJambaRunner: AI21's Jamba (model_type jamba: Jamba 1.5 / 1.6 / 1.7 Mini and Large, Jamba Reasoning 3B) --
Mamba1 layers with an attention layer every attn_layer_period, experts every expert_layer_period -- on the paged KV
cache, with speculative decoding's rollback of the Mamba states (runners/paged_recurrent.py; the mixer:
runners/mamba1.py, its dt / B / C RMS-normed by Jamba's weighted norms).

The math is transformers 5.24's JambaAttentionDecoderLayer / JambaMambaDecoderLayer (modeling_jamba.py), eval mode;
every RMSNorm Llama's:
    x = x + mixer(input_layernorm x);  x = x + feed_forward(pre_ff_layernorm x)
    mixer          "mamba": the Mamba1 mixer; "attention": q / k / v without positions (no RoPE: the Mamba layers
                   carry the order), head_dim^-0.5, on the paged cache, o_proj
    feed_forward   a SwiGLU MLP, or the MoE block (runners/_moe.py: softmax in float32, the top k not
                   renormalised, cast to the model dtype)
    logits = lm_head(final_layernorm x)
Token trees: each node from its parent's states (runners/paged_recurrent.py). A Mamba projection bias (mamba_proj_bias) is refused: transformers zeroes a padded
position's input, whose biased projection would then reach the convolution. Tensor parallelism:
runners/paged_jamba_tp.py. Not timed on a GPU.
"""
import torch

from ._layer_math import linear_params, norm_params
from ._linear import linear
from ._moe import is_moe, moe_or_gated_mlp, layers_moe_reason, moe_or_mlp
from .mamba1 import Mamba1, mamba1_forward
from .paged_base import decoder_reason, head_dim_reason
from .paged_olmo2 import llama_rms_norm
from .paged_recurrent import PagedRecurrentRunner, padded_bias_reason

JAMBA_TYPES = ("jamba",)


def _projections(layer) -> tuple:
    """A layer's projection modules (for plain_projections_reason; a MoE block's experts are 3-D tensors)."""
    ff = layer.feed_forward
    mlp = () if is_moe(ff) else (ff.gate_proj, ff.up_proj, ff.down_proj)
    mixer = getattr(layer, "mamba", None)
    if mixer is not None:
        return (mixer.in_proj, mixer.x_proj, mixer.dt_proj, mixer.out_proj) + mlp
    attn = layer.self_attn
    return (attn.q_proj, attn.k_proj, attn.v_proj, attn.o_proj) + mlp


def jamba_unsupported_reason(model, max_tokens_per_row: int | None = None, backend=None) -> str | None:
    """Why PagedJambaRunner cannot run ``model``, or None when it can."""
    reason = decoder_reason(model, JAMBA_TYPES, "model.layers", "a JambaForCausalLM", _projections)
    if reason is not None:
        return reason
    config = model.config
    if config.hidden_act != "silu":
        return f"a Mamba convolution with activation {config.hidden_act!r}"
    reason = padded_bias_reason(config, "mamba_proj_bias")
    if reason is not None:
        return reason
    if getattr(config, "sliding_window", None):
        return f"sliding_window {config.sliding_window}: Jamba's attention layers here are full"
    reason = layers_moe_reason([layer.feed_forward for layer in model.model.layers], config)
    return reason or head_dim_reason(config.hidden_size // config.num_attention_heads, backend)


class _Layer:
    """One layer's kind ("linear_attention": Mamba, for _index_layers; "full_attention"), norms, mixer's tensors and
    feed-forward (references)."""

    def __init__(self, layer, config, kernels: str):
        mixer = getattr(layer, "mamba", None)
        self.kind = "linear_attention" if mixer is not None else "full_attention"
        if mixer is not None:
            self.mixer = Mamba1(mixer)
        else:
            attn = layer.self_attn
            self.q, self.k, self.v, self.o = linear_params(attn.q_proj, attn.k_proj, attn.v_proj, attn.o_proj)
        self.input, self.pre_ff = norm_params(layer.input_layernorm), norm_params(layer.pre_ff_layernorm)
        ff = layer.feed_forward
        self.moe, mlp, self.act = moe_or_gated_mlp(ff, config, kernels)
        self.gate, self.up, self.down = mlp or (None, None, None)


class PagedJambaRunner(PagedRecurrentRunner):
    """Runner (see runners/base.py) for a JambaForCausalLM instance (weights shared); the arguments are
    PagedRunnerBase's. Token trees: each node from its parent's states."""

    unsupported_reason = staticmethod(jamba_unsupported_reason)

    def _bind(self, model) -> None:
        config, inner = model.config, model.model
        self.embed = inner.embed_tokens.weight
        self.layers = [_Layer(layer, config, self.kernels) for layer in inner.layers]
        self._index_layers()
        self.final_norm = norm_params(inner.final_layernorm)
        self.lm_head = model.get_output_embeddings().weight
        self._bind_heads(config)

    def _decode(self, flat, positions, cu, attn_lens, n) -> torch.Tensor:
        """Packed tokens [T] at positions [T] -> final-norm hidden states [T, H]."""
        total, heads, kv_heads, dim = flat.shape[0], self.num_heads, self.num_kv_heads, self.head_dim
        rows = self._row_layout(cu, total, n)
        x = self._embed(flat)
        sum_ = self._sum_partials  # a tensor-parallel rank's branch partials summed (identity on one process)
        self._keep(0, x)
        for i, layer in enumerate(self.layers):
            h = llama_rms_norm(x, layer.input)
            if layer.kind == "linear_attention":
                x = x + sum_(mamba1_forward(layer.mixer, self.states[self._recurrent_index[i]], h, rows,
                                            self._prefilling))
            else:
                q = linear(h, *layer.q).view(total, heads, dim)
                k, v = (linear(h, *p).view(total, kv_heads, dim) for p in (layer.k, layer.v))
                o = self._attend(self._attention_index[i], q, k, v, attn_lens, cu, n, self.scale)
                x = x + sum_(linear(o.reshape(total, -1), *layer.o))
            h = llama_rms_norm(x, layer.pre_ff)
            x = x + sum_(moe_or_mlp(layer, h, self._prefilling))
            if i + 1 < len(self.layers):
                self._keep(i + 1, x)
        out = llama_rms_norm(x, self.final_norm)
        self._keep(len(self.layers), out)
        return out
