"""Repetition, frequency and presence penalties in plain torch: the spec every backend implements
(fused into the verify and sample kernels: kernels/verify/reference.py calls penalised_logits),
and the test oracle. Written for clarity, not speed.

Per row b and vocabulary token v, from the row's context (docs/architecture.md §6):
    in_prompt(v)  v occurs in the prompt as transformers passes it as input_ids (left pads included)
    count(v)      occurrences of v among the row's GENERATED tokens: the output so far (the state,
                  PenaltyTensors.counts) plus the tokens before this position (the drafts
                  x_0..x_{i-1} of a chain's position i; sample()'s prefix_tokens)
On the raw logits z (float32), before temperature and the rest of standardisation, in vLLM's order:
    repetition r  (transformers' RepetitionPenaltyLogitsProcessor; 1 = off), where in_prompt(v) or
                  count(v) > 0:   z = z * r if z < 0 else z / r
    frequency f   (OpenAI / vLLM; 0 = off):          z = z - f * count(v)
    presence pr   (OpenAI / vLLM; 0 = off):          z = z - pr * (count(v) > 0)
each step rounded to float32 as written (z * r, z / r, f * count, the two subtractions: no fused
multiply-add, so every backend gives the same bits; vLLM subtracts the two terms the same way).
Greedy rows take the argmax of the penalised logits (transformers applies processors before the
argmax and before warpers).

The state, one int32 per (row, token): bits 0-29 the output count, bit 30 in_prompt
(kernels/penalties/state.py builds and updates it).
"""
import torch

COUNT_MASK = (1 << 30) - 1  # bits 0-29: the output count of a token
PROMPT_BIT = 1 << 30  # bit 30: the token occurs in the prompt


def count_tokens(tokens: torch.Tensor, vocab: int) -> torch.Tensor:
    """Occurrences int32 [B, V] of each token among tokens [B, W] (any int dtype); entries outside
    [0, V) (-1 pads) are not tokens."""
    batch = tokens.shape[0]
    counts = torch.zeros(batch, vocab + 1, dtype=torch.int32, device=tokens.device)
    t = tokens.long()
    valid = (t >= 0) & (t < vocab)
    counts.scatter_add_(1, torch.where(valid, t, vocab), valid.int())
    return counts[:, :vocab]


def penalise(z: torch.Tensor, count: torch.Tensor, in_prompt: torch.Tensor, repetition: torch.Tensor,
             frequency: torch.Tensor, presence: torch.Tensor) -> torch.Tensor:
    """The penalties on logits z float32 [B, V] with output counts int [B, V], in_prompt bool
    [B, V] and per-row repetition / frequency / presence float32 [B] -> float32 [B, V]."""
    r, f, pr = repetition[:, None], frequency[:, None], presence[:, None]
    seen = in_prompt | (count > 0)
    z = torch.where(seen, torch.where(z < 0, z * r, z / r), z)
    z = z - f * count.float()
    return z - pr * (count > 0).float()


def penalised_logits(logits: torch.Tensor, penalties, tokens: torch.Tensor | None, first: int = 0) -> torch.Tensor:
    """logits [B, N, V] (any float dtype) of N consecutive positions -> float32 [B, N, V] penalised.

    penalties: PenaltyTensors (counts int32 [B, V] and the per-row parameters). tokens [B, W]
    (int, -1 = not a token) or None: the generated tokens in front of the positions that the state
    does not hold yet; position n sees tokens[:, :first + n] on top of the state (chain_verify:
    tokens = the drafts, first = 0, so position i sees x_0..x_{i-1}; sample: tokens = the prefix,
    first = W). Positions past W - first see all of tokens."""
    x = logits.float()
    batch, positions, vocab = x.shape
    state = penalties.counts.to(x.device)
    output = (state & COUNT_MASK).int()
    in_prompt = (state & PROMPT_BIT) != 0
    if tokens is None:
        tokens = torch.full((batch, 0), -1, dtype=torch.int64, device=x.device)
    out = torch.empty_like(x)
    for n in range(positions):
        count = output + count_tokens(tokens[:, :first + n], vocab)
        out[:, n] = penalise(x[:, n], count, in_prompt, penalties.repetition, penalties.frequency, penalties.presence)
    return out
