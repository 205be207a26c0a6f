"""Which generate() options specdec_fast takes, by one rule derived from transformers' GenerationConfig.

Every option name falls in one class (``option_class``):

- handled: implemented. GenerationConfig fields that resolve.resolve_options types
  into Options (HANDLED_FIELDS), arguments api.generate takes itself (API_ARGUMENTS), and the
  names in the caller's ``implemented`` set (see below).
- accepted: never changes our output, whatever its value (ACCEPTED: how transformers caches,
  compiles or schedules its own drafts, ids that only an encoder-decoder or an empty prompt
  reads, metadata).
- unsupported: accepted at a neutral value, any other value raises one line naming the option
  and the value. Neutral, for a GenerationConfig field: None, or transformers' default (the value
  ``GenerationConfig()`` holds, or where that is None the value generate() fills in,
  ``GenerationConfig._get_default_generation_params()``), or False for a field documented as
  `bool` (transformers reads None as False there). For generate()'s other keyword arguments
  (GENERATE_ARGUMENTS): None, or what the table says (an empty StoppingCriteriaList, ...).
  Names neither transformers nor we know raise too.
- ignored in the call: a few unsupported fields that transformers' own generate ignores in some
  calls (IGNORED_IN_MODE: early_stopping without beam search, ...) are accepted at any value in
  those calls (resolve.merge_options asks ignored_in_mode before the rule).

An option turns from unsupported into handled in one place: the ``implemented`` set of names
the caller passes (ENGINE_IMPLEMENTS below by default). Its non-neutral value then
reaches the caller (Options.extra) instead of raising; its neutral values stay ignored.

Nothing here imports transformers until a rule is first asked for (``import specdec_fast`` does
not import it).
"""
import re
from functools import lru_cache
from numbers import Real

# Options the engine implements beyond HANDLED_FIELDS (their non-neutral values reach it in
# Options.extra): the logits stage's (engine/logits_stage.py: transformers' processors, the
# penalties, the warpers the kernels lack, a user's logits_processor). frequency_penalty and
# presence_penalty are vLLM's / OpenAI's, not transformers' (extra keyword arguments).
LOGITS_STAGE_OPTIONS = ("sequence_bias", "encoder_repetition_penalty", "repetition_penalty", "frequency_penalty",
                        "presence_penalty", "no_repeat_ngram_size", "encoder_no_repeat_ngram_size", "bad_words_ids",
                        "min_length", "min_new_tokens", "suppress_tokens", "begin_suppress_tokens", "forced_bos_token_id",
                        "forced_eos_token_id", "exponential_decay_length_penalty", "remove_invalid_values", "top_h",
                        "typical_p", "epsilon_cutoff", "eta_cutoff", "logits_processor", "prefix_allowed_tokens_fn",
                        "watermarking_config", "guidance_scale", "negative_prompt_ids", "negative_prompt_attention_mask")
# Stopping: transformers' stopping criteria, at the exact token (engine/stopping.py).
STOPPING_OPTIONS = ("stopping_criteria", "max_time", "stop_strings")
# The draft length's schedule (engine/schedule.py): "adaptive" (ours; opt-in: a constant K is
# the default), transformers' "heuristic" / "heuristic_transient" (served by the adaptive schedule: speed
# only, never the output), "constant".
SCHEDULE_OPTIONS = ("num_assistant_tokens_schedule",)
# Outputs: more rows (num_return_sequences) and transformers' output dict (engine/outputs.py);
# renormalize_logits changes only the scores (log-softmax last: the same tokens, greedy or sampled).
OUTPUT_OPTIONS = ("num_return_sequences", "return_dict_in_generate", "output_scores", "output_logits",
                  "output_hidden_states", "output_attentions", "renormalize_logits")
# Drafters named by a GenerationConfig field: the target's first N layers as the draft model
# (drafters/early_exit.py; api.generate turns it into an assistant_model); speculation_type="dflash"
# (transformers' DFlash assisted generation: assistant_model is a DFlash drafter, which
# api.generate hands to the draft_head path); use_mtp=True (the target's own multi-token-prediction
# layer drafts: heads/mtp.py, through the draft_head path).
DRAFTER_OPTIONS = ("assistant_early_exit", "speculation_type", "use_mtp")
# A transformers Cache the call continues (engine/user_cache.py): transformers' name from 5.24, then
# its name before.
CACHE_OPTIONS = ("cache", "past_key_values")
ENGINE_IMPLEMENTS = frozenset(LOGITS_STAGE_OPTIONS + STOPPING_OPTIONS + SCHEDULE_OPTIONS + OUTPUT_OPTIONS
                              + DRAFTER_OPTIONS + CACHE_OPTIONS)

# GenerationConfig fields resolve_options implements (typed into Options).
HANDLED_FIELDS = frozenset({
    "max_length", "max_new_tokens", "do_sample", "temperature", "top_k", "top_p", "min_p", "eos_token_id",
    "pad_token_id", "num_assistant_tokens", "prompt_lookup_num_tokens", "max_matching_ngram_size",
})
# Arguments api.generate takes itself (its signature, or popped from its **kwargs: inputs, tokenizer,
# assistant_tokenizer), transformers' names first, then ours.
API_ARGUMENTS = frozenset({
    "inputs", "input_ids", "attention_mask", "generation_config", "assistant_model", "streamer", "tokenizer",
    "assistant_tokenizer", "seed", "return_stats", "backend", "runner", "cuda_graphs", "tree", "draft_head",
})
# Options that change nothing we output, whatever their value, and why.
ACCEPTED = {
    "use_cache": "we always decode with a KV cache; the tokens do not depend on it (False: no cache in "
                 "return_dict_in_generate's output, as transformers', rules.builds_dynamic_cache)",
    "cache_implementation": "which cache transformers builds (we decode with our own; the output dict holds the "
                            "DynamicCache generate builds for none, 'dynamic' or 'hybrid', no cache for the others)",
    "cache_config": "how transformers builds its cache",
    "max_cache_len": "the size of transformers' static cache",
    "prefill_chunk_size": "how transformers chunks its prefill",
    "compile_config": "how transformers compiles its forward",
    "disable_compile": "whether transformers compiles its forward",
    "continuous_batching_config": "transformers' continuous batching",
    "low_memory": "how transformers batches contrastive search",
    "assistant_confidence_threshold": "when transformers' draft stops early (speed only)",
    "assistant_lookbehind": "transformers' re-encoding window across two tokenizers (ours re-encodes from exact "
                            "byte offsets: drafters/cross_tokenizer.py)",
    "target_lookbehind": "transformers' re-encoding window across two tokenizers (ours re-encodes from exact "
                         "byte offsets: drafters/cross_tokenizer.py)",
    "bos_token_id": "read only when there is no prompt (input_ids is required here)",
    "decoder_start_token_id": "read only by encoder-decoder models",
    "is_assistant": "marks a draft model's own config",
    "trust_remote_code": "read only with custom_generate",
    "transformers_version": "metadata", "_from_model_config": "metadata", "_commit_hash": "metadata",
    "_original_object_hash": "metadata",
}


def _single_beam(merged: dict) -> bool:
    beams = merged.get("num_beams")
    return beams is None or (type(beams) is int and beams == 1)


# GenerationConfig fields that transformers' own generate ignores in some calls, whatever their
# value (GenerationConfig.validate: "this flag is only used in beam-based / sample-based
# generation modes", "... is ignored"): accepted in those calls, since transformers decodes the
# same tokens and returns the same outputs there. A checkpoint whose generation_config.json holds
# early_stopping=True with num_beams=1 speculates. name -> ignored(merged options).
IGNORED_IN_MODE = {
    "early_stopping": _single_beam, "length_penalty": _single_beam,  # beam search only
}


def ignored_in_mode(name: str, merged: dict) -> bool:
    """True when transformers' generate ignores option ``name`` in a call whose merged options are
    ``merged`` (IGNORED_IN_MODE), so any value of it changes nothing."""
    ignored = IGNORED_IN_MODE.get(name)
    return ignored is not None and ignored(merged)


class UnsupportedOptionError(ValueError):
    """An option at a value specdec_fast does not implement (or a name it does not know): what
    patch_generate's fallback hands to transformers' own generate."""


def _synthid_watermark(value) -> bool:
    """SynthID's watermark config (SynthIDTextWatermarkingConfig, or a dict of its fields)."""
    if isinstance(value, dict):
        return "ngram_len" in value or "keys" in value
    return any(cls.__name__ == "SynthIDTextWatermarkingConfig" for cls in type(value).__mro__)


# Handled options implemented at some values only: name -> (refused(value), what we take, in words).
# SynthID's processor keeps state from step to step (its last n-gram, the contexts seen, a call
# count) that per-position calls, rejected drafts included, would corrupt (processing/watermark.py).
REFUSED_VALUES = {
    "watermarking_config": (_synthid_watermark, "None or a WatermarkingConfig (SynthID's processor keeps state "
                                                "across steps)"),
    "speculation_type": (lambda value: value != "dflash", "None or 'dflash' (assistant_model a DFlash drafter)"),
    "use_mtp": (lambda value: not isinstance(value, bool), "None, False or True (the target's MTP layer drafts)"),
}


def _is_none(value) -> bool:
    return value is None


def _none_or_empty(value) -> bool:
    return value is None or (hasattr(value, "__len__") and not isinstance(value, (str, bytes)) and len(value) == 0)


def _none_or_false(value) -> bool:
    return value is None or value is False


# transformers' generate() keyword arguments that are not GenerationConfig fields and that we do
# not implement: name -> (is it neutral?, the neutral values in words).
GENERATE_ARGUMENTS = {
    "logits_processor": (_none_or_empty, "None or an empty LogitsProcessorList"),
    "stopping_criteria": (_none_or_empty, "None or an empty StoppingCriteriaList"),
    "prefix_allowed_tokens_fn": (_is_none, "None"),
    "synced_gpus": (_none_or_false, "None or False (we keep no other process in step)"),
    "custom_generate": (_is_none, "None"),
    "inputs_embeds": (_is_none, "None (give input_ids)"),
    "position_ids": (_is_none, "None (positions follow the attention mask)"),
    "decoder_input_ids": (_is_none, "None (decoder-only models)"),
    "encoder_outputs": (_is_none, "None (decoder-only models)"),
}
_METADATA = {"transformers_version", "_from_model_config", "_commit_hash", "_original_object_hash"}


@lru_cache(maxsize=1)
def field_defaults() -> dict:
    """name -> transformers' default, for every GenerationConfig field: the value GenerationConfig()
    holds, or where that is None the value generate() fills in (GenerationConfig.
    _get_default_generation_params in transformers 5.x; absent in 4.x, whose __init__ held the numbers)."""
    from transformers import GenerationConfig

    fill = getattr(GenerationConfig, "_get_default_generation_params", dict)()
    return {name: fill.get(name) if value is None else value
            for name, value in GenerationConfig().to_dict().items() if name not in _METADATA}


@lru_cache(maxsize=1)
def boolean_fields() -> frozenset:
    """Fields GenerationConfig's docstring types as `bool` (output_attentions, renormalize_logits, ...):
    for these transformers reads None as False (GenerationConfig.validate), so False is neutral too."""
    from transformers import GenerationConfig

    return frozenset(re.findall(r"^\s+(\w+) \(`bool`[,)]", GenerationConfig.__doc__ or "", re.M)) & set(field_defaults())


def neutral_values(name: str) -> list:
    """The values of GenerationConfig field ``name`` that leave the output as transformers' default does."""
    default = field_defaults()[name]
    values = [None] if default is None else [None, default]
    if name in boolean_fields() and False not in values:
        values.append(False)
    return values


def _equal(value, neutral) -> bool:
    """value == neutral without Python's bool/int/None mixing (True is not 1, 0 is not False)."""
    if neutral is None or isinstance(neutral, bool) or isinstance(value, bool):
        return value is neutral
    if isinstance(neutral, Real):
        return isinstance(value, Real) and value == neutral
    return type(value) is type(neutral) and value == neutral


def is_neutral(name: str, value) -> bool:
    """True when option ``name`` at ``value`` leaves transformers' default output unchanged (None always)."""
    if value is None:
        return True
    if name in GENERATE_ARGUMENTS:
        return GENERATE_ARGUMENTS[name][0](value)
    if name in field_defaults():
        return any(_equal(value, neutral) for neutral in neutral_values(name))
    return False


def neutral_text(name: str) -> str:
    """The neutral values of ``name`` in words, for an error message."""
    if name in GENERATE_ARGUMENTS:
        return f"{name}={GENERATE_ARGUMENTS[name][1]}"
    return " or ".join(f"{name}={value!r}" for value in neutral_values(name)[::-1])


def option_class(name: str, implemented=ENGINE_IMPLEMENTS) -> str:
    """"handled", "accepted" or "unsupported" (see the module docstring); "unknown" for a name that is
    neither a GenerationConfig field nor a keyword argument of transformers' generate() or ours."""
    if name in HANDLED_FIELDS or name in API_ARGUMENTS or name in implemented:
        return "handled"
    if name in ACCEPTED:
        return "accepted"
    if name in GENERATE_ARGUMENTS or name in field_defaults():
        return "unsupported"
    return "unknown"


def short_repr(value, limit: int = 60) -> str:
    """repr on one line, at most ``limit`` characters (a tensor by its shape, a StoppingCriteriaList or
    LogitsProcessorList by its items' types)."""
    if hasattr(value, "shape") and hasattr(value, "dtype"):
        return f"<{type(value).__name__} of shape {tuple(value.shape)}>"
    if isinstance(value, (list, tuple)) and type(value) not in (list, tuple):
        value = f"{type(value).__name__}([{', '.join(type(item).__name__ for item in value)}])"
        return value if len(value) <= limit else value[: limit - 3] + "..."
    text = " ".join(repr(value).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def builds_dynamic_cache(merged: dict) -> bool:
    """Whether transformers' generate builds a DynamicCache of its own for a call whose options are
    ``merged`` (every option, before filtering), and so returns one with return_dict_in_generate where
    the call passed no cache (GenerationMixin._prepare_cache_for_generation, 5.24): use_cache not
    False, and cache_implementation None, "dynamic" or "hybrid" (older sliding-window checkpoints'
    default, which generate unsets). The others (static, offloaded, quantized, ...) build caches of
    other classes: not built here."""
    return merged.get("use_cache") is not False and merged.get("cache_implementation") in (None, "dynamic", "hybrid")


def check_cache_implementation(merged: dict, model=None) -> None:
    """transformers' ValueError for a cache passed with a cache_implementation (merged: every
    option of the call, before filtering), from any source: GenerationMixin._prepare_cache_for_generation
    (5.24) raises it; "hybrid", older sliding-window checkpoints' default, it unsets first. Its words
    name the cache as the installed transformers does (``past_key_values`` before 5.24: the
    forward's name, runners/hf.py's cache_keyword, whichever name the call used)."""
    if any(merged.get(name) is not None for name in CACHE_OPTIONS) and merged.get("cache_implementation") not in (None, "hybrid"):
        from ..runners.hf import cache_keyword

        name = cache_keyword(model) if callable(getattr(model, "forward", None)) else "cache"
        raise ValueError(f"Passing both `cache_implementation` (used to initialize certain caches) and `{name}` (a "
                         "Cache object) is unsupported. Please use only one of the two.")


def check_option(name: str, value, where: str, implemented=ENGINE_IMPLEMENTS) -> bool:
    """Apply the rule to one option from ``where`` ("keyword argument", "generation_config", ...):
    True when its value must reach the caller (a handled option that is not neutral), False when it
    changes nothing (accepted, or neutral), ValueError naming the option and value otherwise."""
    kind = option_class(name, implemented)
    if kind == "accepted" or name in API_ARGUMENTS:
        return False
    origin = "" if where == "keyword argument" else f" (from {where})"
    if kind == "handled":
        refused = REFUSED_VALUES.get(name)
        if refused is not None and value is not None and refused[0](value):
            raise UnsupportedOptionError(f"unsupported generate option {name}={short_repr(value)}{origin}: "
                                         f"specdec_fast supports only {refused[1]}")
        return name in HANDLED_FIELDS or not is_neutral(name, value)
    if kind == "unknown":
        raise UnsupportedOptionError(f"unsupported generate option {name!r}{origin}: not a GenerationConfig field nor a "
                                     "generate() argument specdec_fast knows")
    if is_neutral(name, value):
        return False
    raise UnsupportedOptionError(f"unsupported generate option {name}={short_repr(value)}{origin}: specdec_fast "
                                 f"supports only {neutral_text(name)}")


def classification(implemented=ENGINE_IMPLEMENTS) -> dict:
    """{"handled": [...], "accepted": [...], "unsupported": [...]}: every GenerationConfig field and
    every keyword argument of transformers' generate() we know, by class (the README's table)."""
    names = set(field_defaults()) | set(GENERATE_ARGUMENTS) | set(ACCEPTED) | API_ARGUMENTS | set(implemented)
    table = {"handled": [], "accepted": [], "unsupported": []}
    for name in sorted(names - _METADATA):
        table[option_class(name, implemented)].append(name)
    return table
