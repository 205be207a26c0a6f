"""LogitsProcessing: transformers' logits processors for one generate call, per speculative
position, in transformers' order (generation/utils.py _get_logits_processor):

    0 guidance_scale           UnbatchedClassifierFreeGuidanceLogitsProcessor
                                                                    guidance.py (the target only: an
                                                                    unconditional forward per row, eager)
    1 sequence_bias            SequenceBiasLogitsProcessor          sequence_bias.py
   1b encoder_repetition_penalty
                               EncoderRepetitionPenaltyLogitsProcessor
                                                                    encoder_penalty.py (the prompt's tokens)
    2 repetition_penalty (+ frequency / presence, vLLM's)           penalties.py
                               RepetitionPenaltyLogitsProcessor     (here or fused in the kernel)
    3 no_repeat_ngram_size     NoRepeatNGramLogitsProcessor         ngram.py
   3b encoder_no_repeat_ngram_size
                               EncoderNoRepeatNGramLogitsProcessor  ngram.py (the prompt's n-grams)
    4 bad_words_ids            NoBadWordsLogitsProcessor            sequence_bias.py
    5 min_length               MinLengthLogitsProcessor             masks.py
    6 min_new_tokens           MinNewTokensLengthLogitsProcessor    masks.py
      prefix_allowed_tokens_fn PrefixConstrainedLogitsProcessor     user.py (eager: a host call per
                                                                    row and position)
    7 forced_bos_token_id      ForcedBOSTokenLogitsProcessor        masks.py
    8 forced_eos_token_id      ForcedEOSTokenLogitsProcessor        masks.py (needs max_new_tokens)
      remove_invalid_values    InfNanRemoveLogitsProcessor          masks.py
    9 exponential_decay_length_penalty
                               ExponentialDecayLengthPenalty        masks.py
   10 suppress_tokens          SuppressTokensLogitsProcessor        masks.py
   11 begin_suppress_tokens    SuppressTokensAtBeginLogitsProcessor masks.py
   12 the user's logits_processor list (eager, user.py); a user processor of the same
      transformers class as a built-in one takes that one's slot (transformers'
      _merge_criteria_processor_list)
    then, when sampling, the warpers: temperature -> top_k -> top_p -> min_p in the verify kernel,
    or all of them with top_h (after the temperature) and typical_p -> epsilon_cutoff -> eta_cutoff
    in standardise_all (warpers.py)
   13 watermarking_config      WatermarkLogitsProcessor             watermark.py (eager; after the
                                                                    warpers, which then run here)

``process`` runs it all: the guidance (target side: guided=True), apply_ (1-12), standardise when
the warpers run here, the watermark.

Where the penalties run: a verify kernel that applies them fused (fused_penalties=True) does so
after everything here; that equals
transformers' order because every step after the penalty slot only sets logits to -inf, which
the penalties keep at -inf. It stops being equal when something after that slot is not a mask
(a user processor, forced_bos / forced_eos_token_id, remove_invalid_values,
exponential_decay_length_penalty) or when
the warpers run here (standardise_all: the kernel's penalty would
come after them): then the penalties run here, in their slot (``penalties_here``), and
``kernel_penalties`` hands the kernel neutral values.

Every built-in step is device-side, batched over [B, N, V], free of host syncs and graph safe
(static tensors built here once, per-call temporaries only). User processors are not
(``graph_safe`` False, ``graph_note`` says why).
"""
from numbers import Integral

import torch

from .encoder_penalty import EncoderRepetitionPenalty
from .guidance import ClassifierFreeGuidance, guidance_on
from .masks import (ExponentialDecay, ForcedTokens, LengthMask, RemoveInvalidValues, SuppressTokens,
                    begin_suppress_mask, forced_bos, forced_eos, forced_ids, min_new_tokens_mask, nonnegative_int,
                    token_list)
from .ngram import EncoderNoRepeatNGram, NoRepeatNGram, check_ngram_size
from .penalties import apply_penalties_, check_penalties
from .prefix import Prefixes, tree_prefixes
from .sequence_bias import SequenceBias, parse_bad_words, parse_sequence_bias
from .user import PrefixAllowedTokens, UserProcessors
from .warpers import STAGE_WARPERS, check_warpers, stage_warpers_on, standardise_all
from .watermark import watermark_stage

# The options LogitsProcessing reads, with the value that means "off" (None is off too).
OPTIONS = {
    "sequence_bias": None, "encoder_repetition_penalty": 1.0, "no_repeat_ngram_size": 0,
    "encoder_no_repeat_ngram_size": 0, "bad_words_ids": None,
    "min_length": 0, "min_new_tokens": None,
    "suppress_tokens": None, "begin_suppress_tokens": None, "forced_bos_token_id": None, "forced_eos_token_id": None,
    "exponential_decay_length_penalty": None, "prefix_allowed_tokens_fn": None, "num_return_sequences": 1,
    "remove_invalid_values": False,
    "repetition_penalty": 1.0,
    "frequency_penalty": 0.0, "presence_penalty": 0.0, "do_sample": False, **STAGE_WARPERS, "eos_token_id": None,
    "watermarking_config": None, "guidance_scale": None, "negative_prompt_ids": None,
    "negative_prompt_attention_mask": None,
}
NEUTRAL_PENALTIES = {"repetition_penalty": 1.0, "frequency_penalty": 0.0, "presence_penalty": 0.0}


class _Penalties:
    def __init__(self, prompt_width: int, repetition: float, frequency: float, presence: float, device):
        self.prompt_width = torch.full((), prompt_width, dtype=torch.long, device=device)  # re-filled per call
        self.kwargs = dict(repetition_penalty=repetition, frequency_penalty=frequency, presence_penalty=presence)

    def set_prompt_width(self, prompt_width: int) -> None:
        self.prompt_width.fill_(prompt_width)

    def apply_(self, logits: torch.Tensor, prefixes: Prefixes) -> None:
        apply_penalties_(logits, prefixes, prompt_width=self.prompt_width, start=prefixes.start, **self.kwargs)


def _eos_list(eos) -> list:
    if eos is None:
        return []
    if isinstance(eos, torch.Tensor):
        eos = eos.reshape(-1).tolist()
    if isinstance(eos, Integral) and not isinstance(eos, bool):
        return [int(eos)]
    return token_list(eos, "eos_token_id")


class LogitsProcessing:
    """The processors of one generate call (module docstring), built once on the host.

    vocab_size: V of the logits it will process (the draft may need its own: with_vocab);
    prompt_width: P, the padded prompt width (transformers' input_ids_seq_length);
    options: transformers' names (OPTIONS; None = off); logits_processor: the user's list;
    max_new_tokens: the call's (forced_eos_token_id's position; set_max_new_tokens re-fills it);
    fused_penalties: the caller's verify kernel can apply the penalties fused (module docstring);
    False (the default): they always run here, in their slot. guidance_model: the target model
    (a transformers causal LM), which guidance_scale runs unconditionally (guidance.py).

    Attributes for the caller:
        active          process has something to do
        graph_safe      process can be captured (no user processor, no watermark); graph_note: why not
        penalties_here  the penalties run in apply_; kernel_penalties: what the kernel applies
        warpers_here    sampling with top_h / typical_p / epsilon_cutoff / eta_cutoff or a
                        watermark: process standardises; give the kernel temperature 1, no truncation
        watermark       the watermark's stage (process applies it last), or None
        guidance        the guidance's stage (process applies it first when guided), or None
        wants_float32   a step computes new values (sequence_bias, penalties here, user code):
                        transformers processes a float32 copy, so pass float32 logits for its
                        exact values (other dtypes round at each such step; the -inf masks are
                        exact in any dtype)
    """

    def __init__(self, *, vocab_size: int, prompt_width: int, device, logits_processor=None,
                 fused_penalties: bool = False, min_length_follows_min_new: bool = False,
                 max_new_tokens: int | None = None, guidance_model=None, **options):
        unknown = sorted(set(options) - set(OPTIONS))
        if unknown:
            raise ValueError(f"unknown logits processing option(s) {unknown}; known: {sorted(OPTIONS)}")
        for name, value in (("vocab_size", vocab_size), ("prompt_width", prompt_width)):
            if isinstance(value, bool) or not isinstance(value, Integral) or value < 1:
                raise ValueError(f"{name} must be an int >= 1, got {value!r}")
        self.vocab_size, self.prompt_width, self.device = int(vocab_size), int(prompt_width), torch.device(device)
        self.max_new_tokens = max_new_tokens
        # from_options: min_length is generate()'s min_new_tokens + P (it follows P call by call).
        self.min_length_follows_min_new = bool(min_length_follows_min_new)
        self._init_args = dict(prompt_width=prompt_width, device=device, logits_processor=logits_processor,
                               fused_penalties=fused_penalties, min_length_follows_min_new=min_length_follows_min_new,
                               max_new_tokens=max_new_tokens, guidance_model=guidance_model, **options)
        opt = {name: default if options.get(name) is None else options[name] for name, default in OPTIONS.items()}
        penalties = check_penalties(opt["repetition_penalty"], opt["frequency_penalty"], opt["presence_penalty"])
        self.typical_p, self.epsilon_cutoff, self.eta_cutoff, self.top_h = check_warpers(
            opt["typical_p"], opt["epsilon_cutoff"], opt["eta_cutoff"], opt["top_h"])
        self.do_sample = bool(opt["do_sample"])
        self.warpers_here = stage_warpers_on(opt, self.do_sample)

        stages = self._merge_users(self._builtins(opt, penalties), list(logits_processor or []))
        self.watermark = (None if opt["watermarking_config"] is None
                          else watermark_stage(opt["watermarking_config"], self.vocab_size, self.device))
        self.guidance = None
        if guidance_on(opt["guidance_scale"]):
            if guidance_model is None:
                raise ValueError("guidance_scale needs the model (guidance_model=) for its unconditional forward")
            self.guidance = ClassifierFreeGuidance(opt["guidance_scale"], guidance_model, self.prompt_width,
                                                   opt["negative_prompt_ids"], opt["negative_prompt_attention_mask"])
        eager = [s for s in [self.guidance] + stages + [self.watermark]
                 if s is not None and not getattr(s, "graph_safe", True)]
        self.graph_safe = not eager
        self.graph_note = None if self.graph_safe else eager[0].graph_note
        penalty_stage = next((s for s in stages if isinstance(s, _Penalties)), None)
        # After the penalty's slot every built-in must only write -inf for the kernel's penalty (applied
        # after them all) to equal transformers' order: forced tokens write 0 (a frequency penalty then
        # moves it) and the decay's |s| scaling does not commute with the penalty's (s < 0: s*theta*(1-c)
        # against s*(1-c)/theta once 1 - c < 0).
        after_values = any(isinstance(s, (ForcedTokens, RemoveInvalidValues, ExponentialDecay)) for s in stages)
        self.penalties_here = penalty_stage is not None and (not fused_penalties or not self.graph_safe
                                                             or self.warpers_here or after_values)
        self.kernel_penalties = dict(NEUTRAL_PENALTIES)
        if penalty_stage is not None and not self.penalties_here:  # the kernel applies them, after all of these
            stages.remove(penalty_stage)
            self.kernel_penalties = dict(zip(NEUTRAL_PENALTIES, penalties))
        self.stages = self._group_users(stages)
        self.active = bool(self.stages) or self.watermark is not None or self.guidance is not None
        self.wants_float32 = self.watermark is not None or self.guidance is not None or any(
            isinstance(s, (_Penalties, UserProcessors, ExponentialDecay, RemoveInvalidValues,
                           EncoderRepetitionPenalty))
            or (isinstance(s, SequenceBias) and s.rounds) for s in self.stages)

    @staticmethod
    def _check_forced_not_suppressed(opt: dict) -> None:
        """GenerationConfig.validate's rule (transformers #24099): every forced BOS / EOS token also
        suppressed leaves the forced step without a token; the same ValueError."""
        if opt["suppress_tokens"] is None:
            return
        suppressed = set(token_list(opt["suppress_tokens"], "suppress_tokens"))
        for name in ("forced_bos_token_id", "forced_eos_token_id"):
            forced = opt[name]
            if forced is None:
                continue
            forced = {forced} if isinstance(forced, Integral) else set(forced)
            if forced and forced <= suppressed:
                raise ValueError(
                    f"Every token in `{name}` ({sorted(forced)}) is also in `suppress_tokens`. Forcing a token while "
                    "suppressing it sets all logits to `-inf` at the forcing step, which produces `nan` probabilities "
                    f"and crashes generation. Remove the overlapping token(s) from either `{name}` or "
                    "`suppress_tokens` (if you meant to prevent an early EOS token, use `min_new_tokens` instead).")

    def _builtins(self, opt: dict, penalties: tuple) -> list:
        """[(transformers class name, stage)] for the options that are on, in transformers' order."""
        self._check_forced_not_suppressed(opt)
        V, P, dev = self.vocab_size, self.prompt_width, self.device
        eos = _eos_list(opt["eos_token_id"])
        ngram = check_ngram_size(opt["no_repeat_ngram_size"])
        min_length = nonnegative_int(opt["min_length"], "min_length")
        min_new = 0 if opt["min_new_tokens"] is None else nonnegative_int(opt["min_new_tokens"], "min_new_tokens")
        slots = []
        if opt["sequence_bias"] is not None:
            slots.append(("SequenceBiasLogitsProcessor",
                          SequenceBias(parse_sequence_bias(opt["sequence_bias"], V), V, dev)))
        if opt["encoder_repetition_penalty"] != 1.0:
            slots.append(("EncoderRepetitionPenaltyLogitsProcessor",
                          EncoderRepetitionPenalty(opt["encoder_repetition_penalty"], P, dev)))
        if penalties != tuple(NEUTRAL_PENALTIES.values()):
            slots.append(("RepetitionPenaltyLogitsProcessor", _Penalties(P, *penalties, dev)))
        if ngram > 0:
            slots.append(("NoRepeatNGramLogitsProcessor", NoRepeatNGram(ngram)))
        encoder_ngram = check_ngram_size(opt["encoder_no_repeat_ngram_size"], "encoder_no_repeat_ngram_size")
        if encoder_ngram > 0:
            slots.append(("EncoderNoRepeatNGramLogitsProcessor", EncoderNoRepeatNGram(encoder_ngram, P, dev)))
        if opt["bad_words_ids"] is not None:
            slots.append(("NoBadWordsLogitsProcessor",
                          SequenceBias(parse_bad_words(opt["bad_words_ids"], V, eos), V, dev)))
        if eos and min_length > 0:  # transformers builds the two EOS masks only with an EOS id
            min_length_of = ((lambda width, new: width + min_new) if self.min_length_follows_min_new
                             else (lambda width, new: min_length))
            slots.append(("MinLengthLogitsProcessor", LengthMask(eos, min_length_of, "below", V, dev, P)))
        if eos and min_new > 0:
            slots.append(("MinNewTokensLengthLogitsProcessor", min_new_tokens_mask(eos, P, min_new, V, dev)))
        if opt["prefix_allowed_tokens_fn"] is not None:
            slots.append(("PrefixConstrainedLogitsProcessor",
                          PrefixAllowedTokens(opt["prefix_allowed_tokens_fn"], opt["num_return_sequences"])))
        if opt["forced_bos_token_id"] is not None:
            slots.append(("ForcedBOSTokenLogitsProcessor", forced_bos(opt["forced_bos_token_id"], V, dev, P)))
        if opt["forced_eos_token_id"] is not None:
            ids = forced_ids(opt["forced_eos_token_id"], "forced_eos_token_id", V)
            if self.max_new_tokens is None:
                raise ValueError("forced_eos_token_id needs the call's max_new_tokens (the last position is forced)")
            slots.append(("ForcedEOSTokenLogitsProcessor",
                          forced_eos(ids, V, dev, P, nonnegative_int(self.max_new_tokens, "max_new_tokens"))))
        if opt["remove_invalid_values"] is not False:
            if opt["remove_invalid_values"] is not True:
                raise ValueError(f"remove_invalid_values must be a bool, got {opt['remove_invalid_values']!r}")
            slots.append(("InfNanRemoveLogitsProcessor", RemoveInvalidValues()))
        if opt["exponential_decay_length_penalty"] is not None:
            slots.append(("ExponentialDecayLengthPenalty",
                          ExponentialDecay(opt["exponential_decay_length_penalty"], eos, V, dev, P)))
        if opt["suppress_tokens"] is not None:
            ids = token_list(opt["suppress_tokens"], "suppress_tokens")
            slots.append(("SuppressTokensLogitsProcessor", SuppressTokens(ids, V, dev)))
        if opt["begin_suppress_tokens"] is not None:
            ids = token_list(opt["begin_suppress_tokens"], "begin_suppress_tokens")
            slots.append(("SuppressTokensAtBeginLogitsProcessor",
                          begin_suppress_mask(ids, P, V, dev, opt["forced_bos_token_id"])))
        return slots

    @staticmethod
    def _merge_users(slots: list, users: list) -> list:
        """transformers' _merge_criteria_processor_list: a user processor of a built-in's exact
        class takes that built-in's slot; the other user processors follow the built-ins."""
        stages, used = [], set()
        for name, stage in slots:
            custom = next((u for u in users if type(u).__name__ == name
                           and type(u).__module__.startswith("transformers.")), None)
            if custom is not None:
                used.add(id(custom))
            stages.append(stage if custom is None else UserProcessors([custom]))
        return stages + [UserProcessors([u]) for u in users if id(u) not in used]

    @staticmethod
    def _group_users(stages: list) -> list:
        """Adjacent user processors as one eager stage (one host read for all of them)."""
        grouped = []
        for stage in stages:
            if isinstance(stage, UserProcessors) and grouped and isinstance(grouped[-1], UserProcessors):
                grouped[-1] = UserProcessors(grouped[-1].processors + stage.processors)
            else:
                grouped.append(stage)
        return grouped

    @classmethod
    def from_options(cls, config, *, vocab_size: int, prompt_width: int, device, logits_processor=None,
                     fused_penalties: bool = False, max_new_tokens: int | None = None,
                     guidance_model=None) -> "LogitsProcessing":
        """From a GenerationConfig or a dict of resolved options (transformers' names). Like
        generate(): min_new_tokens, when given, sets min_length = min_new_tokens + P
        (_prepare_generated_length)."""
        values = config if isinstance(config, dict) else config.to_dict()
        options = {name: values.get(name) for name in OPTIONS if values.get(name) is not None}
        follows = options.get("min_new_tokens") is not None
        if follows:
            options["min_length"] = nonnegative_int(options["min_new_tokens"], "min_new_tokens") + prompt_width
        return cls(vocab_size=vocab_size, prompt_width=prompt_width, device=device, logits_processor=logits_processor,
                   fused_penalties=fused_penalties, min_length_follows_min_new=follows, max_new_tokens=max_new_tokens,
                   guidance_model=guidance_model, **options)

    def set_prompt_width(self, prompt_width: int) -> None:
        """Another call's prompt width P: every value that depends on it (length thresholds, where
        the generated tokens begin) re-filled in place, so the stages, and a CUDA graph that
        captured them, serve calls of any prompt width."""
        if isinstance(prompt_width, bool) or not isinstance(prompt_width, Integral) or prompt_width < 1:
            raise ValueError(f"prompt_width must be an int >= 1, got {prompt_width!r}")
        self.prompt_width = int(prompt_width)
        for stage in self.stages + [self.guidance]:
            if hasattr(stage, "set_prompt_width"):
                stage.set_prompt_width(self.prompt_width)

    def set_max_new_tokens(self, max_new_tokens: int) -> None:
        """Another call's max_new_tokens (forced_eos_token_id's position), re-filled in place."""
        self.max_new_tokens = self._init_args["max_new_tokens"] = nonnegative_int(max_new_tokens, "max_new_tokens")
        for stage in self.stages:
            if hasattr(stage, "set_max_new_tokens"):
                stage.set_max_new_tokens(self.max_new_tokens)

    def set_rows(self, rows: int) -> None:
        """The call's real rows (a decoder may hold more, unused): host-called stages ask only these."""
        for stage in self.stages + [self.guidance]:
            if hasattr(stage, "set_rows"):
                stage.set_rows(rows)

    def with_vocab(self, vocab_size: int) -> "LogitsProcessing":
        """The same options for logits of another vocabulary size (e.g. the draft model's)."""
        return LogitsProcessing(vocab_size=vocab_size, **self._init_args)

    def process(self, logits: torch.Tensor, seq: torch.Tensor, end: torch.Tensor, drafts: torch.Tensor,
                start=None, params=None, guided: bool = True) -> torch.Tensor:
        """Everything transformers does to logits [B, N, V] before it samples or takes the argmax:
        the guidance when ``guided`` (the target's logits; a draft's are not guided: guidance.py),
        apply_ (in place), then standardise when the warpers run here (params: SamplingTensors [B],
        required then; a new float32 tensor), then the watermark (in place); the stages read one
        Prefixes. Arguments as apply_."""
        self._check_call(logits, params)
        prefixes = Prefixes(seq, end, drafts, logits.shape[1], start=start) if self.active else None
        if guided and self.guidance is not None:
            self.guidance.apply_(logits, prefixes)
        return self._process_rest(logits, prefixes, params, logits.shape)

    def process_tree(self, logits: torch.Tensor, seq: torch.Tensor, end: torch.Tensor, tokens: torch.Tensor,
                     parents: torch.Tensor, depths: torch.Tensor, depth: int, start=None, params=None,
                     nodes: torch.Tensor | None = None) -> torch.Tensor:
        """process for a token tree's nodes: logits [B, N, V] at nodes tokens [B, N] (node 0 the
        last emitted token; parents int64 [B, N] or [N], -1 at the root; depths [N]; depth: at
        least the deepest node's), node i processed with the prefix seq[b, :end[b]] ++ its ancestor
        path (prefix.tree_prefixes: B * N rows of one position). nodes int64 [E]: logits [B, E, V]
        are those nodes' only (a drafter expanding one level; depth: theirs). No guidance (a
        chain's only: guidance.py)."""
        self._check_call(logits, params)
        if self.guidance is not None:
            raise ValueError("guidance_scale guides a chain's positions, not a token tree's nodes")
        batch, n, vocab = logits.shape
        prefixes = tree_prefixes(seq, end, tokens, parents, depths, depth, start=start, nodes=nodes) if self.active else None
        # the stages and the watermark write into [B * N, 1, V] views of it
        return self._process_rest(logits.contiguous(), prefixes, params, (batch * n, 1, vocab))

    def _check_call(self, logits: torch.Tensor, params) -> None:
        self._check_width(logits)
        if self.warpers_here and params is None:
            raise ValueError("this call's warpers run here (warpers_here): process needs its sampling params")

    def _process_rest(self, logits: torch.Tensor, prefixes, params, rows: tuple) -> torch.Tensor:
        """After the guidance, in transformers' order: the stages (in place), standardise when the
        warpers run here, the watermark; the stages and the watermark see logits viewed as ``rows``
        (the prefixes' rows: a tree's nodes are rows of one position)."""
        self._run_stages(logits.view(rows), prefixes)
        if self.warpers_here:
            logits = self.standardise(logits, params)
        if self.watermark is not None:
            self.watermark.apply_(logits.view(rows), prefixes)
        return logits

    def apply_(self, logits: torch.Tensor, seq: torch.Tensor, end: torch.Tensor, drafts: torch.Tensor,
               start=None) -> torch.Tensor:
        """The processors (module docstring, 1-12: not the warpers, not the watermark): logits
        [B, N, V] processed in place and returned. seq int64 [B, T] (padded prompt of
        width P, then the generated tokens), end int64 [B] (P + gen_len), drafts int64 [B, D]
        with D >= N - 1 (-1 pads): position i sees seq[b, :end[b]] ++ drafts[b, :D - N + 1 + i]
        (target: D = N - 1; draft model before draft k: N = 1, D = k). start int64 [B]: the
        first real prompt slot (DecodeState.start), used by repetition_penalty as generate()
        does (pads ignored); None counts the pads."""
        self._check_width(logits)
        if self.stages:
            self._run_stages(logits, Prefixes(seq, end, drafts, logits.shape[1], start=start))
        return logits

    def _run_stages(self, logits: torch.Tensor, prefixes: Prefixes) -> None:
        for stage in self.stages:
            stage.apply_(logits, prefixes)

    def _check_width(self, logits: torch.Tensor) -> None:
        if logits.dim() != 3 or logits.shape[-1] != self.vocab_size:
            raise ValueError(f"logits must be [B, N, V={self.vocab_size}], got {tuple(logits.shape)}")

    def standardise(self, logits: torch.Tensor, params) -> torch.Tensor:
        """float32 [B, N, V]: every warper (standardise_all with this call's top_h, typical_p,
        epsilon_cutoff, eta_cutoff); params: SamplingTensors [B]."""
        return standardise_all(logits, params, top_h=self.top_h, typical_p=self.typical_p,
                               epsilon_cutoff=self.epsilon_cutoff, eta_cutoff=self.eta_cutoff)
