"""Sampling with token trees through the engine follows the target's standardised distribution
(chi-square), for top-b and sampled children, static and dynamic shapes: tokens 1-2 jointly and token 3, like
test_sampling_exact.py for chains (one batch of identical prompts, each row its own streams)."""
import pytest
import torch

import specdec_fast.api as api
from specdec_fast.drafters.token_tree import TokenTree

from tests.kernels.stats import P_VALUE_THRESHOLD, chi_square_pvalue

from .test_sampling_exact import PROMPT, ROWS, VOCAB, pair, target_probs  # noqa: F401 (fixture)

# Settings under which this pair's trees accept lower-ranked children too (the depth-1
# distribution is peaked: at T 0.7, or with top-p 0.9, the top-b tree accepts rank 0 only).
SETTINGS = {"plain": dict(temperature=1.0), "top_k": dict(temperature=1.5, top_k=6)}

TREES = {"top": TokenTree.from_branching([3, 2], children="top"), "sample": TokenTree.from_branching([3, 2], children="sample"),
         # dynamic shapes (tree_dynamic.py): 3 nodes at depth 1, 4 at depth 2 hung per row on the best parents
         "dynamic_top": TokenTree((-1, 0, 0, 0, 1, 1, 2, 3), children="top", dynamic=True),
         "dynamic_sample": TokenTree((-1, 0, 0, 0, 1, 1, 2, 3), children="sample", dynamic=True)}


@pytest.mark.parametrize("children", list(TREES))
@pytest.mark.parametrize("name", list(SETTINGS))
def test_tree_tokens_follow_target_distribution(pair, name, children):  # noqa: F811
    target, draft = pair
    settings = SETTINGS[name]
    out, stats = api.generate(target, PROMPT.expand(ROWS, -1), assistant_model=draft, tree=TREES[children],
                              do_sample=True, max_new_tokens=3, seed=321, return_stats=True, **settings)
    new = out[:, PROMPT.shape[1]:]
    ranks = stats.extra["tree"]["accepted_rank_by_depth"]
    assert 0 < ranks[0][1] + ranks[0][2] and ranks[0][0] < ROWS, "the test needs rejections and lower-rank acceptances"
    vocab = torch.arange(VOCAB)
    p1 = target_probs(target, PROMPT, settings)[0]
    p2_given_1 = target_probs(target, torch.cat([PROMPT.expand(VOCAB, -1), vocab[:, None]], 1), settings)
    joint12 = (p1[:, None] * p2_given_1).reshape(-1)
    assert chi_square_pvalue(new[:, 0] * VOCAB + new[:, 1], joint12) > P_VALUE_THRESHOLD
    grid = torch.cartesian_prod(vocab, vocab)
    p3_given_12 = target_probs(target, torch.cat([PROMPT.expand(grid.shape[0], -1), grid], 1), settings)
    assert chi_square_pvalue(new[:, 2], (joint12[:, None] * p3_given_12).sum(0)) > P_VALUE_THRESHOLD
