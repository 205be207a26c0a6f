"""StepGraph (specdec_fast/engine/graphs.py): the static twin (capture=False) runs the step eagerly on the
captured buffers and catches every graph-safety violation on CPU; on CUDA the capture replays."""
import pytest
import torch

from specdec_fast.engine.graphs import GraphSafetyError, StepGraph, address_changes, addresses, state_tensors

from .fake_cuda import fake_cuda  # noqa: F401 (fixture)


PACKAGES = ("specdec_fast", __name__)


class Counter:
    """A graph-safe step: state updated in place, one output [2]."""

    def __init__(self, device="cpu"):
        self.total = torch.zeros(2, device=device)
        self.step = torch.zeros((), dtype=torch.long, device=device)

    def __call__(self, x):
        self.total += x
        self.step += 1
        return self.total * 2, None


def make_graph(obj, *, capture=False, warmup=1):
    return StepGraph(obj, name="counter", capture=capture, warmup=warmup, state=lambda: state_tensors({"obj": obj}, PACKAGES))


def test_static_twin_reuses_the_captured_outputs():
    counter = Counter()
    graph = make_graph(counter, warmup=2)
    x = torch.ones(2)
    outputs = []
    for i in range(6):
        assert graph.next_call_captures == (i == 2)
        out, none = graph(x)
        assert none is None
        outputs.append(out)
        assert torch.equal(out, torch.full((2,), 2.0 * (i + 1)))
    # Warm-up calls return fresh tensors; from the capture call on, always the same buffer.
    assert len({id(o) for o in outputs[2:]}) == 1 and outputs[2] is graph.outputs[0]
    assert graph.replays == 4 and graph.calls == 6
    assert int(counter.step) == 6


def test_rebinding_a_state_tensor_is_caught():
    class Rebinds(Counter):
        def __call__(self, x):
            self.total = self.total + x  # a new tensor: a replay would keep writing the old one
            return self.total

    graph = make_graph(Rebinds())
    graph(torch.ones(2))  # warm-up: not checked
    with pytest.raises(GraphSafetyError, match=r"obj\.total rebound"):
        graph(torch.ones(2))


def test_state_appearing_after_warmup_is_caught():
    class Lazy(Counter):
        def __call__(self, x):
            self.cache = getattr(self, "cache", {})
            self.cache.setdefault("index", torch.arange(2))  # built inside a capture: filled by this graph only
            self.step += 1
            return self.total

    graph = make_graph(Lazy(), warmup=0)
    with pytest.raises(GraphSafetyError, match="appeared"):
        graph(torch.ones(2))


def test_a_new_argument_tensor_is_caught():
    graph = make_graph(Counter())
    x = torch.ones(2)
    graph(x)
    graph(x)
    with pytest.raises(GraphSafetyError, match="not the captured static tensors"):
        graph(torch.ones(2))


class TwoArgs(Counter):
    """A graph-safe step of two arguments, the second optional (the verify step's drafts, draft logits)."""

    def __call__(self, x, y=None):
        self.total += x if y is None else x + y
        return self.total


REBINDS = {
    # the same tensor object, its storage swapped in place: a replay would read the old address
    "storage swapped (set_)": lambda x, y: (x.set_(torch.zeros(2)), y),
    "storage reallocated (resize_ then back)": lambda x, y: (x.resize_(4096).resize_(2), y),
    "shape changed in place (resize_)": lambda x, y: (x.resize_(1), y),
    "dtype changed (.data)": lambda x, y: (setattr(x, "data", torch.zeros(2, dtype=torch.float64)) or x, y),
    "another tensor": lambda x, y: (torch.ones(2), y),
    "a view at the same address, other shape": lambda x, y: (x[:1], y),
    "a tensor where None was captured": lambda x, y: (x, torch.ones(2)),
    "an argument more": lambda x, y: (x, y, torch.ones(2)),
    "None where a tensor was captured": lambda x, y: (x, None),
    "an argument fewer": lambda x, y: (x,),
}
CAPTURED_Y = ("None where a tensor was captured", "an argument fewer")  # these capture (x, a tensor)


@pytest.mark.parametrize("capture", [False, True])
@pytest.mark.parametrize("change", list(REBINDS))
def test_a_rebound_argument_is_caught_at_replay(change, capture, request):
    """The replay check (identity and address of each argument, graphs.StepGraph._again) misses
    nothing the full comparison by name catches: a swapped storage, a new shape or dtype, another
    tensor, another argument structure."""
    if capture:
        request.getfixturevalue("fake_cuda")
    obj = TwoArgs()
    graph = StepGraph(obj, name="verify", capture=capture, warmup=1,
                      state=lambda: state_tensors({"obj": obj}, PACKAGES))
    x = torch.ones(2)
    y = torch.ones(2) if change in CAPTURED_Y else None
    graph(x, y)
    graph(x, y)  # captured
    graph(x, y)  # a replay: the captured objects, unmoved
    args = REBINDS[change](x, y)
    with pytest.raises(GraphSafetyError, match="not the captured static tensors"):
        graph(*args)


def test_another_tensor_object_at_the_captured_address_is_accepted():
    """As before the fast path: what a replay depends on is the address, shape and dtype, so a
    different tensor object viewing the captured memory the same way is a valid argument."""
    obj = TwoArgs()
    graph = make_graph(obj)
    x = torch.ones(2)
    graph(x, None)
    graph(x, None)
    out = graph(x.view(2), None)  # a new object, same address, shape and dtype
    assert out is graph.outputs and torch.equal(out, torch.full((2,), 3.0))


def test_host_reads_are_caught():
    class Syncs(Counter):
        def __call__(self, x):
            self.total += float(x.sum())  # .item(): a sync, illegal in a capture
            return self.total

    graph = make_graph(Syncs())
    graph(torch.ones(2))
    with pytest.raises(GraphSafetyError, match="_local_scalar_dense"):
        graph(torch.ones(2))


# A step whose call 3 passes one op another argument than the capture call (call 2) did: what a
# replay would not repeat. name -> the op of calls 1-2, the op of call 3 (x: the input [4]). The
# first two read a tensor the state walk does not see (held here, as a global would be): only
# its shape or dtype tells the calls apart.
HELD = {"2 floats": torch.ones(2), "3 floats": torch.ones(3), "2 doubles": torch.ones(2, dtype=torch.float64)}
DRIFTS = {
    "a tensor's shape": (lambda x: HELD["2 floats"].sum(), lambda x: HELD["3 floats"].sum()),
    "a tensor's dtype": (lambda x: HELD["2 floats"].sum(dtype=torch.float32),
                         lambda x: HELD["2 doubles"].sum(dtype=torch.float32)),
    "a float scalar": (lambda x: x.mul(2.0).sum(), lambda x: x.mul(3.0).sum()),
    # a Python number that follows the calls: baked into a graph at capture, it changes eagerly
    "a scalar keyword": (lambda x: x.add(x, alpha=2).sum(), lambda x: x.add(x, alpha=3).sum()),
    "a list of ints": (lambda x: x.view([2, 2]).sum(), lambda x: x.view([4, 1]).sum()),
    "a keyword": (lambda x: torch.sum(x, dim=0, keepdim=False), lambda x: torch.sum(x, dim=0, keepdim=True).squeeze()),
    "the op": (lambda x: x.amax(), lambda x: x.amin()),
}


@pytest.mark.parametrize("name", list(DRIFTS))
def test_an_op_argument_that_drifts_is_caught(name):
    """The twin compares each op's described arguments (shapes, dtypes, scalars, containers,
    keywords) with the capture call's: any one drifting is caught, as a replay would not repeat it."""
    before, after = DRIFTS[name]

    class Drifts(Counter):
        calls = 0

        def __call__(self, x):
            Drifts.calls += 1
            self.total += (before if Drifts.calls < 3 else after)(x).to(self.total.dtype)
            return self.total

    graph = make_graph(Drifts())
    x = torch.arange(4.0)
    graph(x)
    graph(x)
    with pytest.raises(GraphSafetyError, match="op sequence differs"):
        graph(x)


def test_output_shape_change_is_caught():
    class Grows(Counter):
        def __call__(self, x):
            self.step += 1
            return torch.zeros(3) if getattr(self, "grown", False) else torch.zeros(2)

    obj = Grows()
    graph = make_graph(obj, warmup=0)
    x = torch.ones(2)
    graph(x)
    obj.grown = True
    with pytest.raises(GraphSafetyError):
        graph(x)


def test_state_tensors_walks_our_objects_only():
    import torch.nn as nn

    counter = Counter()
    counter.pair = (torch.zeros(1), {"a": torch.ones(1)})
    counter.module = nn.Linear(2, 2)  # foreign: not entered
    counter.graph = make_graph(counter)  # graph machinery: not entered
    counter.me = counter  # cycles are fine
    names = set(state_tensors({"c": counter}, PACKAGES))
    assert names == {"c.total", "c.step", "c.pair[0]", "c.pair[1]['a']"}
    before = addresses(state_tensors({"c": counter}, PACKAGES))
    counter.total = torch.zeros(2)
    assert address_changes(before, addresses(state_tensors({"c": counter}, PACKAGES))) == ["c.total rebound"]
    # Roots are always entered; below them only classes of the given packages (default specdec_fast).
    assert set(state_tensors({"h": [counter]})) == set()


def test_bad_warmup():
    with pytest.raises(ValueError, match="warmup"):
        StepGraph(Counter(), name="x", capture=False, state=dict, warmup=-1)


@pytest.mark.gpu
def test_cuda_graph_replays_the_step():
    counter = Counter("cuda")
    graph = make_graph(counter, capture=True, warmup=2)
    x = torch.ones(2, device="cuda")
    for i in range(6):
        out, _ = graph(x)
    torch.cuda.synchronize()
    assert graph.replays == 4 and graph.graph is not None
    assert torch.equal(out.cpu(), torch.full((2,), 12.0)) and int(counter.step) == 6


def test_capture_mode_control_flow(fake_cuda):
    counter = Counter()
    graph = StepGraph(counter, name="counter", capture=True, warmup=1, pool="pool",
                      state=lambda: state_tensors({"obj": counter}, PACKAGES))
    x = torch.ones(2)
    graph(x)  # warm-up: eager, on the side stream, ordered after and before the main stream
    assert fake_cuda.log == [("wait", False, True), ("enter stream", False), ("exit stream",), ("wait", True, False)]
    fake_cuda.log.clear()
    out, _ = graph(x)  # capture (here: the step runs once, eagerly) then one replay
    assert fake_cuda.log == [("capture", "CUDAGraph", "pool", True), ("end capture", True), ("replay",)]
    assert out is graph.outputs[0] and graph.replays == 1
    fake_cuda.log.clear()
    for _ in range(3):
        assert graph(x)[0] is out
    assert fake_cuda.log == [("replay",)] * 3 and graph.replays == 4 and int(counter.step) == 2  # replays run no Python
    with pytest.raises(GraphSafetyError, match="not the captured static tensors"):
        graph(torch.ones(2))


def test_capture_mode_catches_rebinding_during_capture(fake_cuda):
    class Rebinds(Counter):
        def __call__(self, x):
            self.total = self.total + x
            return self.total

    obj = Rebinds()
    graph = StepGraph(obj, name="bad", capture=True, warmup=0, state=lambda: state_tensors({"obj": obj}, PACKAGES))
    with pytest.raises(GraphSafetyError, match=r"obj\.total rebound"):
        graph(torch.ones(2))


def test_a_failed_capture_names_the_step_and_the_way_out(fake_cuda):
    class Syncs(Counter):
        def __call__(self, x):
            raise RuntimeError("operation not permitted when stream is capturing")

    obj = Syncs()
    graph = StepGraph(obj, name="draft", capture=True, warmup=0, state=lambda: state_tensors({"obj": obj}, PACKAGES))
    with pytest.raises(GraphSafetyError, match="capture of the draft step failed .* cuda_graphs=False"):
        graph(torch.ones(2))
