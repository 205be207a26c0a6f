"""CUDA graphs on a GPU (skipped without CUDA): the captured draft and verify steps give the eager
path's tokens, token for token, with the Triton kernels; the replayed loop never syncs; every
iteration after the warm-up is served by the graphs."""
import pytest
import torch

import specdec_fast.api as api
from specdec_fast.drafters import ModelDrafter, PromptLookupDrafter
from specdec_fast.engine import SpeculativeDecoder
from specdec_fast.engine.graph_policy import GRAPHS_BY_DEFAULT
from specdec_fast.kernels.sampling_params import make_sampling_tensors
from specdec_fast.runners import PagedLlamaRunner

from .runner_checks import steps_without_sync
from .models import left_padded_prompts, make_draft
from .test_paged_runner import VOCAB, tiny

pytestmark = pytest.mark.gpu

MODES = {"greedy": dict(do_sample=False), "sampling": dict(do_sample=True, temperature=0.9, top_k=20, seed=7)}


def _pair():
    target = tiny("llama").cuda()  # head_dim 16: the Triton attention kernel's shapes
    draft = make_draft(tiny("llama"), noise=0.1).cuda()
    return target, draft


@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("drafter", ["model", "lookup", "plain"])
def test_graphs_equal_eager_on_cuda(drafter, mode):
    target, draft = _pair()
    ids, mask = left_padded_prompts([5, 9, 3], vocab=VOCAB, seed=3)
    ids, mask = ids.cuda(), mask.cuda()
    extra = {"model": dict(assistant_model=draft, num_assistant_tokens=4), "lookup": dict(prompt_lookup_num_tokens=3),
             "plain": {}}[drafter]
    runs = {flag: api.generate(target, ids, mask, max_new_tokens=24, pad_token_id=0, return_stats=True, backend="triton",
                               runner="paged", cuda_graphs=flag, **extra, **MODES[mode]) for flag in (False, True, None)}
    (eager, e_stats), (graphed, g_stats), (default, d_stats) = runs[False], runs[True], runs[None]
    assert torch.equal(graphed, eager) and torch.equal(default, eager)
    default_mode = "cuda_graphs" if GRAPHS_BY_DEFAULT else "eager"
    assert e_stats.graph_mode == "eager" and g_stats.graph_mode == "cuda_graphs" and d_stats.graph_mode == default_mode
    steps = ("draft", "verify") if drafter != "plain" else ("verify",)
    assert g_stats.graph_replays == {name: g_stats.iterations - 1 for name in steps}
    assert g_stats.accepted_hist == e_stats.accepted_hist
    if drafter != "plain":
        assert g_stats.draft_s > 0 and g_stats.target_s > 0 and g_stats.capture_s > 0


@pytest.mark.parametrize("drafter", ["model", "lookup", "plain"])
def test_replayed_loop_has_no_host_sync(drafter):
    target, draft = _pair()
    ids, mask = left_padded_prompts([5, 9, 3], vocab=VOCAB, seed=4)
    k = 0 if drafter == "plain" else 4
    new = 48
    runner = PagedLlamaRunner(target, max_new_tokens=new, num_draft_tokens=k, backend="triton")
    chosen = {"model": lambda: ModelDrafter(PagedLlamaRunner(draft, max_new_tokens=new, num_draft_tokens=k, backend="triton")),
              "lookup": lambda: PromptLookupDrafter(2), "plain": lambda: None}[drafter]()
    params = make_sampling_tensors(3, "cuda", temperature=0.8, top_k=20, seed=0)
    decoder = SpeculativeDecoder(runner, chosen, k=k, params=params, max_new_tokens=new, backend="triton", cuda_graphs=True)
    decoder._prefill(ids.cuda(), mask.cuda())
    decoder.step()  # warm-up (eager, side stream)
    decoder.step()  # capture + first replay (synchronises)
    steps_without_sync(decoder, 5)
    assert decoder.steps.verify.replays == 6 and decoder.steps.verify.graph is not None
    if k:
        assert decoder.steps.draft.replays == 6
    assert int(decoder.state.gen_len.min()) >= 8  # the replays really decoded (1 + >= 1 per iteration)
