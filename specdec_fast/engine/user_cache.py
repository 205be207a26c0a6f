"""generate(..., cache=c) (transformers 5.24+'s name; past_key_values=c before, still taken; we
take both names on every transformers): a transformers Cache that the call continues.
transformers' docs show two uses: a chat loop that keeps one DynamicCache across turns and passes
it to every generate(), and a prompt cache (a long system prompt's KV) deep-copied into each call.

transformers' contract (GenerationMixin._prefill, 5.24): the cache holds the KV of
input_ids[:, :L] (L = cache.get_seq_length()); input_ids is the whole sequence and the
attention_mask as wide; generate runs input_ids[:, L:] over the cache, and the cache it leaves
holds the KV of every token of the returned sequences but the last. That is what the next turn
builds on. With return_dict_in_generate the output's cache is this same object; a call that passed
none gets the one generate would have built (generation_cache, below).

Ours: the engine decodes as it does without a cache. Its runners prefill the whole prompt into
their own paged KV, and the cache's tensors are never read: the tokens are the same function of
input_ids, up to the rounding between a cached and a whole prefill. Then ``extend_user_cache``
brings the cache to the state generate leaves it in: forwards of the target over
sequences[:, L:-1] on top of it (the prompt's, then the generated tokens'), with the mask and
positions generate makes; the scores, logits, hidden states or attentions the output asks come from
those same forwards. So a call with a cache costs one extra prefill of its new tokens (the prompt past L and the generated tokens); the
cached prefix itself is prefilled again by our runners (not copied from the cache: a cache's
layout and RoPE are the model's, ours are the runner's).

Refused (ValueError, as transformers would fail or misbehave):
- a cache holding the whole prompt: transformers would then run the whole prompt again on top of it;
- num_return_sequences > 1: the cache holds one row per prompt, and transformers fails on it;
- a cache whose batch differs from input_ids';
- a StaticCache too short for the returned tokens but the last (transformers fails as it writes
  past it; we find it after the loop and leave the cache as it came).
Refused with UnsupportedInputError (patch_generate hands the call to transformers): input_ids
holding only the tokens past the cache (an attention_mask as wide as cache + input_ids).
Its KV would be needed for those tokens, and ours are recomputed from input_ids.
"""
import torch

from ..options.rules import CACHE_OPTIONS
from .inputs import UnsupportedInputError
from .outputs import attentions_over, generation_mask, step_forwards


def take_user_cache(extra: dict):
    """(extra without the cache names, the Cache or None) from Options.extra. ValueError for two
    different caches (cache= and past_key_values=) or a value that is not a transformers Cache."""
    given = [extra[name] for name in CACHE_OPTIONS if extra.get(name) is not None]
    rest = {name: value for name, value in extra.items() if name not in CACHE_OPTIONS}
    if not given:
        return rest, None
    if len(given) == 2 and given[0] is not given[1]:
        raise ValueError("pass the cache once: cache= (transformers 5.24+) or past_key_values=, not two caches")
    from transformers.cache_utils import Cache

    cache = given[0]
    if isinstance(cache, tuple):  # transformers' own words for it
        raise ValueError("Passing a tuple for `cache` is not supported anymore. Please use a `Cache` instance.")
    if not isinstance(cache, Cache):
        raise ValueError(f"cache must be a transformers Cache (DynamicCache, StaticCache, ...), got {type(cache).__name__}")
    return rest, cache


def cached_length(cache, input_ids: torch.Tensor, attention_mask, return_sequences: int) -> int:
    """L, the tokens of input_ids [B, P] the cache holds, after the checks of the module docstring
    (attention_mask: the call's, [B, P], or None)."""
    length = int(cache.get_seq_length())
    width = input_ids.shape[1]
    if isinstance(attention_mask, torch.Tensor) and attention_mask.dim() == 2 and attention_mask.shape[1] != width:
        if attention_mask.shape[1] == length + width:
            raise UnsupportedInputError(
                f"input_ids holds only the {width} tokens past the cache's {length} (the attention_mask is "
                f"{length + width} wide): specdec_fast recomputes the prompt from input_ids; pass the whole sequence "
                "(the cached tokens, then the new ones)")
        return length  # check_inputs names the mismatch
    if length >= width:
        raise ValueError(f"the cache holds {length} tokens and input_ids {width}: generate runs the tokens past the "
                         "cache, so input_ids must extend what the cache holds by at least one token")
    if return_sequences > 1:
        raise ValueError(f"num_return_sequences={return_sequences} with a cache: the cache holds one row per prompt "
                         "(transformers' generate fails on it too); pass a cache per sequence, or none")
    rows = _batch_size(cache) if length else -1
    if rows not in (-1, input_ids.shape[0]):
        raise ValueError(f"the cache holds {rows} rows and input_ids {input_ids.shape[0]}")
    return length


def _batch_size(cache) -> int:
    """The cache's rows: its first filled layer's keys [B, heads, tokens, D] (-1 where none is)."""
    for layer in getattr(cache, "layers", ()):
        keys = getattr(layer, "keys", None)
        if getattr(layer, "is_initialized", False) and isinstance(keys, torch.Tensor) and keys.dim() == 4:
            return keys.shape[0]
    return -1


def _capacity(cache):
    """The tokens a static cache holds at most (its full-attention layers' max_cache_len), None
    where every layer grows or slides (a sliding layer keeps its last window, any length)."""
    sizes = [layer.max_cache_len for layer in getattr(cache, "layers", ())
             if isinstance(getattr(layer, "max_cache_len", None), int) and "Sliding" not in type(layer).__name__]
    return min(sizes) if sizes else None


@torch.no_grad()
def extend_user_cache(model, cache, sequences: torch.Tensor, prompt_mask: torch.Tensor, cached: int,
                      logits: bool = False, hidden_states: bool = False, attentions: bool = False):
    """Leave ``cache`` (holding the KV of the prompt's first ``cached`` tokens) as transformers'
    generate leaves it: the KV of sequences [B, P + T] but the last token. Generate's two forwards of
    ``model`` over it (outputs.step_forwards): its prefill (prompt tokens cached .. P - 1), then the
    generated tokens but the last (the mask: the prompt's [B, P] then ones, pads after EOS included,
    as generate feeds them; positions from the mask). Not one: eager attention spreads a left pad's
    fully masked query over every key its forward holds, so one forward would give the pads' KV other
    values than generate's prefill (seen: 2.8 apart; the real tokens' agree either way).

    logits / hidden_states / attentions: what the call's output dict asks (outputs.forwards_asked), computed
    by the same forwards, over the user's cache as generate's are: returns step_forwards' tuple for
    outputs.output_dict, or None where nothing is asked. Attentions of a cache whose second forward cannot
    be cut into generate's steps (outputs.attentions_over: a static sliding layer) take one forward a
    generated token, as generate's."""
    width, end = prompt_mask.shape[1], sequences.shape[1] - 1
    capacity = _capacity(cache)
    if capacity is not None and end > capacity:  # transformers fails as it writes slot `capacity` (IndexError)
        raise ValueError(f"the cache holds at most {capacity} tokens and this call's {end + 1} tokens need {end} "
                         "(all but the last): give the StaticCache a larger max_cache_len; the cache is left as it was")
    asked = dict(logits=logits, hidden_states=hidden_states, attentions=attentions)
    forwards = step_forwards(model, sequences, prompt_mask, end + 1 - width, cached=cached, cache=cache,
                             stepwise=attentions and not attentions_over(cache), **asked)
    return forwards if any(asked.values()) else None


def generation_cache(model, sequences: torch.Tensor, prompt_mask: torch.Tensor):
    """The cache transformers' generate returns with return_dict_in_generate where the call passed
    none and generate built its own (Options.builds_cache): the KV of sequences [B, P + T] but the
    last token, in the cache the model's forward makes when it is given none (DynamicCache(config):
    generate's DynamicCache(config=text config); the model's own class where it brings one), from
    generate's two forwards asked for nothing else (outputs.step_forwards)."""
    return step_forwards(model, sequences, prompt_mask, sequences.shape[1] - prompt_mask.shape[1])[3]
