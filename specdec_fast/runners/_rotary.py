"""A model's rotary frequencies as transformers' rotary module holds them: one table (inv_freq,
attention_scaling, rope_type), or one per layer type (Gemma 3's and OLMo 3's module, a subclass
of Gemma 3's: {type}_inv_freq / {type}_attention_scaling, rope_type a dict, each layer's type in
config.layer_types). Read by the runners that rotate per layer type (paged_olmo2.py, paged_gemma.py).
"""
import torch

from ._layer_math import rope_cos_sin


def rotary_dims(config, head_dim: int) -> int:
    """The dims of each head that RoPE rotates: int(head_dim * partial_rotary_factor) as transformers'
    rope parameters compute it (the factor in rope_parameters, else on the config, else 1)."""
    params = getattr(config, "rope_parameters", None) or {}
    factor = params.get("partial_rotary_factor", getattr(config, "partial_rotary_factor", None) or 1.0)
    return int(head_dim * factor)


def static_rope_limit(config, rope_type) -> int | None:
    """For a RoPE whose frequencies change with the length (transformers' dynamic_rope_update): the
    most positions a row may take with the frequencies the rotary module starts with
    (original_inv_freq): longrope switches to its long factors once a forward's positions reach
    original_max_position_embeddings, dynamic rescales past max_position_embeddings. None for any
    other rope_type (static: no limit), or where the config does not say."""
    if not isinstance(rope_type, str):
        return None
    if rope_type == "longrope":
        params = getattr(config, "rope_parameters", None) or {}
        limit = params.get("original_max_position_embeddings") or getattr(config, "original_max_position_embeddings", None)
    elif "dynamic" in rope_type:
        limit = getattr(config, "max_position_embeddings", None)
    else:
        return None
    return int(limit) if isinstance(limit, int) and limit > 0 else None


def static_rope_reason(rope_type) -> str | None:
    """Why a RoPE of ``rope_type`` is refused by the runners that take static frequencies only (dynamic /
    longrope change theirs with the length), or None."""
    if not isinstance(rope_type, str) or "dynamic" in rope_type or "longrope" in rope_type:
        return f"rope_type {rope_type!r}: this runner takes RoPE with static frequencies"
    return None


def layer_theta_tables(model) -> tuple[list, list] | None:
    """A RoPE base a layer (Granite SWA: config.layer_rope_theta, 0 = NoPE) read from the rotary module
    transformers builds for each distinct base (model.model.rotary_embs, ordered by base): ([(inv_freq,
    attention_scaling, rope_type)] a base, each layer's 1-based index into that list or 0 for NoPE), or None
    when the model has no such modules or one is missing for a base."""
    thetas, modules = getattr(model.config, "layer_rope_theta", None), getattr(model.model, "rotary_embs", None)
    if thetas is None or modules is None:
        return None
    by_base = {module.config.rope_parameters["rope_theta"]: module for module in modules}
    bases = sorted(by_base)
    if any(theta and theta not in by_base for theta in thetas) or not all(hasattr(m, "inv_freq") for m in modules):
        return None
    tables = [(by_base[b].inv_freq, by_base[b].attention_scaling, getattr(by_base[b], "rope_type", None)) for b in bases]
    return tables, [bases.index(theta) + 1 if theta else 0 for theta in thetas[:len(model.model.layers)]]


def rope_tables(model) -> tuple[dict, list] | None:
    """{layer type: (inv_freq, attention_scaling, rope_type)} of the model's rotary module, and
    each layer's key into it (config.layer_types for a per-type RoPE, else one table under None)
    -> (tables, keys), or None when the module has no frequencies to read."""
    rotary = getattr(model.model, "rotary_emb", None)
    if rotary is None:
        return None
    if hasattr(rotary, "inv_freq"):
        table = (rotary.inv_freq, rotary.attention_scaling, getattr(rotary, "rope_type", None))
        return {None: table}, [None] * len(model.model.layers)
    kinds = getattr(rotary, "layer_types", None)
    if not kinds or not all(hasattr(rotary, f"{kind}_inv_freq") for kind in kinds):
        return None
    tables = {kind: (getattr(rotary, f"{kind}_inv_freq"), getattr(rotary, f"{kind}_attention_scaling"),
                     rotary.rope_type.get(kind)) for kind in kinds}
    return tables, list(model.config.layer_types)


def device_rope_tables(model, device) -> tuple[dict, list]:
    """rope_tables(model) as a runner keeps them: ({key: (inv_freq float32 on ``device``,
    attention_scaling float)}, each layer's key)."""
    tables, keys = rope_tables(model)
    return {key: (inv_freq.to(device=device, dtype=torch.float32), float(scaling))
            for key, (inv_freq, scaling, _) in tables.items()}, keys


def rotations(tables: dict, positions: torch.Tensor, dtype: torch.dtype) -> dict:
    """{key: (cos, sin) [T, D] in ``dtype``} of device_rope_tables' tables for one forward's
    positions [T], with transformers' float32 math (_layer_math.rope_cos_sin)."""
    return {key: rope_cos_sin(positions, inv_freq, scaling, dtype) for key, (inv_freq, scaling) in tables.items()}


def rope_tables_reason(model, max_tokens_per_row: int | None = None, backend=None, config=None) -> str | None:
    """Why a runner that rotates with rope_tables(model) cannot run ``model``: no tables, or a
    table that fails the Llama runner's config checks on ``config`` (default model.config) (a window
    reached, dynamic RoPE, a partial rotation, the head_dim the backend takes); None when it can."""
    from .paged_llama import llama_config_reason

    rope = rope_tables(model)
    if rope is None:
        return "the model has no rotary_emb with inv_freq (or {layer type}_inv_freq)"
    for inv_freq, _, rope_type in rope[0].values():
        reason = llama_config_reason(model.config if config is None else config, rope_type, max_tokens_per_row, backend,
                                     rotary_dims=2 * inv_freq.numel())
        if reason is not None:
            return reason
    return None
