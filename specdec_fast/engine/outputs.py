"""What generate() returns when asked for more than the tokens: return_dict_in_generate with
output_scores / output_logits / output_hidden_states / output_attentions (transformers'
GenerateDecoderOnlyOutput; its cache: the call's own, engine/user_cache.py, else the one generate
would have built, user_cache.generation_cache, else None), and the rows that num_return_sequences adds.

scores and logits: transformers returns, for every step s of the generation, the target's raw
logits [B, V] (``logits``) and the processed ones (``scores``: after every logits processor and,
when sampling, the warpers), float32. A step's logits depend only on the tokens before it, so
they are computed after the loop, teacher-forced over the final sequences in generate's two
forwards (the prompt as its prefill, then every generated token but the last over that cache: the
model's own forward, positions from the attention mask as generate() makes them; pads after a
row's end are fed as generate() feeds them; the cache they fill is the one the output returns
where the call passed none), then processed per position with that position's
prefix (processing/, penalties included, in transformers' order), then log-softmax when
renormalize_logits (transformers' LogitNormalization, its last processor: output_dict).
Measured on CPU (tiny Llama, B = 3, 6 steps): equal to model.generate's within 4e-6. The loop itself is untouched: a call
without these options pays nothing, one with them pays forwards over B x (P + T) tokens, a
prefill's worth, instead of a [B, K+1, V] copy per iteration.

hidden_states and attentions: the same two forwards (step_forwards, which computes all of them at
once: the prompt alone, as generate's prefill, whose left pads' values depend on the row's width;
then the generated tokens over its cache).
"""
import torch

from ..kernels.verify.reference import standardise
from ..processing import LogitsProcessing
from ..processing.penalties import generate_skips_prompt_pads
from .logits_stage import stage_options_of


def return_sequences(opts) -> int:
    """num_return_sequences of a call (transformers' rule: more than 1 needs sampling)."""
    n = opts.extra.get("num_return_sequences") or 1
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"num_return_sequences must be an int >= 1, got {n!r}")
    if n > 1 and not opts.do_sample:
        raise ValueError("Greedy methods without beam search do not support `num_return_sequences` different than 1 "
                         f"(got {n}).")
    return n


def expand_rows(input_ids: torch.Tensor, attention_mask, n: int):
    """num_return_sequences = n: every row n times in a row (transformers' _expand_inputs_for_generation)."""
    if n == 1:
        return input_ids, attention_mask
    return input_ids.repeat_interleave(n, 0), None if attention_mask is None else attention_mask.repeat_interleave(n, 0)


def generation_mask(prompt_mask: torch.Tensor, new: int) -> tuple:
    """(attention_mask, position_ids), int64 [B, P + new]: the prompt's mask then ``new`` ones
    (generated tokens, pads after EOS too, as generate() feeds them), positions from the mask."""
    ones = torch.ones(prompt_mask.shape[0], new, dtype=torch.long, device=prompt_mask.device)
    mask = torch.cat([prompt_mask.long(), ones], 1)
    return mask, (mask.cumsum(-1) - 1).clamp(min=0)


# The model types whose transformers forward of several tokens over a cache restarts its recurrent scan from zero
# (their Mamba1 mixers call mamba_selective_scan without the cached state; only a one-token step continues it):
# step_forwards feeds them generate's way, a generated token a forward. Found by the families fuzzer (2026-11-30,
# --seed 1573 case 11: Jamba's scores 2.25 off from step 1 on, its tokens equal).
SCAN_RESTARTING_TYPES = ("mamba", "falcon_mamba", "jamba")
# ... of which those whose generate feeds a step no attention mask (their prepare_inputs_for_generation drops it
# after the first iteration; given one, their mixer would broadcast the step over the mask's width)
MASKLESS_STEP_TYPES = ("mamba", "falcon_mamba")
# ... and the types whose forward of several tokens over a cache reads the cache's length from layer 0, which holds no
# keys: MiniMax's (a lightning layer first in its checkpoints; transformers 5.24's MiniMaxCache), whose causal mask
# then takes those tokens for the first ones (its scores 2.3 off on a tiny model); generate feeds it a token a step
LAYER0_LENGTH_TYPES = ("minimax",)


def forwards_asked(opts) -> dict:
    """What of step_forwards' outputs a call's output dict needs (step_forwards' keywords): logits for
    output_scores / output_logits, hidden_states, attentions; all False without return_dict_in_generate."""
    extra = opts.extra if opts.extra.get("return_dict_in_generate") else {}
    return dict(logits=bool(extra.get("output_scores") or extra.get("output_logits")),
                hidden_states=bool(extra.get("output_hidden_states")), attentions=bool(extra.get("output_attentions")))


@torch.no_grad()
def step_forwards(model, sequences: torch.Tensor, prompt_mask: torch.Tensor, steps: int, *, logits: bool = False,
                  hidden_states: bool = False, attentions: bool = False, cached: int = 0, cache=None,
                  stepwise: bool = False) -> tuple:
    """(logits, hidden_states, attentions, cache) as transformers' generate computes them for the
    T = ``steps`` generated tokens of sequences [B, P + T], from generate's two forwards (None where
    not asked). Two forwards, not one: the prompt alone, as generate's prefill (a left pad's query
    sees no key, and what the model puts there depends on the width of the row it is in), then
    tokens P .. P + T - 2 over the prompt's cache (each query sees the keys generate's step saw;
    equal up to fp32 rounding).

    logits: float32 [B, T, V], the logits that chose token P + s (position P + s - 1: the prompt
    forward's last, then the second forward's). hidden states and attentions: per step, a tuple
    over the layers (hidden states: the embeddings first); step 0 is the prompt's forward: [B, P, H]
    and [B, heads, P, P]; step s >= 1 the forward of token P + s - 1: [B, 1, H] and [B, heads, 1,
    P + s]. Attentions are what the model gives (empty tuples for sdpa, as in generate; eager
    attention returns them). Split as generate splits them, because eager attention spreads a left
    pad's fully masked query over every key its forward holds. cache, cached: a user's cache holding
    the KV of the prompt's first ``cached`` tokens (user_cache.extend_user_cache): generate's prefill
    runs the others over it, so step 0 holds positions cached .. P - 1 (queries; the attentions' keys
    stay all P), and the forwards leave it extended in place. stepwise: the generated tokens one forward each, as generate feeds them (where the
    second forward's attentions cannot be cut into generate's steps: a static sliding layer's slots roll,
    attentions_over; always for SCAN_RESTARTING_TYPES and LAYER0_LENGTH_TYPES, MASKLESS_STEP_TYPES' steps without a mask). Returned cache: the one these forwards filled (that one where given), holding the KV
    of every token but the last, as generate leaves its own (user_cache.generation_cache's)."""
    from ..runners.hf import cache_keyword, output_cache

    width = prompt_mask.shape[1]
    model_type = getattr(getattr(model, "config", None), "model_type", None)
    stepwise = stepwise or model_type in SCAN_RESTARTING_TYPES + LAYER0_LENGTH_TYPES
    mask, positions = generation_mask(prompt_mask, steps - 1)
    asked = dict(output_hidden_states=hidden_states, output_attentions=attentions)
    if cached and cache is None:
        raise ValueError("cached prompt tokens need the cache that holds them")
    prefix = {} if cache is None else {cache_keyword(model): cache}  # generate's prefill over a user's cache
    prompt = model(input_ids=sequences[:, cached:width], attention_mask=mask[:, :width],
                   position_ids=positions[:, cached:width], use_cache=True, logits_to_keep=1, **prefix, **asked)
    # (a Mamba model's output has no attentions field: None, as generate gives it)
    scores, hidden, attention = [prompt.logits[:, -1:].float()], [prompt.hidden_states], [getattr(prompt, "attentions", None)]
    cache = output_cache(prompt)
    if steps > 1 and stepwise:
        for t in range(width, width + steps - 1):  # generate's steps: token t over the cache, its mask so far
            out = model(input_ids=sequences[:, t: t + 1],
                        attention_mask=None if model_type in MASKLESS_STEP_TYPES else mask[:, : t + 1],
                        position_ids=positions[:, t: t + 1], use_cache=True, logits_to_keep=1,
                        **{cache_keyword(model): cache}, **asked)
            scores.append(out.logits[:, -1:].float())
            hidden.append(out.hidden_states)
            attention.append(getattr(out, "attentions", None))
    elif steps > 1:
        windows, whole = _cache_windows(cache), _static_full_layers(cache)
        rest = model(input_ids=sequences[:, width: width + steps - 1], attention_mask=mask,
                     position_ids=positions[:, width:], use_cache=True, logits_to_keep=0 if logits else 1,
                     **{cache_keyword(model): cache}, **asked)
        scores.append(rest.logits.float())
        fed = width + steps - 1  # slots 0 .. fed - 1 went through the model
        for s in range(1, steps):
            hidden.append(None if rest.hidden_states is None else tuple(h[:, s - 1: s] for h in rest.hidden_states))
            if getattr(rest, "attentions", None) is None:
                attention.append(None)
                continue
            step = []
            for i, a in enumerate(rest.attentions):  # keys: the last a.shape[-1] slots fed
                if i < len(whole) and whole[i]:  # a user's static layer: every slot, as generate's step over it
                    step.append(a[:, :, s - 1: s])
                    continue
                window = windows[i] if i < len(windows) else None
                first = 0 if window is None else max(0, width + s - window)  # a sliding layer's step keeps `window`
                start = fed - a.shape[-1]
                step.append(a[:, :, s - 1: s, first - start: width + s - start])
            attention.append(tuple(step))
    return (torch.cat(scores, 1) if logits else None, tuple(hidden) if hidden_states else None,
            tuple(attention) if attentions else None, cache)


def _cache_windows(cache) -> list:
    """Each layer's sliding window in transformers' own cache (what its generate builds: its
    sliding layers keep the last window - 1 keys and attend `window` at each step), None for a
    full layer. Found by the options fuzzing round: a sliding layer's step attentions were
    [.., P + s] here against transformers' [.., min(window, P + s)]."""
    return [getattr(layer, "sliding_window", None) if getattr(layer, "is_sliding", False) else None
            for layer in getattr(cache, "layers", ())]


def _static_full_layers(cache) -> list:
    """Per layer of a cache, whether it is a static full-attention layer (transformers' StaticLayer: its
    keys span max_cache_len slots, zero weights past the tokens so far, in every step's attentions)."""
    return [isinstance(getattr(layer, "max_cache_len", None), int) and not getattr(layer, "is_sliding", False)
            for layer in getattr(cache, "layers", ())]


def attentions_over(cache) -> bool:
    """Whether step_forwards' one forward of the generated tokens gives generate's attentions over this user's
    cache: a DynamicCache (its layers grow or slide as generate's own), or a cache of static full-attention
    layers only; else (a static sliding layer, whose slots roll as its window does) stepwise."""
    layers = getattr(cache, "layers", ())
    return type(cache).__name__ == "DynamicCache" or (bool(layers) and all(_static_full_layers(cache)))


def step_scores(logits: torch.Tensor, sequences: torch.Tensor, prompt_width: int, start: torch.Tensor, options: dict,
                eos_token_ids, params, do_sample: bool, max_new_tokens: int, model=None) -> torch.Tensor:
    """float32 [B, T, V]: transformers' scores from the raw step logits [B, T, V]: the processors
    at each step with that step's prefix (the generated tokens before it), then the warpers when
    sampling (params: the call's SamplingTensors [B]). start int64 [B]: each row's first real
    prompt slot; the repetition penalty counts from there where the installed transformers'
    generate() skips left pads (5.23 and later), from slot 0 where it penalises the pad token
    (5.22 and earlier), as the loop's own penalties do (logits_stage._pads_start). max_new_tokens:
    the call's (forced_eos_token_id forces its last position; T is less where rows stopped early).
    model: the target, which guidance_scale runs unconditionally."""
    steps = logits.shape[1]
    start = start if generate_skips_prompt_pads() else None
    processed = logits.clone()
    if options:
        processing = LogitsProcessing.from_options(dict(options, eos_token_id=eos_token_ids, do_sample=do_sample),
                                                   vocab_size=logits.shape[-1], prompt_width=prompt_width,
                                                   device=logits.device, logits_processor=options.get("logits_processor"),
                                                   fused_penalties=False, max_new_tokens=max_new_tokens,
                                                   guidance_model=model)
        end = torch.full((logits.shape[0],), prompt_width, dtype=torch.long, device=logits.device)
        generated = sequences[:, prompt_width: prompt_width + steps - 1].long()
        # Step s sees the prompt and the generated tokens 0..s-1: the "drafts" of one long iteration.
        processed = processing.process(processed, sequences[:, :prompt_width], end, generated, start=start,
                                       params=params)
        if processing.warpers_here:  # standardised (and watermarked after) in process
            return processed
    return standardise(processed, params) if do_sample else processed


def output_dict(target, tokens, mask, opts, params, user_cache=None, new_cache: bool = False, forwards=None):
    """transformers' GenerateDecoderOnlyOutput for a call that asked return_dict_in_generate:
    tokens [B, P + T], mask the prompt's [B, P], opts the call's Options, params its
    SamplingTensors; scores / logits / hidden states / attentions when asked, and the user's
    cache (extended by user_cache.extend_user_cache), else with new_cache the cache
    generate would have built: the one the forwards of the scores, logits or hidden states filled,
    else user_cache.generation_cache's. forwards: step_forwards' (logits, hidden states, attentions, cache)
    where the call's user cache was extended by them (user_cache.extend_user_cache), else None (run here)."""
    want_scores, want_logits = bool(opts.extra.get("output_scores")), bool(opts.extra.get("output_logits"))
    want_hidden, want_attentions = (bool(opts.extra.get("output_hidden_states")),
                                    bool(opts.extra.get("output_attentions")))
    scores = logits = hidden = attentions = filled = None
    width, steps = mask.shape[1], tokens.shape[1] - mask.shape[1]
    if forwards is not None:
        raw, hidden, attentions, _ = forwards
    elif want_scores or want_logits or want_hidden or want_attentions:  # generate's two forwards, once for all
        raw, hidden, attentions, filled = step_forwards(target, tokens, mask, steps, **forwards_asked(opts))
    if want_scores or want_logits:
        if want_logits:
            logits = tuple(raw.unbind(1))
        if want_scores:
            start = (width - mask.sum(1)).long()
            processed = step_scores(raw, tokens, width, start, stage_options_of(opts), opts.eos_token_ids, params,
                                    opts.do_sample, opts.max_new_tokens, model=target)
            if opts.extra.get("renormalize_logits"):  # transformers' LogitNormalization, its last processor
                processed = processed.log_softmax(-1)
            scores = tuple(processed.unbind(1))
    cache = user_cache
    if new_cache:  # the forwards above filled one as generate does; else its own two
        from .user_cache import generation_cache  # user_cache imports this module's generation_mask

        cache = filled if filled is not None else generation_cache(target, tokens, mask)
    return decoder_only_output(tokens, scores, logits, hidden, attentions, cache)


def decoder_only_output(sequences, scores=None, logits=None, hidden_states=None, attentions=None, cache=None):
    """transformers' GenerateDecoderOnlyOutput; cache: the call's own (engine/user_cache.py), under
    the field's name in the installed transformers (``cache`` from 5.24, ``past_key_values`` before)."""
    import dataclasses

    from transformers.generation.utils import GenerateDecoderOnlyOutput

    names = {field.name for field in dataclasses.fields(GenerateDecoderOnlyOutput)}
    cache_field = {("cache" if "cache" in names else "past_key_values"): cache} if cache is not None else {}
    return GenerateDecoderOnlyOutput(sequences=sequences, scores=scores, logits=logits, hidden_states=hidden_states,
                                     attentions=attentions, **cache_field)
