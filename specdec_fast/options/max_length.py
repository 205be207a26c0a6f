"""How many new tokens a generate() call makes, decided as transformers 5.24's generate decides it
(GenerationMixin._prepare_generated_length and _validate_generated_length), same warnings and errors.

- max_new_tokens given (anywhere: keyword, generation_config, model.generation_config): it wins; if
  max_length is given too, transformers logs "Both `max_new_tokens` ... and `max_length` ... seem
  to have been set" (here: a warning on the "specdec_fast" logger).
- max_length given, no max_new_tokens: max_length counts the prompt, i.e. input_ids' width,
  left padding included; a width >= max_length raises transformers' ValueError ("Input length of
  input_ids is ..., but `max_length` is set to ...").
- neither: transformers' default max_length (20) counts NEW tokens then: max_length = 20 +
  width, capped at model.config.max_position_embeddings, with transformers' UserWarning "Using the
  model-agnostic default `max_length` (=...)". (Not 20 - width: the default is 20 new tokens.)
"""
import logging
import warnings
from numbers import Integral

from .rules import field_defaults

logger = logging.getLogger("specdec_fast")


def _check_int(name: str, value) -> None:
    if isinstance(value, bool) or not isinstance(value, Integral) or value < 1:
        raise ValueError(f"{name} must be an int >= 1, got {value!r}")


def resolve_max_new_tokens(max_new_tokens, max_length, prompt_width: int, max_position_embeddings=None) -> int:
    """The number of new tokens per row. ``max_new_tokens`` / ``max_length``: the merged values (None =
    given nowhere); ``max_position_embeddings``: the model config's (None: no cap), which caps only
    the default length, as in transformers."""
    if max_new_tokens is not None:
        _check_int("max_new_tokens", max_new_tokens)
        if max_length is not None:
            logger.warning(
                f"Both `max_new_tokens` (={max_new_tokens}) and `max_length`(={max_length}) seem to have been set. "
                "`max_new_tokens` will take precedence.")
        return int(max_new_tokens)
    if max_length is None:
        max_length = field_defaults()["max_length"] + prompt_width
        if isinstance(max_position_embeddings, Integral):
            max_length = min(max_length, int(max_position_embeddings))
        warnings.warn(
            f"Using the model-agnostic default `max_length` (={max_length}) to control the generation length. We "
            "recommend setting `max_new_tokens` to control the maximum length of the generation.", UserWarning,
            stacklevel=4)
    else:
        _check_int("max_length", max_length)
    if prompt_width >= max_length:
        raise ValueError(
            f"Input length of input_ids is {prompt_width}, but `max_length` is set to {max_length}. This can lead to "
            "unexpected behavior. You should consider increasing `max_length` or, better yet, setting `max_new_tokens`.")
    return int(max_length) - prompt_width
