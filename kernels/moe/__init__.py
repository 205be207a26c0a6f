"""moe_pairs: each (token, expert) pair's product with its expert's weight, and the experts'
activation, for the MoE MLPs of runners/_moe.py; validation + dispatch.

Backends: "triton" (CUDA, or CPU under TRITON_INTERPRET=1), "cpp" (csrc/moe_experts.cpp: CPU
tensors of any float dtype; the pairs grouped by expert on the host, each chosen expert's weight
applied once to its pairs' rows, in place), "torch" (reference.py: the spec). backend=None:
triton on CUDA, cpp on CPU where it built, else torch. The Triton backend has two schedules of
the same spec:
  "pair"   (triton.py): one program per (pair, BLOCK_N output rows), a GEMV: for decode and
           verify steps whose pairs mostly chose distinct experts;
  "expert" (triton_grouped.py): the pairs sorted by expert (group_pairs: no host sync), one
           program per (expert, BLOCK_N output rows) that streams its expert's rows once per
           BLOCK_M of the pairs that chose it, tl.dot tiles: wide batches and prefills.
schedule=None picks "pair" when 3 P <= E (few pairs: each likely a distinct expert, so grouping
saves no bytes and its sort costs launches), "expert" otherwise. Neither has been timed on a GPU.
"""
import torch

from .._backend import resolve_backend
from .reference import ACT_CODES, ACTIVATIONS, GATED, activate, moe_pairs_reference

__all__ = ["moe_pairs", "moe_pairs_reference", "group_pairs", "activate", "ACTIVATIONS", "SCHEDULES"]

SCHEDULES = (None, "pair", "expert")


_BOUNDS = {}  # (E, device, dtype) -> arange(E + 1): made once, not one launch per MoE layer per step


def _expert_bounds(num_experts: int, like: torch.Tensor) -> torch.Tensor:
    """arange(E + 1) on like's device and dtype, kept after its first eager use. One made during a
    CUDA-graph capture is not kept: it lives in that graph's private memory pool."""
    key = (num_experts, like.device, like.dtype)
    bounds = _BOUNDS.get(key)
    if bounds is None:
        bounds = torch.arange(num_experts + 1, device=like.device, dtype=like.dtype)
        if not (like.is_cuda and torch.cuda.is_current_stream_capturing()):
            _BOUNDS[key] = bounds
    return bounds


def group_pairs(experts: torch.Tensor, num_experts: int) -> tuple[torch.Tensor, torch.Tensor]:
    """experts [P] int64 -> (order [P] int64: the pair ids sorted by expert, stable; offsets
    [E + 1] int64: expert e's pairs are order[offsets[e]:offsets[e + 1]]). Static shapes, no host
    sync (graph safe); ids outside [0, E) fall outside every expert's range."""
    order = torch.argsort(experts, stable=True)
    return order, torch.searchsorted(experts.index_select(0, order), _expert_bounds(num_experts, experts))


def _check(x, experts, weight, pairs_per_token, scale, act, bias, schedule, groups):
    for name, t, ndim in (("x", x, 2), ("experts", experts, 1), ("weight", weight, 3)):
        if not isinstance(t, torch.Tensor) or t.dim() != ndim:
            raise ValueError(f"{name} must be a {ndim}-d tensor, got {getattr(t, 'shape', type(t).__name__)}")
    if not x.is_floating_point() or weight.dtype != x.dtype:
        raise TypeError(f"x and weight must share a float dtype, got {x.dtype} and {weight.dtype}")
    if experts.dtype != torch.int64:
        raise TypeError(f"experts must be int64, got {experts.dtype}")
    if weight.shape[2] != x.shape[1]:
        raise ValueError(f"weight must be [E, R, K] with K = {x.shape[1]} (x's width), got {tuple(weight.shape)}")
    if x.stride(1) != 1:
        raise ValueError("x needs a unit stride along K")
    if isinstance(pairs_per_token, bool) or not isinstance(pairs_per_token, int) or pairs_per_token < 1:
        raise ValueError(f"pairs_per_token must be a positive int, got {pairs_per_token!r}")
    if experts.shape[0] != x.shape[0] * pairs_per_token:
        raise ValueError(f"experts must have {x.shape[0] * pairs_per_token} entries (tokens x pairs_per_token), "
                         f"got {experts.shape[0]}")
    if act not in ACTIVATIONS:
        raise ValueError(f"act must be one of {ACTIVATIONS}, got {act!r}")
    if act in GATED and weight.shape[1] % 2:
        raise ValueError(f"a gated ({act}) weight stacks gate and up rows: an even row count, got {weight.shape[1]}")
    if scale is not None and (not isinstance(scale, torch.Tensor) or tuple(scale.shape) != (experts.shape[0],)
                              or not scale.is_floating_point()):
        raise ValueError(f"scale must be a float tensor of shape [{experts.shape[0]}]")
    if bias is not None and (not isinstance(bias, torch.Tensor) or tuple(bias.shape) != tuple(weight.shape[:2])
                             or not bias.is_floating_point()):
        raise ValueError(f"bias must be a float tensor of shape {list(weight.shape[:2])} (experts, rows)")
    if schedule not in SCHEDULES:
        raise ValueError(f"schedule must be one of {SCHEDULES}, got {schedule!r}")
    if groups is not None:
        ok = (isinstance(groups, tuple) and len(groups) == 2 and all(isinstance(g, torch.Tensor) for g in groups)
              and tuple(groups[0].shape) == (experts.shape[0],) and tuple(groups[1].shape) == (weight.shape[0] + 1,)
              and all(g.dtype == torch.int64 for g in groups))
        if not ok:
            raise ValueError("groups must be group_pairs(experts, E)'s (order [P], offsets [E + 1]) int64 tensors")
    for name, t in (("experts", experts), ("weight", weight), ("scale", scale), ("bias", bias),
                    ("groups", None if groups is None else groups[0])):
        if t is not None and t.device != x.device:
            raise ValueError(f"{name} is on {t.device} but x is on {x.device}")


def moe_pairs(x: torch.Tensor, experts: torch.Tensor, weight: torch.Tensor, *, pairs_per_token: int,
              scale: torch.Tensor | None = None, act: str | None = None, bias: torch.Tensor | None = None,
              alpha: float = 1.0, limit: float = float("inf"), backend=None, schedule: str | None = None,
              groups: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
    """x [T, K] (unit stride along K); experts [P = T * pairs_per_token] int64 (pair p: token
    p // pairs_per_token, expert experts[p]; ids are not range-checked: no host sync); weight
    [E, R, K] (any strides: GPT-OSS's experts are transposed views); bias [E, R] or None; act
    None / "silu" / "gpt_oss" / "relu2" (reference.py; alpha, limit: GPT-OSS's); scale [P] multiplies each
    pair's output. schedule: the Triton schedule (None: by 3 P <= E); groups: group_pairs(experts,
    E), to share one sort between the calls of a layer (the "expert" schedule). -> out [P, R]
    (act None, relu2) or [P, R / 2] (the gated ones), in x's dtype (float32 sums, rounded once)."""
    _check(x, experts, weight, pairs_per_token, scale, act, bias, schedule, groups)
    name = resolve_backend(backend, x.device, "moe_experts")
    if name == "cpp":
        return torch.ops.specdec_fast.moe_experts(x, experts, weight, pairs_per_token, scale, ACT_CODES[act], bias,
                                                  float(alpha), float(limit))
    if name != "triton":
        return moe_pairs_reference(x, experts, weight, pairs_per_token, scale, act, bias, alpha, limit)
    if schedule is None:
        schedule = "pair" if 3 * experts.shape[0] <= weight.shape[0] else "expert"
    if schedule == "pair":
        from .triton import moe_pairs_triton

        return moe_pairs_triton(x, experts, weight, pairs_per_token, scale, act, bias, alpha, limit)
    from .triton_grouped import moe_grouped_triton

    order, offsets = groups if groups is not None else group_pairs(experts, weight.shape[0])
    return moe_grouped_triton(x, order, offsets, weight, pairs_per_token, scale, act, bias, alpha, limit)
