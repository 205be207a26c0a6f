"""conv_steps (torch spec, Triton kernel) against a float64 loop that walks each token's window: kernels of 2, 3 (LFM2)
and 4 (the Gated DeltaNet's, Mamba's), channels over one program's block (300 > 256) and under it, bf16 and float32,
with and without a bias and silu; chains with left padding (padded columns are no token's source) and token trees
(sources along the ancestors, past the call's roots the starting window), rows from the committed window or a
snapshot; every real token's output and snapshot, every untouched slot as it was; bad inputs."""
import pytest
import torch
import torch.nn.functional as F

from specdec_fast.kernels.causal_conv import conv_steps

from .backends import kernel_backends

# (channels, kernel, dtype, bias, silu)
CASES = {
    "deltanet_k4_bf16_silu": (40, 4, torch.bfloat16, True, True),
    "lfm2_k3_no_activation": (24, 3, torch.float32, True, False),
    "kda_k4_no_bias": (36, 4, torch.float32, False, True),
    "two_programs_k2": (300, 2, torch.float32, True, True),
}
START = [-1, 0, 2]
PAD = [2, 0, 1]
N, SLOTS = 5, 9
TREE = [[-1, 0, 0, 1, 1], [-1, -1, 0, 1, 2], [-1, 0, 1, 2, 3]]  # BFS order; -1: a root of the call


def _inputs(channels, kernel, dtype, bias, seed, device):
    gen = torch.Generator().manual_seed(seed)
    batch = len(START)
    x = torch.randn(batch, N, channels, generator=gen).to(dtype)
    weight = (torch.randn(channels, kernel, generator=gen) * 0.5).to(dtype)
    b = (torch.randn(channels, generator=gen) * 0.3).to(dtype) if bias else None
    committed = torch.randn(batch + 1, channels, kernel - 1, generator=gen).to(dtype)
    snapshots = torch.randn(batch + 1, SLOTS, channels, kernel - 1, generator=gen).to(dtype)
    to = lambda t: None if t is None else t.to(device)  # noqa: E731
    return to(x), to(weight), to(b), to(committed), to(snapshots)


def _oracle(x, weight, bias, committed, snapshots, start, slot, real, parent, silu):
    """float64: each real token's window walked up its row (or its ancestors), past the call the starting window ->
    (y [B, n, C] float64, the snapshots after the call)."""
    x, weight, committed, snapshots = (t.cpu().double() for t in (x, weight, committed, snapshots))
    bias = None if bias is None else bias.cpu().double()
    snapshots = snapshots.clone()
    batch, n, channels = x.shape
    kernel = weight.shape[1]
    y = torch.zeros(batch, n, channels, dtype=torch.float64)
    for b in range(batch):
        first = committed[b] if start[b] < 0 else snapshots[b, start[b]]
        for t in range(n):
            window, node, beyond = [x[b, t]], t, 0
            for _ in range(kernel - 1):
                if parent is not None:
                    up = int(parent[b, node]) if node >= 0 else -1
                else:
                    up = node - 1 if node > 0 and real[b, node - 1] else -1
                if up >= 0:
                    window.insert(0, x[b, up])
                else:
                    beyond += 1
                    window.insert(0, first[:, kernel - 1 - beyond])
                node = up
            win = torch.stack(window, dim=-1)  # [C, K]
            out = (win * weight).sum(-1) + (0 if bias is None else bias)
            y[b, t] = F.silu(out) if silu else out
            snapshots[b, slot[b, t]] = win[:, 1:]
    return y, snapshots


@pytest.mark.parametrize("backend", kernel_backends())
@pytest.mark.parametrize("tree", [False, True])
@pytest.mark.parametrize("name", list(CASES))
def test_matches_the_float64_walk(name, tree, backend, device):
    if backend == "triton":
        pytest.importorskip("triton")
    if backend == "cpp":
        device = "cpu"
    channels, kernel, dtype, bias, silu = CASES[name]
    x, weight, b, committed, snapshots = _inputs(channels, kernel, dtype, bias, len(name), device)
    start = torch.tensor(START)
    if tree:
        real, parent = torch.ones(len(START), N, dtype=torch.bool), torch.tensor(TREE)
        slot = start[:, None] + 1 + torch.arange(N)
    else:
        real = torch.tensor([[c >= min(p, N - 1) for c in range(N)] for p in PAD])
        parent, slot = None, torch.where(real, start[:, None] + real.long().cumsum(1), SLOTS - 1)
    expected_y, expected_snaps = _oracle(x, weight, b, committed, snapshots, start, slot, real, parent, silu)
    dev = lambda t: None if t is None else t.to(device)  # noqa: E731
    y = conv_steps(x, weight, b, committed, snapshots, dev(start), dev(slot), dev(real), parent=dev(parent), silu=silu,
                   backend=backend)
    assert y.dtype == dtype and y.shape == (len(START), N, channels)
    tol = dict(atol=2e-2, rtol=2e-2) if dtype == torch.bfloat16 else dict(atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(y.cpu().double()[real], expected_y[real], **tol)
    written = snapshots.cpu().double()
    if not tree:  # the spare slot holds the padded columns' windows: no token's (compared in trees, which have none)
        written, expected_snaps = written[:, :-1], expected_snaps[:, :-1]
    torch.testing.assert_close(written, expected_snaps, atol=0, rtol=0)  # the inputs themselves: exact


def test_control_the_walk_tells_a_tree_from_a_chain():
    """The same inputs as a chain and as the tree: node 2 (a child of the root beside node 1) gets another window."""
    x, weight, b, committed, snapshots = _inputs(24, 3, torch.float32, True, 1, "cpu")
    start, real = torch.tensor(START), torch.ones(len(START), N, dtype=torch.bool)
    slot = start[:, None] + 1 + torch.arange(N)
    chain, _ = _oracle(x, weight, b, committed, snapshots, start, slot, real, None, False)
    tree, _ = _oracle(x, weight, b, committed, snapshots, start, slot, real, torch.tensor(TREE), False)
    assert (chain[0, 2] - tree[0, 2]).abs().max() > 1e-2


def test_the_triton_call_is_one_launch_and_never_syncs(device):
    pytest.importorskip("triton")
    from .test_public_calls_no_sync import PackageOps, SYNC_OPS

    x, weight, b, committed, snapshots = _inputs(40, 4, torch.float32, True, 0, device)
    start, real = torch.tensor(START, device=device), torch.ones(len(START), N, dtype=torch.bool, device=device)
    slot = start[:, None] + 1 + torch.arange(N, device=device)
    args = (x, weight, b, committed, snapshots, start, slot, real)
    conv_steps(*args, silu=True, backend="triton")
    with PackageOps() as ops:
        conv_steps(*args, silu=True, backend="triton")
    assert not [op for op in ops.ours if op.startswith(SYNC_OPS)], ops.ours
    assert all(op.startswith(("aten.empty", "aten.view", "aten.detach")) for op in ops.ours), ops.ours


@pytest.mark.parametrize("change, message", [
    (lambda a: a.update(weight=a["weight"][:, :1]), "weight must be"),
    (lambda a: a.update(bias=a["bias"][:3]), "bias must be None or"),
    (lambda a: a.update(committed=a["committed"][:, :, :1]), "committed must be"),
    (lambda a: a.update(snapshots=a["snapshots"][:, :, :3]), "snapshots must be"),
    (lambda a: a.update(start=a["start"].int()), "start and slot are int64"),
    (lambda a: a.update(parent=torch.zeros(3, N, dtype=torch.int32)), "parent must be None or"),
    (lambda a: a.update(x=a["x"].transpose(1, 2).contiguous().transpose(1, 2)), "unit stride"),
])
def test_bad_inputs_raise(change, message):
    x, weight, b, committed, snapshots = _inputs(40, 4, torch.float32, True, 0, "cpu")
    start, real = torch.tensor(START), torch.ones(len(START), N, dtype=torch.bool)
    args = dict(x=x, weight=weight, bias=b, committed=committed, snapshots=snapshots, start=start,
                slot=start[:, None] + 1 + torch.arange(N), real=real, parent=None)
    change(args)
    with pytest.raises((ValueError, TypeError), match=message):
        conv_steps(**args, backend="torch")
