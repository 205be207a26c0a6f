"""The public chain_verify / sample with check=False read nothing back from the device and, for
repeated scalar parameters (an int seed included), cost no device op beyond the kernel's own;
on a GPU they capture into a CUDA graph whose replays equal eager calls.

The H100 probe (bench/results/h100_3dca4fa/verify_public_api_probe.json): 35 kernels per call, 5 of them
device-to-host copies (the scalar checks), 3.2 ms with an int seed (273 tiny Philox ops to
derive the row seeds) against 0.6 ms with seed tensors, and the capture failed."""
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from specdec_fast.engine.graphs import SYNC_OPS
from specdec_fast.kernels import sampling_params
from specdec_fast.kernels.verify import chain_verify, sample

from ..implicit_device import package_roots
from .backends import TEST_DEVICE, kernel_backends

# The interpreted Triton column takes 7-11 s here (every launch interpreted, every op traced).
BACKENDS = [pytest.param(b, marks=pytest.mark.slow) if b == "triton" and TEST_DEVICE == "cpu" else b
            for b in kernel_backends()]


class PackageOps(TorchDispatchMode):
    """Every torch op run inside it (``all``) and those called from package code (``ours``: the
    Triton interpreter's own host copies are not the package's and do not exist on a GPU)."""

    def __init__(self):
        super().__init__()
        self.roots = tuple(r + "/" for r in package_roots())
        self.all, self.ours = [], []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        import sys

        name = str(func)
        self.all.append(name)
        frame = sys._getframe(1)
        while frame is not None and "/torch/" in frame.f_code.co_filename:
            frame = frame.f_back
        if frame is not None and frame.f_code.co_filename.startswith(self.roots):
            self.ours.append(name)
        return func(*args, **(kwargs or {}))

    def syncs(self) -> list:
        return [op for op in self.all if op.startswith(SYNC_OPS)]


def _problem(device, batch=2, k=3, vocab=64):
    g = torch.Generator().manual_seed(batch * 10 + k)
    target = torch.randn(batch, k + 1, vocab, generator=g).to(device)
    draft = torch.randn(batch, k, vocab, generator=g).to(device)
    drafts = torch.randint(0, vocab, (batch, k), generator=g).to(device)
    return target, draft, drafts


def _traced(call):
    with PackageOps() as ops:
        out = call()
    return out, ops


SCALARS = dict(temperature=0.8, top_k=20, top_p=0.9, min_p=0.01, seed=1234, offset=5)


@pytest.mark.parametrize("backend", BACKENDS)
def test_unchecked_calls_never_sync_and_an_int_seed_costs_nothing_on_a_hit(backend, device):
    target, draft, drafts = _problem(device)
    per_row = dict(temperature=torch.full((2,), 0.8, device=device), top_k=torch.full((2,), 20, device=device),
                   top_p=torch.full((2,), 0.9, device=device), min_p=torch.full((2,), 0.01, device=device),
                   seed=torch.tensor([3, 4], device=device), offset=torch.tensor([5, 6], device=device))
    verify = lambda **kw: chain_verify(target, draft, drafts, backend=backend, check=False, **kw)  # noqa: E731
    draw = lambda **kw: sample(target[:, 0], position=3, backend=backend, check=False, **kw)  # noqa: E731
    sampling_params._cache.clear()
    _, miss = _traced(lambda: verify(**SCALARS))  # the first call builds the per-row constants
    expected, hit = _traced(lambda: verify(**SCALARS))
    _, tensors = _traced(lambda: verify(**per_row))
    draw(**SCALARS)
    drawn, sample_hit = _traced(lambda: draw(**SCALARS))
    _, sample_tensors = _traced(lambda: draw(**per_row))
    for ops in (miss, hit, tensors, sample_hit, sample_tensors):
        assert ops.syncs() == []
    # A repeated int seed and scalar parameters: no op of ours beyond what per-row tensors cost
    # (those are used as given), and far fewer than deriving the row seeds again (273 ops).
    assert len(hit.ours) <= len(tensors.ours) and len(sample_hit.ours) <= len(sample_tensors.ours)
    built_once = len(miss.ours) - len(hit.ours)  # what the cache saves every later call
    if torch.device(device).type == "cuda":
        assert 0 < built_once <= 8  # 5 fills + the row seeds' buffer (derived in one Triton launch)
    else:
        assert built_once > 100  # 5 fills + derive_row_seeds in torch ops (~270)
    if backend == "cpp":  # the one C++ op (sample also slices the logits: one view)
        assert hit.ours == ["specdec_fast.chain_verify.default"] and len(sample_hit.ours) == 2
    if backend == "triton":  # output and partial-statistics buffers, and the one zero fill of the launches' counters
        assert len(hit.ours) <= 24 and all(op.startswith(("aten.empty", "aten.expand", "aten.unsqueeze", "aten.view",
                                                          "aten.slice", "aten.select")) for op in hit.ours
                                           if op != "aten.zeros.default"), hit.ours
        assert hit.ours.count("aten.zeros.default") == 1, hit.ours
    assert torch.equal(verify(**SCALARS)[0], expected[0]) and torch.equal(draw(**SCALARS), drawn)


def test_cached_constants_survive_a_caller_modifying_them(device):
    """A caller that writes into a SamplingTensors field (forbidden, but possible) must not poison
    later calls: the cache notices the in-place change (tensor._version) and rebuilds."""
    from specdec_fast.kernels.sampling_params import make_sampling_tensors
    from specdec_fast.kernels.rng import derive_row_seeds

    first = make_sampling_tensors(3, device, temperature=0.5, seed=77)
    first.temperature.fill_(9.0)
    first.seed.zero_()
    again = make_sampling_tensors(3, device, temperature=0.5, seed=77)
    assert again.temperature.tolist() == [0.5] * 3
    assert torch.equal(again.seed.cpu(), derive_row_seeds(77, 3, "cpu"))
    assert make_sampling_tensors(3, device, temperature=0.5, seed=77).seed is again.seed  # cached again


def test_scalar_checks_read_nothing_back(device):
    """check=True with scalar parameters only: the parameters are validated on the host (the
    H100's 5 device-to-host copies per call were these checks)."""
    from specdec_fast.kernels.sampling_params import make_sampling_tensors

    sampling_params._cache.clear()
    _, ops = _traced(lambda: make_sampling_tensors(4, device, check=True, **SCALARS))
    assert ops.syncs() == []
    with pytest.raises(ValueError, match="top_p"):
        make_sampling_tensors(4, device, top_p=float("nan"))
    with pytest.raises(ValueError, match="top_k"):
        make_sampling_tensors(4, device, top_k=2**31)


@pytest.mark.gpu
@pytest.mark.parametrize("seed_kind", ["int", "int unseen at warm-up", "per-row"])
def test_public_calls_capture_in_a_cuda_graph_and_replay_like_eager(seed_kind):
    """chain_verify and sample (public API, check=False) captured in one CUDA graph: replays on new
    logits written into the captured inputs equal eager calls on them, bit for bit; the eager
    calls run under sync debug mode "error" (no host sync)."""
    device = "cuda"
    target, draft, drafts = _problem(device, batch=3, k=4, vocab=1000)
    seed = {"int": 2024, "int unseen at warm-up": 2025, "per-row": torch.tensor([7, -8, 9], device=device)}[seed_kind]
    warm_seed = 2024 if seed_kind != "per-row" else seed
    kw = dict(temperature=0.9, top_k=50, top_p=0.95, backend="triton", check=False)

    def calls(s):
        tokens, accepted = chain_verify(target, draft, drafts, seed=s, offset=11, **kw)
        drawn = sample(target[:, 0], seed=s, position=2, **kw)
        return tokens, accepted, drawn

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        calls(warm_seed)  # compiles the kernels, builds the constants
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = calls(seed)
    g = torch.Generator(device=device).manual_seed(5)
    for _ in range(3):
        for t in (target, draft):
            t.copy_(torch.randn(t.shape, generator=g, device=device) * 3)
        drafts.copy_(torch.randint(0, 1000, drafts.shape, generator=g, device=device))
        graph.replay()
        torch.cuda.set_sync_debug_mode("error")
        try:
            eager = calls(seed)
        finally:
            torch.cuda.set_sync_debug_mode("default")
        for got, want in zip(captured, eager):
            assert torch.equal(got, want)
