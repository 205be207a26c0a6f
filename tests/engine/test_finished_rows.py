"""Finished rows cost no attention / KV work while the batch runs (engine.py, batch > 1): both
runners are fed 0 real tokens for them (score's num_valid), commit 0, their KV blocks are never
written again, the kernels get zero query rows for them, and the drafts they hand the verify
kernels are -1. Shapes stay static (the graph code path, "static", runs the same ops every
iteration). Tokens stay exact (greedy = the target's own generate)."""
import pytest
import torch

import specdec_fast.api as api
from specdec_fast.drafters import ModelDrafter
from specdec_fast.engine import SpeculativeDecoder
from specdec_fast.kernels.sampling_params import make_sampling_tensors
from specdec_fast.runners import PagedLlamaRunner

from .models import left_padded_prompts, make_draft
from .test_paged_runner import VOCAB, tiny

K, NEW = 3, 16


def _early_eos(target, ids, mask, new=NEW):
    """An EOS that row 1 emits early (within its first 3 tokens) and the other rows never: row 1
    finishes first."""
    free = target.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=new, pad_token_id=0)
    width = ids.shape[1]
    others = {t for row in range(ids.shape[0]) if row != 1 for t in free[row, width:].tolist()}
    for eos in free[1, width : width + 3].tolist():
        if eos not in others:
            return eos
    pytest.skip("no early token of row 1 is absent from the other rows")


class FeedLog:
    """Wraps a runner's score / commit: what each call fed and kept, beside the rows' live flags."""

    def __init__(self, runner, decoder):
        self.calls, self.commits = [], []
        score, commit = runner.score, runner.commit

        def logged_score(tokens, num_valid=None):
            live = decoder.state.live.clone()
            fed = torch.full_like(live, tokens.shape[1]) if num_valid is None else num_valid.clone()
            self.calls.append((live, fed, tokens.shape[1]))
            return score(tokens, num_valid)

        def logged_commit(keep):
            self.commits.append((decoder.state.live.clone(), keep.clone()))
            return commit(keep)

        runner.score, runner.commit = logged_score, logged_commit


# The torch reference kernels read lengths on the host: not graph safe, so eager only.
@pytest.mark.parametrize("backend, cuda_graphs", [(None, False), (None, "static"), ("torch", False)])
def test_finished_rows_are_fed_nothing(backend, cuda_graphs):
    target = tiny("llama")
    draft = make_draft(target, noise=0.05)
    ids, mask = left_padded_prompts([5, 9, 3], vocab=VOCAB, seed=4)
    eos = _early_eos(target, ids, mask)
    expected = target.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=NEW, pad_token_id=0,
                               eos_token_id=eos)
    runners = [PagedLlamaRunner(model, max_new_tokens=NEW, num_draft_tokens=K, block_size=4, backend=backend)
               for model in (target, draft)]
    decoder = SpeculativeDecoder(runners[0], ModelDrafter(runners[1]), k=K, pad_token_id=0, eos_token_ids=[eos],
                                 params=make_sampling_tensors(3, "cpu", temperature=0.0, seed=0), max_new_tokens=NEW,
                                 backend=backend, cuda_graphs=cuda_graphs)
    logs = [FeedLog(runner, decoder) for runner in runners]
    blocks_written = {}

    def snapshot_row1_blocks():
        return [runner.cache.kv[:, :, runner.cache.blocks_of(1)].clone() for runner in runners]

    step = decoder.step

    def step_and_watch_row1():
        if int(decoder.state.live[1]) == 0 and "at_finish" not in blocks_written:
            blocks_written["at_finish"] = snapshot_row1_blocks()
            blocks_written["seq_lens"] = [int(runner.cache.seq_lens[1]) for runner in runners]
        step()

    decoder.step = step_and_watch_row1
    out = decoder.generate(ids, mask)
    assert torch.equal(out, expected)
    assert "at_finish" in blocks_written, "row 1 must finish while the batch runs"
    # Every score call after the prefill: a live row feeds all its tokens, a finished row none.
    for log in logs:
        for live, fed, width in log.calls:
            assert torch.equal(fed, torch.where(live > 0, fed, 0)) and bool((fed[live > 0] > 0).all())
        assert any(int(live[1]) == 0 for live, _, _ in log.calls), "calls after row 1 finished were logged"
        for live, keep in log.commits:
            assert bool((keep[live == 0] == 0).all())
    # Row 1's KV blocks and committed length did not change after it finished.
    for before, after in zip(blocks_written["at_finish"], snapshot_row1_blocks()):
        # bit for bit: a block's slots past the row's tokens are uninitialised (a NaN equals nothing)
        assert torch.equal(before.view(torch.uint8), after.view(torch.uint8))
    assert blocks_written["seq_lens"] == [int(runner.cache.seq_lens[1]) for runner in runners]


def test_finished_row_drafts_reach_verify_as_minus_one():
    target = tiny("llama")
    draft = make_draft(target, noise=0.05)
    ids, mask = left_padded_prompts([5, 9, 3], vocab=VOCAB, seed=4)
    eos = _early_eos(target, ids, mask)
    runners = [PagedLlamaRunner(model, max_new_tokens=NEW, num_draft_tokens=K) for model in (target, draft)]
    decoder = SpeculativeDecoder(runners[0], ModelDrafter(runners[1]), k=K, pad_token_id=0, eos_token_ids=[eos],
                                 params=make_sampling_tensors(3, "cpu", temperature=0.0, seed=0), max_new_tokens=NEW)
    seen = []
    verify = decoder._verify_impl

    def logged(target_logits, draft_logits, drafts, params):
        seen.append((decoder.state.live.clone(), drafts.clone()))
        return verify(target_logits, draft_logits, drafts, params)

    decoder._verify_impl = logged
    decoder.generate(ids, mask)
    assert any(int(live[1]) == 0 for live, _ in seen)
    for live, drafts in seen[1:]:  # seen[0]: the prefill's first token (no drafts)
        assert bool((drafts[live == 0] == -1).all()) and bool((drafts[live > 0] >= 0).all())


def test_batch_one_keeps_the_identity_packing():
    """At batch 1 a finished row is a finished batch: no num_valid (the packing's ~15 index ops)."""
    target = tiny("llama")
    ids, mask = left_padded_prompts([5], vocab=VOCAB, seed=4)
    runner = PagedLlamaRunner(target, max_new_tokens=8, num_draft_tokens=0)
    decoder = SpeculativeDecoder(runner, None, k=0, params=make_sampling_tensors(1, "cpu", temperature=0.0, seed=0),
                                 max_new_tokens=8)
    log = FeedLog(runner, decoder)
    calls = []
    score = runner.score
    runner.score = lambda tokens, num_valid=None: calls.append(num_valid) or score(tokens, num_valid)
    decoder.generate(ids, mask)
    assert len(log.calls) == 7 and calls == [None] * 7


@pytest.mark.slow  # ~10 s: the Triton kernels through the interpreter
def test_finished_rows_with_triton_kernels(device):
    """backend='triton' (on a GPU, or interpreted on CPU): zero-query rows in append_kv / paged_attention."""
    target = tiny("llama", layers=1)
    draft = make_draft(target, noise=0.05).to(device)
    target = target.to(device)
    ids, mask = (t.to(device) for t in left_padded_prompts([4, 6], vocab=VOCAB, seed=4))
    new = 8
    eos = _early_eos(target, ids, mask, new)
    ours, stats = api.generate(target, ids, mask, assistant_model=draft, num_assistant_tokens=2, max_new_tokens=new,
                               do_sample=False, pad_token_id=0, eos_token_id=eos, backend="triton", runner="paged",
                               return_stats=True)
    expected = target.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=new, pad_token_id=0,
                               eos_token_id=eos)
    assert torch.equal(ours, expected)
    assert stats.tokens_per_row[1] <= 3 and stats.iterations > 2, "row 1 finished while row 0 ran on"


def test_skip_finished_off_gives_the_same_tokens():
    """skip_finished=False (finished rows keep being scored, their tokens discarded): same output."""
    target = tiny("llama")
    draft = make_draft(target, noise=0.05)
    ids, mask = left_padded_prompts([5, 9, 3], vocab=VOCAB, seed=4)
    eos = _early_eos(target, ids, mask)
    outs = []
    for skip in (True, False):
        runners = [PagedLlamaRunner(model, max_new_tokens=NEW, num_draft_tokens=K) for model in (target, draft)]
        decoder = SpeculativeDecoder(runners[0], ModelDrafter(runners[1]), k=K, pad_token_id=0, eos_token_ids=[eos],
                                     params=make_sampling_tensors(3, "cpu", temperature=0.0, seed=0), max_new_tokens=NEW,
                                     skip_finished=skip)
        log = FeedLog(runners[0], decoder)
        outs.append(decoder.generate(ids, mask))
        fed_nothing = any(int(fed.min()) == 0 for _, fed, _ in log.calls)
        assert fed_nothing == skip
    assert torch.equal(outs[0], outs[1])


class LoudPadding:
    """Wraps PagedRunnerBase.score: every padding position's logits (the first N - num_valid[b] of
    row b; unspecified by the runner interface, runners/base.py) become NaN -- garbage made loud.
    Counts the calls that had a padding row."""

    def __init__(self, monkeypatch):
        from specdec_fast.runners.paged_base import PagedRunnerBase

        self.poisoned = 0
        score = PagedRunnerBase.score

        def loud_score(runner, tokens, num_valid=None, *, tree=None):
            logits = score(runner, tokens, num_valid, tree=tree)
            if num_valid is None:
                return logits
            n = tokens.shape[1]
            pad = torch.arange(n, device=logits.device)[None, :] < (n - num_valid)[:, None]
            self.poisoned += int(pad.any())
            return logits.masked_fill(pad[..., None], float("nan"))

        monkeypatch.setattr(PagedRunnerBase, "score", loud_score)


@pytest.mark.slow  # ~15 s: the Triton kernels through the interpreter
@pytest.mark.filterwarnings("ignore:All-NaN slice:RuntimeWarning")  # the interpreter's numpy max over a NaN row
@pytest.mark.parametrize("backend, sampling", [  # greedy on Triton (~9 s interpreted) never handed back the sentinel
    ("triton", dict(do_sample=True, top_k=50)), ("triton", dict(do_sample=True, repetition_penalty=1.2)),
    ("cpp", dict(do_sample=True, top_k=50)), ("cpp", dict(do_sample=False))])
def test_the_logits_of_finished_rows_cannot_reach_the_tokens(monkeypatch, backend, sampling, device):
    """Rows that finished are fed nothing: the verify and the draft sampler run over logits that
    nobody wrote (NaN here). Their tokens are discarded, but the draft's are fed back to the draft
    model's embedding: a Triton search finding no maximum in a NaN row once handed back 2**31 - 1
    ("IndexError: index out of range in self", a flaky failure of the 2-rank Triton test).
    V = 128 (tests/engine/models.py), a whole number of blocks, as that failure's. The tokens equal
    those of the same call with the padding left as it is."""
    from ..conftest import backend_device, on_device
    from ..kernels.backends import cpp_tested
    from .models import make_model

    if backend == "cpp" and not cpp_tested():
        pytest.skip("the C++ kernels are not built here (SPECDEC_FAST_NO_CPP=1)")
    target = make_model("qwen2")
    target.generation_config.eos_token_id = None
    draft = make_draft(target, noise=0.1)
    target, draft, ids, mask = on_device(backend_device(backend, device), target, draft,
                                         *left_padded_prompts([5, 3], seed=1))
    # eager steps: LoudPadding counts its poisoned calls on the host, which a CUDA graph's capture refuses
    kw = dict(assistant_model=draft, max_new_tokens=6, seed=2, backend=backend, pad_token_id=0, cuda_graphs=False,
              **sampling)
    quiet = api.generate(target, ids, mask, **kw)
    loud = LoudPadding(monkeypatch)
    ours = api.generate(target, ids, mask, **kw)
    assert loud.poisoned > 0, "no call had a finished row: the test would not see the garbage"
    assert torch.equal(ours, quiet)
