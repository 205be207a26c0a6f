"""PagedPhimoeRunner: Phi-3.5-MoE (model_type phimoe: microsoft/Phi-3.5-MoE-instruct, 16 experts of which 2 a token) run
layer by layer over a PagedKVCache with the project's append_kv / paged_attention kernels (the machinery:
runners/paged_base.py).

Weights are the model's own parameters (no copy): embed_tokens, per layer input_layernorm, self_attn.{q,k,v,o}_proj
(+ biases: attention_bias), post_attention_layernorm, the MoE block (mlp.router, mlp.experts), then model.norm and
lm_head (+ bias: lm_head_bias). The math is transformers 5.24's PhimoeDecoderLayer (modeling_phimoe.py), eval mode:
    h = input_layernorm(x)          nn.LayerNorm with bias (eps rms_norm_eps)
    q, k = RoPE(q_proj h, k_proj h) Llama's rotation in the model dtype; cos / sin times short_mscale where the
                                    RoPE is not the default one (PhimoeRotaryEmbedding: long_mscale past
                                    original_max_position_embeddings, where transformers' output depends on how a
                                    forward groups positions: rows are kept within it unless the two scales agree)
    x = x + o_proj(attention(q, k, v))      the config's window on every layer (in the kernels)
    x = x + moe(post_attention_layernorm(x)) sparsemixer's two experts (runners/_moe.py), Mixtral's SwiGLU experts
    logits = lm_head(norm(x))
The inverse frequencies are what PhimoeRotaryEmbedding.forward recomputes at every call (rope_init_fn(config), no
length given: longrope's short factors), not its inv_freq buffer, which a long forward rewrites. The layer loop is the StarCoder2 runner's (runners/paged_starcoder2.py).
One path on every backend: the attention and KV append through the kernels, the experts through kernels/moe where the backend fuses
them, the rest torch ops. No tensor-parallel runner yet (refused by name).
"""
import torch

from ._layer_math import layer_norm_params, linear_params
from ._moe import MoE, layers_moe_reason
from .paged_base import decoder_reason, head_dim_reason
from .paged_llama import projection_modules
from .paged_starcoder2 import PagedStarcoder2Runner

PHIMOE_TYPES = ("phimoe",)


def rope_frequencies(rotary) -> tuple:
    """(inv_freq float32, the cos / sin scale, the rows' position limit or None) of a PhimoeRotaryEmbedding, as its
    forward computes them for positions within original_max_position_embeddings."""
    config = rotary.config
    params = config.rope_parameters
    inv_freq, scale = rotary.rope_init_fn(config)
    if params["rope_type"] == "default":
        return inv_freq, float(scale), None
    short, long = float(params["short_mscale"]), float(params["long_mscale"])
    return inv_freq, short, None if short == long else int(params["original_max_position_embeddings"])


def phimoe_unsupported_reason(model, max_tokens_per_row: int | None = None, backend=None) -> str | None:
    """Why PagedPhimoeRunner cannot run ``model`` with rows of up to max_tokens_per_row tokens and kernel ``backend``,
    or None when it can."""
    reason = (decoder_reason(model, PHIMOE_TYPES, "model.layers", "a PhimoeForCausalLM", projection_modules)
              or layers_moe_reason([layer.mlp for layer in model.model.layers], model.config))
    if reason is not None:
        return reason
    rope_type = model.config.rope_parameters.get("rope_type")
    if rope_type not in ("default", "longrope"):
        return f"rope_type {rope_type!r}: this runner takes Phi-3.5-MoE's default or longrope RoPE"
    _, _, limit = rope_frequencies(model.model.rotary_emb)
    if limit is not None and max_tokens_per_row is not None and max_tokens_per_row > limit:
        return (f"rope_type 'longrope' changes its scale past {limit} positions (short_mscale != long_mscale) and a "
                f"row needs up to {max_tokens_per_row}")
    return head_dim_reason(model.model.layers[0].self_attn.head_dim, backend)


class _PhimoeLayer:
    """One PhimoeDecoderLayer's parameters (references to the model's tensors, not copies), under the StarCoder2
    runner's layer names (its loop runs them: no per-head norms)."""

    q_norm = k_norm = None

    def __init__(self, layer, config, kernels: str):
        attn = layer.self_attn
        self.q, self.k, self.v, self.o = linear_params(attn.q_proj, attn.k_proj, attn.v_proj, attn.o_proj)
        self.ln_in, self.ln_post = layer_norm_params(layer.input_layernorm), layer_norm_params(layer.post_attention_layernorm)
        self.moe = MoE(layer.mlp, config, kernels)


class PagedPhimoeRunner(PagedStarcoder2Runner):
    """Runner (see runners/base.py) for a PhimoeForCausalLM instance (weights shared); the arguments are
    PagedRunnerBase's. The pre-LayerNorm loop is the StarCoder2 runner's; the MLP is the layer's MoE block."""

    unsupported_reason = staticmethod(phimoe_unsupported_reason)
    positions_limit = "positions of its short RoPE scale"

    def _bind(self, model) -> None:
        config, inner = model.config, model.model
        self.embed = inner.embed_tokens.weight
        self.layers = [_PhimoeLayer(layer, config, self.kernels) for layer in inner.layers]
        self.final_norm = layer_norm_params(inner.norm)
        self.lm_head = model.get_output_embeddings().weight
        self.lm_head_bias = model.get_output_embeddings().bias  # lm_head_bias: Phi-3.5-MoE's published config sets it
        self.hidden = config.hidden_size
        self._bind_heads(config)
        inv_freq, self.rope_scaling, self.max_positions = rope_frequencies(inner.rotary_emb)
        self.inv_freq = inv_freq.to(device=self.device, dtype=torch.float32)

    def _mlp(self, layer, h: torch.Tensor) -> torch.Tensor:
        """The layer's MoE block of h [T, H] (the post-attention LayerNorm's output)."""
        return layer.moe(h, self._prefilling)
