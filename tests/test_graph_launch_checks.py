"""StepGraph's Triton and garbage-collection rules (specdec_fast/engine/graphs.py, triton_launches.py):
  - the capture call must not launch a Triton kernel under a specialisation key the warm-up did
    not launch (it would compile inside the capture: cudaErrorStreamCaptureInvalidated);
  - later calls of the static twin must launch what was captured with the same scalar arguments
    (a replay repeats the captured ones);
  - no garbage collection during a capture (a finaliser destroying an old graph invalidates it).
Triton runs through the interpreter here: the keys are computed as triton 3.6 compiles them."""
import gc

import pytest
import torch
import triton
import triton.language as tl

from specdec_fast.engine.graphs import GraphSafetyError, StepGraph, state_tensors
from specdec_fast.engine.triton_launches import TritonLaunches, launch_of

from .fake_cuda import fake_cuda  # noqa: F401 (fixture)


@triton.jit
def _add_kernel(x_ptr, n, value, BLOCK: tl.constexpr):
    i = tl.arange(0, BLOCK)
    tl.store(x_ptr + i, tl.load(x_ptr + i, mask=i < n) + value, mask=i < n)


@triton.jit(do_not_specialize=["n"])
def _add_kernel_any_n(x_ptr, n, BLOCK: tl.constexpr):
    i = tl.arange(0, BLOCK)
    tl.store(x_ptr + i, tl.load(x_ptr + i, mask=i < n) + 1, mask=i < n)


class Step:
    """A step launching one Triton kernel on a state buffer; ``schedule(call)`` -> (n, offset)."""

    def __init__(self, device, schedule, kernel=_add_kernel):
        self.buffer = torch.zeros(64, device=device)
        self.schedule, self.kernel, self.call = schedule, kernel, 0

    def __call__(self):
        n, offset = self.schedule(self.call)
        self.call += 1
        target = self.buffer[offset:]
        if self.kernel is _add_kernel:
            self.kernel[(1,)](target, n, 1.0, BLOCK=32)
        else:
            self.kernel[(1,)](target, n, BLOCK=32)
        return None


def _graph(step, warmup=1, capture=False):
    return StepGraph(step, name="add", capture=capture, warmup=warmup,
                     state=lambda: state_tensors({"step": step}, ("specdec_fast", __name__)))


def test_keys_follow_triton_specialisation_rules(device):
    x = torch.zeros(64, device=device)
    keys = {n: launch_of(_add_kernel, (x, n, 1.0), {"BLOCK": 32}, (1,)) for n in (1, 5, 16, 2**31)}
    spec = {n: launch.specialization[1] for n, launch in keys.items()}
    assert spec == {1: ("constexpr", 1), 5: ("i32", ""), 16: ("i32", "D"), 2**31: ("i64", "D")}
    assert launch_of(_add_kernel, (x[1:], 5, 1.0), {"BLOCK": 32}, (1,)).specialization[0] == ("*fp32", "")
    assert len({launch_of(_add_kernel_any_n, (x, n), {"BLOCK": 32}, (1,)).key for n in (1, 5, 16)}) == 1
    with TritonLaunches() as launches:
        _add_kernel[(1,)](x, 16, 2.0, BLOCK=32)
    assert [launch.key for launch in launches.launches] == [keys[16].key]
    assert float(x[0]) == 2.0  # the wrapped launch still ran


@pytest.mark.parametrize("capture_n,capture_offset,named", [
    (16, 0, "n = 16 (i32 divisible by 16; before: i32, value 15)"),
    (1, 0, "n = 1 (constexpr 1; before: i32, value 15)"),
    (15, 1, "x_ptr"),  # a view 4 bytes in: no longer 16-byte aligned
])
def test_a_new_specialisation_at_the_capture_call_is_caught(capture_n, capture_offset, named, device):
    step = Step(device, lambda call: (15, 0) if call == 0 else (capture_n, capture_offset))
    graph = _graph(step)
    graph()  # warm-up
    with pytest.raises(GraphSafetyError, match="_add_kernel") as caught:
        graph()
    assert named in str(caught.value) and "capture call" in str(caught.value)


def test_a_scalar_argument_that_varies_after_the_capture_is_caught(device):
    """Same specialisation (do_not_specialize), different value: a replay would use the captured one."""
    step = Step(device, lambda call: (3 + call, 0), kernel=_add_kernel_any_n)
    graph = _graph(step)
    graph()
    graph()  # capture call: key as in the warm-up (n not specialised)
    with pytest.raises(GraphSafetyError, match=r"n = 5 \(captured: 4\)"):
        graph()


def test_a_representative_warmup_passes(device):
    step = Step(device, lambda call: (20, 0))
    graph = _graph(step)
    for _ in range(4):
        graph()
    assert graph.replays == 3 and float(step.buffer[0]) == 4.0


def test_no_warmup_means_no_key_check(device):
    graph = _graph(Step(device, lambda call: (16, 0)), warmup=0)
    graph()
    graph()
    assert graph.replays == 2


class _Cycle:
    """An unreachable reference cycle with a finaliser (like a dead decoder holding a CUDA graph)."""

    log = []
    capturing = False

    def __init__(self):
        self.me = self

    def __del__(self):
        _Cycle.log.append("during capture" if _Cycle.capturing else "outside")


def _allocating_step():
    """Drops a cycle, then allocates enough container objects for generation-0 collections to run
    (threshold 1): with the collector on, the cycle is finalised in the middle of the step (Python
    3.11; from 3.12 the collector runs only at the interpreter's eval-breaker checks, not always
    inside the step). Logs whether the collector was enabled."""
    _Cycle.capturing = True
    _Cycle.enabled.append(gc.isenabled())
    _Cycle()
    junk = [[i] for i in range(2000)]
    _Cycle.capturing = False
    return torch.zeros(1) + len(junk)


def test_garbage_is_not_collected_during_a_capture(fake_cuda):
    thresholds, enabled = gc.get_threshold(), gc.isenabled()
    gc.enable()
    gc.set_threshold(1, 1, 1)
    _Cycle.enabled = []
    try:
        _Cycle.log.clear()
        _allocating_step()
        collects_mid_step = _Cycle.log == ["during capture"]  # 3.11: always; 3.12: not guaranteed
        gc.collect()
        _Cycle.log.clear()
        graph = StepGraph(_allocating_step, name="alloc", capture=True, warmup=0, state=dict)
        graph()  # the capture call: the same step, the collector paused
        assert _Cycle.enabled == [True, False] and gc.isenabled()  # paused inside the capture only
        gc.collect()
        if collects_mid_step:
            assert _Cycle.log == ["outside"]  # finalised, but after the capture
        assert "during capture" not in _Cycle.log
    finally:
        gc.set_threshold(*thresholds)
        if not enabled:
            gc.disable()
