"""Per-row sampling parameters as device tensors, validated once, shared by every kernel.

Each parameter is a Python scalar (same for every row) or a tensor [B]. Scalars are checked
on their Python value (free: no device tensor is built to check them, nothing is read back);
tensors are checked only when ``check`` is True (that reads their values, i.e. synchronises).

Scalars become per-row tensors through a small cache (constant_rows): a repeated value costs
no device op at all. On the H100 the public chain_verify built and read back a tensor per
scalar (5 device-to-host copies per call) and derived the per-row seeds of an int seed with
273 tiny torch ops (3.2 ms per call against 0.6 ms with seed tensors).
"""
import math
from collections import OrderedDict
from dataclasses import dataclass
from numbers import Integral, Real

import torch

from ._backend import canonical_device, triton_available, triton_interpreting
from .rng import MAX_OFFSET
from .rng.reference import derive_row_seeds


# The sampling modes a row can use (host names; kernels/verify/_triton_plan.py sizes its launches
# from them): greedy (temperature 0), plain (T > 0, no top-k / top-p / min-p), and the truncations
# a sampled row applies (top_k > 0, top_p < 1, min_p > 0; a sampled row may use several).
MODES = ("greedy", "plain", "top_k", "top_p", "min_p")
TRUNCATIONS = frozenset(("top_k", "top_p", "min_p"))
_MODE_SET = frozenset(MODES)


class HostModes(frozenset):
    """SamplingTensors.modes: a frozenset of MODES that remembers the four standardisation
    tensors (temperature, top_k, top_p, min_p) it describes."""

    __slots__ = ("of",)


@dataclass(frozen=True)
class SamplingTensors:
    """Standardisation and randomness parameters, one entry per row (all on one device).

    temperature: float32 [B]  (0 = greedy)       top_k: int32 [B]  (0 = off)
    top_p:       float32 [B]  (1 = off)          min_p: float32 [B] (0 = off)
    seed:        int64 [B]                       offset: int64 [B] in [0, 2**56)
    modes:       the MODES some row may use, known on the host (a superset is allowed, never a
                 subset), or None: unknown (launchers then assume every mode).

    modes given as a set describe the tensors given with them (stored as a HostModes, which
    remembers those tensors). dataclasses.replace() of other fields (offset, seed) keeps them;
    a replace() that swaps temperature, top_k, top_p or min_p without a new set of modes drops
    them to None (never a stale claim).
    The tensors may be shared with later calls (constant_rows): never modify them in place.
    """

    temperature: torch.Tensor
    top_k: torch.Tensor
    top_p: torch.Tensor
    min_p: torch.Tensor
    seed: torch.Tensor
    offset: torch.Tensor
    modes: frozenset | None = None

    def __post_init__(self):
        modes = self.modes
        if modes is None:
            return
        if isinstance(modes, HostModes):  # carried over by replace(): still about these tensors?
            of = modes.of
            if not (of[0] is self.temperature and of[1] is self.top_k and of[2] is self.top_p and of[3] is self.min_p):
                object.__setattr__(self, "modes", None)
            return
        described = HostModes(modes)
        if not described <= _MODE_SET:
            raise ValueError(f"unknown sampling modes {sorted(described - _MODE_SET)}; choose from {MODES}")
        described.of = (self.temperature, self.top_k, self.top_p, self.min_p)
        object.__setattr__(self, "modes", described)

    @property
    def batch(self) -> int:
        return self.temperature.shape[0]

    def select_rows(self, index: torch.Tensor) -> "SamplingTensors":
        """The parameters of rows ``index`` (int64 [M], values in [0, B)), e.g. one row per drafted
        child. The host modes carry over (the selected rows use a subset of them)."""
        return SamplingTensors(self.temperature[index], self.top_k[index], self.top_p[index], self.min_p[index],
                               self.seed[index], self.offset[index], modes=None if self.modes is None else set(self.modes))


FIELDS = ("temperature", "top_k", "top_p", "min_p", "seed", "offset")


def static_sampling_tensors(rows: int, device, modes=None) -> SamplingTensors:
    """SamplingTensors of [rows] buffers of its own (greedy, seed 0) that later calls copy their
    parameters into (fill_rows): the same tensors every call, as captured CUDA graphs need."""
    device = canonical_device(device)

    def zeros(dtype):
        return torch.zeros(rows, dtype=dtype, device=device)

    return SamplingTensors(zeros(torch.float32), zeros(torch.int32), torch.ones(rows, device=device), zeros(torch.float32),
                           zeros(torch.int64), zeros(torch.int64), modes=None if modes is None else set(modes))


def fill_rows(dst: SamplingTensors, src: SamplingTensors, fields=("temperature", "top_k", "top_p", "min_p", "seed")) -> None:
    """dst's [R] buffers <- src's [B] rows (B <= R), in place; rows B.. repeat row 0 (a bucket's
    unused rows: any valid value). The offsets are the caller's (the loop's live counter)."""
    batch, rows = src.batch, dst.batch
    for name in fields:
        into, values = getattr(dst, name), getattr(src, name)
        into[:batch].copy_(values)
        if batch < rows:
            into[batch:].copy_(values[:1].expand(rows - batch))


def refill_params(dst: SamplingTensors, src: SamplingTensors) -> None:
    """Copies every per-row tensor of ``src`` into ``dst``'s (same shapes), in place: buffers that
    a captured CUDA graph reads take a later call's values. ``dst`` must own its tensors (not
    constant_rows' shared ones); its modes stay (the caller keeps them consistent)."""
    for name in FIELDS:
        getattr(dst, name).copy_(getattr(src, name))


# name -> (dtype, integral, rule on a value (Python scalar or tensor), rule text)
RULES = {
    "temperature": (torch.float32, False, lambda v: (v >= 0) & (v < math.inf), "0 <= temperature < inf"),
    "top_k": (torch.int32, True, lambda v: (v >= 0) & (v < 2**31), "0 <= top_k < 2**31"),
    "top_p": (torch.float32, False, lambda v: (v > 0) & (v <= 1), "0 < top_p <= 1"),
    "min_p": (torch.float32, False, lambda v: (v >= 0) & (v <= 1), "0 <= min_p <= 1"),
    "offset": (torch.int64, True, lambda v: (v >= 0) & (v < MAX_OFFSET), "0 <= offset < 2**56"),
}

# ---- the cache of per-row constant tensors ------------------------------------------------
CACHE_ENTRIES = 256
_cache: OrderedDict = OrderedDict()  # key -> (tensor, its _version when cached), least recent first
_pinned: dict = {}  # key -> tensor handed to a CUDA-graph capture: the graph reads it at every replay


def _capturing(device: torch.device) -> bool:
    return device.type == "cuda" and torch.cuda.is_current_stream_capturing()


def constant_rows(kind: str, value, batch: int, device, build) -> torch.Tensor:
    """The per-row tensor [batch] of ``kind`` for a scalar ``value`` on ``device``: build() once per
    (kind, value, batch, device), then the same tensor from an LRU cache (no device op).

    A cached tensor that was modified in place (its _version moved) is rebuilt. Inside a CUDA
    graph capture a hit is pinned (never freed: the graph reads its address at every replay) and
    a miss is built in the capture (torch.full / device kernels are capturable) but not cached:
    its values exist only once the graph has run."""
    device = canonical_device(device)
    key = (kind, type(value).__name__, value, batch, device)
    capturing = _capturing(device)
    entry = _cache.get(key)
    if entry is not None and entry[0]._version == entry[1]:
        _cache.move_to_end(key)
        if capturing:
            _pinned[key] = entry[0]
        return entry[0]
    tensor = build()
    if not capturing:
        _cache[key] = (tensor, tensor._version)
        while len(_cache) > CACHE_ENTRIES:
            _cache.popitem(last=False)
    return tensor


def row_seeds(seed: int, batch: int, device) -> torch.Tensor:
    """derive_row_seeds(seed, batch) on ``device``: one Triton launch on CUDA, the torch spec
    elsewhere; cached per (seed, batch, device) through constant_rows."""
    device = canonical_device(device)

    def build():
        if device.type == "cuda" and triton_available() and not triton_interpreting():
            from .rng.triton import derive_row_seeds_triton

            return derive_row_seeds_triton(seed, batch, device)
        return derive_row_seeds(seed, batch, device)

    return constant_rows("seed", seed, batch, device, build)


# ---- validation ---------------------------------------------------------------------------
def _scalar(value, name: str, integral: bool):
    """The Python value of a scalar parameter, type-checked."""
    if isinstance(value, bool) or not isinstance(value, Integral if integral else Real):
        kind = "an int" if integral else "a number"
        raise TypeError(f"{name} must be {kind} or a tensor [B], got {type(value).__name__}")
    return int(value) if integral else float(value)


def row_tensor(value: torch.Tensor, name: str, batch: int, device: torch.device, beside: str) -> torch.Tensor:
    """A per-row parameter given as a tensor: a 0-dim one expanded to [batch]; else it must be
    [batch] on ``device`` (where ``beside`` are, e.g. "the logits are": the error's words)."""
    if value.dim() == 0:
        value = value.reshape(1).expand(batch)
    if value.dim() != 1 or value.shape[0] != batch:
        raise ValueError(f"{name} must be a scalar or a tensor of shape [{batch}], got shape {tuple(value.shape)}")
    if value.device != device:
        raise ValueError(f"{name} is on {value.device} but {beside} on {device}")
    return value


def _per_row(value, name: str, batch: int, device: torch.device, check: bool) -> torch.Tensor:
    """Parameter ``name`` as a tensor [batch] of its dtype on device, validated (scalars always,
    on the host; tensors only when check, which reads their values)."""
    dtype, integral, rule, text = RULES[name]
    if isinstance(value, torch.Tensor):
        value = row_tensor(value, name, batch, device, "the logits are")
        if integral and (value.is_floating_point() or value.is_complex() or value.dtype == torch.bool):
            raise TypeError(f"{name} must be an integer tensor, got {value.dtype}")
        if not integral and not (value.is_floating_point() or value.dtype in (torch.int32, torch.int64)):
            raise TypeError(f"{name} must be a real tensor, got {value.dtype}")
        if check and batch:
            ok = rule(value.long() if integral else value)  # int64: the bounds (2**31, 2**56) fit
            if not bool(ok.all()):
                raise ValueError(f"{name} must satisfy {text}, got {value[~ok][0].item()}")
        return value.to(dtype).contiguous()
    value = _scalar(value, name, integral)
    if not rule(value):
        raise ValueError(f"{name} must satisfy {text}, got {value}")
    return constant_rows(name, value, batch, device, lambda: torch.full((batch,), value, dtype=dtype, device=device))


def _possible_modes(given: dict) -> frozenset:
    """The modes rows may use, from the arguments as given (name -> Python number or tensor):
    exact for Python scalars; a tensor not read may hold anything, so every state of its
    parameter stays possible (a superset)."""
    def states(name, on) -> set:
        value = given[name]
        return {True, False} if isinstance(value, torch.Tensor) else {on(value)}

    greedy = states("temperature", lambda t: t == 0)
    modes = {"greedy"} if True in greedy else set()
    if False in greedy:  # some row may sample
        truncating = {name: states(name, on) for name, on in
                      (("top_k", lambda k: k > 0), ("top_p", lambda p: p < 1), ("min_p", lambda p: p > 0))}
        modes |= {name for name, st in truncating.items() if True in st}
        if all(False in st for st in truncating.values()):
            modes.add("plain")
    return frozenset(modes)


def _rows_modes(params: dict) -> frozenset:
    """Exact modes of per-row tensors [B] (reads their values: one device-to-host copy)."""
    t, k, p, mp = params["temperature"], params["top_k"], params["top_p"], params["min_p"]
    sampled = t > 0
    topk, topp, minp = sampled & (k > 0), sampled & (p < 1), sampled & (mp > 0)
    rows = torch.stack([~sampled, sampled & ~(topk | topp | minp), topk, topp, minp])
    return frozenset(mode for mode, used in zip(MODES, rows.any(1).tolist()) if used)


def make_sampling_tensors(
    batch: int,
    device,
    *,
    temperature=1.0,
    top_k=0,
    top_p=1.0,
    min_p=0.0,
    seed=0,
    offset=0,
    check: bool = True,
) -> SamplingTensors:
    """Validate the sampling arguments and broadcast them to per-row tensors [batch].

    An int seed gives each row its own stream (derive_row_seeds); a tensor seed [B] is used
    as given. Raises ValueError/TypeError naming the argument on bad input. With check=False
    nothing is read from the device (scalars are checked on their Python values), and for
    repeated scalar values no device op runs at all (constant_rows).

    modes (SamplingTensors.modes) come free from scalars; check=True with tensor parameters
    reads the modes of their rows too (exact); unread tensors leave every state of their
    parameter possible (a superset: launchers then keep the launches those states need)."""
    device = canonical_device(device)
    params = {name: _per_row(value, name, batch, device, check)
              for name, value in (("temperature", temperature), ("top_k", top_k), ("top_p", top_p),
                                  ("min_p", min_p), ("offset", offset))}
    if isinstance(seed, torch.Tensor):
        if seed.dim() == 0:
            seed = seed.reshape(1).expand(batch)
        if seed.dim() != 1 or seed.shape[0] != batch:
            raise ValueError(f"seed must be a scalar or a tensor of shape [{batch}], got shape {tuple(seed.shape)}")
        if seed.device != device:
            raise ValueError(f"seed is on {seed.device} but the logits are on {device}")
        if seed.is_floating_point() or seed.is_complex() or seed.dtype == torch.bool:
            raise TypeError(f"seed must be an integer tensor, got {seed.dtype}")
        s = seed.to(torch.int64).contiguous()  # any int64 is a valid seed
    else:
        if isinstance(seed, bool) or not isinstance(seed, Integral):
            raise TypeError(f"seed must be an int or an int64 tensor [B], got {type(seed).__name__}")
        seed = int(seed)
        if not -(1 << 63) <= seed < (1 << 63):
            raise ValueError(f"seed must fit in int64, got {seed}")
        s = row_seeds(seed, batch, device)
    given = dict(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p)
    if check and batch and any(isinstance(v, torch.Tensor) for v in given.values()):
        modes = _rows_modes(params)  # the values were read anyway: the exact modes of the rows
    else:
        modes = _possible_modes(given)
    return SamplingTensors(params["temperature"], params["top_k"], params["top_p"], params["min_p"], s, params["offset"],
                           modes=modes)
