"""recurrent_steps (torch spec, Triton kernel) against a float64 loop, over the four recurrences it serves -- the
Gated DeltaNet (grouped key heads, a decay a head, L2-normed q / k in bf16), KDA (a decay a key channel), Mamba2's
SSD (the [P, N] state layout, groups of B / C, no delta rule), lightning attention (a constant decay, a stride-0
g), a head per channel of [N, 1], and Mamba1's (one head of [C, N] stored [Dv, Dk], decay_rates A times a step a
channel) -- at awkward sizes (Dk / Dv not powers of two, a value side wider than one tile, whole 128 x 128 tiles, one
token), rows starting from the committed state or a snapshot, left-padded rows whose padded columns hold garbage,
the snapshots at their slots and every other slot untouched; bad inputs."""
import pytest
import torch

from specdec_fast.kernels.recurrent import QK_NORM_EPS, recurrent_steps

from .backends import kernel_backends

# (Hk, Hv, Dk, Dv, n, g per key, delta, qk_norm, layout, q/k/v dtype)
CASES = {
    "gated_deltanet_grouped_bf16": (2, 4, 16, 24, 5, False, True, True, "kv", torch.bfloat16),
    "kda_decay_per_key": (3, 3, 20, 20, 4, True, True, True, "kv", torch.float32),
    "mamba2_vk_groups": (2, 4, 8, 12, 5, False, False, False, "vk", torch.float32),
    "lightning_constant_decay": (2, 2, 32, 32, 6, False, False, False, "kv", torch.float32),
    "value_side_over_one_tile": (1, 2, 64, 100, 3, False, True, True, "kv", torch.float32),
    "whole_tiles_128_one_token": (1, 1, 128, 128, 1, False, True, True, "kv", torch.bfloat16),
    # a head per channel of [N, 1] decaying per key row, B and C one key head for all (a form decay_rates serves better)
    "channels_as_heads": (1, 6, 16, 1, 4, True, False, False, "kv", torch.float32),
}
SLOTS = 10  # 9 tentative slots and the spare one
START = [-1, 0, 2]  # row 0 from the committed state, rows 1 / 2 from snapshots 0 / 2
PAD = [2, 0, 1]  # padded (first) columns per row


def _inputs(case, seed, device):
    hk, hv, dk, dv, n, per_key, delta, qk_norm, layout, dtype = case
    gen = torch.Generator().manual_seed(seed)
    batch = len(START)
    real = torch.tensor([[c >= min(p, n - 1) for c in range(n)] for p in PAD])  # every row holds a real token
    q, k = (torch.randn(batch, n, hk, dk, generator=gen).to(dtype) for _ in range(2))
    v = torch.randn(batch, n, hv, dv, generator=gen).to(dtype)
    if per_key:
        g = -torch.rand(batch, n, hv, dk, generator=gen)
    else:
        g = -torch.rand(batch, n, hv, generator=gen)
    beta = torch.rand(batch, n, hv, generator=gen) if delta else None
    state = (dk, dv) if layout == "kv" else (dv, dk)
    committed = torch.randn(batch + 1, hv, *state, generator=gen) * 0.3  # one row more than the call's
    snapshots = torch.randn(batch + 1, SLOTS, hv, *state, generator=gen) * 0.3
    start = torch.tensor(START)
    before = start + 1
    rank = real.long().cumsum(1) - 1
    slot = torch.where(real, before[:, None] + rank, SLOTS - 1)
    to = lambda t: None if t is None else t.to(device)  # noqa: E731
    return tuple(map(to, (q, k, v, g, committed, snapshots, start, slot, real, beta)))


def _oracle(q, k, v, g, committed, snapshots, start, slot, real, beta, qk_norm, scale, layout, parent=None):
    """float64, one token at a time (a tree's token from its parent's state): (o [B, n, Hv, Dv], the snapshots after
    the call)."""
    q, k, v, g, committed, snapshots = (t.double().cpu() for t in (q, k, v, g, committed, snapshots))
    beta = None if beta is None else beta.double().cpu()
    start, slot, real = start.cpu(), slot.cpu(), real.cpu()
    snapshots = snapshots.clone()
    batch, n, hk = q.shape[:3]
    hv = v.shape[2]
    o = torch.zeros(batch, n, hv, v.shape[3], dtype=torch.float64)
    for b in range(batch):
        for h in range(hv):
            s = committed[b, h] if start[b] < 0 else snapshots[b, start[b], h]
            first = s = (s.t() if layout == "vk" else s).clone()
            after = []
            for t in range(n):
                if parent is not None:
                    s = first if parent[b, t] < 0 else after[parent[b, t]]
                qt, kt = q[b, t, h // (hv // hk)], k[b, t, h // (hv // hk)]
                if qk_norm:
                    qt, kt = qt / (qt @ qt + QK_NORM_EPS).sqrt(), kt / (kt @ kt + QK_NORM_EPS).sqrt()
                if real[b, t]:
                    gt = g[b, t, h]
                    s = s * (gt.exp()[:, None] if gt.dim() else gt.exp())
                    if beta is not None:
                        s = s + torch.outer(kt, beta[b, t, h] * (v[b, t, h] - s.t() @ kt))
                    else:
                        s = s + torch.outer(kt, v[b, t, h])
                o[b, t, h] = s.t() @ (qt * scale)
                snapshots[b, slot[b, t], h] = s.t() if layout == "vk" else s
                after.append(s)
    return o, snapshots


@pytest.mark.parametrize("backend", kernel_backends())
@pytest.mark.parametrize("name", list(CASES))
def test_matches_the_float64_loop(name, backend, device):
    if backend == "triton":
        pytest.importorskip("triton")
    if backend == "cpp":
        device = "cpu"
    case = CASES[name]
    hk, hv, dk, dv, n, per_key, delta, qk_norm, layout, dtype = case
    q, k, v, g, committed, snapshots, start, slot, real, beta = _inputs(case, len(name), device)
    if "lightning" in name:  # MiniMax's: one decay a head for every token, an expanded (stride 0) tensor
        g = -torch.rand(hv, generator=torch.Generator().manual_seed(1)).to(device).expand(len(START), n, hv)
    scale = dk ** -0.5 if qk_norm else 1.0
    expected_o, expected_snaps = _oracle(q, k, v, g, committed, snapshots, start, slot, real, beta, qk_norm, scale, layout)
    o = recurrent_steps(q, k, v, g, committed, snapshots, start, slot, real, beta=beta, qk_norm=qk_norm, scale=scale,
                        layout=layout, backend=backend)
    assert o.dtype == torch.float32 and o.shape == (len(START), n, hv, dv)
    on = real.cpu()
    torch.testing.assert_close(o.cpu().double()[on], expected_o[on], atol=2e-5, rtol=2e-5)
    # every snapshot where the oracle's is (the real tokens' slots, the spare slot), every other slot as it was
    torch.testing.assert_close(snapshots.cpu().double(), expected_snaps, atol=2e-5, rtol=2e-5)


# Each row's parents (BFS order: a parent before its children; -1: the row's start): a binary tree, a tree of two roots
# (a draft's re-fed levels: depth-1 nodes continue the committed state), a chain
PARENTS = [[-1, 0, 0, 1, 1, 2], [-1, -1, 0, 1, 2, 2], [-1, 0, 1, 2, 3, 4]]


@pytest.mark.parametrize("backend", kernel_backends())
@pytest.mark.parametrize("name", ["gated_deltanet_grouped_bf16", "kda_decay_per_key", "mamba2_vk_groups",
                                  "channels_as_heads"])
def test_a_token_tree_continues_each_parent(name, backend, device):
    """parent given: each node from its parent's state (the snapshot this call wrote) or the row's start, every node's
    snapshot at its slot; the float64 loop over the same tree."""
    if backend == "triton":
        pytest.importorskip("triton")
    if backend == "cpp":
        device = "cpu"
    hk, hv, dk, dv, _, per_key, delta, qk_norm, layout, dtype = CASES[name]
    case = (hk, hv, dk, dv, 6, per_key, delta, qk_norm, layout, dtype)
    q, k, v, g, committed, snapshots, start, slot, _, beta = _inputs(case, 7, device)
    real = torch.ones(len(START), 6, dtype=torch.bool, device=device)  # a tree has no padding
    slot = (start[:, None] + 1 + torch.arange(6, device=device)).contiguous()
    parent = torch.tensor(PARENTS, device=device)
    expected_o, expected_snaps = _oracle(q, k, v, g, committed, snapshots, start, slot, real, beta, qk_norm, 0.5, layout,
                                         parent.cpu())
    o = recurrent_steps(q, k, v, g, committed, snapshots, start, slot, real, beta=beta, qk_norm=qk_norm, scale=0.5,
                        layout=layout, parent=parent, backend=backend)
    torch.testing.assert_close(o.cpu().double(), expected_o, atol=2e-5, rtol=2e-5)
    torch.testing.assert_close(snapshots.cpu().double(), expected_snaps, atol=2e-5, rtol=2e-5)
    # the control: the same tokens as a chain (parent t - 1) differ where the tree branches
    chain_o, _ = _oracle(q, k, v, g, committed, snapshots, start, slot, real, beta, qk_norm, 0.5, layout)
    assert (chain_o[0, 2] - expected_o[0, 2]).abs().max() > 1e-3


@pytest.mark.parametrize("backend", kernel_backends())
@pytest.mark.parametrize("tree", [False, True])
def test_mamba1_decay_rates(tree, backend, device):
    """decay_rates: one head whose [C = 40, N = 16] state (stored [Dv, Dk]: layout "vk", as Mamba1 keeps it) decays by
    exp(A[c, k] dt_c), against the float64 loop of the same recurrence, as a chain with padding or a tree."""
    if backend == "triton":
        pytest.importorskip("triton")
    if backend == "cpp":
        device = "cpu"
    gen = torch.Generator().manual_seed(11)
    batch, n, channels, state = len(START), 5, 40, 16
    q, k = (torch.randn(batch, n, 1, state, generator=gen) for _ in range(2))
    v = torch.randn(batch, n, 1, channels, generator=gen)
    dt = torch.rand(batch, n, 1, channels, generator=gen)
    rates = -torch.rand(1, state, channels, generator=gen) * 2
    committed = torch.randn(batch + 1, 1, channels, state, generator=gen) * 0.3
    snapshots = torch.randn(batch + 1, SLOTS, 1, channels, state, generator=gen) * 0.3
    start = torch.tensor(START)
    if tree:
        real, parent = torch.ones(batch, n, dtype=torch.bool), torch.tensor([p[:n] for p in PARENTS])
        slot = start[:, None] + 1 + torch.arange(n)
    else:
        real, parent = torch.tensor([[c >= min(p, n - 1) for c in range(n)] for p in PAD]), None
        slot = torch.where(real, start[:, None] + real.long().cumsum(1), SLOTS - 1)
    expected = []
    for b in range(batch):  # the recurrence in float64, per key row and value column
        s = (committed[b, 0] if start[b] < 0 else snapshots[b, start[b], 0]).double().t()  # [N, C]
        after, out = [], []
        for t in range(n):
            if parent is not None:
                s = (committed[b, 0] if start[b] < 0 else snapshots[b, start[b], 0]).double().t() if parent[b, t] < 0 \
                    else after[parent[b, t]]
            if real[b, t]:
                s = s * (rates[0].double() * dt[b, t, 0].double()).exp() + torch.outer(k[b, t, 0], v[b, t, 0]).double()
            after.append(s)
            out.append(s.t() @ q[b, t, 0].double())
        expected.append(torch.stack(out))
    to = lambda *ts: [t.to(device) for t in ts]  # noqa: E731
    args = to(q, k, v, dt, committed, snapshots, start, slot, real)
    o = recurrent_steps(*args, layout="vk", decay_rates=rates.to(device), backend=backend,
                        parent=None if parent is None else parent.to(device))
    on = real
    torch.testing.assert_close(o.cpu().double()[:, :, 0][on], torch.stack(expected)[on], atol=2e-5, rtol=2e-5)


def test_control_a_snapshot_one_token_late_is_caught():
    """The tolerance tells neighbouring states apart: the oracle's snapshot after token t against the one after t + 1
    differs by far more than it (so a kernel that stored the wrong token's state fails the table)."""
    case = CASES["gated_deltanet_grouped_bf16"]
    q, k, v, g, committed, snapshots, start, slot, real, beta = _inputs(case, 3, "cpu")
    _, snaps = _oracle(q, k, v, g, committed, snapshots, start, slot, real, beta, True, 0.25, "kv")
    row = 1  # no padding, from snapshot 0: its tokens' snapshots at slots 1..5
    gaps = [(snaps[row, s + 1] - snaps[row, s]).abs().max().item() for s in range(1, 5)]
    assert min(gaps) > 1e-2, gaps


def test_untouched_rows_and_the_committed_states_stay():
    """Rows past the call's B (the pool's spare capacity) and the committed states are read, never written."""
    case = CASES["kda_decay_per_key"]
    q, k, v, g, committed, snapshots, start, slot, real, beta = _inputs(case, 5, "cpu")
    before_c, before_spare = committed.clone(), snapshots[len(START)].clone()
    recurrent_steps(q, k, v, g, committed, snapshots, start, slot, real, beta=beta, qk_norm=True, backend="torch")
    assert torch.equal(committed, before_c) and torch.equal(snapshots[len(START)], before_spare)


@pytest.mark.parametrize("change, message", [
    (lambda a: a.update(k=a["k"][:, :, :1]), "k must have q's shape"),
    (lambda a: a.update(v=a["v"][:, :, :3]), "Hv a multiple of q's 2 heads"),
    (lambda a: a.update(g=a["g"][..., :1]), "g must be"),
    (lambda a: a.update(beta=a["beta"][:, :1]), "beta must be None or"),
    (lambda a: a.update(committed=a["committed"][:2]), "committed must be"),
    (lambda a: a.update(snapshots=a["snapshots"].double()), "the states are float32"),
    (lambda a: a.update(start=a["start"].int()), "start and slot are int64"),
    (lambda a: a.update(layout="kvv"), "layout must be one of"),
    (lambda a: a.update(decay_rates=torch.zeros(4, 16, 24)), "g must be \\[B, n, Hv, Dv\\]"),
    (lambda a: a.update(decay_rates=torch.zeros(4, 16, 23)), "decay_rates must be None or"),
    (lambda a: a.update(q=a["q"].transpose(2, 3).contiguous().transpose(2, 3)), "unit stride"),
])
def test_bad_inputs_raise(change, message):
    case = CASES["gated_deltanet_grouped_bf16"]
    names = ("q", "k", "v", "g", "committed", "snapshots", "start", "slot", "real", "beta")
    args = dict(zip(names, _inputs(case, 0, "cpu")), layout="kv")
    args["decay_rates"] = None
    change(args)
    with pytest.raises((ValueError, TypeError), match=message):
        recurrent_steps(**{k: args[k] for k in names[:-1]}, beta=args["beta"], layout=args["layout"],
                        decay_rates=args["decay_rates"], backend="torch")


def test_the_triton_call_is_one_launch_and_never_syncs(device):
    """Graph safe and one launch: the Triton backend's package code runs no op that reads the device back, and its only
    torch ops make the output and views (the state gather, masks and repeats are the kernel's)."""
    pytest.importorskip("triton")
    from .test_public_calls_no_sync import PackageOps, SYNC_OPS

    case = CASES["gated_deltanet_grouped_bf16"]
    q, k, v, g, committed, snapshots, start, slot, real, beta = _inputs(case, 0, device)
    recurrent_steps(q, k, v, g, committed, snapshots, start, slot, real, beta=beta, qk_norm=True, backend="triton")
    with PackageOps() as ops:
        recurrent_steps(q, k, v, g, committed, snapshots, start, slot, real, beta=beta, qk_norm=True, backend="triton")
    assert not [op for op in ops.ours if op.startswith(SYNC_OPS)], ops.ours
    # the output's allocation; real read as bytes (a view: view.dtype and its detach)
    assert all(op.startswith(("aten.empty", "aten.view", "aten.detach")) for op in ops.ours), ops.ours


@pytest.mark.parametrize("backend", kernel_backends())
def test_a_slot_of_minus_one_keeps_no_snapshot(backend, device):
    """A prefill's form (runners/mamba1.py on the Triton path): every token's slot -1 but the last's -- the same
    outputs as with every snapshot kept, the last token's snapshot at its slot, every other slot untouched."""
    if backend == "triton":
        pytest.importorskip("triton")
    if backend == "cpp":
        device = "cpu"
    case = CASES["mamba2_vk_groups"]
    q, k, v, g, committed, snapshots, start, slot, real, beta = _inputs(case, 5, device)
    layout = case[8]
    kept_all = snapshots.clone()
    expected = recurrent_steps(q, k, v, g, committed, kept_all, start, slot, real, beta=beta, layout=layout,
                               backend=backend)
    last_only = torch.full_like(slot, -1)
    last_only[:, -1] = slot[:, -1]
    before = snapshots.clone()
    o = recurrent_steps(q, k, v, g, committed, snapshots, start, last_only, real, beta=beta, layout=layout,
                        backend=backend)
    torch.testing.assert_close(o, expected)
    rows = torch.arange(len(START), device=device)
    written = torch.zeros(snapshots.shape[:2], dtype=torch.bool, device=device)
    written[rows, slot[:, -1]] = True
    torch.testing.assert_close(snapshots[written], kept_all[written])
    assert torch.equal(snapshots[~written], before[~written])
