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
