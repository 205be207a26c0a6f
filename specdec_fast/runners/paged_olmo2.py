"""PagedOlmo2Runner: an OLMo 2 or OLMo 3 decoder (model_type olmo2 / olmo3) run layer by layer over
a PagedKVCache with the project's append_kv / paged_attention kernels (the machinery is shared:
runners/paged_base.py).

Weights are the model's own parameters (no copy): embed_tokens, per layer self_attn.{q,k,v,o}_proj,
self_attn.q_norm / k_norm, post_attention_layernorm, post_feedforward_layernorm,
mlp.{gate,up,down}_proj, then model.norm and lm_head. The math is transformers 5.24's
Olmo2DecoderLayer (modeling_olmo2.py), eval mode:
    q = q_norm(q_proj(x)), k = k_norm(k_proj(x))   norms over the whole projection [T, H * D],
                                                    not per head (Qwen3's)
    q, k = RoPE(q, k) in float32, cast back          OLMo's cos / sin stay float32
    x = x + post_attention_layernorm(o_proj(attention(q, k, v)))      norms AFTER each branch,
    x = x + post_feedforward_layernorm(down(act(gate(x)) * up(x)))    no input norms
    out = norm(x)
and OLMo 2's RMSNorm multiplies by its weight in float32 before the cast (Llama's casts first):
``olmo_rms_norm``. So the layer fits neither the Llama runner's fused norms (add then norm) nor
its RoPE kernel (per-head q / k norms, model-dtype tables): one path for every backend, the
attention and the KV append through the kernels (paged_base._attend), the rest torch ops, as the
GPT-2 runner does. Static RoPE types only. Tensor parallelism: paged_olmo2_tp.py.
OLMo 3 is OLMo 2's layer with sliding_attention layers (3 of 4; their window, by the rule of
runners/sliding_window.py, applied by the kernels) and one RoPE per layer type (its
rotary module's {type}_inv_freq / {type}_attention_scaling: scaling such as YaRN on the
full_attention layers only): runners/_rotary.py.
EXAONE 4.0 (exaone4: 1.2B, 32B; transformers' Exaone4DecoderLayer) is the same layer with Llama's
pieces (LLAMA_PIECES): q / k norms per head ([D], Qwen3's), Llama's RMSNorm (cast, then the weight),
RoPE tables in the model dtype; its sliding layers rotate and slide (window 4096), its full layers
are NoPE where a window is set (paged_llama.NOPE_UNLESS_SLIDING).
"""
import torch

from ..kernels.llama_ops.reference import rotate_half_apply
from ._layer_math import linear_params, norm_params, rms_norm
from ._linear import linear
from ._moe import layers_moe_reason, moe_or_gated_mlp, moe_or_mlp
from ._rotary import device_rope_tables, rope_tables_reason, rotations
from .paged_base import PagedRunnerBase, decoder_reason
from .paged_llama import projection_modules, rotates


def olmo_rms_norm(x: torch.Tensor, norm) -> torch.Tensor:
    """Olmo2RMSNorm over the last dim of x: (weight * x_normed) in float32, then x's dtype. norm:
    (weight, eps)."""
    weight, eps = norm
    x32 = x.float()
    return (weight * (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps))).to(x.dtype)


def llama_rms_norm(x: torch.Tensor, norm) -> torch.Tensor:
    """LlamaRMSNorm / Exaone4RMSNorm over the last dim of x (the cast before the weight). norm: (weight, eps)."""
    return rms_norm(x, norm[0], norm[1], False)


# flex_olmo: FlexOlmo, OLMo 2's layer with OLMoE's experts as its MLP (runners/_moe.py)
OLMO_MODEL_TYPES = ("olmo2", "olmo3", "exaone4", "flex_olmo")
# The families of this layer with Llama's pieces: per-head q / k norms, Llama's RMSNorm, model-dtype RoPE tables
LLAMA_PIECES = ("exaone4",)


def olmo2_unsupported_reason(model, max_tokens_per_row: int | None = None, backend=None) -> str | None:
    """Why PagedOlmo2Runner cannot run ``model`` with rows of up to max_tokens_per_row tokens and
    kernel ``backend``, or None when it can."""
    return (decoder_reason(model, OLMO_MODEL_TYPES, "model.layers", "an Olmo2ForCausalLM", projection_modules)
            or layers_moe_reason([layer.mlp for layer in model.model.layers], model.config)
            or rope_tables_reason(model, max_tokens_per_row, backend))


class _Olmo2Layer:
    """One Olmo2DecoderLayer's parameters (references to the model's tensors, not copies)."""

    def __init__(self, layer, config, kernels: str):
        attn, mlp = layer.self_attn, layer.mlp
        self.q, self.k, self.v, self.o = linear_params(attn.q_proj, attn.k_proj, attn.v_proj, attn.o_proj)
        self.q_norm, self.k_norm = norm_params(attn.q_norm), norm_params(attn.k_norm)
        self.post_attention = norm_params(layer.post_attention_layernorm)
        self.post_feedforward = norm_params(layer.post_feedforward_layernorm)
        # FlexOlmo's MoE block, or the gated MLP's (weight, bias) pairs and act_fn
        self.moe, dense, self.act = moe_or_gated_mlp(mlp, config, kernels)
        self.gate, self.up, self.down = dense or (None, None, None)
        self.rope = rotates(config, attn.layer_idx)  # EXAONE 4's full layers: NoPE


class PagedOlmo2Runner(PagedRunnerBase):
    """Runner (see runners/base.py) for an Olmo2ForCausalLM / Olmo3ForCausalLM instance (weights
    shared); the arguments are PagedRunnerBase's."""

    unsupported_reason = staticmethod(olmo2_unsupported_reason)

    llama_pieces = False  # EXAONE 4's (LLAMA_PIECES): per-head q/k norms, Llama's RMSNorm, model-dtype RoPE tables

    def _bind(self, model) -> None:
        config, inner = model.config, model.model
        self.llama_pieces = config.model_type in LLAMA_PIECES
        self.embed = inner.embed_tokens.weight
        self.layers = [_Olmo2Layer(layer, config, self.kernels) for layer in inner.layers]
        self.final_norm = norm_params(inner.norm)
        self.lm_head = model.get_output_embeddings().weight
        self._bind_heads(config)
        self.rope_tables, self.rope_keys = device_rope_tables(model, self.device)

    def _qk_norm(self, x: torch.Tensor, norm) -> torch.Tensor:
        """The q / k norm over the whole projection (olmo_rms_norm; under tensor parallelism its mean square
        over every rank's slice: paged_olmo2_tp.py)."""
        return olmo_rms_norm(x, norm)

    def _norm(self, x: torch.Tensor, norm) -> torch.Tensor:
        """The family's RMSNorm: OLMo's (the weight in float32), EXAONE 4's (Llama's)."""
        return llama_rms_norm(x, norm) if self.llama_pieces else olmo_rms_norm(x, norm)

    def _qk(self, x: torch.Tensor, norm, heads: int) -> torch.Tensor:
        """q or k [T, heads * D] -> [T, heads, D], normed: per head (EXAONE 4), else over the whole projection."""
        if self.llama_pieces:
            return llama_rms_norm(x.view(x.shape[0], heads, self.head_dim), norm)
        return self._qk_norm(x, norm).view(x.shape[0], heads, self.head_dim)

    def _decode(self, flat, positions, cu, attn_lens, n) -> torch.Tensor:
        """Packed tokens [T] at positions [T] -> final-norm hidden states [T, H]."""
        total, heads, kv_heads, dim = flat.shape[0], self.num_heads, self.num_kv_heads, self.head_dim
        # [T, D] cos / sin of each RoPE (one, or OLMo 3's per layer type), once per call: float32 (OLMo's), the
        # model dtype (EXAONE 4's)
        tables = rotations(self.rope_tables, positions, self.dtype if self.llama_pieces else torch.float32)
        x = self._embed(flat)
        sum_ = self._sum_partials
        self._keep(0, x)
        for i, layer in enumerate(self.layers):
            cos, sin = tables[self.rope_keys[i]]
            q = self._qk(linear(x, *layer.q), layer.q_norm, heads)
            k = self._qk(linear(x, *layer.k), layer.k_norm, kv_heads)
            v = linear(x, *layer.v).view(total, kv_heads, dim)
            if layer.rope:  # x * cos + rotate_half(x) * sin: in float32 with OLMo's tables, then x's dtype
                q, k = rotate_half_apply(q, cos, sin).to(q.dtype), rotate_half_apply(k, cos, sin).to(k.dtype)
            o = self._attend(i, q, k, v, attn_lens, cu, n, self.scale)
            x = x + self._norm(sum_(linear(o.reshape(total, heads * dim), *layer.o)), layer.post_attention)
            x = x + self._norm(sum_(moe_or_mlp(layer, x, self._prefilling)), layer.post_feedforward)
            if i + 1 < len(self.layers):
                self._keep(i + 1, x)
        out = self._norm(x, self.final_norm)
        self._keep(len(self.layers), out)
        return out
