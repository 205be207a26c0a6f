"""Sampling through the engine follows the target's standardised distribution (chi-square).

One batch of N identical prompts with one int seed: every row has its own random streams
(derive_row_seeds), so the N rows are N independent runs. Tokens 2 and 3 come from the first
speculative block (K = 2: accepted drafts, residual samples and bonus tokens all occur).
"""
import pytest
import torch

import specdec_fast.api as api
from specdec_fast.kernels import standardise
from specdec_fast.kernels.sampling_params import make_sampling_tensors

from tests.kernels.stats import P_VALUE_THRESHOLD, chi_square_pvalue

from .models import make_draft, make_model

VOCAB = 12
ROWS = 3000
PROMPT = torch.tensor([[3, 7, 5, 9]])


@pytest.fixture(scope="module")
def pair():
    target = make_model("llama", vocab=VOCAB, init_std=0.5, seed=5)
    target.generation_config.eos_token_id = None
    return target, make_draft(target, noise=0.4, seed=6)


def target_probs(model, prefixes: torch.Tensor, settings: dict) -> torch.Tensor:
    """Standardised next-token distribution [N, V] after each prefix [N, T]."""
    with torch.no_grad():
        logits = model(prefixes).logits[:, -1:, :].float()
    params = make_sampling_tensors(prefixes.shape[0], "cpu", **settings)
    return torch.softmax(standardise(logits, params)[:, 0], -1).double()


def joint_and_third(model, prompt: torch.Tensor, vocab: int, settings: dict) -> tuple:
    """The laws of the first sampled tokens after ``prompt`` [1, T] over a vocabulary of ``vocab`` tokens: of tokens 1
    and 2 jointly [vocab * vocab] (row-major: token 1 * vocab + token 2), and of token 3 [vocab]."""
    ids = torch.arange(vocab)
    p1 = target_probs(model, prompt, settings)[0]
    joint12 = (p1[:, None] * target_probs(model, torch.cat([prompt.expand(vocab, -1), ids[:, None]], 1),
                                          settings)).reshape(-1)
    grid = torch.cartesian_prod(ids, ids)
    p3 = (joint12[:, None] * target_probs(model, torch.cat([prompt.expand(grid.shape[0], -1), grid], 1), settings)).sum(0)
    return joint12, p3


def first_tokens_pvalues(model, prompt: torch.Tensor, new: torch.Tensor, vocab: int, settings: dict) -> tuple:
    """(p-value of tokens 1-2 jointly, p-value of token 3) of sampled rows ``new`` [rows, >= 3] against
    joint_and_third's laws."""
    joint12, p3 = joint_and_third(model, prompt, vocab, settings)
    return chi_square_pvalue(new[:, 0] * vocab + new[:, 1], joint12), chi_square_pvalue(new[:, 2], p3)


SETTINGS = {
    "temperature": dict(temperature=0.7),
    "top_k": dict(temperature=1.0, top_k=4),
    "top_p": dict(temperature=1.0, top_p=0.7),
    "min_p": dict(temperature=1.3, min_p=0.1),
}


@pytest.mark.parametrize("name", list(SETTINGS))
def test_first_tokens_follow_target_distribution(pair, name):
    target, draft = pair
    s = SETTINGS[name]
    kwargs = dict(temperature=s["temperature"], top_k=s.get("top_k", 0), top_p=s.get("top_p", 1.0), min_p=s.get("min_p"))
    ids = PROMPT.expand(ROWS, -1)
    out, stats = api.generate(target, ids, assistant_model=draft, num_assistant_tokens=2, do_sample=True,
                              max_new_tokens=3, seed=123, return_stats=True, **kwargs)
    new = out[:, PROMPT.shape[1]:]
    assert 0.2 < stats.alpha < 0.95, f"alpha {stats.alpha}: the test needs both accepts and rejects"
    settings = dict(temperature=s["temperature"], top_k=s.get("top_k", 0), top_p=s.get("top_p", 1.0), min_p=s.get("min_p", 0.0))
    vocab = torch.arange(VOCAB)
    p1 = target_probs(target, PROMPT, settings)[0]
    prefix2 = torch.cat([PROMPT.expand(VOCAB, -1), vocab[:, None]], 1)
    p2_given_1 = target_probs(target, prefix2, settings)  # [t1, t2]
    joint12 = (p1[:, None] * p2_given_1).reshape(-1)
    assert chi_square_pvalue(new[:, 0] * VOCAB + new[:, 1], joint12) > P_VALUE_THRESHOLD
    # token 3 given (t1, t2): marginal over all V^2 prefixes
    grid = torch.cartesian_prod(vocab, vocab)
    p3_given_12 = target_probs(target, torch.cat([PROMPT.expand(grid.shape[0], -1), grid], 1), settings)
    p3 = (joint12[:, None] * p3_given_12).sum(0)
    assert chi_square_pvalue(new[:, 2], p3) > P_VALUE_THRESHOLD


def test_prompt_lookup_sampling_follows_target(pair):
    """Deterministic drafts (p = one-hot): a repetitive prompt makes lookup drafts likely."""
    target, _ = pair
    prompt = torch.tensor([[3, 7, 3, 7, 3, 7, 3]])
    ids = prompt.expand(ROWS, -1)
    settings = dict(temperature=1.0)
    out = api.generate(target, ids, prompt_lookup_num_tokens=2, do_sample=True, max_new_tokens=2, top_k=0, seed=7)
    new = out[:, prompt.shape[1]:]
    vocab = torch.arange(VOCAB)
    p1 = target_probs(target, prompt, settings)[0]
    p2 = target_probs(target, torch.cat([prompt.expand(VOCAB, -1), vocab[:, None]], 1), settings)
    joint = (p1[:, None] * p2).reshape(-1)
    assert chi_square_pvalue(new[:, 0] * VOCAB + new[:, 1], joint) > P_VALUE_THRESHOLD


def test_seed_reproducible_and_rows_independent(pair):
    target, draft = pair
    ids = PROMPT.expand(4, -1)
    a = api.generate(target, ids, assistant_model=draft, do_sample=True, max_new_tokens=8, seed=5, top_k=0)
    b = api.generate(target, ids, assistant_model=draft, do_sample=True, max_new_tokens=8, seed=5, top_k=0)
    c = api.generate(target, ids, assistant_model=draft, do_sample=True, max_new_tokens=8, seed=6, top_k=0)
    assert torch.equal(a, b)
    assert not torch.equal(a, c)
    assert len({tuple(r) for r in a[:, 4:].tolist()}) > 1, "identical prompts must get different streams per row"
