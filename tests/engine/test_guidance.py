"""generate(guidance_scale=..., negative_prompt_ids=..., negative_prompt_attention_mask=...):
classifier-free guidance (specdec_fast/processing/guidance.py), transformers'
UnbatchedClassifierFreeGuidanceLogitsProcessor at every speculative position of the target.
Greedy tokens and output scores equal model.generate's; top_k = 1 sampling too; sampled tokens
follow the guided distribution (chi-square against transformers' own processor, with a control
that leaves the target unguided); bad inputs raise one line."""
import pytest
import torch
from transformers.generation import logits_process as lp

import specdec_fast
import specdec_fast.api as api
from specdec_fast.engine import logits_stage
from specdec_fast.options.rules import option_class

from tests.kernels.stats import P_VALUE_THRESHOLD, chi_square_pvalue

from .conftest import model_pair
from .models import left_padded_prompts, make_draft, make_model

NEW = 10
DRAFTING = {"draft": lambda draft: dict(assistant_model=draft), "lookup": lambda draft: dict(prompt_lookup_num_tokens=3),
            "plain": lambda draft: {}}


def _negative(rows: int, padded: bool):
    ids, mask = left_padded_prompts([3, 5, 2][:rows] if padded else [4] * rows, seed=7)
    return dict(negative_prompt_ids=ids, negative_prompt_attention_mask=mask)


GUIDANCE = {
    "last_token": lambda rows: dict(guidance_scale=1.5),
    "negative_prompt": lambda rows: dict(guidance_scale=2.0, **_negative(rows, padded=False)),
    "padded_negative_prompt": lambda rows: dict(guidance_scale=3.0, **_negative(rows, padded=True)),
    "below_one": lambda rows: dict(guidance_scale=0.5, negative_prompt_ids=_negative(rows, False)["negative_prompt_ids"]),
}


@pytest.mark.parametrize("lengths", [[6], [6, 9, 4]])
@pytest.mark.parametrize("drafting", list(DRAFTING))
@pytest.mark.parametrize("guidance", list(GUIDANCE))
def test_greedy_equals_generate(guidance, drafting, lengths):
    target, draft = model_pair("llama")
    ids, mask = left_padded_prompts(lengths, seed=len(lengths) + 40)
    kw = dict(max_new_tokens=NEW, do_sample=False, pad_token_id=0, eos_token_id=5, **GUIDANCE[guidance](len(lengths)))
    out, stats = api.generate(target, ids, mask, return_stats=True, **kw, **DRAFTING[drafting](draft))
    assert torch.equal(out, target.generate(ids, attention_mask=mask, **kw))


@pytest.mark.parametrize("sampled", [False, True], ids=["greedy", "top_k_1"])
def test_scores_equal_generate(sampled):
    """The output scores are the guided ones (processed per step with the guidance first, then a
    repetition penalty on the log-probabilities, as transformers orders them); top_k = 1 sampling
    is deterministic, so model.generate's tokens are ours there too."""
    target, draft = model_pair("llama")
    ids, mask = left_padded_prompts([6, 9, 4], seed=43)
    kw = dict(max_new_tokens=NEW, pad_token_id=0, output_scores=True, return_dict_in_generate=True,
              repetition_penalty=1.3, **GUIDANCE["padded_negative_prompt"](3))
    kw.update(dict(do_sample=True, top_k=1, temperature=0.7) if sampled else dict(do_sample=False))
    theirs = target.generate(ids, attention_mask=mask, **kw)
    ours = api.generate(target, ids, mask, assistant_model=draft, seed=3, **kw)
    assert torch.equal(ours.sequences, theirs.sequences)
    for mine, hf in zip(ours.scores, theirs.scores):
        finite = torch.isfinite(hf)
        assert torch.equal(torch.isfinite(mine), finite)
        torch.testing.assert_close(mine[finite], hf[finite], atol=1e-4, rtol=1e-4)


VOCAB, ROWS, PROMPT, SCALE = 12, 1500, torch.tensor([[3, 7, 3, 9]]), 2.5


@pytest.fixture(scope="module")
def sampling_pair():
    target = make_model("llama", vocab=VOCAB, init_std=0.5, seed=5)
    target.generation_config.eos_token_id = None
    return target, make_draft(target, noise=0.4, seed=6)


def _guided_probs(model, prefix: torch.Tensor) -> torch.Tensor:
    """transformers' guided next-token distribution after prefix [1, T] (T >= P): its processor
    fed step by step from the prompt on, as generate feeds it."""
    processor = lp.UnbatchedClassifierFreeGuidanceLogitsProcessor(SCALE, model)
    with torch.no_grad():
        for width in range(PROMPT.shape[1], prefix.shape[1] + 1):
            scores = processor(prefix[:, :width], model(prefix[:, :width]).logits[:, -1].float())
    return torch.softmax(scores[0], -1).double()


def _first_two_pvalue(model, new: torch.Tensor) -> float:
    p1 = _guided_probs(model, PROMPT)
    p2 = torch.stack([_guided_probs(model, torch.cat([PROMPT, torch.tensor([[t]])], 1)) for t in range(VOCAB)])
    return chi_square_pvalue(new[:, 0] * VOCAB + new[:, 1], (p1[:, None] * p2).reshape(-1))


def _sample(pair):
    target, draft = pair
    out, stats = api.generate(target, PROMPT.expand(ROWS, -1), assistant_model=draft, num_assistant_tokens=2,
                              do_sample=True, temperature=1.0, top_k=0, max_new_tokens=2, seed=13,
                              guidance_scale=SCALE, return_stats=True)
    assert 0.1 < stats.alpha < 0.95, f"alpha {stats.alpha}: the test needs both accepts and rejects"
    return out[:, PROMPT.shape[1]:]


def test_sampled_tokens_follow_the_guided_distribution(sampling_pair):
    assert _first_two_pvalue(sampling_pair[0], _sample(sampling_pair)) > P_VALUE_THRESHOLD


def test_control_an_unguided_target_fails(sampling_pair, monkeypatch):
    """The same check catches a verify that samples the unguided target (the draft is unguided
    anyway): its first two tokens follow the plain distribution."""
    target = logits_stage.LogitsStage.target

    def unguided(self, logits, state, drafts):
        guidance, self.processing.guidance = self.processing.guidance, None
        try:
            return target(self, logits, state, drafts)
        finally:
            self.processing.guidance = guidance

    monkeypatch.setattr(logits_stage.LogitsStage, "target", unguided)
    assert _first_two_pvalue(sampling_pair[0], _sample(sampling_pair)) < 1e-6


def test_a_patched_model_speculates_with_guidance():
    target, draft = model_pair("llama")
    ids, mask = left_padded_prompts([6, 9], seed=44)
    kw = dict(max_new_tokens=NEW, do_sample=False, pad_token_id=0, guidance_scale=1.5)
    expected = target.generate(ids, attention_mask=mask, **kw)
    with specdec_fast.patch_generate(target, assistant_model=draft) as model:
        out = model.generate(ids, attention_mask=mask, **kw)
        assert torch.equal(out, expected) and model.specdec_last_stats.k > 0
    _, stats = api.generate(target, ids, mask, assistant_model=draft, cuda_graphs="static", return_stats=True, **kw)
    assert stats.graph_mode == "eager" and "guidance_scale" in stats.graph_note  # the graph path says why not


@pytest.mark.parametrize("case", ["rows", "return_sequences", "mask_shape", "mask_values", "ids_type", "scale_type",
                                  "tree"])
def test_bad_inputs_raise_one_line(case):
    target, draft = model_pair("llama")
    ids, mask = left_padded_prompts([6, 9], seed=45)
    negative = _negative(2, padded=True)
    calls = {
        "rows": ("has 3 rows and input_ids 2", dict(negative_prompt_ids=torch.zeros(3, 2, dtype=torch.long))),
        "return_sequences": ("num_return_sequences=2", dict(negative, do_sample=True, num_return_sequences=2)),
        "mask_shape": ("shaped as negative_prompt_ids", dict(negative, negative_prompt_attention_mask=torch.ones(2, 9))),
        "mask_values": ("only 0 and 1", dict(negative, negative_prompt_attention_mask=2 * negative[
            "negative_prompt_attention_mask"])),
        "ids_type": ("int tensor", dict(negative_prompt_ids=[[1, 2], [3, 4]])),
        "scale_type": ("guidance_scale must be a number", dict(guidance_scale="high")),
        "tree": ("guidance_scale", dict(tree=True)),
    }
    words, options = calls[case]
    options = dict(dict(guidance_scale=1.5), **options)
    with pytest.raises(ValueError, match=words) as info:
        api.generate(target, ids, mask, assistant_model=draft, max_new_tokens=4, pad_token_id=0, **options)
    assert "\n" not in str(info.value)


def test_the_rule_takes_guidance_and_a_scale_of_one_builds_nothing():
    """transformers builds no guidance at guidance_scale 1 and ignores a negative prompt then: the
    call has no logits stage at all (graph safe, the same tokens as without)."""
    assert {option_class(n) for n in ("guidance_scale", "negative_prompt_ids", "negative_prompt_attention_mask")} == {
        "handled"}
    target, draft = model_pair("llama")
    ids, mask = left_padded_prompts([6, 9], seed=46)
    kw = dict(max_new_tokens=NEW, do_sample=False, pad_token_id=0)
    out, stats = api.generate(target, ids, mask, assistant_model=draft, guidance_scale=1.0, return_stats=True,
                              negative_prompt_ids=torch.zeros(5, 1, dtype=torch.long), **kw)
    assert torch.equal(out, target.generate(ids, attention_mask=mask, **kw))
