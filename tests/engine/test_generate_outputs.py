"""generate()'s outputs beyond the tokens (specdec_fast/engine/outputs.py): return_dict_in_generate
with output_scores / output_logits equal model.generate's at every step (fp32 tolerance), and
num_return_sequences (rows expanded as transformers expands them, each its own random stream)."""
import copy

import pytest
import torch
from transformers.generation import WatermarkingConfig

import specdec_fast
import specdec_fast.api as api
from specdec_fast.engine import logits_stage, outputs
from specdec_fast.processing.penalties import generate_skips_prompt_pads

from .conftest import as_generate_takes, model_pair
from .models import left_padded_prompts

NEW = 10


def _both(target, draft, ids, mask, **options):
    kw = dict(max_new_tokens=NEW, pad_token_id=0, output_scores=True, output_logits=True, return_dict_in_generate=True,
              **options)
    ours = api.generate(target, ids, mask, assistant_model=draft, **kw)
    theirs = target.generate(ids, attention_mask=mask,
                             **as_generate_takes({k: v for k, v in kw.items() if k != "seed"}))
    return ours, theirs


def _assert_steps_equal(ours, theirs):
    assert torch.equal(ours.sequences, theirs.sequences)
    assert len(ours.scores) == len(theirs.scores) == len(ours.logits) == len(theirs.logits)
    for mine, hf in zip(ours.logits, theirs.logits):
        torch.testing.assert_close(mine, hf, atol=1e-4, rtol=1e-4)
    for mine, hf in zip(ours.scores, theirs.scores):
        assert mine.dtype == hf.dtype == torch.float32 and mine.shape == hf.shape
        assert torch.equal(torch.isinf(mine), torch.isinf(hf))
        finite = torch.isfinite(hf)
        torch.testing.assert_close(mine[finite], hf[finite], atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("lengths", [[6], [5, 9, 3]])
@pytest.mark.parametrize("options", [{}, dict(repetition_penalty=1.3, no_repeat_ngram_size=2, min_new_tokens=4),
                                     dict(eos_token_id=5),
                                     dict(forced_eos_token_id=7, exponential_decay_length_penalty=(3, 1.5),
                                          eos_token_id=[5, 7]),
                                     dict(prefix_allowed_tokens_fn=lambda batch_id, ids: list(range(batch_id, 64, 2))),
                                     dict(watermarking_config=WatermarkingConfig(bias=2.5), repetition_penalty=1.2)],
                         ids=["plain", "processors", "eos", "forced_eos_decay", "prefix_allowed", "watermark"])
def test_greedy_scores_and_logits_equal_generate(lengths, options):
    target, draft = model_pair("llama")
    ids, mask = left_padded_prompts(lengths, seed=len(lengths))
    if options.get("min_new_tokens"):
        options = dict(options, eos_token_id=5)
    ours, theirs = _both(target, draft, ids, mask, do_sample=False, **options)
    _assert_steps_equal(ours, theirs)


@pytest.mark.parametrize("extra", [{}, dict(top_h=0.6), dict(watermarking_config=WatermarkingConfig(bias=3.0)),
                                   dict(top_h=0.6, watermarking_config=dict(seeding_scheme="selfhash", bias=2.0))],
                         ids=["kernel_warpers", "top_h", "watermark", "top_h_selfhash_watermark"])
def test_sampled_scores_are_after_the_warpers(extra):
    """top_k = 1 sampling is deterministic, so model.generate's steps are ours: its scores hold the
    warpers' -inf and the temperature (0.7) as ours do; top_h (before top_k) and the watermark
    (after every warper: a bias on the one finite score) as well."""
    target, draft = model_pair("llama")
    ids, mask = left_padded_prompts([5, 9, 3], seed=3)
    ours, theirs = _both(target, draft, ids, mask, do_sample=True, top_k=1, temperature=0.7, repetition_penalty=1.2,
                         seed=4, **extra)
    _assert_steps_equal(ours, theirs)
    assert all(int(torch.isfinite(s).sum()) == 3 for s in ours.scores)  # one token per row survives top_k = 1


@pytest.mark.parametrize("sampling", [dict(do_sample=False, repetition_penalty=1.3),
                                      dict(do_sample=True, top_k=1, temperature=0.7, seed=4)], ids=["greedy", "sampled"])
def test_renormalize_logits_gives_log_softmax_scores_and_the_same_tokens(sampling):
    """renormalize_logits: transformers' LogitNormalization (log-softmax after every processor and
    warper) in the scores; the tokens are the call's without it. Control: the scores differ from
    the call's without it (so the comparison with model.generate's reads the normalisation)."""
    target, draft = model_pair("llama")
    ids, mask = left_padded_prompts([5, 9, 3], seed=7)
    ours, theirs = _both(target, draft, ids, mask, renormalize_logits=True, **sampling)
    _assert_steps_equal(ours, theirs)
    plain, _ = _both(target, draft, ids, mask, **sampling)
    assert torch.equal(plain.sequences, ours.sequences)
    finite = torch.isfinite(ours.scores[0])
    assert not torch.allclose(plain.scores[0][finite], ours.scores[0][finite])
    for step in ours.scores:  # each row a log-distribution
        torch.testing.assert_close(step.exp().sum(-1), torch.ones(step.shape[0]), atol=1e-5, rtol=0)


def test_scores_count_pads_where_the_installed_generate_does(monkeypatch):
    """repetition_penalty's scores follow the installed transformers' rule for left pads, as the
    tokens do (processing/penalties.py generate_skips_prompt_pads): 5.23 and later skip them, 5.22
    and earlier penalise the pad token. Unpatched, and with the installed rule forced: the installed
    generate's scores. With the older rule forced: those of generate with the processor built
    without prompt_ignore_length (what 5.22 builds). Control: the two rules' scores differ here
    (the pads hold a token the rows see)."""
    target, draft = model_pair("llama")
    ids, mask = left_padded_prompts([3, 12, 6], seed=8)
    with torch.no_grad():  # pads hold the token the target would say next for row 0: penalising it shows
        favourite = int(target(ids[:1, -3:]).logits[0, -1].argmax())
    ids = ids.masked_fill(mask == 0, favourite)
    installed = _both(target, draft, ids, mask, do_sample=False, repetition_penalty=3.0)
    _assert_steps_equal(*installed)
    from transformers import LogitsProcessorList
    from transformers.generation.logits_process import RepetitionPenaltyLogitsProcessor

    counting = target.generate(ids, attention_mask=mask, max_new_tokens=NEW, pad_token_id=0, do_sample=False,
                               output_scores=True, output_logits=True, return_dict_in_generate=True,
                               logits_processor=LogitsProcessorList([RepetitionPenaltyLogitsProcessor(3.0)]))
    runs = {}
    for rule in (True, False):
        for module in (logits_stage, outputs):
            monkeypatch.setattr(module, "generate_skips_prompt_pads", lambda rule=rule: rule)
        specdec_fast.release_engines(target)
        runs[rule], _ = _both(target, draft, ids, mask, do_sample=False, repetition_penalty=3.0)
    _assert_steps_equal(runs[False], counting)
    _assert_steps_equal(runs[generate_skips_prompt_pads()], installed[1])
    assert not all(torch.equal(a, b) for a, b in zip(runs[True].scores, runs[False].scores)), "the rules must differ"


def test_a_dict_without_scores_and_plain_tokens_without_the_dict():
    target, draft = model_pair("llama")
    ids, mask = left_padded_prompts([4, 6], seed=5)
    kw = dict(assistant_model=draft, max_new_tokens=6, do_sample=False, pad_token_id=0)
    out = api.generate(target, ids, mask, return_dict_in_generate=True, **kw)
    assert out.scores is None and out.logits is None
    assert torch.equal(out.sequences, api.generate(target, ids, mask, output_scores=True, **kw))


def test_num_return_sequences_expands_rows_with_their_own_streams():
    target, draft = model_pair("llama")
    ids, mask = left_padded_prompts([4, 7], seed=6)
    kw = dict(assistant_model=draft, max_new_tokens=8, do_sample=True, temperature=1.0, top_k=0, pad_token_id=0, seed=9)
    out = api.generate(target, ids, mask, num_return_sequences=3, **kw)
    assert out.shape[0] == 6
    # What transformers' expansion gives: each row three times in a row, decoded as rows of their own.
    assert torch.equal(out, api.generate(target, ids.repeat_interleave(3, 0), mask.repeat_interleave(3, 0), **kw))
    assert len({tuple(r) for r in out[:3].tolist()}) > 1, "copies of one prompt draw their own streams"
    with pytest.raises(ValueError, match="Greedy methods without beam search do not support `num_return_sequences`"):
        api.generate(target, ids, mask, num_return_sequences=2, assistant_model=draft, do_sample=False, max_new_tokens=4)


def _assert_states_equal(ours, theirs, field: str, width: int):
    """Per step (one per generated token), per layer: the same shapes, values within fp32 rounding."""
    mine, hf = getattr(ours, field), getattr(theirs, field)
    assert mine is not None and len(mine) == len(hf) == ours.sequences.shape[1] - width
    for step, (a, b) in enumerate(zip(mine, hf)):
        assert len(a) == len(b), (field, step)
        for x, y in zip(a, b):
            assert x.shape == y.shape and x.dtype == y.dtype, (field, step, x.shape, y.shape)
            torch.testing.assert_close(x, y, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
@pytest.mark.parametrize("lengths", [[6], [5, 9, 3]])
def test_hidden_states_and_attentions_equal_generate(attention, lengths):
    """output_hidden_states / output_attentions per step and layer as model.generate returns them:
    step 0 the prompt (its left pads too), then one position per step, rows that stop at EOS
    padded; sdpa gives no attentions (empty tuples, as in generate), eager gives them."""
    target, draft = model_pair("llama")
    if attention == "eager":
        target = copy.deepcopy(target)
        target.set_attn_implementation("eager")
    ids, mask = left_padded_prompts(lengths, seed=len(lengths) + 11)
    ours, theirs = _both(target, draft, ids, mask, do_sample=False, eos_token_id=5, output_hidden_states=True,
                         output_attentions=True)
    _assert_steps_equal(ours, theirs)
    _assert_states_equal(ours, theirs, "hidden_states", ids.shape[1])
    _assert_states_equal(ours, theirs, "attentions", ids.shape[1])
    assert len(ours.hidden_states[0]) == target.config.num_hidden_layers + 1
    assert ours.hidden_states[0][0].shape[1] == ids.shape[1] and ours.hidden_states[-1][0].shape[1] == 1
    assert all(len(step) == (target.config.num_hidden_layers if attention == "eager" else 0) for step in ours.attentions)


def test_hidden_states_of_sampled_rows_and_returned_sequences():
    """top_k = 1 sampling (deterministic) with num_return_sequences = 2: the expanded rows' states
    equal generate's; hidden states alone leave attentions None."""
    target, draft = model_pair("llama")
    ids, mask = left_padded_prompts([5, 9, 3], seed=3)
    ours, theirs = _both(target, draft, ids, mask, do_sample=True, top_k=1, num_return_sequences=2, seed=4,
                         output_hidden_states=True)
    assert ours.sequences.shape[0] == 6
    _assert_steps_equal(ours, theirs)
    _assert_states_equal(ours, theirs, "hidden_states", ids.shape[1])
    assert ours.attentions is None and theirs.attentions is None


def test_control_one_forward_gives_other_values_at_the_prompt_pads():
    """Why the prompt gets its own forward: one forward of the whole sequence computes the left
    pads' positions (queries that see no key) otherwise than generate's prefill does, in eager
    attention; so hidden states read from it differ from generate's there."""
    target, _ = model_pair("llama")
    target = copy.deepcopy(target)
    target.set_attn_implementation("eager")
    ids, mask = left_padded_prompts([5, 9, 3], seed=3)
    theirs = target.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=4, pad_token_id=0,
                             output_hidden_states=True, return_dict_in_generate=True)
    full = torch.cat([mask, torch.ones(3, 3, dtype=mask.dtype)], 1)
    with torch.no_grad():
        one = target(input_ids=theirs.sequences[:, :-1], attention_mask=full,
                     position_ids=(full.cumsum(-1) - 1).clamp(min=0), output_hidden_states=True).hidden_states
    width = ids.shape[1]
    pads = mask == 0
    assert pads.any()
    assert not torch.allclose(one[-1][:, :width][pads], theirs.hidden_states[0][-1][pads], atol=1e-3)
    torch.testing.assert_close(one[-1][:, :width][~pads], theirs.hidden_states[0][-1][~pads], atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("with_cache", [False, True])
def test_the_outputs_carry_no_autograd_graph(with_cache):
    """Scores, logits, hidden states and the returned cache hold no autograd graph, as generate's (it runs under
    no_grad): the forwards after the loop run under no_grad whichever path runs them (output_dict's own, or a
    caller's cache extended by user_cache.extend_user_cache). Found in review: a decorator moved with a new
    function left step_forwards without it (scores with requires_grad=True, the graph kept alive)."""
    from transformers import DynamicCache

    target, draft = model_pair("llama")
    ids, mask = left_padded_prompts([5, 7], seed=1)
    extra = {"cache": DynamicCache(config=target.config)} if with_cache else {}
    out = api.generate(target, ids, mask, assistant_model=draft, max_new_tokens=4, do_sample=False, pad_token_id=0,
                       return_dict_in_generate=True, output_scores=True, output_logits=True, output_hidden_states=True,
                       **extra)
    tensors = [*out.scores, *out.logits, *(h for step in out.hidden_states for h in step)]
    cache = getattr(out, "cache", None) or getattr(out, "past_key_values", None)
    tensors += [layer.keys for layer in cache.layers]
    assert tensors and not any(t.requires_grad for t in tensors)
