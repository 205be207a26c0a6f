"""The drop-in for code that already calls model.generate (specdec_fast/patch.py): transformers'
text-generation pipeline and an evaluation-harness-shaped call (max_length, a stop-sequence
stopping criterion, use_cache=True, pad_token_id) through a patched model, with and without a
bound draft, give the plain model's output token for token; stopping criteria end a row at the
exact token, inside an accepted run too; sampled tokens before a stop follow the target; an
option we do not implement falls back to transformers with a warning (or raises)."""
import copy
import random
import threading

import pytest
import torch
from transformers import StoppingCriteria, StoppingCriteriaList, pipeline

import specdec_fast
from specdec_fast.engine.inputs import UnsupportedInputError
from specdec_fast.options.rules import UnsupportedOptionError

from tests.kernels.stats import P_VALUE_THRESHOLD, chi_square_pvalue

from .conftest import assert_handed_to_transformers, model_pair
from .models import left_padded_prompts, make_draft, make_model


class StopSequence(StoppingCriteria):
    """An evaluation harness's stop-sequence criterion (lm-evaluation-harness style): done when a
    row's last tokens are the sequence."""

    def __init__(self, sequence):
        self.sequence = torch.tensor(sequence)

    def __call__(self, input_ids, scores, **kwargs):
        n = len(self.sequence)
        if input_ids.shape[1] < n:
            return torch.zeros(input_ids.shape[0], dtype=torch.bool)
        return (input_ids[:, -n:] == self.sequence).all(-1)


def _harness_call(model, ids, mask, stop, **extra):
    return model.generate(input_ids=ids, attention_mask=mask, max_length=ids.shape[1] + 16, pad_token_id=0,
                          stopping_criteria=StoppingCriteriaList([StopSequence(stop)]), use_cache=True, do_sample=False,
                          **extra)


@pytest.mark.parametrize("lengths", [[6], [5, 9, 3]])
@pytest.mark.parametrize("binding", ["draft", "lookup", "none"])
def test_harness_shaped_calls_equal_the_plain_model(lengths, binding):
    target, draft = model_pair("llama")
    ids, mask = left_padded_prompts(lengths, seed=len(lengths) + 30)
    plain = target.generate(input_ids=ids, attention_mask=mask, max_length=ids.shape[1] + 16, pad_token_id=0,
                            do_sample=False)
    stop = plain[0, ids.shape[1] + 4: ids.shape[1] + 6].tolist()  # row 0's 5th and 6th tokens: it stops there
    expected = _harness_call(target, ids, mask, stop, eos_token_id=1)  # with an EOS, ended rows are padded
    assert (expected[0, ids.shape[1] + 6:] == 0).all(), "the criterion ends row 0 at its 6th token"
    unpadded = _harness_call(target, ids, mask, stop)  # without one, every row runs until all are done
    bound = {"draft": dict(assistant_model=draft), "lookup": dict(prompt_lookup_num_tokens=3), "none": {}}[binding]
    with specdec_fast.patch_generate(target, **bound) as model:
        extra = {} if bound else dict(assistant_model=draft)  # unbound: the call brings its draft
        out = _harness_call(model, ids, mask, stop, eos_token_id=1, **extra)
        out_unpadded = _harness_call(model, ids, mask, stop, **extra)
    assert torch.equal(out, expected) and torch.equal(out_unpadded, unpadded)


def test_a_stop_inside_an_accepted_run():
    """Draft = target: every draft is accepted and one iteration emits K + 1 = 8 tokens; the
    criterion fires at the 4th, inside that run: the row ends there, as plain generate ends it."""
    target, _ = model_pair("llama")
    ids, mask = left_padded_prompts([7], seed=2)
    plain = target.generate(ids, attention_mask=mask, max_new_tokens=20, pad_token_id=0, do_sample=False)
    stop = [int(plain[0, ids.shape[1] + 3])]  # the 4th new token
    first = plain[0, ids.shape[1]:].tolist().index(stop[0]) + 1  # where it first occurs
    expected = target.generate(ids, attention_mask=mask, max_new_tokens=20, pad_token_id=0, do_sample=False,
                               stopping_criteria=StoppingCriteriaList([StopSequence(stop)]))
    out, stats = specdec_fast.generate(target, ids, mask, assistant_model=target, num_assistant_tokens=7,
                                       max_new_tokens=20, pad_token_id=0, do_sample=False, return_stats=True,
                                       stopping_criteria=StoppingCriteriaList([StopSequence(stop)]))
    assert torch.equal(out, expected)
    assert stats.tokens_per_row == [first] and first <= 4 and stats.alpha == 1.0
    assert stats.accepted_hist[-1] >= 1, "a run of K accepted drafts was emitted past the stop"


def test_transformers_text_generation_pipeline():
    target_dir, draft_dir = specdec_fast.demo_pair()
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(target_dir, padding_side="left")
    target = AutoModelForCausalLM.from_pretrained(target_dir)
    draft = AutoModelForCausalLM.from_pretrained(draft_dir)
    prompts = ["def binary_search(a, x):", "class Queue:", "import os\n\ndef main("]
    kwargs = dict(max_new_tokens=24, do_sample=False, return_full_text=False)
    plain = pipeline("text-generation", model=target, tokenizer=tok)
    draft.to(target.device)  # the pipeline moves its model to the GPU where there is one (transformers 5.17)
    expected = plain(prompts, batch_size=3, **kwargs)
    expected_one = plain(prompts[0], **kwargs)
    with specdec_fast.patch_generate(target, assistant_model=draft) as model:
        patched = pipeline("text-generation", model=model, tokenizer=tok)
        got, got_one = patched(prompts, batch_size=3, **kwargs), patched(prompts[0], **kwargs)
    assert got == expected and got_one == expected_one
    assert target.specdec_last_stats.alpha > 0.3  # the calls speculated (the last one, batch 1)


def test_sampled_tokens_before_a_stop_follow_the_target():
    """Rows end when their token is `stop` (the criterion) or `eos`: (t1, t2) is (t1, pad) with
    p1(t1) for those two, else (a, b) with p1(a) p2(b | a). Chi-square over those categories."""
    vocab, rows, prompt = 12, 3000, torch.tensor([[3, 7, 5, 9]])
    target = make_model("llama", vocab=vocab, init_std=0.5, seed=5)
    target.generation_config.eos_token_id = None
    draft = make_draft(target, noise=0.4, seed=6)
    with torch.no_grad():
        p1 = torch.softmax(target(prompt).logits[0, -1].double(), -1)
        grid = torch.cat([prompt.expand(vocab, -1), torch.arange(vocab)[:, None]], 1)
        p2 = torch.softmax(target(grid).logits[:, -1].double(), -1)
    stop, eos = p1.argsort(descending=True)[:2].tolist()  # the two likeliest first tokens
    out = specdec_fast.generate(target, prompt.expand(rows, -1), assistant_model=draft, num_assistant_tokens=2,
                                do_sample=True, temperature=1.0, top_k=0, max_new_tokens=2, seed=3, pad_token_id=0,
                                eos_token_id=eos, stopping_criteria=StoppingCriteriaList([StopSequence([stop])]))
    t1, t2 = out[:, 4], out[:, 5]
    ended = (t1 == stop) | (t1 == eos)
    assert bool((t2[ended] == 0).all()), "rows ended at t1 are padded (pad_token_id 0)"
    category = torch.where(ended, t1 * vocab, t1 * vocab + t2)  # (t1, pad) sits at (t1, 0)
    joint = (p1[:, None] * p2).clone()
    for token in (stop, eos):
        joint[token] = 0.0
        joint[token, 0] = p1[token]
    assert chi_square_pvalue(category, joint.reshape(-1)) > P_VALUE_THRESHOLD


def test_an_option_we_do_not_implement_falls_back_with_a_warning():
    target, draft = model_pair("llama")
    ids, mask = left_padded_prompts([5, 8], seed=9)
    expected = target.generate(ids, attention_mask=mask, max_new_tokens=6, num_beams=2, do_sample=False, pad_token_id=0)
    with specdec_fast.patch_generate(target, assistant_model=draft) as model:
        with pytest.warns(UserWarning, match="num_beams=2.*runs on transformers' generate"):
            out = model.generate(ids, attention_mask=mask, max_new_tokens=6, num_beams=2, do_sample=False, pad_token_id=0)
    assert torch.equal(out, expected)
    with specdec_fast.patch_generate(target, assistant_model=draft, fallback="raise") as model:
        with pytest.raises(UnsupportedOptionError, match="num_beams=2"):
            model.generate(ids, attention_mask=mask, max_new_tokens=6, num_beams=2, do_sample=False, pad_token_id=0)
    assert "generate" not in vars(target)  # restored


def test_a_right_padded_call_falls_back_as_an_unsupported_option_does():
    """transformers' generate takes a right-padded batch (it warns that the output is off); a harness
    whose tokenizer pads on the right keeps working when patched: the call runs on transformers'
    generate with our warning (fallback="raise": one line)."""
    from specdec_fast.engine.inputs import UnsupportedInputError

    target, draft = model_pair("llama")
    ids, mask = left_padded_prompts([5, 8], seed=9)
    ids, mask = ids.flip(1), mask.flip(1)  # the pads on the right
    kw = dict(max_new_tokens=6, do_sample=False, pad_token_id=0)
    expected = target.generate(ids, attention_mask=mask, **kw)
    with specdec_fast.patch_generate(target, assistant_model=draft) as model:
        with pytest.warns(UserWarning, match="right-padded.*runs on transformers' generate"):
            out = model.generate(ids, attention_mask=mask, **kw)
    assert torch.equal(out, expected)
    with specdec_fast.patch_generate(target, assistant_model=draft, fallback="raise") as model:
        with pytest.raises(UnsupportedInputError, match="right-padded"):
            model.generate(ids, attention_mask=mask, **kw)
    with pytest.raises(ValueError, match="right-padded"):  # specdec_fast.generate itself: the error, no fallback
        specdec_fast.generate(target, ids, mask, assistant_model=draft, **kw)


def test_a_bound_patch_keeps_defaults_stats_and_lets_calls_override():
    target, draft = model_pair("llama")
    ids, mask = left_padded_prompts([6], seed=4)
    patch = specdec_fast.patch_generate(target, assistant_model=draft, num_assistant_tokens=2)
    try:
        target.generate(ids, attention_mask=mask, max_new_tokens=8, do_sample=False, pad_token_id=0)
        assert patch.last_stats.k == 2 and target.specdec_last_stats is patch.last_stats
        target.generate(ids, attention_mask=mask, max_new_tokens=8, do_sample=False, pad_token_id=0,
                        num_assistant_tokens=5)
        assert patch.last_stats.k == 5  # the call's option wins
    finally:
        patch.restore()


def test_three_threads_calling_one_model_get_what_they_would_alone():
    """Three threads, each making mixed greedy and seeded sampling calls through specdec_fast.generate on
    one model and draft (one cached engine): the same tokens as the same calls one after another."""
    target, draft = model_pair("llama")

    def request(rng):
        ids, mask = left_padded_prompts([rng.randint(2, 9) for _ in range(rng.randint(1, 3))], seed=rng.randrange(999))
        opts = dict(max_new_tokens=rng.randint(3, 9), pad_token_id=0, seed=rng.randrange(99), cuda_graphs="static")
        opts.update(dict(do_sample=True, temperature=0.9) if rng.random() < 0.5 else dict(do_sample=False))
        return ids, mask, opts

    requests = [[request(random.Random(10 * t + i)) for i in range(4)] for t in range(3)]
    alone = [[specdec_fast.generate(target, ids, mask, assistant_model=draft, **o) for ids, mask, o in r] for r in requests]
    together, errors = [[None] * 4 for _ in range(3)], []

    def work(t):
        try:
            for i, (ids, mask, o) in enumerate(requests[t]):
                together[t][i] = specdec_fast.generate(target, ids, mask, assistant_model=draft, **o)
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(t,)) for t in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors, errors
    assert all(torch.equal(together[t][i], alone[t][i]) for t in range(3) for i in range(4))


@pytest.mark.parametrize("runner", ["paged", "hf"])
def test_stop_strings_with_a_chat_combination_equal_generate(runner):
    """repetition_penalty + stop_strings + min_new_tokens, as a chat template's generation_config
    would set them, batch 3 with left padding (the demo pair: its byte-level tokenizer)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    target_dir, draft_dir = specdec_fast.demo_pair()
    tok = AutoTokenizer.from_pretrained(target_dir, padding_side="left")
    target = AutoModelForCausalLM.from_pretrained(target_dir)
    draft = AutoModelForCausalLM.from_pretrained(draft_dir)
    batch = tok(["def binary_search(a, x):", "class Queue:", "import os\n\ndef main("], return_tensors="pt", padding=True)
    options = dict(max_new_tokens=40, do_sample=False, repetition_penalty=1.05, min_new_tokens=3,
                   stop_strings=["return", ":\n"], tokenizer=tok, eos_token_id=tok.eos_token_id,
                   pad_token_id=tok.pad_token_id)
    expected = target.generate(batch.input_ids, attention_mask=batch.attention_mask, **options)
    out, stats = specdec_fast.generate(target, batch.input_ids, batch.attention_mask, assistant_model=draft,
                                       runner=runner, return_stats=True, **options)
    assert torch.equal(out, expected)
    assert min(stats.tokens_per_row) < 40, "a stop string ended a row"


@pytest.mark.parametrize("case", ["pads", "pad_is_eos", "no_pad_in_ids", "no_pad_token"])
def test_a_call_without_attention_mask_infers_it_as_generate_does(case):
    """No attention_mask: transformers masks the pad token where it occurs in input_ids and is not
    an EOS id, and attends to everything otherwise (no pad token, or pad = EOS); so does the
    engine, by generate() and through the patch (a harness that passes only input_ids)."""
    target, draft = model_pair("llama")
    ids, _ = left_padded_prompts([3, 7, 5], seed=12)  # pad id 0 on the left of rows 0 and 2
    kw = dict(max_new_tokens=8, do_sample=False)
    if case == "pads":
        kw.update(pad_token_id=0)
    elif case == "pad_is_eos":
        kw.update(pad_token_id=0, eos_token_id=[0, 9])
    elif case == "no_pad_in_ids":
        ids, kw = ids[1:2], dict(kw, pad_token_id=0)
    expected = target.generate(ids, **kw)
    if case == "pads":  # the inference matters here: attending to the pads gives other tokens
        assert not torch.equal(expected, target.generate(ids, attention_mask=torch.ones_like(ids), **kw))
    assert torch.equal(specdec_fast.generate(target, ids, assistant_model=draft, **kw), expected)
    patched = copy.deepcopy(target)
    specdec_fast.patch_generate(patched, prompt_lookup_num_tokens=3, fallback="raise")
    assert torch.equal(patched.generate(ids, **kw), expected)


def test_a_pad_token_inside_a_prompt_without_attention_mask_is_handed_to_transformers():
    """transformers masks every pad token when it infers the mask, one inside the prompt too (a
    hole); the engine takes left padding only: one line saying so, and the bound patch's call
    runs on transformers' generate."""
    target, draft = model_pair("llama")
    ids = torch.tensor([[5, 0, 7, 9]])
    kw = dict(max_new_tokens=4, do_sample=False, pad_token_id=0)
    with pytest.raises(UnsupportedInputError, match="input_ids hold pad_token_id=0 after a real token"):
        specdec_fast.generate(target, ids, assistant_model=draft, **kw)
    patched = copy.deepcopy(target)
    specdec_fast.patch_generate(patched, assistant_model=draft)
    with pytest.warns(UserWarning, match="pad_token_id=0 after a real token"):
        assert torch.equal(patched.generate(ids, **kw), target.generate(ids, **kw))


class _StopOn(StoppingCriteria):
    """A user's criterion without an eos_token_id: a row is done at the given token."""

    def __init__(self, token: int):
        self.token = token

    def __call__(self, input_ids, scores, **kwargs):
        return input_ids[:, -1] == self.token


def _rows_stopping_apart(target, seed: int, drafting: dict, tree=None):
    """(ours, transformers') for 2 rows whose criteria fire at their 2nd and 7th token, no EOS:
    transformers pads nothing then and runs both rows until the last is done (7 tokens each)."""
    ids, mask = left_padded_prompts([4, 4], seed=seed)
    width = ids.shape[1]
    plain = target.generate(ids, attention_mask=mask, max_new_tokens=16, do_sample=False, pad_token_id=0)
    first, last = int(plain[0, width + 1]), int(plain[1, width + 6])
    kw = dict(max_new_tokens=16, do_sample=False, pad_token_id=0,
              stopping_criteria=StoppingCriteriaList([_StopOn(first), _StopOn(last)]))
    theirs = target.generate(ids, attention_mask=mask, **kw)
    ours = specdec_fast.generate(target, ids, mask, tree=tree, **drafting, **kw)
    return ours, theirs


@pytest.mark.parametrize("drafting", ["draft", "lookup", "tree"])
def test_rows_a_criterion_ends_without_eos_run_to_the_last_row_s_end(drafting):
    """Found by the fuzzing helper: speculation left the earlier-ended row short of the last
    row's end (its tail came back as pads); it now runs on to it, as transformers' rows do."""
    target, draft = model_pair("llama")
    kinds = {"draft": dict(assistant_model=draft, num_assistant_tokens=2), "lookup": dict(prompt_lookup_num_tokens=2),
             "tree": dict(assistant_model=draft)}
    for seed in (0, 28, 3):
        ours, theirs = _rows_stopping_apart(target, seed, kinds[drafting], tree=4 if drafting == "tree" else None)
        assert theirs.shape[1] - 4 == 7 and (theirs[0, -1] != 0 or theirs[0, -2] != 0)
        assert torch.equal(ours, theirs), (drafting, seed)


class _LowConfidence(StoppingCriteria):
    """A criterion that reads ``scores`` (transformers passes the steps' processed scores so far
    with output_scores=True, else None): done when the last step's top probability is low."""

    def __call__(self, input_ids, scores, **kwargs):
        if scores is None:
            return torch.zeros(input_ids.shape[0], dtype=torch.bool)
        return scores[-1].softmax(-1).max(-1).values < 0.5


def test_a_criterion_reading_the_scores_falls_back_and_one_that_does_not_speculates():
    """Found by the options fuzzing round: with output_scores a criterion reading scores[-1] got
    None here, stopped nowhere, and the tokens ran past transformers'. Now reading them raises an
    UnsupportedOptionError (a bound patch hands the call to transformers); a criterion that never
    reads them, and a call without output_scores (transformers passes None too), speculate."""
    target, draft = model_pair("llama")
    ids, mask = left_padded_prompts([6, 9], seed=41)
    kw = dict(max_new_tokens=16, do_sample=False, pad_token_id=0, return_dict_in_generate=True, output_scores=True)
    reading = dict(kw, stopping_criteria=StoppingCriteriaList([_LowConfidence()]))
    expected = target.generate(ids, attention_mask=mask, **reading)
    assert expected.sequences.shape[1] < ids.shape[1] + 16, "the criterion stops transformers' call early"
    with pytest.raises(UnsupportedOptionError, match="a stopping criterion read `scores`"):
        specdec_fast.generate(target, ids, mask, assistant_model=draft, **reading)
    with specdec_fast.patch_generate(target, assistant_model=draft) as model:
        with pytest.warns(UserWarning, match="a stopping criterion read `scores`"):
            out = model.generate(ids, attention_mask=mask, **reading)
    assert torch.equal(out.sequences, expected.sequences)
    # A criterion that never reads scores, with output_scores: speculates, tokens and scores equal.
    plain = target.generate(ids, attention_mask=mask, max_new_tokens=16, do_sample=False, pad_token_id=0)
    other = dict(kw, eos_token_id=1, stopping_criteria=StoppingCriteriaList([_StopOn(int(plain[0, ids.shape[1] + 3]))]))
    ours, stats = specdec_fast.generate(target, ids, mask, assistant_model=draft, return_stats=True, **other)
    theirs = target.generate(ids, attention_mask=mask, **other)
    assert torch.equal(ours.sequences, theirs.sequences) and stats.k > 0
    assert all(torch.allclose(a, b, atol=1e-4) for a, b in zip(ours.scores, theirs.scores))
    # Without output_scores both pass None: the reading criterion never fires, in either.
    none = dict(max_new_tokens=16, do_sample=False, pad_token_id=0, stopping_criteria=StoppingCriteriaList([_LowConfidence()]))
    assert torch.equal(specdec_fast.generate(target, ids, mask, assistant_model=draft, **none),
                       target.generate(ids, attention_mask=mask, **none))


class _StopWhenAnyRow(StoppingCriteria):
    """A criterion that judges the batch: one bool, True once any row's last token is ``token``."""

    def __init__(self, token: int):
        self.token = token

    def __call__(self, input_ids, scores, **kwargs):
        return bool((input_ids[:, -1] == self.token).any())


@pytest.mark.parametrize("eos", [None, 1])
@pytest.mark.parametrize("drafting", ["draft", "lookup", "tree"])
def test_a_criterion_that_judges_the_batch_sees_every_row_at_each_step(drafting, eos):
    """transformers calls the criteria once per step with every row ([B, P + s]; rows that ended
    padded after their end) and applies a single bool to all. Found by the options fuzzing round:
    they were called with the rows that had reached the step, so a batch-level criterion decided
    on part of the batch (both rows ran to max_new_tokens where transformers stopped them)."""
    target, draft = model_pair("llama")
    kinds = {"draft": dict(assistant_model=draft, num_assistant_tokens=3), "lookup": dict(prompt_lookup_num_tokens=2),
             "tree": dict(assistant_model=draft, tree=4)}
    for seed in (0, 5):
        ids, mask = left_padded_prompts([4, 7, 5], seed=seed + 50)
        plain = target.generate(ids, attention_mask=mask, max_new_tokens=16, do_sample=False, pad_token_id=0)
        token = int(plain[1, ids.shape[1] + 8])  # row 1's 9th token (maybe earlier in another row)
        kw = dict(max_new_tokens=16, do_sample=False, pad_token_id=0, eos_token_id=eos,
                  stopping_criteria=StoppingCriteriaList([_StopWhenAnyRow(token)]))
        theirs = target.generate(ids, attention_mask=mask, **kw)
        assert theirs.shape[1] < ids.shape[1] + 16, "the criterion stops transformers' call early"
        ours = specdec_fast.generate(target, ids, mask, **kinds[drafting], **kw)
        assert torch.equal(ours, theirs), (seed, ours[:, ids.shape[1]:].tolist(), theirs[:, ids.shape[1]:].tolist())


def test_control_criteria_shown_one_row_at_a_time_fail_the_batch_test(monkeypatch):
    """Control: a criterion that sees each row alone (what calling it with part of the batch
    amounts to) ends only the row that holds the token, where transformers ends every row."""
    from specdec_fast.engine import stopping

    original = stopping.HostStops.check

    def row_by_row(self, seq, gen_len, live=None):
        criteria, self.criteria = self.criteria, [
            lambda ids, scores, c=c: torch.cat([torch.as_tensor(c(ids[i:i + 1], scores)).reshape(-1)
                                                 for i in range(ids.shape[0])]) for c in self.criteria]
        try:
            return original(self, seq, gen_len, live)
        finally:
            self.criteria = criteria

    monkeypatch.setattr(stopping.HostStops, "check", row_by_row)
    with pytest.raises(AssertionError):
        test_a_criterion_that_judges_the_batch_sees_every_row_at_each_step("lookup", 1)


def test_more_eos_ids_than_the_decoder_holds_go_to_transformers():
    """transformers takes any number of EOS ids; a decoder holds EOS_SLOTS (8). A ninth is an
    UnsupportedOptionError, which a bound patch hands to transformers' generate with one warning."""
    from specdec_fast.engine.loop import EOS_SLOTS

    target, draft = model_pair("llama")
    ids, mask = left_padded_prompts([5, 3], seed=8)
    assert_handed_to_transformers(target, UnsupportedOptionError,
                                  f"at most {EOS_SLOTS} eos_token_id values are supported, got 9",
                                  dict(assistant_model=draft), ids, attention_mask=mask, do_sample=False, max_new_tokens=6,
                                  pad_token_id=0, eos_token_id=list(range(10, 10 + EOS_SLOTS + 1)))
