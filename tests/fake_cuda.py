"""FakeCuda: stand-ins for torch.cuda's stream / graph API, so StepGraph's capture mode runs on CPU."""
import pytest
import torch


class FakeCuda:
    """Stand-ins for torch.cuda's stream / graph API that record what StepGraph(capture=True) does,
    so its capture-mode control flow runs on CPU (the kernels are not captured: the "capture"
    block runs the step eagerly and replay() only counts)."""

    def __init__(self):
        self.log, self.captures = [], []
        fake = self

        class Stream:
            def wait_stream(self, other):
                fake.log.append(("wait", self is main, other is main))

        main = Stream()
        self.main = main

        class StreamContext:
            def __init__(self, stream):
                self.stream = stream

            def __enter__(self):
                fake.log.append(("enter stream", self.stream is main))

            def __exit__(self, *exc):
                fake.log.append(("exit stream",))

        class CUDAGraph:
            def replay(self):
                fake.log.append(("replay",))

        class GraphContext:
            def __init__(self, graph, pool=None, stream=None):
                fake.log.append(("capture", type(graph).__name__, pool, stream is not main))
                fake.captures.append((pool, stream))

            def __enter__(self):
                pass

            def __exit__(self, *exc):
                fake.log.append(("end capture", exc[0] is None))

        self.Stream, self.CUDAGraph, self.graph = Stream, CUDAGraph, GraphContext
        self.current_stream = lambda: main
        self.stream = StreamContext
        self.graph_pool_handle = object


@pytest.fixture
def fake_cuda(monkeypatch):
    fake = FakeCuda()
    for name in ("Stream", "CUDAGraph", "graph", "current_stream", "stream", "graph_pool_handle"):
        monkeypatch.setattr(torch.cuda, name, getattr(fake, name))
    return fake


class LateDevice:
    """A fake device whose work completes late, for the loop's run-ahead (specdec_fast/engine/run_ahead.py).

    Its clock is the host's iteration count (``tick()``, called once per issued iteration: the
    tests wrap the decoder's step). An event recorded at tick t completes (query() turns true)
    ``lag`` ticks later, like a GPU that runs ``lag`` iterations behind its host; synchronize()
    completes it and every event recorded before it (stream order) at once, and is logged.
    lag = 0: a device that keeps up (every event complete when the host next looks).
    The values a poll copies are those at issue (CPU copies are synchronous): only their
    visibility is delayed, which is what the host's protocol depends on."""

    def __init__(self, lag: int):
        self.lag, self.now, self.done_upto = lag, 0, -1
        self.log = []  # ("record" | "query" | "sync", tick of the event, timing event?, result)
        device = self

        class Event:
            def __init__(self, enable_timing=False, blocking=False, interprocess=False):
                self.timing, self.tick = enable_timing, None

            def record(self, stream=None):
                self.tick = device.now
                device.log.append(("record", self.tick, self.timing, None))

            def query(self):
                done = self.tick <= max(device.done_upto, device.now - device.lag)
                device.log.append(("query", self.tick, self.timing, done))
                return done

            def synchronize(self):
                device.done_upto = max(device.done_upto, self.tick)
                device.log.append(("sync", self.tick, self.timing, None))

            def elapsed_time(self, other):
                return 0.0

        self.Event = Event

    def tick(self) -> None:
        self.now += 1

    def poll_syncs(self) -> list:
        """Ticks of the poll events (no timing) the host blocked on."""
        return [tick for kind, tick, timing, _ in self.log if kind == "sync" and not timing]
