"""PagedCohereRunner: a Cohere decoder (model_type cohere: Command R / R+, Aya 23, Aya Expanse 8B /
32B -- one tokenizer across sizes; cohere2: Command R7B, Command A, Aya Vision's text decoder) run
layer by layer over a PagedKVCache with the project's append_kv / paged_attention kernels (the
machinery is shared: runners/paged_base.py).

Weights are the model's own parameters (no copy): embed_tokens, per layer input_layernorm,
self_attn.{q,k,v,o}_proj, self_attn.q_norm / k_norm (use_qk_norm: Command R+), mlp.{gate,up,down}_proj,
then model.norm and lm_head (tied). The math is transformers 5.24's CohereDecoderLayer
(modeling_cohere.py), eval mode:
    h = input_layernorm(x)                  Cohere's LayerNorm: mean-centred, no bias, float32
    q, k, v = projections of h; with use_qk_norm, q / k through per-head LayerNorms ([H, D] weights)
    RoPE interleaved: frequencies repeated pairwise (not cat) and rotate_half over even / odd
    lanes (x[2i], x[2i+1]) -> (-x[2i+1], x[2i]); computed in float32, cast back
    x = (x + o_proj(attention(q, k, v))) + down(silu(gate(h)) * up(h))   one norm, parallel branches
    logits = lm_head(norm(x)) * logit_scale
Cohere 2 (modeling_cohere2.py) is that layer without q / k norms, with sliding_attention layers
(their window, 4096, in the kernels) that rotate and full_attention layers that do not (NoPE).
Cohere 2 MoE (cohere2_moe, 2026-12-01; not under TP) is Cohere 2's layer with a MoE block as the MLP (its dense
prefix layers, full attention, rotated where prefix_dense_sliding_window_pattern is 1: force_rope), routed by
softmax or sigmoid over the top-k logits (expert_selection_fn), its shared experts summed or averaged with the
routed output (shared_expert_combination_strategy), and Llama's RMSNorm where the config sets rms_norm_eps.
One path on every backend, as the GPT-2 runner: the attention and KV append through the kernels,
the rest torch ops. Static RoPE types only. Tensor parallelism: runners/paged_cohere_tp.py.
"""
import torch

from ._layer_math import linear_params, norm_params, rms_norm
from ._linear import linear
from ._moe import layers_moe_reason, moe_or_gated_mlp, moe_or_mlp
from ._rotary import rope_tables_reason
from .paged_base import PagedRunnerBase, decoder_reason
from .paged_llama import projection_modules


COHERE_TYPES = ("cohere", "cohere2", "cohere2_moe")


def cohere_layer_norm(x: torch.Tensor, norm) -> torch.Tensor:
    """CohereLayerNorm over the last dim of x (mean-centred, no bias) in float32, then x's dtype;
    norm: (weight [..., D] broadcast over x's leading dims, eps)."""
    weight, eps = norm
    x32 = x.float()
    centred = x32 - x32.mean(-1, keepdim=True)
    return (weight.float() * (centred * torch.rsqrt(centred.pow(2).mean(-1, keepdim=True) + eps))).to(x.dtype)


def rotate_interleaved(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Cohere's RoPE: x [T, H, D], cos / sin [T, D] (frequencies repeated pairwise) -> x * cos +
    rot(x) * sin in float32 (rot: each lane pair (a, b) -> (-b, a)), cast back to x's dtype."""
    x32 = x.float()
    rotated = torch.stack((-x32[..., 1::2], x32[..., ::2]), dim=-1).flatten(-2)
    return (x32 * cos[:, None, :] + rotated * sin[:, None, :]).to(x.dtype)


def cohere_unsupported_reason(model, max_tokens_per_row: int | None = None, backend=None) -> str | None:
    """Why PagedCohereRunner cannot run ``model`` with rows of up to max_tokens_per_row tokens and
    kernel ``backend``, or None when it can."""
    return (decoder_reason(model, COHERE_TYPES, "model.layers", "a CohereForCausalLM or Cohere2ForCausalLM",
                           projection_modules)
            or layers_moe_reason([layer.mlp for layer in model.model.layers], model.config)
            or rope_tables_reason(model, max_tokens_per_row, backend))


def cohere_rotates(config) -> list:
    """Whether each layer rotates: every Cohere 1 layer; Cohere 2's sliding layers (5.24: `if self.sliding_window`),
    and Cohere 2 MoE's dense prefix layers where prefix_dense_sliding_window_pattern is 1 (its attention's
    force_rope)."""
    if config.model_type == "cohere":
        return [True] * config.num_hidden_layers
    dense = getattr(config, "mlp_layer_types", None) or ["sparse"] * config.num_hidden_layers
    forced = [kind == "dense" and getattr(config, "prefix_dense_sliding_window_pattern", None) == 1 for kind in dense]
    return [kind == "sliding_attention" or force for kind, force in zip(config.layer_types, forced)]


def cohere_rms(config) -> bool:
    """Whether the norms are Llama's RMSNorm (Cohere 2 MoE where the config sets rms_norm_eps), not Cohere's
    LayerNorm; the eps is then rms_norm_eps, else layer_norm_eps."""
    return config.model_type == "cohere2_moe" and getattr(config, "rms_norm_eps", None) is not None


class _CohereLayer:
    """One CohereDecoderLayer's or Cohere2DecoderLayer's parameters (references to the model's
    tensors, not copies); rope: whether the layer rotates (Cohere 2's full-attention layers do not)."""

    def __init__(self, layer, rope: bool, config, kernels: str):
        attn, mlp = layer.self_attn, layer.mlp
        self.rope = rope
        self.norm = norm_params(layer.input_layernorm)
        self.q, self.k, self.v, self.o = linear_params(attn.q_proj, attn.k_proj, attn.v_proj, attn.o_proj)
        qk_norm = getattr(attn, "use_qk_norm", False)  # Cohere 2 has none
        self.q_norm = norm_params(getattr(attn, "q_norm", None)) if qk_norm else None
        self.k_norm = norm_params(getattr(attn, "k_norm", None)) if qk_norm else None
        # Cohere 2 MoE's MoE block, or the gated MLP's (weight, bias) pairs and act_fn
        self.moe, dense, self.act = moe_or_gated_mlp(mlp, config, kernels)
        self.gate, self.up, self.down = dense or (None, None, None)


class PagedCohereRunner(PagedRunnerBase):
    """Runner (see runners/base.py) for a CohereForCausalLM or Cohere2ForCausalLM instance (weights
    shared); the arguments are PagedRunnerBase's."""

    unsupported_reason = staticmethod(cohere_unsupported_reason)

    rms = False  # whether the norms are Llama's RMSNorm (Cohere 2 MoE where rms_norm_eps is set), not Cohere's LayerNorm

    def _bind(self, model) -> None:
        config, inner = model.config, model.model
        self.embed = inner.embed_tokens.weight
        self.rms = cohere_rms(config)
        self.layers = [_CohereLayer(layer, rope, config, self.kernels)
                       for layer, rope in zip(inner.layers, cohere_rotates(config))]
        self.final_norm = norm_params(inner.norm)
        self.lm_head = model.get_output_embeddings().weight
        self.logit_scale = config.logit_scale
        self._bind_heads(config)
        self.inv_freq = inner.rotary_emb.inv_freq.to(device=self.device, dtype=torch.float32)
        self.rope_scaling = float(inner.rotary_emb.attention_scaling)

    def _cos_sin(self, positions: torch.Tensor):
        """cos / sin [T, D] in the model dtype with Cohere's pairwise-repeated frequencies, as
        CohereRotaryEmbedding computes them (float32, times attention_scaling, cast)."""
        freqs = positions.to(torch.float32)[:, None] * self.inv_freq[None, :]
        emb = torch.repeat_interleave(freqs, 2, dim=-1)
        cos, sin = emb.cos() * self.rope_scaling, emb.sin() * self.rope_scaling
        return cos.to(self.dtype), sin.to(self.dtype)

    def _decode(self, flat, positions, cu, attn_lens, n) -> torch.Tensor:
        """Packed tokens [T] at positions [T] -> final-norm hidden states [T, H]."""
        total, heads, kv_heads, dim = flat.shape[0], self.num_heads, self.num_kv_heads, self.head_dim
        cos, sin = self._cos_sin(positions)  # once per call
        x = self._embed(flat)
        self._keep(0, x)
        for i, layer in enumerate(self.layers):
            h = self._norm(x, layer.norm)
            q, k = linear(h, *layer.q).view(total, heads, dim), linear(h, *layer.k).view(total, kv_heads, dim)
            if layer.q_norm is not None:
                q, k = cohere_layer_norm(q, layer.q_norm), cohere_layer_norm(k, layer.k_norm)
            if layer.rope:
                q, k = rotate_interleaved(q, cos, sin), rotate_interleaved(k, cos, sin)
            o = self._attend(i, q, k, linear(h, *layer.v).view(total, kv_heads, dim), attn_lens, cu, n, self.scale)
            x = self._parallel_add(x, linear(o.reshape(total, heads * dim), *layer.o),
                                   moe_or_mlp(layer, h, self._prefilling))
            if i + 1 < len(self.layers):
                self._keep(i + 1, x)
        out = self._norm(x, self.final_norm)
        self._keep(len(self.layers), out)
        return out

    def _norm(self, x: torch.Tensor, norm) -> torch.Tensor:
        """The family's norm of x: Cohere's LayerNorm, or Llama's RMSNorm (rms)."""
        return rms_norm(x, *norm, False) if self.rms else cohere_layer_norm(x, norm)

    def _parallel_add(self, x: torch.Tensor, attn: torch.Tensor, mlp: torch.Tensor) -> torch.Tensor:
        """The stream after a layer whose attention and MLP both read one norm of x (the tensor-
        parallel runner: both row-parallel partials summed in one all-reduce)."""
        return x + attn + mlp

    def _logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """The lm_head product times logit_scale (CohereForCausalLM)."""
        return super()._logits(hidden) * self.logit_scale
