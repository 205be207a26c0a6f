"""chain_verify and sample: the public entry points, with validation and backend dispatch.

Backends: "triton" (fused kernels, CUDA or TRITON_INTERPRET=1), "cpp" (csrc/verify.cpp, the
CPU default when it builds), "torch" (reference.py: the spec). See reference.py for the exact
semantics every backend implements; penalties (repetition / frequency / presence):
kernels/penalties/reference.py, applied by every backend where it loads the logits.
"""
import functools

import torch

from .._backend import resolve_backend
from ..penalties.state import check_penalty_tensors
from ..rng import STREAM_DRAFT
from ..sampling_params import constant_rows, make_sampling_tensors
from .reference import chain_verify_reference, sample_reference, standardise

LOGIT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
TOKEN_DTYPES = (torch.int32, torch.int64)

__all__ = ["chain_verify", "sample", "standardise", "chain_verify_reference", "sample_reference", "prepared_impls"]


def _check_tokens(name: str, tokens: torch.Tensor, batch: int, device: torch.device) -> None:
    """tokens must be an int32 / int64 tensor [B, W] on device (values are not read)."""
    if not isinstance(tokens, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(tokens).__name__}")
    if tokens.dtype not in TOKEN_DTYPES:
        raise TypeError(f"{name} must be int32 or int64, got {tokens.dtype}")
    if tokens.dim() != 2 or tokens.shape[0] != batch:
        raise ValueError(f"{name} must have shape [B, W] with B = {batch}, got {list(tokens.shape)}")
    if tokens.device != device:
        raise ValueError(f"{name} is on {tokens.device} but the logits are on {device}")


def _check_logits(name: str, logits: torch.Tensor, ndim: int) -> None:
    if not isinstance(logits, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(logits).__name__}")
    if logits.dtype not in LOGIT_DTYPES:
        raise TypeError(f"{name} must be float32, bfloat16 or float16, got {logits.dtype}")
    if logits.dim() != ndim:
        raise ValueError(f"{name} must have {ndim} dims, got shape {tuple(logits.shape)}")
    if logits.shape[-1] < 1:
        raise ValueError(f"{name} has an empty vocabulary dimension: shape {tuple(logits.shape)}")


def _check_draft_logits(draft_logits: torch.Tensor, target_logits: torch.Tensor, positions: int, letter: str) -> None:
    """draft_logits must be logits [B, positions, V] on target_logits' device, in its dtype, over
    its vocabulary (``letter`` names the middle dimension in the message: K drafts, N nodes)."""
    _check_logits("draft_logits", draft_logits, 3)
    batch, vocab, device = target_logits.shape[0], target_logits.shape[-1], target_logits.device
    if draft_logits.device != device:
        raise ValueError(f"draft_logits is on {draft_logits.device} but target_logits is on {device}")
    if draft_logits.dtype != target_logits.dtype:
        raise TypeError(f"draft_logits dtype {draft_logits.dtype} differs from target_logits dtype {target_logits.dtype}")
    if draft_logits.shape[-1] != vocab:
        raise ValueError(f"vocab mismatch: draft_logits has V={draft_logits.shape[-1]}, target_logits has V={vocab}")
    if tuple(draft_logits.shape) != (batch, positions, vocab):
        raise ValueError(f"draft_logits must have shape [B, {letter}, V] = [{batch}, {positions}, {vocab}], "
                         f"got {list(draft_logits.shape)}")


def _check_finite(name: str, logits: torch.Tensor) -> None:
    """NaN or +inf anywhere, or a distribution with no finite logit -> ValueError (reads values)."""
    if bool(torch.isnan(logits).any()) or bool(torch.isposinf(logits).any()):
        raise ValueError(f"{name} contains NaN or +inf")
    if logits.numel() and bool(torch.isneginf(logits).all(-1).any()):
        raise ValueError(f"{name} has a row where every logit is -inf")


def chain_verify(
    target_logits: torch.Tensor,
    draft_logits: torch.Tensor | None,
    draft_tokens: torch.Tensor,
    *,
    temperature=1.0,
    top_k=0,
    top_p=1.0,
    min_p=0.0,
    seed=0,
    offset=0,
    backend: str | None = None,
    check: bool = True,
    penalties=None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Speculative-sampling verify of a chain of K drafts per row, from logits.

    target_logits [B, K+1, V] float32/bfloat16/float16; draft_logits [B, K, V] same dtype, or
    None for deterministic drafts (p = one-hot); draft_tokens [B, K] int32/int64, -1 pads from
    the first -1 on. Sampling params: scalars or per-row tensors [B]. seed: int (each row gets
    its own stream) or int64 [B]; offset: int or int64 [B] (the row's position in its stream).
    check=False skips the checks that read tensor values: then nothing is read back from the
    device and the call is capturable in a CUDA graph (scalar parameters are checked on their
    Python values and, repeated, cost no device op: sampling_params.constant_rows).
    Returns tokens int32 [B, K+1] (accepted drafts, the resampled or bonus token, then -1)
    and num_accepted int32 [B].

    penalties: PenaltyTensors (kernels/penalties: counts int32 [B, V], per-row parameters) or
    None. Every distribution's raw logits are penalised before standardisation; target and draft
    position i see the counts plus the drafts x_0..x_{i-1} (the drafter sampled x_i after them).
    penalties.active empty (every penalty off): exactly the penalty-free path. The counts are
    not updated here: after appending the emitted tokens, call add_tokens(penalties.counts, ...).
    """
    _check_logits("target_logits", target_logits, 3)
    batch, k_plus_1, vocab = target_logits.shape
    if k_plus_1 < 1:
        raise ValueError(f"target_logits must hold K+1 >= 1 positions, got shape {tuple(target_logits.shape)}")
    if not isinstance(draft_tokens, torch.Tensor):
        raise TypeError(f"draft_tokens must be a torch.Tensor, got {type(draft_tokens).__name__}")
    if draft_tokens.dtype not in TOKEN_DTYPES:
        raise TypeError(f"draft_tokens must be int32 or int64, got {draft_tokens.dtype}")
    if draft_tokens.dim() != 2 or tuple(draft_tokens.shape) != (batch, k_plus_1 - 1):
        raise ValueError(
            f"draft_tokens must have shape [B, K] = [{batch}, {k_plus_1 - 1}] to match target_logits "
            f"[B, K+1, V] = {list(target_logits.shape)}, got {list(draft_tokens.shape)}"
        )
    device = target_logits.device
    if draft_tokens.device != device:
        raise ValueError(f"draft_tokens is on {draft_tokens.device} but target_logits is on {device}")
    if draft_logits is not None:
        _check_draft_logits(draft_logits, target_logits, k_plus_1 - 1, "K")
    if penalties is not None:
        check_penalty_tensors(penalties, batch, vocab, device)
    params = make_sampling_tensors(
        batch, device, temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p, seed=seed, offset=offset, check=check
    )
    if check:
        if draft_tokens.numel() and (bool((draft_tokens < -1).any()) or bool((draft_tokens >= vocab).any())):
            raise ValueError(f"draft_tokens must lie in [-1, V) = [-1, {vocab}), got min {int(draft_tokens.min())}, max {int(draft_tokens.max())}")
        _check_finite("target_logits", target_logits)
        if draft_logits is not None:
            _check_finite("draft_logits", draft_logits)

    chosen = resolve_backend(backend, device, "chain_verify")
    if chosen == "triton":
        from .triton import chain_verify_triton

        return chain_verify_triton(target_logits, draft_logits, draft_tokens, params, penalties)
    if chosen == "cpp":
        from .cpp import chain_verify_cpp

        return chain_verify_cpp(target_logits, draft_logits, draft_tokens, params, penalties)
    return chain_verify_reference(target_logits, draft_logits, draft_tokens, params, penalties)


def sample(
    logits: torch.Tensor,
    *,
    temperature=1.0,
    top_k=0,
    top_p=1.0,
    min_p=0.0,
    seed=0,
    offset=0,
    position=0,
    stream: int = STREAM_DRAFT,
    backend: str | None = None,
    check: bool = True,
    penalties=None,
    prefix_tokens: torch.Tensor | None = None,
) -> torch.Tensor:
    """One token per row from the standardised distribution of logits [B, V] -> int32 [B].

    Same standardisation and random stream as chain_verify; the noise of row b is keyed by
    (seed_b, offset_b, position, stream). A drafter samples its i-th draft with position=i
    and the default stream, so its noise never coincides with the verify step's.
    position: int or int tensor [B].
    penalties: PenaltyTensors or None (as chain_verify's); prefix_tokens: int32 / int64 [B, W] or
    None, the row's generated tokens that penalties.counts does not hold yet (a drafter's drafts
    x_0..x_{i-1} of this iteration when it samples x_i; -1 entries are not tokens). Without
    penalties the prefix changes nothing.
    """
    _check_logits("logits", logits, 2)
    batch, _ = logits.shape
    device = logits.device
    if isinstance(stream, bool) or not isinstance(stream, int) or not 0 <= stream < 256:
        raise ValueError(f"stream must be an int in [0, 256), got {stream!r}")
    if isinstance(position, torch.Tensor):
        if position.dtype not in TOKEN_DTYPES or position.shape not in ((batch,), ()):
            raise ValueError(f"position must be an int or an int tensor [{batch}], got {position.dtype} {tuple(position.shape)}")
        if position.device != device:
            raise ValueError(f"position is on {position.device} but logits is on {device}")
        positions = position.to(torch.int64).expand(batch).contiguous()
    elif isinstance(position, int) and not isinstance(position, bool) and 0 <= position < 2**32:
        positions = constant_rows("position", position, batch, device,
                                  lambda: torch.full((batch,), position, dtype=torch.int64, device=device))
    else:
        raise ValueError(f"position must be an int in [0, 2**32) or an int tensor [B], got {position!r}")
    if penalties is not None:
        check_penalty_tensors(penalties, batch, logits.shape[1], device)
    if prefix_tokens is not None:
        _check_tokens("prefix_tokens", prefix_tokens, batch, device)
    params = make_sampling_tensors(
        batch, device, temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p, seed=seed, offset=offset, check=check
    )
    if check:
        _check_finite("logits", logits)
        if prefix_tokens is not None and prefix_tokens.numel() and (
                bool((prefix_tokens < -1).any()) or bool((prefix_tokens >= logits.shape[1]).any())):
            raise ValueError(f"prefix_tokens must lie in [-1, V) = [-1, {logits.shape[1]})")
        if bool((positions < 0).any()) or bool((positions >= 2**32).any()):
            raise ValueError("position must lie in [0, 2**32)")

    chosen = resolve_backend(backend, device, "sample")
    if chosen == "triton":
        from .triton import sample_triton

        return sample_triton(logits, params, positions, stream, penalties, prefix_tokens)
    if chosen == "cpp":
        from .cpp import sample_cpp

        return sample_cpp(logits, params, positions, stream, penalties, prefix_tokens)
    return sample_reference(logits, params, positions, stream, penalties, prefix_tokens)


def prepared_impls(backend, device):
    """(chain_verify_impl, sample_impl) of the backend resolve_backend picks for ``device``:
        chain_verify_impl(target_logits [B, K+1, V], draft_logits [B, K, V] or None,
                          draft_tokens [B, K], params: SamplingTensors,
                          penalties: PenaltyTensors | None = None) -> (tokens, num_accepted)
        sample_impl(logits [B, V], params: SamplingTensors, positions int64 [B], stream,
                    penalties: PenaltyTensors | None = None,
                    prefix_tokens: int [B, W] | None = None) -> int32 [B]
    penalties None (or with no active penalty): exactly the penalty-free kernels and launches.
    For a caller that validated its arguments once and calls every decoding step (the engine,
    the drafters): no checks, no per-call dispatch. params come from make_sampling_tensors
    (offset set per call with dataclasses.replace). The public entry points cost ~0.3 ms of
    Python per call on CPU (cProfile, demo pair: 156 draft samples 48 ms, of which the op 11 ms).
    Triton: each impl holds a KernelWorkspace (its counters stay zero between calls: no zero fill
    per call), so one pair serves one sequence of calls on one stream -- call prepared_impls once
    per decoder or drafter, as the engine does."""
    chosen = resolve_backend(backend, torch.device(device), "chain_verify")
    if chosen == "triton":  # each with its own workspace: no zero fill per call (kernels/_workspace.py)
        from .triton import KernelWorkspace, chain_verify_triton, sample_triton

        return (functools.partial(chain_verify_triton, workspace=KernelWorkspace()),
                functools.partial(sample_triton, workspace=KernelWorkspace()))
    if chosen == "cpp":
        from .cpp import chain_verify_cpp, sample_cpp

        return chain_verify_cpp, sample_cpp
    return chain_verify_reference, sample_reference
