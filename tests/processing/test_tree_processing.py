"""Logits processors on a token tree's nodes (LogitsProcessing.process_tree): node i of row b is
processed as transformers would process the sequence seq[b, :end[b]] ++ node i's ancestor path
(every built-in, the penalties in their slot, a user processor, prefix_allowed_tokens_fn, the
warpers and a watermark), static trees and per-row (dynamic) parents; a control shows that the
chain's rule (node i sees the drafts before it in BFS order) differs, so the test would catch it."""
import random

import pytest
import torch
from transformers.generation import WatermarkingConfig
from transformers.generation import logits_process as lp

from specdec_fast.drafters.token_tree import TokenTree
from specdec_fast.kernels.sampling_params import make_sampling_tensors
from specdec_fast.processing import LogitsProcessing
from specdec_fast.processing.prefix import NO_TOKEN, node_paths, tree_prefixes
from specdec_fast.processing.warpers import standardise_all

from ..engine.test_generate_processors import BanEvenAfterOdd
from .cases import assert_same, random_case
from .test_builtin_processors import EOS, ExponentialDecayLengthPenalty, hf

TREES = {"chain": [1, 1, 1], "branching": [2, 2, 1], "wide": [4, 1, 2]}


def _per_row_parents(tree: TokenTree, batch: int, seed: int) -> torch.Tensor:
    """int64 [B, N]: a dynamic tree's parents, each node's among the previous level, chosen per row."""
    rng = random.Random(seed)
    parents = torch.tensor(tree.parents).repeat(batch, 1)
    for b in range(batch):
        for d in range(2, tree.depth + 1):
            for i in tree.level(d):
                parents[b, i] = rng.choice(tree.level(d - 1))
    return parents


def _tree_case(seed: int, branching, dynamic: bool, vocab: int = 50):
    """(case, tree, tokens [B, N], parents [B, N] or [N], logits [B, N, V]): random_case's rows
    and a random tree of tokens over the same small alphabet (so n-grams repeat)."""
    case = random_case(seed, vocab=vocab)
    tree = TokenTree.from_branching(branching)
    batch, n = case.seq.shape[0], tree.size
    g = torch.Generator().manual_seed(seed + 100)
    tokens = torch.randint(1, 8, (batch, n), generator=g)
    tokens[:, 0] = case.seq.gather(1, (case.end - 1)[:, None])[:, 0]  # the root: the last emitted token
    parents = _per_row_parents(tree, batch, seed) if dynamic else torch.tensor(tree.parents)
    logits = torch.randn(batch, n, vocab, generator=g) * 3
    return case, tree, tokens, parents, logits


def _path(tokens, parents, b: int, i: int) -> list:
    """Node i's ancestor tokens below the root, node included, read off the parents one by one."""
    parents = parents[b] if parents.dim() == 2 else parents
    path = []
    while i > 0:
        path.append(int(tokens[b, i]))
        i = int(parents[i])
    return path[::-1]


def _oracle(make_processors, case, tokens, parents, logits):
    """expected [B, N, V]: transformers' processors on each node's exact input_ids [1, L]."""
    expected = logits.clone()
    for b in range(logits.shape[0]):
        processors = make_processors(b)
        for i in range(logits.shape[1]):
            ids = torch.cat([case.seq[b, : int(case.end[b])], torch.tensor(_path(tokens, parents, b, i), dtype=torch.long)])[None, :]
            expected[b, i] = processors(ids, logits[b, i][None, :].clone())[0]
    return expected


def _process(case, tree, tokens, parents, logits, params=None, **options):
    processing = LogitsProcessing(vocab_size=logits.shape[-1], prompt_width=case.prompt_width, device="cpu",
                                  fused_penalties=False, **options)
    return processing.process_tree(logits.clone(), case.seq, case.end, tokens, parents, tree.tensors("cpu")["depths"],
                                   tree.depth, start=case.start, params=params)


def _all_builtins(case):
    P = case.prompt_width
    bias = [[[2], 1.5], [[1, 2], -0.5], [[4, 4, 1], 2.0]]
    bad = [[6], [5, 1]]
    options = dict(sequence_bias=bias, repetition_penalty=1.3, no_repeat_ngram_size=2, bad_words_ids=bad,
                   min_length=P + 6, min_new_tokens=4, eos_token_id=EOS, suppress_tokens=[7], begin_suppress_tokens=[1],
                   forced_eos_token_id=[EOS, 7], max_new_tokens=9, exponential_decay_length_penalty=(2, 1.4),
                   encoder_repetition_penalty=1.4, encoder_no_repeat_ngram_size=2)

    def make(b):
        prompt = case.seq[b : b + 1, :P]
        return hf(lp.SequenceBiasLogitsProcessor(bias), lp.EncoderRepetitionPenaltyLogitsProcessor(1.4, prompt),
                  lp.RepetitionPenaltyLogitsProcessor(1.3, prompt_ignore_length=int(case.start[b])),
                  lp.NoRepeatNGramLogitsProcessor(2), lp.EncoderNoRepeatNGramLogitsProcessor(2, prompt),
                  lp.NoBadWordsLogitsProcessor(bad, EOS), lp.MinLengthLogitsProcessor(P + 6, EOS),
                  lp.MinNewTokensLengthLogitsProcessor(P, 4, EOS), lp.ForcedEOSTokenLogitsProcessor(P + 9, [EOS, 7]),
                  ExponentialDecayLengthPenalty((2, 1.4), EOS, P),
                  lp.SuppressTokensLogitsProcessor([7]), lp.SuppressTokensAtBeginLogitsProcessor([1], P))

    return options, make


@pytest.mark.parametrize("dynamic", [False, True])
@pytest.mark.parametrize("shape", list(TREES))
def test_node_paths_are_the_ancestor_tokens(shape, dynamic):
    case, tree, tokens, parents, _ = _tree_case(3, TREES[shape], dynamic)
    paths = node_paths(tokens, parents, tree.tensors("cpu")["depths"], tree.depth)
    assert paths.shape == (*tokens.shape, tree.depth)
    for b in range(tokens.shape[0]):
        for i in range(tree.size):
            path = _path(tokens, parents, b, i)
            assert paths[b, i].tolist() == path + [NO_TOKEN] * (tree.depth - len(path)), (b, i)


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("dynamic", [False, True])
@pytest.mark.parametrize("shape", list(TREES))
def test_every_builtin_on_each_node_s_own_prefix(shape, dynamic, seed):
    case, tree, tokens, parents, logits = _tree_case(seed, TREES[shape], dynamic)
    options, make = _all_builtins(case)
    expected = _oracle(make, case, tokens, parents, logits)
    assert_same(_process(case, tree, tokens, parents, logits, **options), expected,
                torch.ones(logits.shape[:2], dtype=torch.bool))


def test_control_the_chain_rule_on_a_tree_differs():
    """Processing the nodes as a chain (node i after nodes 1 .. i - 1 in BFS order, siblings
    included) gives other values than the oracle on a branching tree: the test above would fail."""
    case, tree, tokens, parents, logits = _tree_case(1, TREES["branching"], False)
    options, make = _all_builtins(case)
    processing = LogitsProcessing(vocab_size=logits.shape[-1], prompt_width=case.prompt_width, device="cpu",
                                  fused_penalties=False, **options)
    as_chain = processing.process(logits.clone(), case.seq, case.end, tokens[:, 1:], start=case.start)
    expected = _oracle(make, case, tokens, parents, logits)
    with pytest.raises(AssertionError):
        assert_same(as_chain, expected, torch.ones(logits.shape[:2], dtype=torch.bool))


@pytest.mark.parametrize("dynamic", [False, True])
def test_frequency_and_presence_count_each_node_s_generated_tokens(dynamic):
    """vLLM's penalties over the generated tokens and the node's path (the group's shared count)."""
    case, tree, tokens, parents, logits = _tree_case(4, TREES["wide"], dynamic)
    P = case.prompt_width

    def make(b):
        def vllm(input_ids, scores):
            counts = torch.bincount(input_ids[0, P:], minlength=scores.shape[-1]).float()
            return scores - 0.4 * counts - 0.9 * (counts > 0).float()
        return vllm

    expected = _oracle(make, case, tokens, parents, logits)
    ours = _process(case, tree, tokens, parents, logits, frequency_penalty=0.4, presence_penalty=0.9)
    assert_same(ours, expected, torch.ones(logits.shape[:2], dtype=torch.bool))


def test_host_stages_are_asked_with_each_node_s_input_ids_and_its_row():
    """A user processor, prefix_allowed_tokens_fn (batch_id = the row, not the node's row among
    B * N) and a watermark, eager, per node."""
    case, tree, tokens, parents, logits = _tree_case(2, TREES["branching"], True)
    allowed = lambda batch_id, ids: [t for t in range(50) if (t + int(ids[-1]) + batch_id) % 3 == 0]  # noqa: E731
    watermark = WatermarkingConfig(bias=2.5)
    options = dict(logits_processor=[BanEvenAfterOdd()], prefix_allowed_tokens_fn=allowed, repetition_penalty=1.2,
                   watermarking_config=watermark)

    def make(b):
        return hf(lp.RepetitionPenaltyLogitsProcessor(1.2, prompt_ignore_length=int(case.start[b])),
                  lp.PrefixConstrainedLogitsProcessor(lambda _, ids: allowed(b, ids), 1),
                  BanEvenAfterOdd(), watermark.construct_processor(logits.shape[-1], "cpu"))

    expected = _oracle(make, case, tokens, parents, logits)
    assert_same(_process(case, tree, tokens, parents, logits, **options), expected,
                torch.ones(logits.shape[:2], dtype=torch.bool))


def test_the_warpers_here_standardise_each_node():
    """typical_p (a warper the kernels lack) after a repetition penalty: standardise_all of the
    per-node processed logits, with the rows' sampling parameters."""
    case, tree, tokens, parents, logits = _tree_case(5, TREES["branching"], False)
    params = make_sampling_tensors(logits.shape[0], "cpu", temperature=0.8)

    def make(b):
        return hf(lp.RepetitionPenaltyLogitsProcessor(1.5, prompt_ignore_length=int(case.start[b])))

    expected = standardise_all(_oracle(make, case, tokens, parents, logits), params, typical_p=0.6)
    ours = _process(case, tree, tokens, parents, logits, params=params, repetition_penalty=1.5, typical_p=0.6,
                    do_sample=True)
    assert_same(ours, expected, torch.ones(logits.shape[:2], dtype=torch.bool))


def test_tree_prefixes_are_node_rows_in_groups_of_n():
    """B * N node rows in groups of N: seq, end and start repeated per row, each node one position
    seeing its depth's drafts."""
    case, tree, tokens, parents, _ = _tree_case(0, TREES["branching"], False)
    depths = tree.tensors("cpu")["depths"]
    prefixes = tree_prefixes(case.seq, case.end, tokens, parents, depths, tree.depth, start=case.start)
    batch, n = tokens.shape
    assert prefixes.group == n and prefixes.n == 1 and prefixes.seq.shape[0] == batch * n
    assert torch.equal(prefixes.seen[:, 0], depths.long().repeat(batch))
    assert torch.equal(prefixes.lengths[:, 0], case.end.repeat_interleave(n) + depths.long().repeat(batch))
    assert torch.equal(prefixes.start, case.start.repeat_interleave(n))


@pytest.mark.parametrize("dynamic", [False, True])
def test_a_level_s_nodes_alone_equal_their_rows_of_the_whole_tree(dynamic):
    """nodes= (a drafter expanding one level): logits [B, E, V] of those nodes processed as the
    whole tree's rows at them, reading no token past them (the rest of tokens is garbage)."""
    case, tree, tokens, parents, logits = _tree_case(6, TREES["branching"], dynamic)
    options, _ = _all_builtins(case)
    whole = _process(case, tree, tokens, parents, logits, **options)
    nodes = torch.tensor(tree.level(2))
    garbage = tokens.clone()
    garbage[:, nodes.max() + 1:] = 10**9  # deeper nodes not drawn yet
    processing = LogitsProcessing(vocab_size=logits.shape[-1], prompt_width=case.prompt_width, device="cpu",
                                  fused_penalties=False, **options)
    level = processing.process_tree(logits[:, nodes].clone(), case.seq, case.end, garbage, parents,
                                    tree.tensors("cpu")["depths"], 2, start=case.start, nodes=nodes)  # their depth
    assert torch.equal(level, whole[:, nodes])
