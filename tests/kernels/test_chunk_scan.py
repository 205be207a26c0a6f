"""chunk_scan (torch spec, Triton kernel) against a float64 chunk loop over the forms it serves -- the delta rule with a
decay a head (Gated DeltaNet) or a key row (KDA), no delta rule over a transposed state view (Mamba2's [P, N] state),
awkward sizes (Dk / Dv not powers of two, a value side wider than one tile, chunks of 3 tokens, whole 128 x 128
tiles, one chunk), bf16 operands; and the prefill forms built on it (runners/chunked_prefill.py) against the
token-by-token recurrence in float64 -- left-padded rows, a last chunk part padding, a start state, the chunks made in
several groups -- with controls (the carry dropped between calls; the delta rule's w ignored) that fail; one launch,
no host sync; bad inputs."""

import pytest
import torch

from specdec_fast.kernels.chunk_scan import chunk_scan
from specdec_fast.runners import chunked_prefill
from specdec_fast.runners.chunked_prefill import row_decay_prefill, scalar_decay_prefill

from .backends import kernel_backends

# (B, H, C, L, Dk, Dv, delta, decay a key row, the state a transposed view, operand dtype)
CASES = {
    "delta_decay_a_head": (2, 3, 3, 16, 20, 24, True, False, False, torch.float32),
    "delta_decay_a_key_row": (2, 2, 2, 8, 12, 10, True, True, False, torch.float32),
    "plain_transposed_state": (2, 2, 3, 32, 16, 40, False, False, True, torch.float32),
    "value_side_over_one_tile_chunks_of_3": (1, 2, 4, 3, 20, 100, True, False, False, torch.float32),
    "whole_128_tiles": (1, 1, 2, 64, 128, 128, True, False, False, torch.float32),
    "one_chunk_bf16": (2, 1, 1, 16, 16, 16, True, False, False, torch.bfloat16),
}


def _operands(case, seed, device):
    batch, heads, chunks, size, dk, dv, delta, rows, transposed, dtype = case
    gen = torch.Generator().manual_seed(seed)
    lower = torch.ones(size, size).tril()
    qd = torch.randn(batch, heads, chunks, size, dk, generator=gen)
    kd = torch.randn(batch, heads, chunks, size, dk, generator=gen) * 0.3
    a = torch.randn(batch, heads, chunks, size, size, generator=gen) * lower * 0.3
    u = torch.randn(batch, heads, chunks, size, dv, generator=gen)
    w = torch.randn(batch, heads, chunks, size, dk, generator=gen) * 0.1 if delta else None
    decay = torch.rand(batch, heads, chunks, *((dk,) if rows else ()), generator=gen)
    state = torch.randn(batch, heads, dk, dv, generator=gen)
    if transposed:  # stored [B, H, Dv, Dk], handed over as its [Dk, Dv] view
        state = state.transpose(-1, -2).contiguous().transpose(-1, -2)
    cast = lambda t: None if t is None else t.to(dtype).to(device)  # noqa: E731
    return tuple(map(cast, (qd, kd, a, u, w, decay))) + (state.to(device),)


def _chunk_oracle(qd, kd, a, u, w, decay, state):
    """float64, one (row, head, chunk) at a time -> (o, the last state)."""
    qd, kd, a, u, decay, s = (t.double().cpu() for t in (qd, kd, a, u, decay, state))
    w = None if w is None else w.double().cpu()
    batch, heads, chunks = qd.shape[:3]
    o = torch.zeros(*u.shape, dtype=torch.float64)
    s = s.clone()
    for b in range(batch):
        for h in range(heads):
            for c in range(chunks):
                fresh = u[b, h, c] - (w[b, h, c] @ s[b, h] if w is not None else 0)
                o[b, h, c] = qd[b, h, c] @ s[b, h] + a[b, h, c] @ fresh
                d = decay[b, h, c]
                s[b, h] = s[b, h] * (d[:, None] if d.dim() else d) + kd[b, h, c].t() @ fresh
    return o, s


# each backend, and the Triton kernel's other precision (the torch form's products are float32's whatever it says)
WAYS = [(backend, "tf32x3") for backend in kernel_backends()] + [("triton", "tf32")]


@pytest.mark.parametrize("backend, precision", WAYS)
@pytest.mark.parametrize("name", list(CASES))
def test_matches_the_float64_chunk_loop(name, backend, precision, device):
    """Every case on every backend; the Triton kernel's two precisions (the interpreter multiplies in float32 either
    way; on a GPU "tf32" rounds its operands to 10-bit mantissas: the tolerance then is tf32's)."""
    if backend == "triton":
        pytest.importorskip("triton")
    if backend == "cpp":
        device = "cpu"
    qd, kd, a, u, w, decay, state = _operands(CASES[name], len(name), device)
    expected_o, expected_state = _chunk_oracle(qd, kd, a, u, w, decay, state)
    o = chunk_scan(qd, kd, a, u, decay, state, w=w, precision=precision, backend=backend)
    assert o.dtype == torch.float32 and o.shape == u.shape
    # float32 against float64 over chunks of up to 64 x 128-wide dots; tf32 on a GPU: 2^-11 an operand, over ~100 terms
    tol = dict(atol=2e-2, rtol=1e-2) if precision == "tf32" and state.is_cuda else dict(atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(o.cpu().double(), expected_o, **tol)
    torch.testing.assert_close(state.cpu().double(), expected_state, **tol)


def _recurrence(q, k, v, g, beta, state):
    """float64, token by token: (o [B, H, n, Dv], the last state). g [B, H, n] or [B, H, n, Dk]."""
    q, k, v, g, s = (t.double() for t in (q, k, v, g, state))
    outs = []
    for t in range(q.shape[2]):
        gt = g[:, :, t]
        s = s * (gt.exp()[..., None] if gt.dim() == 3 else gt.exp()[..., None, None])
        kt = k[:, :, t]
        if beta is None:
            s = s + kt[..., None] * v[:, :, t, None, :]
        else:
            delta = (v[:, :, t] - (s * kt[..., None]).sum(-2)) * beta[:, :, t, None].double()
            s = s + kt[..., None] * delta[..., None, :]
        outs.append((s * q[:, :, t, :, None]).sum(-2))
    return torch.stack(outs, dim=2), s


PAD = [0, 5, 11]  # each row's padded (first) columns: zeros, no decay


def _prefill_inputs(form, n, seed):
    gen = torch.Generator().manual_seed(seed)
    batch, heads, dk, dv = len(PAD), 2, 12, 10
    real = (torch.arange(n)[None, :] >= torch.tensor(PAD)[:, None]).float()[:, None, :]  # [B, 1, n]
    q, k = (torch.nn.functional.normalize(torch.randn(batch, heads, n, dk, generator=gen), dim=-1) * real[..., None]
            for _ in range(2))
    v = torch.randn(batch, heads, n, dv, generator=gen) * real[..., None]
    g = -torch.rand(batch, heads, n, *((dk,) if form == "row" else ()), generator=gen) * 0.3
    g = g * (real[..., None] if form == "row" else real)
    beta = torch.rand(batch, heads, n, generator=gen) * real if form != "plain" else None
    state = torch.randn(batch, heads, dk, dv, generator=gen) * 0.3
    return q, k, v, g, beta, state


def _prefill(form, scan, q, k, v, g, beta, state, size):
    if form == "row":
        return row_decay_prefill(scan, q, k, v, g, beta, state, size)
    return scalar_decay_prefill(scan, q, k, v, g, state, size, beta=beta)


@pytest.mark.parametrize("backend", kernel_backends())
@pytest.mark.parametrize("form", ["delta", "row", "plain"])
def test_the_prefill_forms_are_the_recurrence(form, backend, device, monkeypatch):
    """scalar_decay_prefill with and without the delta rule (Gated DeltaNet; Mamba2 / lightning) and row_decay_prefill
    (KDA) through chunk_scan: 37 tokens in chunks of 16 (the last part padding), rows with 0 / 5 / 11 padded columns,
    from a start state, the chunks made two at a time (PREFILL_BYTES cut): every real output and the last state equal
    the float64 recurrence; a scan that drops its start (each group from zero) fails."""
    if backend == "triton":
        pytest.importorskip("triton")
    if backend == "cpp":
        device = "cpu"
    q, k, v, g, beta, state = _prefill_inputs(form, 37, seed=len(form))
    expected_o, expected_state = _recurrence(q, k, v, g, beta, state)
    heads, dk = q.shape[1], q.shape[-1]
    per_chunk = len(PAD) * heads * 16 * (16 * dk * 3 if form == "row" else 3 * 16 + 4 * dk + 2 * 10) * 4  # the module's
    monkeypatch.setattr(chunked_prefill, "PREFILL_BYTES", 2 * per_chunk)  # two chunks a group: three groups
    calls = []

    def scan(*args, **kwargs):
        calls.append(args[0].shape[2])
        return chunk_scan(*args, **kwargs, backend=backend)

    moved = [None if t is None else t.to(device) for t in (q, k, v, g, beta)]
    carried = state.clone().to(device)
    o = _prefill(form, scan, *moved, carried, 16)
    assert calls == [2, 1]  # 3 chunks: a group of two, then one
    real = (torch.arange(37)[None, :] >= torch.tensor(PAD)[:, None])[:, None, :, None]
    tol = dict(atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(o.cpu().double() * real, expected_o * real, **tol)
    torch.testing.assert_close(carried.cpu().double(), expected_state, **tol)

    def forgetful(qd, kd, a, u, decay, st, w=None):  # the control: every group from a zero state
        st.zero_()
        return chunk_scan(qd, kd, a, u, decay, st, w=w, backend=backend)

    carried = state.clone().to(device)
    o = _prefill(form, forgetful, *moved, carried, 16)
    assert not torch.allclose(o.cpu().double() * real, expected_o * real, **tol)


def test_a_delta_rule_needs_its_w(device):
    """The control for the kernel's delta term: the same operands without w give other outputs and state."""
    qd, kd, a, u, w, decay, state = _operands(CASES["delta_decay_a_head"], 3, device)
    expected_o, expected_state = _chunk_oracle(qd, kd, a, u, w, decay, state)
    o = chunk_scan(qd, kd, a, u, decay, state, backend="torch")
    assert not torch.allclose(o.double().cpu(), expected_o, atol=1e-3)
    assert not torch.allclose(state.double().cpu(), expected_state, atol=1e-3)


@pytest.mark.parametrize("change, message", [
    (lambda x: x.update(kd=x["kd"][..., :-1]), "kd"),
    (lambda x: x.update(a=x["a"][..., :-1]), "a must be"),
    (lambda x: x.update(u=x["u"][:, :1]), "u must be"),
    (lambda x: x.update(decay=x["decay"][..., None]), "decay must be"),
    (lambda x: x.update(state=x["state"][..., :-1]), "state must be"),
    (lambda x: x.update(state=x["state"].double()), "float32"),
    (lambda x: x.update(w=x["w"][:, :, :1]), "w must have"),
    (lambda x: x.update(qd=x["qd"].long()), "float tensor"),
    (lambda x: x.update(qd=x["qd"][0]), "5-d"),
    (lambda x: x.update(precision="ieee"), "precision must be"),
])
def test_bad_inputs_are_refused(change, message):
    names = ("qd", "kd", "a", "u", "w", "decay", "state")
    args = dict(zip(names, _operands(CASES["delta_decay_a_head"], 0, "cpu")), precision="tf32x3")
    change(args)
    with pytest.raises((ValueError, TypeError), match=message):
        chunk_scan(args["qd"], args["kd"], args["a"], args["u"], args["decay"], args["state"], w=args["w"],
                   precision=args["precision"], backend="torch")


def test_the_triton_call_is_one_launch_and_never_syncs(device):
    """Graph safe and one launch: the Triton backend's package code runs no op that reads the device back; its only
    torch op makes the output (the operands are contiguous already)."""
    pytest.importorskip("triton")
    from .test_public_calls_no_sync import PackageOps, SYNC_OPS

    qd, kd, a, u, w, decay, state = _operands(CASES["delta_decay_a_head"], 0, device)
    chunk_scan(qd, kd, a, u, decay, state, w=w, backend="triton")
    with PackageOps() as ops:
        chunk_scan(qd, kd, a, u, decay, state, w=w, backend="triton")
    assert not [op for op in ops.ours if op.startswith(SYNC_OPS)], ops.ours
    assert all(op.startswith("aten.empty") for op in ops.ours), ops.ours
