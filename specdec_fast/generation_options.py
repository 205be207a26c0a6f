"""Resolving transformers-style generate options: the model's and the given GenerationConfig,
then the explicit arguments; anything we do not implement raises instead of being ignored."""
from dataclasses import dataclass
from numbers import Integral, Real

# Fields of GenerationConfig that change the output and that we do not implement, with the
# value that means "off" (None always means off in transformers 5.x).
NEUTRAL_VALUES = {
    "num_beams": 1, "num_return_sequences": 1, "repetition_penalty": 1.0, "encoder_repetition_penalty": 1.0,
    "length_penalty": 1.0, "no_repeat_ngram_size": 0, "encoder_no_repeat_ngram_size": 0, "typical_p": 1.0,
    "epsilon_cutoff": 0.0, "eta_cutoff": 0.0, "diversity_penalty": 0.0, "num_beam_groups": 1, "penalty_alpha": None,
    "output_attentions": False, "output_hidden_states": False, "output_scores": False, "output_logits": False,
    "return_dict_in_generate": False, "use_cache": True, "early_stopping": False, "renormalize_logits": False,
    "remove_invalid_values": False, "min_length": 0, "min_new_tokens": 0, "max_time": None, "stop_strings": None,
    "bad_words_ids": None, "force_words_ids": None, "constraints": None, "sequence_bias": None, "suppress_tokens": None,
    "begin_suppress_tokens": None, "forced_bos_token_id": None, "forced_eos_token_id": None, "guidance_scale": 1.0,
    "watermarking_config": None, "exponential_decay_length_penalty": None, "top_h": None, "token_healing": False,
    "dola_layers": None, "low_memory": False, "num_assistant_tokens_schedule": "constant",
    "assistant_confidence_threshold": None, "assistant_early_exit": None, "assistant_lookbehind": None,
    "target_lookbehind": None, "assistant_ensemble_weight": None, "speculation_type": None, "use_mtp": None,
    "continuous_batching_config": None,
}
# Supported, or describing only how transformers builds its own cache / compiles (we replace both).
HANDLED = {
    "max_length", "max_new_tokens", "do_sample", "temperature", "top_k", "top_p", "min_p", "pad_token_id",
    "eos_token_id", "num_assistant_tokens", "prompt_lookup_num_tokens", "max_matching_ngram_size",
    "bos_token_id", "decoder_start_token_id", "is_assistant", "transformers_version", "_from_model_config",
    "cache_implementation", "cache_config", "max_cache_len", "prefill_chunk_size", "compile_config", "disable_compile",
    "_commit_hash", "_original_object_hash",
}
# transformers' own defaults where the config leaves a field None.
HF_DEFAULTS = {"do_sample": False, "temperature": 1.0, "top_k": 50, "top_p": 1.0, "min_p": None, "max_length": 20}


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
    return {k: v for k, v in config.to_dict().items()}


def _check_unsupported(values: dict, where: str) -> None:
    for name, value in values.items():
        if name in HANDLED or value is None:
            continue
        if name not in NEUTRAL_VALUES:
            raise ValueError(f"unsupported generate option {name!r} (from {where}): specdec_fast does not implement it")
        if value != NEUTRAL_VALUES[name]:
            raise ValueError(
                f"unsupported generate option {name}={value!r} (from {where}): specdec_fast supports only "
                f"{name}={NEUTRAL_VALUES[name]!r}"
            )


def resolve_options(model, generation_config, explicit: dict, prompt_len: int) -> Options:
    """Merge model.generation_config < generation_config < explicit arguments (None = not given)."""
    merged = {}
    for source, where in ((getattr(model, "generation_config", None), "model.generation_config"),
                          (generation_config, "generation_config")):
        values = _config_dict(source)
        _check_unsupported(values, where)
        merged.update({k: v for k, v in values.items() if v is not None})
    merged.update({k: v for k, v in explicit.items() if v is not None})

    def get(name):
        return merged.get(name, HF_DEFAULTS.get(name))

    max_new = get("max_new_tokens")
    if max_new is None:
        max_new = get("max_length") - prompt_len
        if max_new < 1:
            raise ValueError(f"max_length={get('max_length')} leaves no room after a prompt of {prompt_len} tokens; set max_new_tokens")
    if isinstance(max_new, bool) or not isinstance(max_new, Integral) or max_new < 1:
        raise ValueError(f"max_new_tokens must be an int >= 1, got {max_new!r}")
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
        pad = eos_list[0] if eos_list else 0  # transformers also falls back to the first EOS id
    ngram = get("max_matching_ngram_size") or 2
    return Options(
        max_new_tokens=int(max_new), do_sample=do_sample, temperature=float(temperature or 1.0), top_k=int(top_k),
        top_p=float(top_p if top_p is not None else 1.0), min_p=float(min_p), eos_token_ids=eos_list, pad_token_id=int(pad),
        num_assistant_tokens=(explicit["num_assistant_tokens"] if explicit.get("num_assistant_tokens") is not None
                              else _non_default_k(merged.get("num_assistant_tokens"))),
        prompt_lookup_num_tokens=get("prompt_lookup_num_tokens"), max_matching_ngram_size=int(ngram),
    )


def _non_default_k(value):
    """transformers' num_assistant_tokens default (20) is tuned for its heuristic schedule: ignore it."""
    return None if value in (None, 20) else value
