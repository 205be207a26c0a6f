"""The C++ CPU backend of tree_verify (csrc/tree_verify.cpp), called through torch.ops.

Inputs are validated by the public entry point (__init__.py); this wrapper only makes the
tensors contiguous and of the dtypes the op takes.
"""
import torch

from ..sampling_params import SamplingTensors
from ..verify.cpp import _ops, _param_args


def tree_verify_cpp(
    target_logits: torch.Tensor,
    draft_logits: torch.Tensor | None,
    tokens: torch.Tensor,
    parents: torch.Tensor,
    params: SamplingTensors,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """target_logits [B, N, V], draft_logits [B, N, V] or None, tokens / parents [B, N]
    -> tokens int32 [B, N], path int32 [B, N], num_accepted int32 [B]. CPU tensors."""
    draft = None if draft_logits is None else draft_logits.contiguous()
    return _ops().tree_verify(
        target_logits.contiguous(), draft, tokens.to(torch.int64).contiguous(), parents.to(torch.int64).contiguous(),
        *_param_args(params),
    )
