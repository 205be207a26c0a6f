"""Draft heads (an EAGLE-3 head with a reduced vocabulary, a DFlash block drafter, a DFlash2 one: its
selector's rows processed per position) with transformers'
logits processors and the penalties (engine/logits_stage.py): greedy output equals
model.generate(<option>) token for token; sampled tokens follow the target's processed
distribution (chi-square, as tests/engine/test_generate_processors.py checks the draft model).
The verify penalises q with the counts plus the drafts before each position, as it does p, so a
head must sample its drafts from that same penalised q: a control that samples without the
penalties makes the chi-square reject."""
import pytest
import torch

import specdec_fast
import specdec_fast.drafters.block as block_module
import specdec_fast.drafters.eagle3 as eagle3_module

from tests.kernels.stats import P_VALUE_THRESHOLD

from .heads import random_dflash, random_dflash2, random_head, trained_dflash, trained_head
from .models import left_padded_prompts, make_model
from .test_generate_processors import OPTIONS, PROMPT, VOCAB, _check_three_tokens

NEW = 12


@pytest.fixture(scope="module")
def greedy_target():
    target = make_model("llama", layers=4, seed=3)
    target.generation_config.eos_token_id = None
    return target


def _heads(target, draft_vocab: int):
    """kind -> (a random head, K)."""
    return {"eagle3": (random_head(target, draft_vocab, seed=1), 3), "dflash": (random_dflash(target, seed=2), 4),
            "dflash2": (random_dflash2(target, seed=2), 4)}


@pytest.mark.parametrize("name", ["repetition_penalty", "chat", "no_repeat_ngram_size", "decay_forced_and_penalty",
                                  "prefix_allowed_tokens_fn"])
def test_greedy_equals_generate(greedy_target, name):
    target = greedy_target
    ids, mask = left_padded_prompts([5, 9, 3], seed=4)
    options = OPTIONS[name]
    expected = target.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=NEW, pad_token_id=0, **options)
    for kind, (head, k) in _heads(target, target.config.vocab_size // 2).items():
        for graphs in ("static", False):
            out = specdec_fast.generate(target, ids, mask, draft_head=head, num_assistant_tokens=k, do_sample=False,
                                        max_new_tokens=NEW, pad_token_id=0, cuda_graphs=graphs, **options)
            assert torch.equal(out, expected), (kind, graphs)


@pytest.fixture(scope="module")
def sampling_target():
    """The target of test_eagle3_sampling.py / test_dflash_sampling.py, with their trained heads (cached
    per session under the same keys): accepted often enough that both verify paths run."""
    target = make_model("llama", vocab=VOCAB, layers=3, init_std=0.5, seed=5)
    target.generation_config.eos_token_id = None
    return target


def _trained(target, kind):
    if kind == "eagle3":  # 7 of the 12 tokens: -inf outside them
        return trained_head(target, 7, key="chi-square", steps=120, rows=256, temperature=1.0), 2
    if kind == "dflash2":  # random (training one takes ~30 s): accepted ~0.3 here
        return random_dflash2(target, block_size=16, seed=6, std=0.1, selector_std=0.5), 4
    return trained_dflash(target, key="chi-square-b8", block_size=8, temperature=1.0), 4


SAMPLED = {"penalties": dict(repetition_penalty=2.0, frequency_penalty=1.0),
           "no_repeat_ngram_size": dict(no_repeat_ngram_size=1)}


def _sample(target, head, k, options, backend="torch", rows=2400):
    out, stats = specdec_fast.generate(target, PROMPT.expand(rows, -1), draft_head=head, num_assistant_tokens=k,
                                       do_sample=True, temperature=1.0, top_k=0, max_new_tokens=3, seed=11,
                                       backend=backend, return_stats=True, **options)
    assert 0.1 < stats.alpha < 0.95, f"alpha {stats.alpha}: the test needs both accepts and rejects"
    return out[:, PROMPT.shape[1]:]


@pytest.mark.parametrize("name", list(SAMPLED))
@pytest.mark.parametrize("kind", ["eagle3", "dflash", "dflash2"])
def test_sampled_tokens_follow_the_processed_distribution(sampling_target, kind, name):
    head, k = _trained(sampling_target, kind)
    options = SAMPLED[name]
    new = _sample(sampling_target, head, k, options, backend="torch" if kind == "eagle3" else "cpp")
    assert min(_check_three_tokens(sampling_target, new, options, 1.0)) > P_VALUE_THRESHOLD


@pytest.mark.slow  # ~25 s: 6000 rows (the DFlash drafter's control, the same mistake, rejects as clearly)
@pytest.mark.parametrize("kind", ["eagle3"])
def test_control_drafts_sampled_without_the_penalties_fail(sampling_target, kind, monkeypatch):
    """The drafts drawn from the unpenalised q while the verify penalises q: the chi-square rejects."""
    module = eagle3_module if kind == "eagle3" else block_module
    prepared = module.prepared_impls

    def without_penalties(backend, device):
        impls = prepared(backend, device)
        sample = impls[1]
        return (impls[0], lambda logits, params, positions, stream, *rest: sample(logits, params, positions, stream),
                *impls[2:])

    monkeypatch.setattr(module, "prepared_impls", without_penalties)
    head, k = _trained(sampling_target, kind)
    options = dict(repetition_penalty=4.0, frequency_penalty=2.0)
    new = _sample(sampling_target, head, k, options, rows=6000)
    assert min(_check_three_tokens(sampling_target, new, options, 1.0)) < 1e-6


@pytest.mark.parametrize("schedule", [None, "adaptive"])
def test_heads_default_k_and_the_adaptive_schedule(greedy_target, schedule):
    """Without K a head runs its own default: 4 for EAGLE-3, the whole block (block_size - 1) for
    DFlash, constant. Named, the adaptive schedule is taken by the block drafter (K among the first
    drafts of its block) and by EAGLE-3 (K among a draft model's ADAPTIVE_KS; stats.k then says the
    largest, as the block drafter's); greedy output is the target's either way."""
    from specdec_fast.engine.engine import ADAPTIVE_KS

    target = greedy_target
    ids, mask = left_padded_prompts([4, 6], seed=2)
    expected = target.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=NEW, pad_token_id=0)
    extra = {} if schedule is None else dict(num_assistant_tokens_schedule=schedule)
    for kind, (head, _) in _heads(target, target.config.vocab_size // 2).items():
        out, stats = specdec_fast.generate(target, ids, mask, draft_head=head, do_sample=False, max_new_tokens=NEW,
                                           pad_token_id=0, return_stats=True, **extra)
        assert torch.equal(out, expected), kind
        largest = head.block_size - 1 if kind != "eagle3" else 4 if schedule is None else max(ADAPTIVE_KS)
        assert stats.k == largest, (kind, stats.k)
        if schedule is None:
            assert stats.schedule is None, kind
        else:
            assert stats.schedule["ks"][-1] == largest and sum(stats.schedule["chosen"].values()) > 0, kind


@pytest.mark.parametrize("kind", ["eagle3", "dflash"])
def test_a_patch_bound_to_a_head_speculates_with_it(greedy_target, kind):
    """patch_generate(model, draft_head=head): every later model.generate(...) drafts with the head
    (found by the third fuzzing round: the head went to the defaults and nothing speculated); a call
    to an unbound patch that names draft_head= is routed too. The tokens are the target's greedy ones."""
    import copy

    head, k = _heads(greedy_target, 64)[kind]
    model = copy.deepcopy(greedy_target)
    ids, mask = left_padded_prompts([5, 9], seed=6)
    kw = dict(do_sample=False, max_new_tokens=NEW, pad_token_id=0)
    expected = greedy_target.generate(ids, attention_mask=mask, **kw)
    with specdec_fast.patch_generate(model, draft_head=head, num_assistant_tokens=k, fallback="raise") as patched:
        assert torch.equal(patched.generate(ids, attention_mask=mask, **kw), expected)
        assert patched.specdec_last_stats is not None and patched.specdec_last_stats.k == k
    with specdec_fast.patch_generate(model, fallback="raise") as patched:
        assert torch.equal(patched.generate(ids, attention_mask=mask, draft_head=head, num_assistant_tokens=k, **kw),
                           expected)
    with pytest.raises(ValueError, match="give one drafter .* got draft_head and prompt_lookup_num_tokens"):
        specdec_fast.patch_generate(model, prompt_lookup_num_tokens=3, draft_head=head)
