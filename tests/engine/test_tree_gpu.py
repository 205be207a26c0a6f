"""Token trees on a GPU (skipped without CUDA): the captured draft and verify steps give the
eager path's tokens with the Triton kernels, greedy equals generate, and the steady-state tree
iteration never syncs (torch.cuda.set_sync_debug_mode("error"))."""
import pytest
import torch

import specdec_fast.api as api
from specdec_fast.kernels.sampling_params import make_sampling_tensors
from specdec_fast.runners import PagedLlamaRunner
from specdec_fast.drafters.token_tree import TokenTree
from specdec_fast.engine.tree_loop import TreeDecoder
from specdec_fast.drafters.tree import TreeDrafter

from .models import left_padded_prompts, make_draft
from .runner_checks import steps_without_sync
from .test_paged_runner import VOCAB, tiny

pytestmark = pytest.mark.gpu

MODES = {"greedy": dict(do_sample=False), "sampling": dict(do_sample=True, temperature=0.9, top_k=20, seed=7)}
TREES = {"top": TokenTree.default(16), "sample": TokenTree.from_branching([3, 2, 1], children="sample"),
         "dynamic_top": TokenTree.dynamic_tree(16, greedy=True, children="top"),
         "dynamic_sample": TokenTree.from_branching([3, 2, 1], children="sample").as_dynamic()}


def _pair():
    target = tiny("llama").cuda()  # head_dim 16: the Triton attention kernel's shapes
    target.generation_config.eos_token_id = None
    return target, make_draft(tiny("llama"), noise=0.1).cuda()


@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("tree", list(TREES))
def test_tree_graphs_equal_eager_on_cuda(mode, tree):
    target, draft = _pair()
    ids, mask = left_padded_prompts([5, 9, 3], vocab=VOCAB, seed=3)
    ids, mask = ids.cuda(), mask.cuda()
    runs = {flag: api.generate(target, ids, mask, assistant_model=draft, tree=TREES[tree], max_new_tokens=24,
                               pad_token_id=0, return_stats=True, backend="triton", cuda_graphs=flag, **MODES[mode])
            for flag in (False, True)}
    (eager, _), (graphed, g_stats) = runs[False], runs[True]
    assert torch.equal(graphed, eager)
    assert g_stats.graph_mode == "cuda_graphs"
    assert g_stats.graph_replays == {"draft": g_stats.iterations - 1, "verify": g_stats.iterations - 1}
    if mode == "greedy":
        expected = target.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=24, pad_token_id=0)
        assert torch.equal(eager, expected)


@pytest.mark.parametrize("children", ["top", "sample"])
@pytest.mark.parametrize("dynamic", [False, True])
def test_steady_state_tree_iteration_has_no_host_sync(children, dynamic):
    target, draft = _pair()
    ids, mask = left_padded_prompts([5, 9, 3], vocab=VOCAB, seed=3)
    ids, mask = ids.cuda(), mask.cuda()
    tree = TokenTree.default(16, children=children)
    tree = tree.as_dynamic() if dynamic else tree
    runner = lambda m: PagedLlamaRunner(m, max_new_tokens=64, num_draft_tokens=tree.size - 1, backend="triton")  # noqa: E731
    params = make_sampling_tensors(3, "cuda", temperature=0.8, top_k=20, seed=0)
    decoder = TreeDecoder(runner(target), TreeDrafter(runner(draft), tree), params=params, max_new_tokens=64,
                          backend="triton", cuda_graphs=False)
    decoder._prefill(ids, mask)
    for _ in range(2):  # warm-up (allocator, Triton compiles, lazy inits)
        decoder.step()
    steps_without_sync(decoder, 5)


@pytest.mark.parametrize("tree", ["top", "dynamic_sample"])
def test_trees_with_processors_capture_and_equal_generate_on_cuda(tree):
    """A checkpoint's repetition_penalty with the n-gram ban and min_new_tokens on a tree
    (tests/engine/test_tree_processors.py on the CPU): the per-node processing is captured in
    both graphs and gives the eager path's tokens, and greedy equals model.generate. Four rows, a
    full bucket: eager runs the call's rows, the graphs the bucket's, and on the CPU's static twin
    three rows against a bucket of four moved the draft's logits by up to 2e-6, which flipped a
    dynamic sampled tree's near-tied allocation (1 ulp) at seed 7 (both runs exact samples)."""
    target, draft = _pair()
    ids, mask = left_padded_prompts([5, 9, 3, 7], vocab=VOCAB, seed=3)
    ids, mask = ids.cuda(), mask.cuda()
    options = dict(repetition_penalty=1.3, no_repeat_ngram_size=3, min_new_tokens=6, eos_token_id=5)
    for mode in MODES:
        runs = {flag: api.generate(target, ids, mask, assistant_model=draft, tree=TREES[tree], max_new_tokens=24,
                                   pad_token_id=0, return_stats=True, backend="triton", cuda_graphs=flag,
                                   **MODES[mode], **options)
                for flag in (False, True)}
        (eager, _), (graphed, g_stats) = runs[False], runs[True]
        assert torch.equal(graphed, eager) and g_stats.graph_mode == "cuda_graphs", mode
        if mode == "greedy":
            expected = target.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=24, pad_token_id=0,
                                       **options)
            assert torch.equal(eager, expected)
