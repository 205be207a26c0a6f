"""PagedLlama4Runner: Llama 4's text decoder (``llama4_text``: Llama 4 Scout 17B-16E, Maverick
17B-128E, as AutoModelForCausalLM loads a Llama 4 checkpoint: Llama4ForCausalLM) on the Llama
runner's layer loop (runners/paged_llama.py) and the paged kernels.

What differs from a Llama layer, as transformers 5.24's modeling_llama4 computes it, and how it runs
here:
  - RoPE layers (config.no_rope_layers[i] = 1; every fourth layer is NoPE by default) rotate
    interleaved pairs (x_2i, x_2i+1) as complex numbers: each RoPE layer reads its q / k columns
    evens first, odds last (paged_llama.INTERLEAVED_ROPE's reordering) and rotates halves.
  - RoPE layers attend in chunks (layer_types "chunked_attention", attention_chunk_size C: a query
    at position p sees keys from (p // C) * C on): the kernels' chunk (kernels/attention chunk=),
    set per layer as layer_chunks; a chunked layer reads at most C keys back, so long rows keep it
    on the ring cache as a window of C.
  - use_qk_norm: q and k of RoPE layers pass a weightless L2 (RMS) norm per head after the rotation.
    A rotation keeps each head's norm, so normalising before it gives the same vector up to
    rounding: the per-head q/k norm path (Qwen3's, fused into rope_append_kv on Triton) with
    weights of ones (exact: the norm's rounding then times 1).
  - NoPE layers scale their queries by the attention temperature (attn_temperature_tuning):
    1 + attn_scale * log1p(floor((p + 1) / floor_scale)), in float32, the product rounded to the
    model dtype. transformers counts p from the cache's length, so a left-padded row's p there
    includes its pads; here p is the token's position in its row (the pads are not in the cache).
    Equal wherever pads do not move a row across a multiple of floor_scale (8192 in the published
    configs): every unpadded batch.
  - MoE layers (moe_layers; interleave_moe_layer_step): top-1 sigmoid routing whose weight scales
    the expert's input, and a shared expert (runners/_moe.py, "llama4_text"); the other layers a
    SwiGLU MLP of intermediate_size_mlp (`feed_forward` in both: paged_llama.mlp_of).
"""
import torch

from .paged_base import decoder_reason
from .sliding_window import AsFullAttention
from .paged_llama import PagedLlamaRunner, _Layer, interleaved_order, llama_config_reason, projection_modules
from ._moe import input_scaling_reason, moe_reason

LLAMA4_MODEL_TYPES = ("llama4_text",)


def llama4_layer_chunks(config) -> tuple:
    """Each layer's attention chunk: attention_chunk_size for a "chunked_attention" layer, else None."""
    return tuple(config.attention_chunk_size if kind == "chunked_attention" else None for kind in config.layer_types)


def llama4_unsupported_reason(model, max_tokens_per_row: int | None = None, backend=None) -> str | None:
    """Why PagedLlama4Runner cannot run ``model`` with kernel ``backend``, or None when it can."""
    reason = decoder_reason(model, LLAMA4_MODEL_TYPES, "model.layers", "a Llama4ForCausalLM", projection_modules)
    if reason is not None:
        return reason
    config = model.config
    for i, layer in enumerate(model.model.layers):
        mlp = layer.feed_forward
        reason = moe_reason(mlp, config) if getattr(layer, "is_moe_layer", False) else None
        if reason is not None:
            return f"layer {i}: {reason}"
    rotary = getattr(model.model, "rotary_emb", None)
    if rotary is None or not hasattr(rotary, "inv_freq"):
        return "the model has no rotary_emb with inv_freq"
    return llama4_config_reason(config, getattr(rotary, "rope_type", None), max_tokens_per_row, backend,
                                rotary_dims=2 * rotary.inv_freq.numel(), static_window=True)


def llama4_config_reason(config, rope_type, max_tokens_per_row=None, backend=None, rotary_dims=None,
                         static_window: bool = False) -> str | None:
    """The checks of llama4_unsupported_reason that read only the config (shared with the tensor-parallel
    runner): one expert a token (_moe.input_scaling_reason), full or chunked layers with an int chunk, then
    the Llama family's config checks (paged_llama.llama_config_reason) on the config read as full
    attention (the chunks are this runner's: llama4_layer_chunks)."""
    reason = input_scaling_reason(config)
    if reason is not None:
        return reason
    kinds = set(config.layer_types)
    if kinds - {"full_attention", "chunked_attention"}:
        return f"layer_types {sorted(kinds)}: Llama 4's layers are full or chunked attention"
    chunk = config.attention_chunk_size
    if "chunked_attention" in kinds and (isinstance(chunk, bool) or not isinstance(chunk, int) or chunk < 1):
        return f"chunked_attention layers need an int attention_chunk_size, got {chunk!r}"
    return llama_config_reason(AsFullAttention(config), rope_type, max_tokens_per_row, backend,
                               rotary_dims=rotary_dims, static_window=static_window)


def as_llama4_layer(layer, config) -> None:
    """A Llama layer's parameters (paged_llama._Layer, or a tensor-parallel rank's _TPLayer, its rope set
    by no_rope_layers: paged_llama.rotates) made Llama 4's (module docstring): the RoPE layers' q / k
    columns read evens first, odds last, their weightless q/k norm (use_qk_norm, eps rms_norm_eps, as
    Llama4TextL2Norm takes it) as weights of ones, and the query temperature on the NoPE layers only."""
    weight = layer.q[0]
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    layer.rope_order = interleaved_order(layer.q_cols, layer.kv_cols, head_dim, weight.device) if layer.rope else None
    layer.qk_norm = None
    if config.use_qk_norm and layer.rope:
        ones = torch.ones(head_dim, dtype=weight.dtype, device=weight.device)
        layer.qk_norm = (ones, float(config.rms_norm_eps), ones, float(config.rms_norm_eps))
    layer.scaled_query = not layer.rope and bool(config.attn_temperature_tuning)


class _Llama4Layer(_Layer):
    """A Llama 4 decoder layer's parameters: the Llama layer's (its use_rope is no_rope_layers[i]),
    made Llama 4's by as_llama4_layer."""

    def __init__(self, layer, config, fuse: bool, kernels: str = "torch"):
        super().__init__(layer, config, fuse, kernels)
        as_llama4_layer(self, config)


class PagedLlama4Runner(PagedLlamaRunner):
    """Runner (runners/base.py) for a Llama4ForCausalLM (weights shared): PagedLlamaRunner's loop
    and kernels with Llama 4's layers (module docstring)."""

    unsupported_reason = staticmethod(llama4_unsupported_reason)
    layer_class = _Llama4Layer

    def _bind(self, model) -> None:
        super()._bind(model)
        self.layer_chunks = llama4_layer_chunks(model.config)

    def _bind_query_temperature(self, config) -> None:
        """The NoPE layers' temperature (attn_temperature_tuning); their layers say which (scaled_query)."""
        self.query_temperature = (float(config.attn_scale), float(config.floor_scale)) \
            if config.attn_temperature_tuning else None

    def _query_scales(self, positions: torch.Tensor) -> torch.Tensor | None:
        """[T, 1, 1] float32: 1 + attn_scale * log1p(floor((p + 1) / floor_scale)) (transformers'
        Llama4TextAttention, positions counted in the row), or None without temperature tuning."""
        if self.query_temperature is None:
            return None
        attn_scale, floor_scale = self.query_temperature
        scale = torch.log1p(torch.floor((positions.to(torch.float32) + 1.0) / floor_scale)) * attn_scale + 1.0
        return scale[:, None, None]

    def _layer_windows(self, model) -> tuple:
        """Llama 4 slides no layer (its chunks: layer_chunks)."""
        return (None,) * len(self.layers)
