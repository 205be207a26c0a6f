"""EAGLE-3 heads expanding token trees (drafters/eagle3_tree.py): greedy equals target-only greedy
for static and dynamic (EAGLE-2) trees, eager and under the static graph twin; a chain-shaped tree
draws the chain drafter's tokens (same noise positions, same -inf rows over the target's
vocabulary, tree_verify on a chain = chain_verify); sampled trees with the reduced draft
vocabulary follow the target (chi-square: tokens 1-2 jointly and token 3)."""
import pytest
import torch

import specdec_fast
from specdec_fast.drafters.token_tree import TokenTree

from tests.kernels.backends import cpp_tested
from tests.kernels.stats import P_VALUE_THRESHOLD, chi_square_pvalue

from .heads import trained_head
from .models import left_padded_prompts
from .test_eagle3_sampling import PROMPT, SETTINGS, VOCAB, _expected
from .test_eagle3_sampling import pair  # noqa: F401 (fixture)
from .test_paged_runner import VOCAB as TINY_VOCAB
from .test_paged_runner import tiny

TREES = {"static": TokenTree.default(12), "dynamic": TokenTree.dynamic_tree(12, greedy=True),
         "branching_sample": TokenTree.from_branching([3, 2], children="sample"),
         "dynamic_sample": TokenTree((-1, 0, 0, 0, 1, 1, 2, 3), children="sample", dynamic=True)}


@pytest.fixture(scope="module")
def tiny_pair():
    target = tiny("llama", layers=4, seed=2)
    return target, trained_head(target, 40, key="llama4")


@pytest.mark.parametrize("graphs", [False, "static"])
@pytest.mark.parametrize("tree", ["static", "dynamic"])
def test_greedy_tree_decoding_equals_target_greedy(tiny_pair, tree, graphs):
    target, head = tiny_pair
    ids, mask = left_padded_prompts([5, 1, 8], vocab=TINY_VOCAB, seed=2)
    expected = target.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=14, pad_token_id=0)
    out, stats = specdec_fast.generate(target, ids, mask, draft_head=head, tree=TREES[tree], do_sample=False,
                                       max_new_tokens=14, pad_token_id=0, cuda_graphs=graphs, return_stats=True)
    assert torch.equal(out, expected)
    assert stats.mean_accepted_length > 1.0 and stats.k == TREES[tree].depth


@pytest.mark.parametrize("mode", ["greedy", "sampling"])
def test_a_chain_shaped_tree_draws_the_chain_drafters_tokens(tiny_pair, mode):
    target, head = tiny_pair
    ids, mask = left_padded_prompts([5, 2, 7], vocab=TINY_VOCAB, seed=4)
    options = dict(do_sample=False) if mode == "greedy" else dict(do_sample=True, temperature=0.9, top_k=20, seed=7)
    common = dict(draft_head=head, max_new_tokens=16, pad_token_id=0, return_stats=True, **options)
    chain, c_stats = specdec_fast.generate(target, ids, mask, num_assistant_tokens=3, **common)
    tree, t_stats = specdec_fast.generate(target, ids, mask, tree=TokenTree.chain(3, children="sample"), **common)
    assert torch.equal(tree, chain)
    assert t_stats.accepted_hist == c_stats.accepted_hist and sum(c_stats.accepted_hist[1:]) > 0


@pytest.mark.parametrize("tree", ["branching_sample", "dynamic_sample"])
def test_sampled_trees_follow_the_target(pair, tree):  # noqa: F811
    """On the CPU default backend (the tree verify's backends have their own chi-square tests:
    tests/kernels/test_tree_verify_semantics.py; the torch tree verify takes 16 s for these rows)."""
    target, head = pair
    backend = "cpp" if cpp_tested() else "torch"
    out, stats = specdec_fast.generate(target, PROMPT.expand(3000, -1), draft_head=head, tree=TREES[tree], do_sample=True,
                                       max_new_tokens=3, seed=321, backend=backend, return_stats=True,
                                       temperature=SETTINGS["temperature"], top_k=0)
    ranks = stats.extra["tree"]["accepted_rank_by_depth"]
    assert ranks[0][0] < 3000 and sum(ranks[0][1:]) > 0, "the test needs rejections and lower-rank acceptances"
    new = out[:, PROMPT.shape[1]:]
    joint12, p3 = _expected(target)
    assert chi_square_pvalue(new[:, 0] * VOCAB + new[:, 1], joint12) > P_VALUE_THRESHOLD
    assert chi_square_pvalue(new[:, 2], p3) > P_VALUE_THRESHOLD


@pytest.mark.parametrize("drafting", ["chain", "dynamic_sample"])
def test_static_graph_twin_equals_eager_when_sampling(tiny_pair, drafting):
    """The graph code path (every graph-safety check, the ops of every call traced) draws the same
    tokens as eager decoding, with the same acceptance."""
    target, head = tiny_pair
    ids, mask = left_padded_prompts([5, 2, 7], vocab=TINY_VOCAB, seed=6)
    shape = dict(num_assistant_tokens=3) if drafting == "chain" else dict(tree=TREES[drafting])
    runs = [specdec_fast.generate(target, ids, mask, draft_head=head, do_sample=True, temperature=0.9, top_k=20, seed=3,
                                  max_new_tokens=12, pad_token_id=0, cuda_graphs=graphs, return_stats=True, **shape)
            for graphs in (False, "static")]
    (eager, e_stats), (static, s_stats) = runs
    assert torch.equal(static, eager) and e_stats.accepted_hist == s_stats.accepted_hist
    assert s_stats.graph_mode == "static" and s_stats.graph_replays["verify"] == s_stats.iterations - 1


@pytest.mark.parametrize("drafter", ["draft_model", "eagle3_head"])
@pytest.mark.parametrize("tree", ["branching_sample", "dynamic_sample"])
def test_later_calls_on_one_engine_equal_fresh_engines(tiny_pair, drafter, tree):
    """TreeDrafter and Eagle3TreeDrafter keep their buffers per (batch size, modes) and re-fill
    them in place at later calls (TreeDrafter._refill: greedy rows, the levels' sampling
    parameters, a dynamic tree's state): calls alternating sampling and greedy, other prompts,
    sampling values and seeds, on one engine give the tokens of a fresh engine for each."""
    target, head = tiny_pair
    draft = tiny("llama", layers=1, seed=9) if drafter == "draft_model" else None
    source = dict(assistant_model=draft) if draft is not None else dict(draft_head=head)

    def engine():
        return specdec_fast.SpeculativeEngine(target, **source, tree=TREES[tree], max_batch_size=2, max_seq_len=48,
                                              cuda_graphs="static")

    shared = engine()
    # the same modes (top-k) twice with other values: the decoder and its drafter's buffers are reused
    calls = [dict(do_sample=True, temperature=0.9, top_k=20, seed=3), dict(do_sample=False),
             dict(do_sample=True, temperature=3.0, top_k=3, seed=5)]
    for i, options in enumerate(calls):
        ids, mask = left_padded_prompts([4 + i, 2], vocab=TINY_VOCAB, seed=10 + i)
        kw = dict(max_new_tokens=10, pad_token_id=0, **options)
        assert torch.equal(shared.generate(ids, mask, **kw), engine().generate(ids, mask, **kw)), (i, options)

