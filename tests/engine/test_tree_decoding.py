"""Token-tree decoding end to end (tree_decoder.py, tree_drafter.py): greedy equals target-only
greedy token for token (Llama, Qwen2, GPT-2 paged runners; batch 1 and 3; several tree shapes
and both ways of choosing children; static and dynamic trees), the graph code path's static twin
equals eager (no host sync: the twin traces every op), EOS inside an accepted path, the tree
stats, and bad arguments."""
import pytest
import torch

import specdec_fast.api as api
from specdec_fast.drafters.token_tree import TokenTree
from specdec_fast.runners.hf import UnsupportedModelError

from .conftest import model_pair
from .models import eos_inside_a_block, left_padded_prompts, make_draft
from .test_greedy_exact import MAX_NEW, reference
from .test_paged_runner import VOCAB, tiny

TREES = {
    "default16": TokenTree.default(16),
    "branching": TokenTree.from_branching([3, 2, 1]),
    "star": TokenTree.from_branching([4]),
    "chain": TokenTree.chain(3),
    "sampled": TokenTree.default(12, children="sample"),
    "dynamic16": TokenTree.dynamic_tree(16, greedy=True),
    "dynamic_top": TokenTree.from_branching([3, 2, 1], children="top").as_dynamic(),
}


@pytest.mark.parametrize("kind", ["llama", "qwen2", "gpt2"])
@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize("tree", list(TREES))
def test_greedy_tree_decoding_equals_generate(kind, batch, tree):
    target, draft = model_pair(kind)
    ids, mask, expected = reference(kind, batch)
    out, stats = api.generate(target, ids, mask, assistant_model=draft, tree=TREES[tree], do_sample=False,
                              max_new_tokens=MAX_NEW, pad_token_id=0, return_stats=True)
    assert torch.equal(out, expected)
    assert stats.mean_accepted_length > 1.5, "the aligned draft should be accepted often (else the test proves little)"
    assert stats.k == TREES[tree].depth and len(stats.accepted_hist) == TREES[tree].depth + 1


@pytest.mark.parametrize("backend", ["torch", pytest.param("triton", marks=pytest.mark.slow)])
def test_tree_decoding_on_the_other_backends(backend, device):
    """Every kernel through the torch reference, or through Triton (on a GPU, or the interpreter:
    a short run; head_dim 16 for the Triton attention kernel): greedy equals generate, and sampling
    gives the automatic backend's tokens (same counter-based randomness; on CPU the C++ backend)."""
    target, draft = tiny("llama").to(device), make_draft(tiny("llama"), noise=0.1).to(device)
    target.generation_config.eos_token_id = None
    ids, mask = (t.to(device) for t in left_padded_prompts([5, 11, 2], vocab=VOCAB, seed=3))
    new = 4 if backend == "triton" and device == "cpu" else MAX_NEW  # the interpreter: ~15 s
    expected = target.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=new, pad_token_id=0)
    tree = TokenTree.from_branching([2, 2])
    out = api.generate(target, ids, mask, assistant_model=draft, tree=tree, do_sample=False, max_new_tokens=new,
                       pad_token_id=0, backend=backend)
    assert torch.equal(out, expected)
    sampled = {b: api.generate(target, ids, mask, assistant_model=draft, tree=TokenTree.from_branching([2, 2], "sample"),
                               do_sample=True, top_k=10, max_new_tokens=new, seed=9, backend=b) for b in (backend, None)}
    assert torch.equal(sampled[backend], sampled[None])


MODES = {"greedy": dict(do_sample=False), "sampling": dict(do_sample=True, temperature=0.9, top_k=20, seed=7)}


@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("children", ["top", "sample"])
@pytest.mark.parametrize("dynamic", [False, True])
def test_static_graph_path_equals_eager(mode, children, dynamic):
    """cuda_graphs="static": the graph code path (static buffers, no rebinding, same ops every
    call, no host reads) gives the eager tokens; every iteration after the warm-up went through it.
    Dynamic trees: the per-row parents, ranks and masks are state updated in place."""
    target, draft = model_pair("llama")
    ids, mask = left_padded_prompts([5, 9, 3], seed=3)
    tree = TokenTree.best_first(10, (0.7, 0.2, 0.1), children=children)
    tree = tree.as_dynamic() if dynamic else tree
    runs = [api.generate(target, ids, mask, assistant_model=draft, tree=tree, max_new_tokens=13, pad_token_id=0,
                         return_stats=True, cuda_graphs=graphs, **MODES[mode]) for graphs in (False, "static")]
    (eager, e_stats), (static, s_stats) = runs
    assert torch.equal(static, eager)
    assert e_stats.accepted_hist == s_stats.accepted_hist
    assert s_stats.graph_mode == "static"
    assert s_stats.graph_replays == {"draft": s_stats.iterations - 1, "verify": s_stats.iterations - 1}
    assert s_stats.tokens_per_row == [13] * 3


def test_eos_inside_an_accepted_path():
    """Draft = target: the top-1 child is always accepted, so EOS lands inside a path; the rows end there."""
    target, _ = model_pair("gpt2")
    ids, mask, plain = reference("gpt2", 3)
    width = ids.shape[1]
    end, eos = eos_inside_a_block(plain, width, block=7)  # a path of 6 + the bonus
    expected = target.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=MAX_NEW, pad_token_id=0,
                               eos_token_id=eos)
    out, stats = api.generate(target, ids, mask, assistant_model=target, tree=TokenTree.from_branching([2, 1, 1, 1, 1, 1]),
                              do_sample=False, max_new_tokens=MAX_NEW, pad_token_id=0, eos_token_id=eos, return_stats=True)
    assert torch.equal(out, expected)
    assert (out[1, width + end + 1 :] == 0).all() and int(out[1, width + end]) == eos
    tree_stats = stats.extra["tree"]
    assert all(row[1] == 0 for row in tree_stats["accepted_rank_by_depth"])  # rank 0 (the argmax) every time


@pytest.mark.parametrize("dynamic", [False, True])
def test_tree_stats_count_accepted_ranks_per_depth(dynamic):
    target, draft = model_pair("llama")
    ids, mask, _ = reference("llama", 3)
    tree = TokenTree.from_branching([3, 2])
    tree = tree.as_dynamic() if dynamic else tree
    _, stats = api.generate(target, ids, mask, assistant_model=draft, tree=tree, do_sample=False, max_new_tokens=MAX_NEW,
                            pad_token_id=0, return_stats=True)
    extra = stats.extra["tree"]
    counts = extra["accepted_rank_by_depth"]
    assert len(counts) == 2 and len(counts[0]) == 3 + 3 * dynamic  # dynamic: ranks < min(n_d, RANK_CAP) at depth 2
    assert extra["dynamic"] is dynamic
    # row-iterations that accepted a node at depth d = those that reached depth d (accepted_hist)
    for d in range(1, 3):
        assert sum(counts[d - 1]) == sum(stats.accepted_hist[d:])
    assert extra["reached_by_depth"][0] == stats.row_iterations
    assert counts[0][1] + counts[0][2] > 0, "a lower-ranked child should be accepted sometimes (else trees add nothing)"


def test_bad_tree_arguments():
    target, draft = model_pair("llama")
    ids, mask, _ = reference("llama", 1)
    with pytest.raises(ValueError, match="needs an assistant_model"):
        api.generate(target, ids, mask, tree=True, max_new_tokens=4)
    with pytest.raises(ValueError, match="no num_assistant_tokens"):
        api.generate(target, ids, mask, assistant_model=draft, tree=True, num_assistant_tokens=3, max_new_tokens=4)
    with pytest.raises(UnsupportedModelError, match="needs paged runners"):  # a bound patch hands it to transformers
        api.generate(target, ids, mask, assistant_model=draft, tree=True, runner="hf", max_new_tokens=4)
    with pytest.raises(ValueError, match="tree must be a TokenTree, True, .static., .dynamic. or an int"):
        api.generate(target, ids, mask, assistant_model=draft, tree="wide", max_new_tokens=4)
    with pytest.raises(ValueError, match="2 to 64 nodes"):
        api.generate(target, ids, mask, assistant_model=draft, tree=65, max_new_tokens=4)


@pytest.mark.parametrize("mode", list(MODES))
def test_a_chain_shaped_tree_decodes_like_the_chain_engine(mode):
    """TokenTree.chain(K) with sampled children draws ModelDrafter's samples (noise position
    c - 1) and tree_verify on a chain is chain_verify: the same tokens as num_assistant_tokens=K."""
    target, draft = model_pair("llama")
    ids, mask = left_padded_prompts([5, 9, 3], seed=3)
    common = dict(assistant_model=draft, max_new_tokens=MAX_NEW, pad_token_id=0, return_stats=True, **MODES[mode])
    chain, c_stats = api.generate(target, ids, mask, num_assistant_tokens=4, **common)
    tree, t_stats = api.generate(target, ids, mask, tree=TokenTree.chain(4, children="sample"), **common)
    assert torch.equal(tree, chain)
    assert t_stats.accepted_hist == c_stats.accepted_hist
