"""The C++ CPU backend of chain_verify and sample (csrc/verify.cpp), called through torch.ops.

Inputs are validated by the public entry points in __init__.py; these wrappers only make the
tensors contiguous and of the dtypes the ops take, and load the library on first use.
"""
import torch

from .._cpp_build import load_cpu_ops
from ..sampling_params import SamplingTensors


def _ops():
    if not load_cpu_ops():
        raise RuntimeError("the specdec_fast C++ CPU ops did not build (see the RuntimeWarning); use backend='torch'")
    return torch.ops.specdec_fast


def _param_args(params: SamplingTensors) -> tuple[torch.Tensor, ...]:
    return (
        params.temperature.to(torch.float32).contiguous(),
        params.top_k.to(torch.int32).contiguous(),
        params.top_p.to(torch.float32).contiguous(),
        params.min_p.to(torch.float32).contiguous(),
        params.seed.to(torch.int64).contiguous(),
        params.offset.to(torch.int64).contiguous(),
    )


def _penalty_args(penalties) -> tuple:
    """The op's optional penalty tensors: () when no row may use a penalty (the op then runs its
    penalty-free code), else (counts int32 [B, V], repetition, frequency, presence float32 [B])."""
    if penalties is None or not penalties.active:
        return ()
    return (penalties.counts.contiguous(), penalties.repetition.contiguous(), penalties.frequency.contiguous(),
            penalties.presence.contiguous())


def chain_verify_cpp(
    target_logits: torch.Tensor,
    draft_logits: torch.Tensor | None,
    draft_tokens: torch.Tensor,
    params: SamplingTensors,
    penalties=None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """target_logits [B, K+1, V], draft_logits [B, K, V] or None, draft_tokens [B, K] (-1 pads),
    penalties: PenaltyTensors or None -> tokens int32 [B, K+1] (-1 padded), num_accepted int32 [B].
    CPU tensors."""
    draft = None if draft_logits is None else draft_logits.contiguous()
    return _ops().chain_verify(
        target_logits.contiguous(), draft, draft_tokens.to(torch.int64).contiguous(), *_param_args(params),
        *_penalty_args(penalties),
    )


def sample_cpp(logits: torch.Tensor, params: SamplingTensors, positions: torch.Tensor, stream: int, penalties=None,
               prefix_tokens: torch.Tensor | None = None) -> torch.Tensor:
    """logits [B, V], positions int64 [B] -> int32 [B]: Gumbel-max over standardise(logits).
    penalties: PenaltyTensors or None; prefix_tokens int [B, W] (-1 = not a token) or None."""
    pen = _penalty_args(penalties)
    if pen and prefix_tokens is not None:
        pen += (prefix_tokens.to(torch.int64).contiguous(),)
    return _ops().sample(logits.contiguous(), *_param_args(params), positions.to(torch.int64).contiguous(), int(stream),
                         *pen)
