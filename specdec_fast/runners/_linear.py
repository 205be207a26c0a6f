"""The matrix products of the paged runners, in one place: linear(x [T, in], weight [out, in]
(a view; may be the transpose of a [in, out] tensor, as GPT-2's Conv1D stores it), bias [out]
or None) -> [T, out]. Today torch's F.linear."""
import torch
import torch.nn.functional as F


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    return F.linear(x, weight, bias)
