"""LogitsStage: what a decoder does to the logits between a forward and the kernels that sample
from them, for calls with transformers' logits processors or penalties (docs/architecture.md §9).

Three parts, each present only when the call asks for it:
  - processing (specdec_fast/processing/, LogitsProcessing): the device-side processors per
    speculative position (sequence_bias, no_repeat_ngram_size, bad_words_ids, min_length,
    min_new_tokens, forced_bos_token_id, forced_eos_token_id, exponential_decay_length_penalty,
    suppress_tokens, begin_suppress_tokens), the user's logits_processor list
    (eager), the warpers the kernels lack (top_h, typical_p, epsilon_cutoff, eta_cutoff:
    standardise_all, after which the kernels sample with temperature 1 and no truncation), and
    last a watermark (watermarking_config: eager; when sampling, all the warpers run before it);
  - penalties (kernels/penalties): repetition_penalty (transformers' semantics, the prompt's
    left pads skipped as generate() does), frequency_penalty and presence_penalty (vLLM's), fused
    into chain_verify and the draft's sample kernel from a per-row token-count state [R, V] kept
    on the device and updated in place after every append (no [R, K+1, V] copy of the logits);
    where processing must run them itself (a user processor or the warpers come after them in
    transformers' order) they run there instead;
  - the draft side: each draft is proposed from its logits processed the same way, with the
    drafts before it in its prefix, so that the draft samples from what the verify calls p (the
    exact rule holds for any draft; processing it only raises the acceptance);
  - token trees (engine/tree_loop.py): tree processes each node (the target's, the drafter's) with its own
    prefix, its ancestor path (processing/prefix.py tree_prefixes); tree_verify has no penalised
    kernels, so a tree decoder's stage runs the penalties in processing (fused_penalties=False).

A stage belongs to one decoder and serves call after call: the tensors its steps read (counts,
penalty parameters, length thresholds, the real sampling parameters of the warpers) are
re-filled in place by begin_call, so graphs captured at an earlier call stay valid. The options
that shape it (which processors, their static values) are part of the decoder's key (spec()).
"""
from dataclasses import dataclass

import torch

from ..kernels.penalties import PENALTIES, PenaltyTensors, add_tokens, make_penalty_tensors
from ..kernels.sampling_params import SamplingTensors, fill_rows, make_sampling_tensors, static_sampling_tensors
from ..options.rules import LOGITS_STAGE_OPTIONS
from ..processing import LogitsProcessing
from ..processing.guidance import guidance_on
from ..processing.penalties import generate_skips_prompt_pads
from ..processing.warpers import STAGE_WARPERS, stage_warpers_on

# The options a stage implements (options/rules.py owns the list: the engine implements them).
STAGE_OPTIONS = LOGITS_STAGE_OPTIONS
GUIDANCE_OPTIONS = ("guidance_scale", "negative_prompt_ids", "negative_prompt_attention_mask")
_PENALTY_NAMES = {"repetition": "repetition_penalty", "frequency": "frequency_penalty", "presence": "presence_penalty"}


def _freeze(value):
    """A hashable form of an option value (lists and dicts of token ids, floats)."""
    if isinstance(value, dict):
        return tuple(sorted((_freeze(k), _freeze(v)) for k, v in value.items()))
    if isinstance(value, (list, tuple)):
        return tuple(_freeze(v) for v in value)
    if isinstance(value, torch.Tensor):
        return ("tensor", tuple(value.tolist()))
    return value


def spec(extra: dict, do_sample: bool, eos_token_ids=None):
    """The hashable shape of a call's stage (a decoder key part), or None when the call needs none.
    A user's logits_processor, prefix_allowed_tokens_fn or watermarking_config makes the stage
    eager (spec "user": a new stage every call), and so does guidance_scale (its stage holds the
    call's model and negative prompt). The EOS ids are part of it: min_length,
    min_new_tokens, exponential_decay_length_penalty and bad_words_ids build their tensors from
    them (a stage reused for a call with other EOS ids masked the first call's)."""
    values = {name: extra[name] for name in STAGE_OPTIONS if name in extra}
    if not values:
        return None
    if (values.get("logits_processor") or values.get("prefix_allowed_tokens_fn") is not None
            or values.get("watermarking_config") is not None or guidance_on(values.get("guidance_scale"))):
        return "user"
    return (bool(do_sample), tuple(sorted((name, _freeze(v)) for name, v in values.items())),
            tuple(eos_token_ids or ()))


def stage_options_of(opts) -> dict:
    """A call's options the logits stage reads (resolve.Options' extra): its STAGE_OPTIONS, and
    num_return_sequences where prefix_allowed_tokens_fn groups the expanded rows by it. A greedy
    call leaves out the sampling warpers (top_h, typical_p, epsilon_cutoff, eta_cutoff): transformers'
    greedy generate neither builds nor checks them, as ours ignores temperature and top_p there.
    guidance_scale 1 (or none) leaves out the guidance and its negative prompt, as transformers does."""
    options = {name: value for name, value in opts.extra.items() if name in STAGE_OPTIONS
               and (opts.do_sample or name not in STAGE_WARPERS)}
    if not guidance_on(options.get("guidance_scale")):  # the negative prompt is unread then
        for name in GUIDANCE_OPTIONS:
            options.pop(name, None)
    if options.get("prefix_allowed_tokens_fn") is not None:
        options["num_return_sequences"] = int(opts.extra.get("num_return_sequences") or 1)
    return options


@dataclass
class StageRequest:
    """A call's logits-stage arguments: options (its STAGE_OPTIONS at non-neutral values),
    eos_token_ids, do_sample, params: its sampling parameters [B] (the warpers read them), and
    max_new_tokens (forced_eos_token_id's position)."""

    options: dict
    eos_token_ids: list | None
    do_sample: bool
    params: SamplingTensors
    # generation_config's max_new_tokens (max_length - P): where forced_eos_token_id forces EOS.
    # transformers builds ForcedEOSTokenLogitsProcessor from it even when a user's MaxLengthCriteria
    # ends the call elsewhere; None: the loop's own max_new_tokens.
    max_new_tokens: int | None = None
    # The target model (a transformers causal LM): guidance_scale runs it unconditionally.
    model: object = None

    @property
    def spec(self):
        return spec(self.options, self.do_sample, self.eos_token_ids)


def kernel_params(request: "StageRequest | None", params: SamplingTensors, seed) -> SamplingTensors:
    """The sampling parameters the kernels get: ``params``, or, when the call's warpers run in the
    stage (top_h / typical_p / epsilon_cutoff / eta_cutoff), temperature 1 with no truncation and the same
    seeds: the stage hands the kernels standardised logits."""
    if request is None or not stage_warpers_on(request.options, request.do_sample):
        return params
    return make_sampling_tensors(params.batch, params.temperature.device, temperature=1.0, seed=seed)


class LogitsStage:
    """One decoder's logits stage (module docstring), built at the decoder's first call with a
    request: rows: the decoder's rows; vocab: V; prompt_width, max_new_tokens: that call's (later
    calls: begin_call); fused_penalties: the decoder's verify kernels apply the penalties (chains;
    tree_verify has no penalised kernels: the penalties then run in processing, in their slot)."""

    def __init__(self, request: StageRequest, *, rows: int, vocab: int, device, prompt_width: int,
                 max_new_tokens: int, fused_penalties: bool = True):
        self.rows, self.vocab, self.device = rows, vocab, device
        values = {name: request.options[name] for name in STAGE_OPTIONS + ("num_return_sequences",)
                  if name in request.options}
        user = values.pop("logits_processor", None)
        self.processing = LogitsProcessing.from_options(
            dict(values, eos_token_id=request.eos_token_ids, do_sample=request.do_sample), vocab_size=vocab,
            prompt_width=prompt_width, device=device, logits_processor=user, fused_penalties=fused_penalties,
            max_new_tokens=max_new_tokens, guidance_model=request.model)
        self.graph_safe, self.graph_note = self.processing.graph_safe, self.processing.graph_note
        self.warpers = self.processing.warpers_here
        kernel = self.processing.kernel_penalties  # neutral where processing runs them itself
        active = frozenset(name for name, option in _PENALTY_NAMES.items()
                           if kernel[option] != (1.0 if name == "repetition" else 0.0))
        self.penalties = None
        if active:
            self.penalties = PenaltyTensors(
                torch.zeros(rows, vocab, dtype=torch.int32, device=device),
                *(torch.full((rows,), float(kernel[_PENALTY_NAMES[name]]), dtype=torch.float32, device=device)
                  for name in PENALTIES), active=active)
        self.float32 = self.processing.wants_float32
        # The call's real sampling parameters [rows], re-filled per call (standardise_all reads them).
        self.real_params = static_sampling_tensors(rows, device) if self.warpers else None

    # -- per call -------------------------------------------------------------------------------
    def begin_call(self, prompt, request: StageRequest, max_new_tokens: int, batch: int) -> None:
        """prompt: the call's PromptBatch (ids [R, P], mask [R, P]; rows >= batch unused). Re-fills
        every tensor the steps read, in place (graphs captured at an earlier call read them)."""
        self.processing.set_prompt_width(prompt.ids.shape[1])
        self.processing.set_max_new_tokens(max_new_tokens)
        self.processing.set_rows(batch)
        if self.penalties is not None:
            # generate() skips the prompt's left pads (prompt_ignore_length) in transformers 5.23+ (they
            # are no tokens here) and counts them as the pad token up to 5.22: the installed one's rule.
            ids = prompt.ids.masked_fill(prompt.mask == 0, -1) if generate_skips_prompt_pads() else prompt.ids
            fresh = make_penalty_tensors(ids, self.vocab, check=False)
            self.penalties.counts.copy_(fresh.counts)
        if self.real_params is not None:
            fill_rows(self.real_params, request.params)

    @staticmethod
    def _pads_start(state):
        """The first slot the repetition penalty counts: the first real prompt token where the
        installed transformers' generate() skips left pads, else slot 0 (pads count, up to 5.22)."""
        return state.start if generate_skips_prompt_pads() else None

    # -- the steps (in place, no host sync unless a user processor runs) -------------------------
    def _cast(self, logits: torch.Tensor) -> torch.Tensor:
        """float32 where a step computes values (transformers processes a float32 copy), else as given."""
        return logits.float() if self.float32 and logits.dtype != torch.float32 else logits

    def target(self, logits: torch.Tensor, state, drafts: torch.Tensor) -> torch.Tensor:
        """logits [R, K+1, V] of the target at the iteration's positions (drafts [R, K], -1
        pads) -> the logits the verify kernel samples from (processed; standardised when the
        warpers run here)."""
        return self.processing.process(self._cast(logits), state.seq, state.end, drafts, start=self._pads_start(state),
                                       params=self.real_params)

    def tree(self, logits: torch.Tensor, state, tokens: torch.Tensor, tree, nodes: torch.Tensor | None = None
             ) -> torch.Tensor:
        """logits [R, N, V] at a token tree's nodes tokens [R, N] (tree: parents [R, N] or [N],
        depths [N], depth; processing.LogitsProcessing.process_tree), each node processed with its
        ancestor path: the target's, which tree_verify samples from; or, with nodes [E], logits
        [R, E, V] of the drafter at the nodes it expands next (tokens filled up to them, depth
        theirs), processed as the target's there: the rows their children are drawn from and
        tree_verify's q."""
        parents, depths, depth = tree
        return self.processing.process_tree(self._cast(logits), state.seq, state.end, tokens, parents, depths, depth,
                                            start=self._pads_start(state), params=self.real_params, nodes=nodes)

    def draft(self, logits: torch.Tensor, state, drafted: torch.Tensor) -> torch.Tensor:
        """logits [R, V] of the draft before its next draft (drafted [R, i]: the drafts so far)
        -> the logits it samples from (processed like the target's at that position, unguided:
        processing/guidance.py)."""
        out = self.processing.process(self._cast(logits)[:, None, :], state.seq, state.end, drafted,
                                      start=self._pads_start(state), params=self.real_params, guided=False)
        return out[:, 0]

    def appended(self, tokens: torch.Tensor, emitted: torch.Tensor) -> None:
        """After the append: tokens [R, W] of which emitted [R, W] (bool) went into the rows."""
        if self.penalties is not None:
            add_tokens(self.penalties.counts, tokens, emitted)
