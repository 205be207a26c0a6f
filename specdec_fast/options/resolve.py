"""Resolving transformers-style generate options: model.generation_config, then the given
generation_config, then the keyword arguments (None = not given); every option goes through
rules.check_option (one rule derived from transformers' GenerationConfig: neutral values
accepted, what we do not implement raises instead of being ignored)."""
from dataclasses import dataclass, field
from numbers import Integral, Real

from .max_length import resolve_max_new_tokens
from .rules import (ENGINE_IMPLEMENTS, HANDLED_FIELDS, builds_dynamic_cache, check_cache_implementation, check_option,
                    field_defaults, ignored_in_mode)


@dataclass
class Options:
    max_new_tokens: int
    do_sample: bool
    temperature: float
    top_k: int
    top_p: float
    min_p: float
    eos_token_ids: list | None
    pad_token_id: int
    num_assistant_tokens: int | None
    prompt_lookup_num_tokens: int | None
    max_matching_ngram_size: int
    extra: dict = field(default_factory=dict)  # implemented options (ENGINE_IMPLEMENTS) at non-neutral values
    # transformers' own pad token (pad_token_id, else the first EOS id, else None: no fallback to 0),
    # from which it infers a missing attention_mask (engine/inputs.py infer_attention_mask)
    mask_pad_token_id: int | None = None
    # transformers' generate would build a DynamicCache of its own for this call (rules.builds_dynamic_cache):
    # return_dict_in_generate then returns one beside the sequences where the call passed none (engine/outputs.py)
    builds_cache: bool = True

    def kernel_params(self) -> dict:
        """Sampling arguments of the kernels; greedy = temperature 0 (warpers off, like transformers)."""
        if not self.do_sample:
            return dict(temperature=0.0, top_k=0, top_p=1.0, min_p=0.0)
        return dict(temperature=self.temperature, top_k=self.top_k, top_p=self.top_p, min_p=self.min_p)


def _config_dict(config) -> dict:
    if config is None:
        return {}
    if isinstance(config, dict):
        return dict(config)
    return dict(config.to_dict())


def _merged_sources(model, generation_config, explicit: dict) -> tuple:
    """(every option's value, where it came from): model.generation_config < generation_config <
    explicit (None = not given)."""
    merged, origin = {}, {}
    for source, where in ((getattr(model, "generation_config", None), "model.generation_config"),
                          (generation_config, "generation_config"), (explicit, "keyword argument")):
        for name, value in _config_dict(source).items():
            if value is not None:
                merged[name], origin[name] = value, where
    check_cache_implementation(merged, model)
    return merged, origin


def _that_matter(merged: dict, origin: dict, implemented) -> dict:
    # Checked after merging: a neutral keyword overrides a non-neutral model default.
    return {name: value for name, value in merged.items()
            if not ignored_in_mode(name, merged) and check_option(name, value, origin[name], implemented)}


def merge_options(model, generation_config, explicit: dict, implemented=ENGINE_IMPLEMENTS) -> dict:
    """model.generation_config < generation_config < explicit (None = not given), each value checked by
    rules.check_option where it came from, unless transformers ignores it in this call
    (rules.ignored_in_mode: early_stopping without beams, ...); returns the values that matter
    (handled options)."""
    return _that_matter(*_merged_sources(model, generation_config, explicit), implemented)


def resolve_options(model, generation_config, explicit: dict, prompt_len: int, implemented=ENGINE_IMPLEMENTS) -> Options:
    """The options of one call: ``explicit`` holds the keyword arguments (api.generate's named ones and
    its **kwargs), ``prompt_len`` is input_ids' width (padding included: transformers' max_length
    counts it). Raises ValueError naming an option that is unsupported at its value or invalid."""
    every, origin = _merged_sources(model, generation_config, explicit)
    merged = _that_matter(every, origin, implemented)

    def get(name):
        return merged.get(name, field_defaults().get(name))

    max_positions = getattr(getattr(model, "config", None), "max_position_embeddings", None)
    max_new = resolve_max_new_tokens(merged.get("max_new_tokens"), merged.get("max_length"), prompt_len, max_positions)
    do_sample = bool(get("do_sample"))
    temperature, top_k, top_p = get("temperature"), get("top_k"), get("top_p")
    min_p = get("min_p") or 0.0
    top_k = 0 if top_k is None else top_k
    # A negative temperature is an error even where greedy decoding ignores it (transformers would
    # decode greedily and say nothing): the caller meant something we do not do.
    if isinstance(temperature, bool) or not isinstance(temperature, Real) or not temperature >= 0:
        raise ValueError(f"temperature must be a number >= 0, got {temperature!r}")
    if do_sample:
        if not temperature > 0:
            raise ValueError(f"temperature must be a number > 0 when do_sample=True, got {temperature!r}")
        if isinstance(top_k, bool) or not isinstance(top_k, Integral) or top_k < 0:
            raise ValueError(f"top_k must be an int >= 0, got {top_k!r}")
        if isinstance(top_p, bool) or not isinstance(top_p, Real) or not 0 < top_p <= 1:
            raise ValueError(f"top_p must be a number in (0, 1], got {top_p!r}")
        if isinstance(min_p, bool) or not isinstance(min_p, Real) or not 0 <= min_p <= 1:
            raise ValueError(f"min_p must be a number in [0, 1], got {min_p!r}")
    eos = get("eos_token_id")
    eos_list = None if eos is None else ([int(eos)] if isinstance(eos, Integral) else [int(e) for e in eos])
    pad = get("pad_token_id")
    if pad is None:
        pad = eos_list[0] if eos_list else None  # transformers also falls back to the first EOS id
    mask_pad = None if pad is None else int(pad)
    pad = 0 if pad is None else pad
    ngram = get("max_matching_ngram_size") or 2
    return Options(
        max_new_tokens=max_new, do_sample=do_sample, temperature=float(temperature or 1.0), top_k=int(top_k),
        top_p=float(top_p if top_p is not None else 1.0), min_p=float(min_p), eos_token_ids=eos_list, pad_token_id=int(pad),
        num_assistant_tokens=(explicit["num_assistant_tokens"] if explicit.get("num_assistant_tokens") is not None
                              else _non_default_k(merged.get("num_assistant_tokens"))),
        prompt_lookup_num_tokens=get("prompt_lookup_num_tokens"), max_matching_ngram_size=int(ngram),
        extra={name: value for name, value in merged.items() if name not in HANDLED_FIELDS},
        mask_pad_token_id=mask_pad, builds_cache=builds_dynamic_cache(every),
    )


def _non_default_k(value):
    """transformers' num_assistant_tokens default (20) is tuned for its heuristic schedule: ignore it."""
    return None if value is None or value == field_defaults().get("num_assistant_tokens") else value
