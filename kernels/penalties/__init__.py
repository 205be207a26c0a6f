"""Repetition / frequency / presence penalties: the state and its updates (state.py), the spec
(reference.py), the Triton device transform (triton.py) and the C++ one (csrc/penalties.h).

The penalties are not an op of their own: chain_verify and sample (kernels/verify) apply them
where they load the logits, on every backend, when given ``penalties=PenaltyTensors``.

    penalties = make_penalty_tensors(input_ids [B, P], V, repetition_penalty=1.1, frequency_penalty=0.5)
    loop:  tokens, n = chain_verify(target [B, K+1, V], draft [B, K, V], drafts [B, K], penalties=penalties, ...)
           add_tokens(penalties.counts, tokens [B, K+1], tokens >= 0)    # after the append
"""
from .reference import COUNT_MASK, PROMPT_BIT, penalise, penalised_logits
from .state import PENALTIES, PenaltyTensors, add_tokens, check_penalty_tensors, make_penalty_tensors

__all__ = ["PenaltyTensors", "make_penalty_tensors", "add_tokens", "check_penalty_tensors", "penalised_logits",
           "penalise", "PENALTIES", "COUNT_MASK", "PROMPT_BIT"]
