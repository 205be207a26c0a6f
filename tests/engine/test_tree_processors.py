"""generate(tree=...) with transformers' logits processors and the penalties (TreeDecoder: each
node processed with its ancestor path, LogitsStage.tree): greedy equals
model.generate(do_sample=False, <option>) token for token (draft-model trees static and dynamic,
eager and under the static graph twin; an EAGLE-3 head's tree); sampled trees follow the
target's processed distribution (chi-square), with a control that processes the nodes by the
chain's rule and fails; classifier-free guidance stays on chains (refused, and a bound
patch_generate hands it to transformers)."""
import pytest
import torch

import specdec_fast
import specdec_fast.api as api
from specdec_fast.drafters.token_tree import TokenTree
from specdec_fast.engine import logits_stage
from specdec_fast.options.rules import UnsupportedOptionError

from tests.kernels.stats import P_VALUE_THRESHOLD

from .conftest import as_generate_takes, assert_handed_to_transformers, model_pair
from .heads import trained_head
from .models import left_padded_prompts
from .test_generate_processors import NEW, OPTIONS, PROMPT, SAMPLED, _check_three_tokens, _sample
from .test_generate_processors import sampling_pair  # noqa: F401 (fixture)
from .test_paged_runner import VOCAB as TINY_VOCAB
from .test_paged_runner import tiny

# The processors whose prefix matters most (penalties, n-grams, sequences, lengths, host code).
GREEDY = ["repetition_penalty", "chat", "sequence_bias", "decay_forced_and_penalty", "logits_processor",
          "prefix_allowed_tokens_fn", "encoder_no_repeat_ngram_size", "watermark_selfhash"]
TREES = {"static": (TokenTree.from_branching([2, 2, 1], children="top"), "static"),
         "dynamic": (TokenTree.dynamic_tree(12, greedy=True), False)}


@pytest.mark.parametrize("tree", list(TREES))
@pytest.mark.parametrize("name", GREEDY)
def test_greedy_tree_equals_generate(name, tree):
    target, draft = model_pair("llama")
    ids, mask = left_padded_prompts([5, 9, 3], seed=10)
    options = OPTIONS[name]
    expected = target.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=NEW, pad_token_id=0,
                               **as_generate_takes(options))
    token_tree, graphs = TREES[tree]
    out, stats = api.generate(target, ids, mask, assistant_model=draft, tree=token_tree, do_sample=False,
                              max_new_tokens=NEW, pad_token_id=0, cuda_graphs=graphs, return_stats=True, **options)
    # the tree ran (acceptance is not asserted: the drafter expands the tree from its logits
    # unprocessed, so a forced EOS or a strong decay may reject every draft)
    assert torch.equal(out, expected) and stats.extra.get("tree")


def test_an_eagle3_tree_with_a_checkpoint_s_repetition_penalty():
    """Qwen2.5 Instruct's generation_config ships repetition_penalty 1.05: an EAGLE-3 head's
    tree speculates with it and equals model.generate."""
    target = tiny("llama", layers=4, seed=2)
    head = trained_head(target, 40, key="llama4")
    ids, mask = left_padded_prompts([5, 1, 8], vocab=TINY_VOCAB, seed=2)
    kw = dict(do_sample=False, max_new_tokens=14, pad_token_id=0, repetition_penalty=1.05, no_repeat_ngram_size=3)
    expected = target.generate(ids, attention_mask=mask, **kw)
    out, stats = specdec_fast.generate(target, ids, mask, draft_head=head, tree=TokenTree.default(12), return_stats=True,
                                       **kw)
    assert torch.equal(out, expected) and stats.mean_accepted_length > 1.0


SAMPLED_TREE = TokenTree.from_branching([2, 2], children="sample")


def _sample_tree(pair, options):
    return _sample(pair, options, "torch", drafting=dict(tree=SAMPLED_TREE))


def _rows_repeating_a_token(new: torch.Tensor) -> int:
    """Rows whose new tokens [R, 3] repeat a token before them (prompt included): what
    no_repeat_ngram_size = 1 forbids."""
    width = PROMPT.shape[1]
    rows = torch.cat([PROMPT.expand(new.shape[0], -1), new], 1).tolist()
    return sum(any(row[t] in row[:t] for t in range(width, len(row))) for row in rows)


# the penalties and the n-gram ban in processing (tree_verify has no penalised kernels); top_h: the
# warpers the kernels lack, standardised per node
@pytest.mark.parametrize("name", ["repetition_penalty", "no_repeat_ngram_size", "top_h"])
def test_sampled_trees_follow_the_processed_distribution(sampling_pair, name):  # noqa: F811
    options = SAMPLED[name]
    new = _sample_tree(sampling_pair, options)
    assert min(_check_three_tokens(sampling_pair[0], new, options, 1.0)) > P_VALUE_THRESHOLD
    if name == "no_repeat_ngram_size":
        assert _rows_repeating_a_token(new) == 0


def test_control_nodes_processed_without_their_paths_fail(sampling_pair, monkeypatch):  # noqa: F811
    """The mistake the ancestor paths prevent: every node processed with the row's prefix alone
    (its path dropped). With no_repeat_ngram_size = 1 the third token then repeats the second
    in some rows, which the test above counts (the chi-square's marginal of the third token
    barely moves; the chain's rule on a tree, a subtler mistake, is
    tests/processing/test_tree_processing.py's control)."""
    process_tree = logits_stage.LogitsStage.tree

    def without_paths(self, logits, state, tokens, tree, nodes=None):
        if nodes is not None:  # the drafter's levels: as they are (the mistake is the target's)
            return process_tree(self, logits, state, tokens, tree, nodes)
        return self.target(logits, state, torch.full_like(tokens[:, 1:], -1))

    monkeypatch.setattr(logits_stage.LogitsStage, "tree", without_paths)
    new = _sample_tree(sampling_pair, SAMPLED["no_repeat_ngram_size"])
    assert _rows_repeating_a_token(new) > 0


def test_guidance_stays_on_chains():
    """guidance_scale keeps one unconditional stream per row: a tree's call is refused with an
    UnsupportedOptionError, which a bound patch_generate hands to transformers."""
    target, draft = model_pair("llama")
    ids, mask = left_padded_prompts([5, 3], seed=2)
    kw = dict(attention_mask=mask, do_sample=False, max_new_tokens=6, pad_token_id=0)
    bound = dict(assistant_model=draft, tree=TokenTree.from_branching([2, 1]))
    assert_handed_to_transformers(target, UnsupportedOptionError, "guidance_scale with tree=...", bound, ids,
                                  guidance_scale=1.5, **kw)
