"""generate() with transformers' logits processors and the penalties (engine/logits_stage.py):
greedy output equals model.generate(do_sample=False, <option>) token for token (CPU fp32, paged
and hf runners, batch 1 and 3 with left padding, a draft model and prompt lookup); sampled
tokens follow the target's processed distribution (chi-square, every backend), with controls
that show the test catches a processor applied with the wrong prefix."""
import copy

import pytest
import torch
from transformers import GenerationConfig, LogitsProcessor, LogitsProcessorList
from transformers.generation import SynthIDTextWatermarkingConfig, WatermarkingConfig
from transformers.generation import logits_process as lp

import specdec_fast
import specdec_fast.api as api
from specdec_fast.engine import logits_stage
from specdec_fast.kernels import standardise
from specdec_fast.kernels.sampling_params import make_sampling_tensors
from specdec_fast.options.rules import UnsupportedOptionError
from specdec_fast.processing import pipeline, warpers

from tests.kernels.stats import P_VALUE_THRESHOLD, chi_square_pvalue

from .conftest import as_generate_takes, model_pair
from .models import left_padded_prompts, make_draft, make_model

NEW = 14


class VllmPenalties(LogitsProcessor):
    """frequency / presence penalties as vLLM applies them (generated tokens only), the oracle."""

    def __init__(self, prompt_width: int, frequency: float, presence: float):
        self.prompt_width, self.frequency, self.presence = prompt_width, frequency, presence

    def __call__(self, input_ids, scores):
        counts = torch.zeros_like(scores)
        generated = input_ids[:, self.prompt_width:]
        counts.scatter_add_(1, generated, torch.ones_like(generated, dtype=scores.dtype))
        return scores - self.frequency * counts - self.presence * (counts > 0).to(scores.dtype)


def allowed_after(batch_id: int, input_ids: torch.Tensor) -> list:
    """A prefix_allowed_tokens_fn that reads the row (batch_id) and its last token."""
    last = int(input_ids[-1])
    return [t for t in range(64) if (t + last + batch_id) % 3 == 0]


class BanEvenAfterOdd(LogitsProcessor):
    """A user's processor whose output depends on the last token of its input_ids."""

    def __call__(self, input_ids, scores):
        odd = (input_ids[:, -1] % 2 == 1)[:, None]
        even = (torch.arange(scores.shape[-1]) % 2 == 0)[None, :]
        return scores.masked_fill(odd & even, float("-inf"))


OPTIONS = {
    "repetition_penalty": dict(repetition_penalty=1.6),
    "no_repeat_ngram_size": dict(no_repeat_ngram_size=2),
    "min_new_tokens": dict(min_new_tokens=9, eos_token_id=[5, 9]),
    "min_length": dict(min_length=12, eos_token_id=5),
    "suppress_tokens": dict(suppress_tokens=[3, 4, 11]),
    "begin_suppress_tokens": dict(begin_suppress_tokens=[7, 8, 40]),
    "bad_words_ids": dict(bad_words_ids=[[6], [20, 21], [3, 3, 3]]),
    "sequence_bias": dict(sequence_bias={(9,): 4.0, (12, 13): 3.0, (5,): -5.0}),
    "chat": dict(repetition_penalty=1.3, min_new_tokens=6, no_repeat_ngram_size=3, suppress_tokens=[1],
                 eos_token_id=2),
    "logits_processor": dict(logits_processor=LogitsProcessorList([BanEvenAfterOdd()])),
    "forced_eos_token_id": dict(forced_eos_token_id=[9, 5]),
    "exponential_decay_length_penalty": dict(exponential_decay_length_penalty=(2, 1.8), eos_token_id=[5, 9]),
    "prefix_allowed_tokens_fn": dict(prefix_allowed_tokens_fn=allowed_after, repetition_penalty=1.2),
    # -inf from min_new_tokens becomes float32's lowest, suppress_tokens' stays -inf
    "remove_invalid_values": dict(remove_invalid_values=True, min_new_tokens=9, eos_token_id=[5, 9],
                                  suppress_tokens=[3], repetition_penalty=1.3),
    # after the penalty's slot, not masks: the penalties must run in their slot, not fused after them
    "decay_forced_and_penalty": dict(repetition_penalty=1.5, exponential_decay_length_penalty=(1, 2.5),
                                     forced_eos_token_id=9, eos_token_id=[5, 9]),
    # the prompt's tokens (left pads' pad token too) made likelier, before the repetition penalty
    "encoder_repetition_penalty": dict(encoder_repetition_penalty=1.8, repetition_penalty=1.3),
    "encoder_repetition_penalty_below_1": dict(encoder_repetition_penalty=0.6),
    "encoder_no_repeat_ngram_size": dict(encoder_no_repeat_ngram_size=1, no_repeat_ngram_size=2),
    # transformers' own processor, last (after the penalty: the penalty runs in its slot, not fused)
    "watermarking_config": dict(watermarking_config=WatermarkingConfig(bias=3.0), repetition_penalty=1.3),
    "watermark_selfhash": dict(watermarking_config=dict(seeding_scheme="selfhash", context_width=2, bias=2.5)),
}
EAGER = ("logits_processor", "prefix_allowed_tokens_fn", "watermarking_config")


def _drafting(kind, draft):
    return {"draft": dict(assistant_model=draft, num_assistant_tokens=3), "lookup": dict(prompt_lookup_num_tokens=3),
            "plain": {}}[kind]


@pytest.mark.parametrize("lengths", [[6], [5, 9, 3]])
@pytest.mark.parametrize("name", list(OPTIONS))
def test_greedy_equals_generate(name, lengths):
    target, draft = model_pair("llama")
    ids, mask = left_padded_prompts(lengths, seed=len(lengths) + 7)
    options = OPTIONS[name]
    expected = target.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=NEW, pad_token_id=0,
                               **as_generate_takes(options))
    for drafting in ("draft", "lookup", "plain"):
        for graphs in ("static", False):
            out, stats = api.generate(target, ids, mask, do_sample=False, max_new_tokens=NEW, pad_token_id=0,
                                      cuda_graphs=graphs, return_stats=True, **_drafting(drafting, draft), **options)
            assert torch.equal(out, expected), (drafting, graphs)
            eager = next((option for option in EAGER if option in options), None)
            if eager and graphs == "static":
                assert stats.graph_mode == "eager" and eager in (stats.graph_note or "")


@pytest.mark.parametrize("name", ["repetition_penalty", "chat", "logits_processor"])
def test_greedy_equals_generate_on_the_hf_runner(name):
    target, draft = model_pair("qwen2")
    ids, mask = left_padded_prompts([5, 9, 3], seed=3)
    options = OPTIONS[name]
    expected = target.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=NEW, pad_token_id=0, **options)
    out = api.generate(target, ids, mask, assistant_model=draft, do_sample=False, max_new_tokens=NEW, pad_token_id=0,
                       runner="hf", **options)
    assert torch.equal(out, expected)


def test_greedy_ignores_the_sampling_warpers_as_generate_does():
    """top_h, typical_p, epsilon_cutoff and eta_cutoff only warp sampling: with do_sample=False
    model.generate leaves them out, and so does the stage (the same tokens, a penalty beside)."""
    target, draft = model_pair("llama")
    ids, mask = left_padded_prompts([5, 9, 3], seed=4)
    options = dict(top_h=0.2, typical_p=0.5, epsilon_cutoff=0.05, eta_cutoff=0.05, repetition_penalty=1.3)
    expected = target.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=NEW, pad_token_id=0, **options)
    out = api.generate(target, ids, mask, assistant_model=draft, do_sample=False, max_new_tokens=NEW, pad_token_id=0,
                       **options)
    assert torch.equal(out, expected)


def test_frequency_and_presence_penalties_equal_vllms_rule():
    """Not transformers options: the oracle is model.generate with a processor written as vLLM
    applies them (generated tokens only), combined with transformers' repetition_penalty."""
    target, draft = model_pair("llama")
    ids, mask = left_padded_prompts([5, 9, 3], seed=4)
    oracle = LogitsProcessorList([VllmPenalties(ids.shape[1], 0.8, 0.6)])
    expected = target.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=NEW, pad_token_id=0,
                               repetition_penalty=1.2, logits_processor=oracle)
    for drafting in ("draft", "plain"):
        out = api.generate(target, ids, mask, do_sample=False, max_new_tokens=NEW, pad_token_id=0, repetition_penalty=1.2,
                           frequency_penalty=0.8, presence_penalty=0.6, cuda_graphs="static", **_drafting(drafting, draft))
        assert torch.equal(out, expected), drafting


def test_one_engine_serves_calls_with_processors_call_after_call():
    """Calls of other prompt widths and lengths on one engine reuse the decoder's graphs (the
    stage is re-filled in place) and still equal model.generate."""
    target, draft = model_pair("llama")
    engine = specdec_fast.SpeculativeEngine(target, draft, max_batch_size=4, max_seq_len=64, cuda_graphs="static")
    options = OPTIONS["chat"]
    for i, lengths in enumerate([[5, 9, 3], [2, 4], [11, 1, 6, 7], [3]]):
        ids, mask = left_padded_prompts(lengths, seed=20 + i)
        expected = target.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=NEW, pad_token_id=0,
                                   **options)
        out, stats = engine.generate(ids, mask, do_sample=False, max_new_tokens=NEW, pad_token_id=0, return_stats=True,
                                     **options)
        assert torch.equal(out, expected), lengths
        if i == 2:  # the bucket of 4 again (the first call's): its graphs are replayed
            assert stats.graphs_captured == 0


@pytest.mark.parametrize("option", [dict(min_new_tokens=4), dict(min_length=20),
                                    dict(exponential_decay_length_penalty=(0, 3.0)), dict(bad_words_ids=[[52], [9]])])
def test_one_engine_follows_each_call_s_eos_ids(option):
    """Found by the second fuzzing round: a decoder's stage built at a call with one EOS id served a
    later call with another and masked (or raised) the first call's EOS. The EOS ids are now part
    of the stage's key; each call equals model.generate."""
    target = make_model("llama", layers=3, seed=26)
    target.generation_config.eos_token_id = None
    ids = torch.tensor([[7, 126, 52, 7, 126, 52, 7, 126, 52, 7, 126]])  # greedy: 42, then 52
    for eos in (121, 52, [52, 121], 121):
        kw = dict(max_new_tokens=3, do_sample=False, pad_token_id=0, eos_token_id=eos, **option)
        expected = target.generate(ids, attention_mask=torch.ones_like(ids), **kw)
        assert torch.equal(specdec_fast.generate(target, ids, torch.ones_like(ids), **kw), expected), eos


def test_forced_eos_follows_each_call_s_max_new_tokens():
    """The forced position (the last one: P + max_new_tokens - 1) is re-filled per call on one
    engine's captured graphs, and max_length gives the same position as max_new_tokens."""
    target, draft = model_pair("llama")
    engine = specdec_fast.SpeculativeEngine(target, draft, max_batch_size=4, max_seq_len=64, cuda_graphs="static")
    for i, (lengths, new) in enumerate([([5, 9, 3], 14), ([5, 9, 3], 6), ([2, 4], 11)]):
        ids, mask = left_padded_prompts(lengths, seed=30 + i)
        expected = target.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=new, pad_token_id=0,
                                   forced_eos_token_id=9)
        assert (expected[:, -1] == 9).all()
        out = engine.generate(ids, mask, do_sample=False, max_new_tokens=new, pad_token_id=0, forced_eos_token_id=9)
        assert torch.equal(out, expected), (lengths, new)
        out = engine.generate(ids, mask, do_sample=False, max_length=ids.shape[1] + new, pad_token_id=0,
                              forced_eos_token_id=9)
        assert torch.equal(out, expected), (lengths, "max_length")


@pytest.mark.parametrize("extra_steps", [6, -2])
def test_forced_eos_sits_at_max_length_whatever_a_user_max_length_criterion_says(extra_steps):
    """transformers builds ForcedEOSTokenLogitsProcessor from generation_config.max_length even
    when a user's MaxLengthCriteria takes the built-in one's slot and ends the call elsewhere
    (longer: EOS forced mid-way, the rows go on; shorter: never forced). Found by the fuzzing helper."""
    from transformers.generation.stopping_criteria import MaxLengthCriteria, StoppingCriteriaList

    target, draft = model_pair("llama")
    ids, mask = left_padded_prompts([5, 9, 3], seed=8)
    criteria = StoppingCriteriaList([MaxLengthCriteria(ids.shape[1] + 6 + extra_steps)])
    kw = dict(do_sample=False, max_new_tokens=6, pad_token_id=0, forced_eos_token_id=9, stopping_criteria=criteria)
    expected = target.generate(ids, attention_mask=mask, **kw)
    assert expected.shape[1] == ids.shape[1] + 6 + extra_steps
    assert (expected[:, ids.shape[1] + 5] == 9).all() if extra_steps > 0 else not (expected == 9).all(0).any()
    for drafting in ("draft", "lookup"):
        assert torch.equal(api.generate(target, ids, mask, **_drafting(drafting, draft), **kw), expected), drafting


def test_encoder_no_repeat_ngram_size_bans_the_prompt_s_ngrams():
    """encoder_no_repeat_ngram_size = 2, 3 with a prompt the model would go on repeating (its own
    greedy text): equal to model.generate, which it changes."""
    target, draft = model_pair("llama")
    ids, mask = left_padded_prompts([5, 9, 3], seed=3)
    prompt = target.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=20, pad_token_id=0)
    prompt_mask = torch.cat([mask, torch.ones(3, 20, dtype=mask.dtype)], 1)
    plain = target.generate(prompt, attention_mask=prompt_mask, do_sample=False, max_new_tokens=NEW, pad_token_id=0)
    changed = []
    for n in (2, 3):
        kw = dict(do_sample=False, max_new_tokens=NEW, pad_token_id=0, encoder_no_repeat_ngram_size=n)
        expected = target.generate(prompt, attention_mask=prompt_mask, **kw)
        changed.append(not torch.equal(expected, plain))
        for drafting in ("draft", "lookup", "plain"):
            out = api.generate(target, prompt, prompt_mask, **_drafting(drafting, draft), **kw)
            assert torch.equal(out, expected), (n, drafting)
    assert any(changed)


def test_prefix_allowed_tokens_fn_groups_the_returned_sequences():
    """Sampling with num_return_sequences = 3: the fn is asked with batch_id = row // 3 (as
    transformers groups the expanded rows), never for a row beyond the batch, and every token it
    constrains obeys it."""
    target, draft = model_pair("llama")
    ids, mask = left_padded_prompts([4, 7], seed=6)
    asked = []

    def fn(batch_id, input_ids):
        asked.append(batch_id)
        return allowed_after(batch_id, input_ids)

    out = api.generate(target, ids, mask, assistant_model=draft, max_new_tokens=8, do_sample=True, temperature=1.0,
                       top_k=0, pad_token_id=0, seed=3, num_return_sequences=3, prefix_allowed_tokens_fn=fn)
    assert out.shape[0] == 6 and set(asked) == {0, 1}
    width = ids.shape[1]
    for row in range(6):
        for t in range(width, out.shape[1]):
            assert int(out[row, t]) in allowed_after(row // 3, out[row, :t]), (row, t)
    # control: the same rows checked against the wrong grouping (batch_id = row) fail somewhere
    assert any(int(out[row, t]) not in allowed_after(row, out[row, :t])
               for row in range(1, 6) for t in range(width, out.shape[1]))


def test_an_empty_allowed_list_raises_transformers_error():
    target, draft = model_pair("llama")
    ids, mask = left_padded_prompts([4], seed=1)
    with pytest.raises(ValueError, match="returned an empty list for batch ID 0"):
        api.generate(target, ids, mask, assistant_model=draft, max_new_tokens=4, prefix_allowed_tokens_fn=lambda b, i: [])


def test_a_greedy_tree_ignores_the_sampling_warpers_as_generate_does():
    """transformers' greedy generate neither builds nor checks the sampling warpers: a tree's greedy
    call with top_h equals it (tests/engine/test_tree_processors.py: trees with processors)."""
    target, draft = model_pair("llama")
    ids, mask = left_padded_prompts([4], seed=1)
    kw = dict(do_sample=False, max_new_tokens=6, pad_token_id=0)
    assert torch.equal(api.generate(target, ids, mask, assistant_model=draft, tree=True, top_h=0.5, **kw),
                       target.generate(ids, attention_mask=mask, **kw))


@pytest.mark.parametrize("bad", [dict(top_h=1.5), dict(typical_p=0.0), dict(epsilon_cutoff=-1.0), dict(eta_cutoff=2.0)])
def test_greedy_calls_ignore_the_sampling_warpers_values_as_generate_does(bad):
    """transformers' greedy generate neither builds nor checks the sampling warpers (found by the
    second fuzzing round: we raised there); a sampled call still raises, naming the option."""
    target, draft = model_pair("llama")
    ids, mask = left_padded_prompts([4, 6], seed=2)
    kw = dict(do_sample=False, max_new_tokens=6, pad_token_id=0, **bad)
    assert torch.equal(api.generate(target, ids, mask, assistant_model=draft, **kw),
                       target.generate(ids, attention_mask=mask, **kw))
    with pytest.raises(ValueError, match=next(iter(bad))):
        api.generate(target, ids, mask, assistant_model=draft, **dict(kw, do_sample=True))


# -- sampling: chi-square against the target's processed distribution ------------------------------
VOCAB, ROWS = 12, 2400
PROMPT = torch.tensor([[3, 7, 3, 9]])


@pytest.fixture(scope="module")
def sampling_pair():
    target = make_model("llama", vocab=VOCAB, init_std=0.5, seed=5)
    target.generation_config.eos_token_id = None
    return target, make_draft(target, noise=0.4, seed=6)


SAMPLED = {
    "repetition_penalty": dict(repetition_penalty=2.0),
    # no_repeat_ngram_size's -inf reach the kernels as float32's lowest: still probability 0
    "remove_invalid_values": dict(no_repeat_ngram_size=1, remove_invalid_values=True),
    "frequency_penalty": dict(frequency_penalty=1.5),
    "presence_penalty": dict(presence_penalty=1.5),
    "no_repeat_ngram_size": dict(no_repeat_ngram_size=1),
    "encoder_repetition_penalty": dict(encoder_repetition_penalty=2.0),
    # a warper the kernels lack: the stage standardises (top_h over V = 12 < its 100 candidates)
    "top_h": dict(top_h=0.6, repetition_penalty=1.5),
    # after the warpers: the stage standardises, then watermarks (bias 3 on 3 of the 12 tokens)
    "watermarking_config": dict(watermarking_config=WatermarkingConfig(bias=3.0), repetition_penalty=1.5),
}


def _processors(options: dict, prompt_width: int, rows: int) -> LogitsProcessorList:
    """transformers' processors as generate builds them for a batch of ``rows`` prefixes of PROMPT.
    The encoder penalty's ids are that batch's input_ids, one row per row: given the one-row
    PROMPT, transformers before 5.24 penalised the first row only (5.24's repeat_interleave
    broadcasts it), which is not what this test is about."""
    out = LogitsProcessorList()
    if "encoder_repetition_penalty" in options:  # generate builds it from the prompt (no encoder)
        out.append(lp.EncoderRepetitionPenaltyLogitsProcessor(options["encoder_repetition_penalty"],
                                                               PROMPT.expand(rows, -1)))
    if "repetition_penalty" in options:
        out.append(lp.RepetitionPenaltyLogitsProcessor(options["repetition_penalty"]))
    if "no_repeat_ngram_size" in options:
        out.append(lp.NoRepeatNGramLogitsProcessor(options["no_repeat_ngram_size"]))
    if options.get("remove_invalid_values"):
        out.append(lp.InfNanRemoveLogitsProcessor())
    if "frequency_penalty" in options or "presence_penalty" in options:
        out.append(VllmPenalties(prompt_width, options.get("frequency_penalty", 0.0), options.get("presence_penalty", 0.0)))
    if "top_h" in options:  # a warper: after every processor (temperature 1: no TemperatureLogitsWarper)
        out.append(lp.TopHLogitsWarper(options["top_h"]))
    if "watermarking_config" in options:  # last: after the warpers
        out.append(options["watermarking_config"].construct_processor(VOCAB, "cpu"))
    return out


def _probs(model, prefixes: torch.Tensor, options: dict, temperature: float) -> torch.Tensor:
    """The processed, standardised next-token distribution [N, V] after each prefix [N, T]."""
    with torch.no_grad():
        logits = model(prefixes).logits[:, -1, :].float()
    logits = _processors(options, PROMPT.shape[1], prefixes.shape[0])(prefixes, logits)
    params = make_sampling_tensors(prefixes.shape[0], "cpu", temperature=temperature)
    return torch.softmax(standardise(logits[:, None, :], params)[:, 0], -1).double()


def _check_three_tokens(model, new: torch.Tensor, options: dict, temperature: float) -> list:
    """p-values of (t1, t2) against the joint and of t3 against its marginal."""
    vocab = torch.arange(VOCAB)
    p1 = _probs(model, PROMPT, options, temperature)[0]
    p2 = _probs(model, torch.cat([PROMPT.expand(VOCAB, -1), vocab[:, None]], 1), options, temperature)
    joint12 = (p1[:, None] * p2).reshape(-1)
    grid = torch.cartesian_prod(vocab, vocab)
    p3 = (joint12[:, None] * _probs(model, torch.cat([PROMPT.expand(grid.shape[0], -1), grid], 1), options,
                                    temperature)).sum(0)
    return [chi_square_pvalue(new[:, 0] * VOCAB + new[:, 1], joint12), chi_square_pvalue(new[:, 2], p3)]


def _sample(pair, options, backend, rows=ROWS, drafting=None):
    """The new tokens [rows, 3] of one seeded sampled call; drafting: K = 2 (None) or e.g. a tree."""
    target, draft = pair
    drafting = dict(num_assistant_tokens=2) if drafting is None else drafting
    out, stats = api.generate(target, PROMPT.expand(rows, -1), assistant_model=draft, do_sample=True, temperature=1.0,
                              top_k=0, max_new_tokens=3, seed=11, backend=backend, return_stats=True, **drafting,
                              **options)
    assert 0.1 < stats.alpha < 0.95, f"alpha {stats.alpha}: the test needs both accepts and rejects"
    return out[:, PROMPT.shape[1]:]


@pytest.mark.parametrize("backend", ["torch", "cpp"])
@pytest.mark.parametrize("name", list(SAMPLED))
def test_sampled_tokens_follow_the_processed_distribution(sampling_pair, name, backend):
    options = SAMPLED[name]
    new = _sample(sampling_pair, options, backend)
    assert min(_check_three_tokens(sampling_pair[0], new, options, 1.0)) > P_VALUE_THRESHOLD


def test_the_interpreted_triton_kernels_sample_the_reference_tokens(sampling_pair):
    """The Triton path (TRITON_INTERPRET=1; compiled on a GPU): the same seeded rows give the
    torch reference's tokens, every penalty and the n-gram ban at once; the backends draw the
    same Philox numbers, so equal tokens mean the distribution the chi-square above checks. 12
    rows: the interpreter took 529 s for 900 rows of this call on the 2-core CI machine."""
    options = dict(repetition_penalty=1.5, frequency_penalty=0.7, presence_penalty=0.5, no_repeat_ngram_size=2)
    target, draft = sampling_pair
    if torch.cuda.is_available():  # compiled: both backends on the GPU (the same logits for both)
        target, draft = (copy.deepcopy(m).cuda() for m in sampling_pair)
    prompt = PROMPT.to(target.device)
    runs = [api.generate(target, prompt.expand(12, -1), assistant_model=draft, num_assistant_tokens=2, do_sample=True,
                         temperature=1.0, top_k=0, max_new_tokens=5, seed=11, backend=backend, **options)
            for backend in ("torch", "triton")]
    assert torch.equal(runs[0], runs[1])


def test_control_a_processor_that_ignores_the_drafts_before_its_position_fails(sampling_pair, monkeypatch):
    """The mistake the per-position rule prevents: processing every position with the prefix
    before the iteration's drafts. The same chi-square then rejects (so it would catch it)."""
    target = logits_stage.LogitsStage.target

    def without_drafts(self, logits, state, drafts):
        return target(self, logits, state, torch.full_like(drafts, -1))

    monkeypatch.setattr(logits_stage.LogitsStage, "target", without_drafts)
    options = SAMPLED["no_repeat_ngram_size"]
    new = _sample(sampling_pair, options, "torch")
    assert min(_check_three_tokens(sampling_pair[0], new, options, 1.0)) < 1e-6


def test_control_top_h_left_out_fails(sampling_pair, monkeypatch):
    """top_h's check catches a stage that skips the warper (the oracle still applies it): it
    samples tokens the oracle gives probability 0, which chi_square_pvalue refuses."""
    monkeypatch.setattr(warpers, "top_h_", lambda scores, top_h: scores)
    options = SAMPLED["top_h"]
    new = _sample(sampling_pair, options, "torch")
    with pytest.raises(AssertionError, match="sampled tokens of zero probability"):
        _check_three_tokens(sampling_pair[0], new, options, 1.0)


def test_control_an_encoder_penalty_over_the_generated_tokens_too_fails(sampling_pair, monkeypatch):
    """encoder_repetition_penalty's chi-square catches a stage that scales the generated tokens
    (and drafts) too, not only the prompt's."""
    from specdec_fast.processing.encoder_penalty import EncoderRepetitionPenalty

    def every_token(self, prefixes, vocab_size):
        mask = torch.zeros(prefixes.seq.shape[0], vocab_size + 1, dtype=torch.bool)
        seen = torch.cat([prefixes.seq, prefixes.drafts], 1).clamp(min=0)
        return mask.scatter_(1, seen, True)[:, :vocab_size]

    monkeypatch.setattr(EncoderRepetitionPenalty, "prompt_columns", every_token)
    options = SAMPLED["encoder_repetition_penalty"]
    new = _sample(sampling_pair, options, "torch")
    assert min(_check_three_tokens(sampling_pair[0], new, options, 1.0)) < 1e-6


def test_control_the_watermark_left_out_fails(sampling_pair, monkeypatch):
    """The watermark's chi-square catches a stage that leaves it out (the oracle still adds it)."""
    monkeypatch.setattr(pipeline, "watermark_stage", lambda *args: None)
    options = SAMPLED["watermarking_config"]
    new = _sample(sampling_pair, options, "torch")
    assert min(_check_three_tokens(sampling_pair[0], new, options, 1.0)) < 1e-6


def test_synthid_watermarking_is_refused_and_the_patch_hands_it_to_transformers():
    """SynthID's processor keeps state from step to step: refused before the call, by one line
    naming the option (a keyword, or a generation_config holding its dict); under patch_generate
    the call goes to transformers' generate, which watermarks it."""
    target, draft = model_pair("llama")
    ids, mask = left_padded_prompts([5, 9, 3], seed=3)
    synthid = SynthIDTextWatermarkingConfig(ngram_len=3, keys=[11, 12, 13, 14])
    for kw in (dict(watermarking_config=synthid), dict(generation_config=GenerationConfig(watermarking_config=synthid))):
        with pytest.raises(UnsupportedOptionError, match="^unsupported generate option watermarking_config=.*SynthID"):
            api.generate(target, ids, mask, assistant_model=draft, max_new_tokens=NEW, pad_token_id=0, **kw)
    kw = dict(do_sample=False, max_new_tokens=NEW, pad_token_id=0, watermarking_config=synthid)
    expected = target.generate(ids, attention_mask=mask, **kw)
    patched = copy.deepcopy(target)
    specdec_fast.patch_generate(patched, assistant_model=draft)
    with pytest.warns(UserWarning, match="watermarking_config"):
        out = patched.generate(ids, attention_mask=mask, **kw)
    assert torch.equal(out, expected)


def test_control_penalties_that_miss_the_generated_tokens_fail(sampling_pair, monkeypatch):
    """The fused penalty's state must grow with every appended token: without the update the
    chi-square rejects."""
    monkeypatch.setattr(logits_stage.LogitsStage, "appended", lambda self, tokens, emitted: None)
    options = SAMPLED["repetition_penalty"]
    new = _sample(sampling_pair, options, "torch")
    assert min(_check_three_tokens(sampling_pair[0], new, options, 1.0)) < 1e-6


class Identity(LogitsProcessor):
    """A user processor that changes nothing: it moves the penalties off the fused kernel path."""

    def __call__(self, input_ids, scores):
        return scores


@pytest.mark.parametrize("path", ["fused", "processing"])
def test_repetition_penalty_counts_pads_where_the_installed_generate_does(monkeypatch, path):
    """transformers 5.23+'s generate() keeps left pads out of the repetition penalty, 5.22's counts
    them as the pad token (processing/penalties.py generate_skips_prompt_pads). Unpatched, our
    tokens equal the installed generate's; with the older rule forced, those of generate with the
    processor built without prompt_ignore_length (what 5.22 builds); the two rules give other
    tokens here (so the test can tell them apart)."""
    target, draft = model_pair("llama")
    ids, mask = left_padded_prompts([3, 12, 6], seed=8)
    with torch.no_grad():  # pad with the token the target would say next for row 0: penalising it shows
        favourite = int(target(ids[:1, -3:]).logits[0, -1].argmax())
    ids = ids.masked_fill(mask == 0, favourite)
    user = LogitsProcessorList([Identity()] if path == "processing" else [])
    installed = target.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=NEW, pad_token_id=0,
                                repetition_penalty=3.0, logits_processor=user)
    counting = target.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=NEW, pad_token_id=0,
                               logits_processor=LogitsProcessorList([lp.RepetitionPenaltyLogitsProcessor(3.0), *user]))
    kw = dict(assistant_model=draft, num_assistant_tokens=3, do_sample=False, max_new_tokens=NEW, pad_token_id=0,
              repetition_penalty=3.0, **({"logits_processor": user} if user else {}))
    assert torch.equal(api.generate(target, ids, mask, **kw), installed)
    runs = {}
    for rule in (True, False):
        monkeypatch.setattr(logits_stage, "generate_skips_prompt_pads", lambda rule=rule: rule)
        specdec_fast.release_engines(target)
        runs[rule] = api.generate(target, ids, mask, **kw)
    assert torch.equal(runs[False], counting)
    assert not torch.equal(runs[True], runs[False]), "pads counted or not must show in these tokens"


@pytest.mark.parametrize("backend", ["torch", "cpp"])
def test_sampled_exponential_decay_follows_the_processed_distribution(sampling_pair, backend):
    """exponential_decay_length_penalty=(0, 3): the second token's EOS logit s becomes s + 2|s|
    (not the first's); a row that draws EOS first stops (its second slot holds the pad, here EOS
    itself, a pair no other way gives). Chi-square of (t1, t2) against transformers' processor over
    the target's distribution; control: the first token's distribution decayed as well fails."""
    target, draft = sampling_pair
    eos = 5
    decay = lp.ExponentialDecayLengthPenalty((0, 3.0), [eos], PROMPT.shape[1])
    out, stats = api.generate(target, PROMPT.expand(ROWS, -1), assistant_model=draft, num_assistant_tokens=2,
                              do_sample=True, temperature=1.0, top_k=0, max_new_tokens=2, seed=11, backend=backend,
                              pad_token_id=eos, eos_token_id=[eos], exponential_decay_length_penalty=(0, 3.0),
                              return_stats=True)
    assert 0.1 < stats.alpha < 0.95, f"alpha {stats.alpha}: the test needs both accepts and rejects"
    new = out[:, PROMPT.shape[1]:]

    def probs(prefixes, first_too=False):
        with torch.no_grad():
            logits = target(prefixes).logits[:, -1, :].float()
        if first_too:  # the control: decayed as if one step later
            logits = lp.ExponentialDecayLengthPenalty((0, 3.0), [eos], PROMPT.shape[1] - 1)(prefixes, logits)
        return torch.softmax(decay(prefixes, logits), -1).double()

    def joint(first_too=False):
        vocab = torch.arange(VOCAB)
        p1 = probs(PROMPT, first_too)[0]
        pairs = p1[:, None] * probs(torch.cat([PROMPT.expand(VOCAB, -1), vocab[:, None]], 1))
        pairs[eos] = 0
        pairs[eos, eos] = p1[eos]  # EOS first: the row stops, its pad is EOS
        return pairs.reshape(-1)

    observed = new[:, 0] * VOCAB + new[:, 1]
    assert (new[:, 0] == eos).any() and (new[:, 1] == eos).any()
    assert chi_square_pvalue(observed, joint()) > P_VALUE_THRESHOLD
    assert chi_square_pvalue(observed, joint(first_too=True)) < P_VALUE_THRESHOLD


def test_a_bound_tree_speculates_with_a_checkpoint_s_repetition_penalty():
    """patch_generate(model, assistant_model=draft, tree=...) in a harness whose calls carry a
    checkpoint's repetition_penalty (Qwen2.5 Instruct ships 1.05): the call speculates on the
    tree (no fallback) and equals model.generate. Before, trees took no processors and such calls
    ran on transformers' generate."""
    from specdec_fast.drafters.token_tree import TokenTree

    target, draft = model_pair("llama")
    ids, mask = left_padded_prompts([5, 3], seed=2)
    kw = dict(attention_mask=mask, do_sample=False, max_new_tokens=6, pad_token_id=0, repetition_penalty=1.05)
    with specdec_fast.patch_generate(target, assistant_model=draft, tree=TokenTree.from_branching([2, 1]),
                                     fallback="raise") as patched:
        patched.specdec_last_stats = None
        assert torch.equal(patched.generate(ids, **kw), target.generate(ids, **kw))
        assert patched.specdec_last_stats is not None and patched.specdec_last_stats.extra.get("tree")
