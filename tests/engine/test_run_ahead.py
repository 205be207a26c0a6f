"""The loop's run-ahead bound (specdec_fast/engine/run_ahead.py) proven on CPU against a fake device whose
work completes late (tests/fake_cuda.LateDevice: events complete ``lag`` host iterations after they
were recorded, synchronize() completes them at once and is logged):
  - iterations run vs needed: at most R - 1 beyond the iteration after which every row finished,
    exactly that many when the device lags by R or more, none when it keeps up;
  - no poll dropped: polls are read in order, each one, up to the one that saw the batch finished;
  - the blocking rule: the host blocks (synchronize) only on the oldest unread poll, and only when
    it is R iterations old; it is never more than R iterations ahead of the newest read poll;
  - the tokens do not depend on R or on the lag; streaming still works.
The H100 failure this guards against (bench/results/h100_3dca4fa/README.md): a poller that kept only the newest
poll never read one under CUDA graphs and ran max_new_tokens - 1 iterations (127 where 42 sufficed)."""
import pytest
import torch

import specdec_fast.engine.loop as engine
from specdec_fast.drafters import ModelDrafter
from specdec_fast.engine import SpeculativeDecoder
from specdec_fast.kernels.sampling_params import make_sampling_tensors
from specdec_fast.engine.run_ahead import RunAheadPoller
from specdec_fast.runners import PagedLlamaRunner

from ..fake_cuda import LateDevice
from .conftest import model_pair
from .models import left_padded_prompts


class RecordingPoller(RunAheadPoller):
    """RunAheadPoller that logs what the protocol did: polls read, each wait, the lead at each issue."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.reads, self.waits_log, self.lead_at_issue = [], [], []
        RecordingPoller.last = self

    def _read_next(self):
        snapshot = super()._read_next()
        self.reads.append(snapshot.iteration)
        return snapshot

    def wait(self, issued):
        read_before, waits_before = self.read, self.waits
        snapshot = super().wait(issued)
        self.waits_log.append((issued, read_before, self.read, self.waits > waits_before))
        return snapshot

    def issue(self, iteration):
        self.lead_at_issue.append(iteration - self.read)  # iterations issued beyond the newest read poll
        super().issue(iteration)


def decode(monkeypatch, *, lag, run_ahead, lengths=(5,), new=24, k=3, eos=None, streamer=None):
    """Greedy decoding of the llama test pair through the fake late device -> (tokens, stats, poller, device)."""
    monkeypatch.setattr(engine, "RunAheadPoller", RecordingPoller)
    target, draft = model_pair("llama")
    ids, mask = left_padded_prompts(list(lengths), seed=2)
    batch = len(lengths)
    decoder = SpeculativeDecoder(
        PagedLlamaRunner(target, max_new_tokens=new, num_draft_tokens=k),
        ModelDrafter(PagedLlamaRunner(draft, max_new_tokens=new, num_draft_tokens=k)), k=k,
        params=make_sampling_tensors(batch, "cpu", temperature=0.0, seed=0), max_new_tokens=new, pad_token_id=0,
        eos_token_ids=eos, run_ahead=run_ahead, streamer=streamer)
    device = LateDevice(lag)
    decoder.use_events(device.Event)
    step = decoder.step

    def step_on_the_late_device():
        device.tick()
        step()

    decoder.step = step_on_the_late_device
    out = decoder.generate(ids, mask)
    return out, decoder.stats.result, RecordingPoller.last, device


LAGS = [0, 1, 2, 3, 1000]


@pytest.mark.parametrize("run_ahead", [1, 2])
@pytest.mark.parametrize("lag", LAGS)
def test_iterations_run_vs_needed(monkeypatch, lag, run_ahead):
    reference, ref_stats, _, _ = decode(monkeypatch, lag=0, run_ahead=1)
    needed = ref_stats.loop["iterations_needed"]
    assert ref_stats.iterations == needed < 24 - 1, "the draft pair must finish the batch early for this test to bite"
    out, stats, poller, device = decode(monkeypatch, lag=lag, run_ahead=run_ahead)
    assert torch.equal(out, reference) and stats.accepted_hist == ref_stats.accepted_hist
    assert stats.loop["iterations_needed"] == needed
    # The host may run at most R - 1 iterations past the one that finished the batch ...
    extra = stats.iterations - needed
    assert 0 <= extra <= run_ahead - 1
    # ... exactly that many when the device is R or more iterations late (it must block on polls
    # it cannot see yet), and none when the device keeps up (every poll complete at the next look).
    if lag == 0:
        assert extra == 0 and device.poll_syncs() == []
    if lag >= run_ahead:
        assert extra == run_ahead - 1
    assert stats.loop["waits"] == len(device.poll_syncs())


@pytest.mark.parametrize("run_ahead", [1, 2])
@pytest.mark.parametrize("lag", LAGS)
def test_no_poll_dropped_and_the_blocking_rule(monkeypatch, lag, run_ahead):
    _, stats, poller, device = decode(monkeypatch, lag=lag, run_ahead=run_ahead)
    needed = stats.loop["iterations_needed"]
    # Every poll up to the one that saw the batch finished was read, once, in order.
    assert poller.reads == list(range(needed + 1))
    assert poller.first_done == needed
    # Never more than R iterations ahead of the newest read poll.
    assert max(poller.lead_at_issue) <= run_ahead == stats.loop["run_ahead"]
    syncs = iter(device.poll_syncs())
    for issued, read_before, read_after, blocked in poller.waits_log:
        must_read = issued + 1 - run_ahead  # the poll that iteration issued + 1 needs to have been read
        if blocked:
            # Only when required, and on the oldest unread poll, which is then R iterations old.
            assert read_before < must_read == read_before + 1 and next(syncs) == must_read
        if read_after < must_read:
            assert stats.iterations == issued, "only a finished batch leaves the bound unmet: the loop stopped"
    assert next(syncs, None) is None
    if lag >= run_ahead:  # a device this late forces a wait before every iteration after the first R - 1
        assert stats.loop["waits"] >= stats.iterations - run_ahead


def test_rows_finishing_apart_under_lag(monkeypatch):
    """Batch 3 with EOS: rows finish at different iterations (finished rows are fed nothing); the
    batch still stops within R - 1 iterations of the last row finishing."""
    free, free_stats, _, _ = decode(monkeypatch, lag=0, run_ahead=1, lengths=(5, 9, 3), new=20)
    width = 9
    eos = int(free[1, width + 4])  # row 1's 5th token
    reference, ref_stats, _, _ = decode(monkeypatch, lag=0, run_ahead=1, lengths=(5, 9, 3), new=20, eos=[eos])
    out, stats, _, _ = decode(monkeypatch, lag=1000, run_ahead=2, lengths=(5, 9, 3), new=20, eos=[eos])
    assert torch.equal(out, reference)
    assert stats.iterations - stats.loop["iterations_needed"] <= 1
    assert stats.loop["iterations_needed"] == ref_stats.loop["iterations_needed"]
    assert ref_stats.tokens_per_row[1] <= 5 < max(ref_stats.tokens_per_row), "row 1 finished before the others"


class Recorder:
    def __init__(self):
        self.calls = []

    def put(self, value):
        self.calls.append(("put", value.clone()))

    def end(self):
        self.calls.append(("end", None))


@pytest.mark.parametrize("lag", [0, 3])
def test_streaming_under_lag(monkeypatch, lag):
    """The streamer gets row 0's tokens from the polls' host copies (no device read in the loop),
    in order, progressively, and all of them by the end."""
    rec = Recorder()
    out, stats, _, _ = decode(monkeypatch, lag=lag, run_ahead=2, streamer=rec)
    assert rec.calls[0][0] == "put" and rec.calls[-1] == ("end", None)
    streamed = torch.cat([value.reshape(-1) for kind, value in rec.calls[1:-1]])
    assert torch.equal(streamed, out[0, 5:])
    assert len(rec.calls) - 2 >= stats.iterations - 2, "tokens arrive while decoding, not all at the end"


def test_poller_protocol_without_a_model():
    """RunAheadPoller alone: a status buffer changed by hand, a device 5 iterations late."""
    status = torch.tensor([[1, 1], [1, 1]])  # gen_len, live
    device = LateDevice(5)
    poller = RunAheadPoller(status, 2, events=device.Event)
    poller.issue(0)
    assert poller.wait(0) is None and poller.read == -1  # R = 2: iteration 1 may run before poll 0 is read
    for n in range(1, 5):  # iteration n, then its poll, then the wait before iteration n + 1
        device.tick()
        if n <= 3:
            status[0] += 1
        if n == 3:
            status[1] = 0  # both rows finished in iteration 3
        poller.issue(n)
        snapshot = poller.wait(n)
        assert poller.read == n - 1 and snapshot.iteration == n - 1 and list(snapshot.gen_len) == [n, n]
        assert snapshot.done == (n == 4)
    assert device.poll_syncs() == [0, 1, 2, 3] and poller.first_done == 3 and poller.waits == 4
    # A loop bug that issues polls without reading them is refused, not silently lost.
    other = RunAheadPoller(status, 2, events=LateDevice(5).Event)
    other.issue(0)
    other.issue(1)
    with pytest.raises(RuntimeError, match="would overwrite unread poll 0"):
        other.issue(2)
    with pytest.raises(ValueError, match="run_ahead must be an int >= 1"):
        RunAheadPoller(status, 0)


@pytest.mark.gpu
@pytest.mark.parametrize("drafter", ["model", "plain"])
def test_run_ahead_on_cuda_with_graphs(drafter):
    """On a GPU, under CUDA graphs: the whole loop (wait -> step -> poll) runs with
    torch.cuda.set_sync_debug_mode("error") (the polls' pinned copies and events do not sync;
    event.synchronize is the one wait and is not an op); a full run stops within R - 1 iterations
    of the one that finished the batch, and reports the host time per iteration."""
    from .test_paged_runner import tiny
    from .models import make_draft

    target = tiny("llama").cuda()
    draft = make_draft(tiny("llama"), noise=0.1).cuda() if drafter == "model" else None
    ids, mask = (t.cuda() for t in left_padded_prompts([5, 9, 3], vocab=96, seed=3))
    k, new = (4 if draft is not None else 0), 40

    def make():
        return SpeculativeDecoder(
            PagedLlamaRunner(target, max_new_tokens=new, num_draft_tokens=k, backend="triton"),
            ModelDrafter(PagedLlamaRunner(draft, max_new_tokens=new, num_draft_tokens=k, backend="triton")) if k else None,
            k=k, params=make_sampling_tensors(3, "cuda", temperature=0.0, seed=0), max_new_tokens=new,
            backend="triton", cuda_graphs=True)

    decoder = make()
    decoder._prefill(ids, mask)
    poller = decoder._start_polls(ids)
    for n in range(2):  # warm-up + capture, with the loop's reads (every poll is read in order)
        snapshot = poller.wait(n)
        if snapshot is not None:
            decoder._take_snapshot(snapshot, n)
        decoder.step()
        poller.issue(n + 1)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for n in range(2, 8):
            snapshot = poller.wait(n)
            if snapshot is not None:
                decoder._take_snapshot(snapshot, n)
            decoder.step()
            poller.issue(n + 1)
    finally:
        torch.cuda.set_sync_debug_mode(0)
    torch.cuda.synchronize()
    assert poller.read >= 8 + 1 - decoder.run_ahead - 1

    decoder = make()
    decoder.generate(ids, mask)
    stats = decoder.stats.result
    assert stats.graph_mode == "cuda_graphs"
    assert 0 <= stats.iterations - stats.loop["iterations_needed"] <= decoder.run_ahead - 1
    print(f"host ms per iteration (wall - prefill - capture - phases): {stats.host_ms_per_iter:.3f}; "
          f"{stats.loop}")
