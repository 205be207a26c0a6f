"""Sampling with an EAGLE-3 head whose draft vocabulary is 7 of the target's 12 tokens follows the
target's standardised distribution (chi-square) on every kernel backend:
  - the kernels (every backend, Triton interpreted): drafts drawn by ``sample`` from target-vocabulary
    rows that are -inf outside the draft vocabulary, verified by chain_verify with those rows;
  - the engine end to end on the CPU backends (torch, cpp: 3000 rows); the interpreted Triton
    engine draws the same tokens as the torch one (counter-based randomness), on a few rows
    (3000 interpreted rows took 11 minutes);
  - a control shows the test catches the bug a reduced vocabulary invites: a verify that sees the
    draft logits with 0 instead of -inf outside the mapped tokens (p no longer the law the drafts
    were drawn from).

One batch of N identical prompts (N independent row streams, as tests/engine/test_sampling_exact.py):
tokens 2 and 3 come from the first speculative block (K = 2: accepts, residual samples and bonus
tokens all occur)."""
import pytest
import torch

import specdec_fast
from specdec_fast.drafters import Eagle3Drafter
from specdec_fast.kernels import chain_verify, make_sampling_tensors, sample, standardise

from tests.kernels.backends import kernel_backends
from tests.kernels.stats import P_VALUE_THRESHOLD, chi_square_pvalue

from ..conftest import on_device
from .heads import trained_head
from .models import make_model
from .test_sampling_exact import target_probs

VOCAB, DRAFT_VOCAB = 12, 7
PROMPT = torch.tensor([[3, 7, 5, 9]])
SETTINGS = dict(temperature=0.9, top_k=0, top_p=1.0, min_p=0.0)


@pytest.fixture(scope="module")
def pair():
    target = make_model("llama", vocab=VOCAB, layers=3, init_std=0.5, seed=5)
    target.generation_config.eos_token_id = None
    head = trained_head(target, DRAFT_VOCAB, key="chi-square", steps=120, rows=256, temperature=1.0)
    return target, head


def _expected(target):
    """(joint of tokens 1-2 [V*V], marginal of token 3 [V]) under the standardised target."""
    vocab = torch.arange(VOCAB)
    p1 = target_probs(target, PROMPT, SETTINGS)[0]
    p2_given_1 = target_probs(target, torch.cat([PROMPT.expand(VOCAB, -1), vocab[:, None]], 1), SETTINGS)
    joint12 = (p1[:, None] * p2_given_1).reshape(-1)
    grid = torch.cartesian_prod(vocab, vocab)
    p3 = (joint12[:, None] * target_probs(target, torch.cat([PROMPT.expand(grid.shape[0], -1), grid], 1), SETTINGS)).sum(0)
    return joint12, p3


def _pvalues(target, head, backend, rows):
    out, stats = specdec_fast.generate(target, PROMPT.expand(rows, -1), draft_head=head, num_assistant_tokens=2,
                                       do_sample=True, max_new_tokens=3, seed=123, backend=backend, return_stats=True,
                                       temperature=SETTINGS["temperature"], top_k=0)
    new = out[:, PROMPT.shape[1]:]
    joint12, p3 = _expected(target)
    return stats, chi_square_pvalue(new[:, 0] * VOCAB + new[:, 1], joint12), chi_square_pvalue(new[:, 2], p3)


@pytest.mark.parametrize("backend", kernel_backends())
def test_kernels_take_minus_inf_rows_outside_the_draft_vocabulary(backend, device):
    """Chen et al. Theorem 1 with p zero outside 10 of 24 tokens: token 0 ~ q_0, token 1 ~ q_1 given x_0 accepted."""
    vocab, k, rows = 24, 2, 6000 if backend == "triton" else 20000
    g = torch.Generator().manual_seed(3)
    mapped = torch.randperm(vocab, generator=g)[:10]
    target = torch.randn(k + 1, vocab, generator=g) * 2
    draft = torch.full((k, vocab), float("-inf"))
    draft[:, mapped] = target[:k, mapped] + torch.randn(k, 10, generator=g)
    drafts = torch.stack([sample(draft[i].expand(rows, -1).contiguous().to(device), temperature=0.8, seed=7, position=i,
                                 backend=backend) for i in range(k)], 1).long().cpu()
    assert torch.isin(drafts, mapped).all()
    tokens, accepted = chain_verify(target.expand(rows, -1, -1).to(device), draft.expand(rows, -1, -1).to(device),
                                    drafts.to(device), temperature=0.8, seed=123, backend=backend)
    tokens, accepted = tokens.cpu(), accepted.cpu()
    params = make_sampling_tensors(k + 1, "cpu", temperature=0.8)
    q = torch.softmax(standardise(target[:, None], params)[:, 0], -1)
    assert chi_square_pvalue(tokens[:, 0], q[0]) > P_VALUE_THRESHOLD
    assert 0.2 * rows < int((accepted >= 1).sum()) < 0.95 * rows
    assert chi_square_pvalue(tokens[accepted >= 1, 1], q[1]) > P_VALUE_THRESHOLD


def test_triton_engine_draws_the_torch_engines_tokens(pair, device):
    """Both engines on the test device."""
    target, head = on_device(device, *pair)
    ids = PROMPT.expand(6, -1).to(device)
    out = {b: specdec_fast.generate(target, ids, draft_head=head, num_assistant_tokens=3, do_sample=True, max_new_tokens=6,
                                    seed=9, backend=b, temperature=SETTINGS["temperature"], top_k=0)
           for b in ("triton", "torch")}
    assert torch.equal(out["triton"], out["torch"])


@pytest.mark.parametrize("backend", [b for b in kernel_backends() if b != "triton"])
def test_sampled_tokens_follow_the_target(pair, backend):
    target, head = pair
    stats, p12, p3 = _pvalues(target, head, backend, 3000)
    assert 0.2 < stats.alpha < 0.95, f"alpha {stats.alpha}: the test needs both accepts and rejects"
    assert p12 > P_VALUE_THRESHOLD and p3 > P_VALUE_THRESHOLD, (p12, p3)


def test_sampled_tokens_follow_the_target_with_k_changing_every_iteration(pair, chaos):
    """The adaptive schedule's Ks forced to alternate 1, 3 (the head's draft-logits rows sized for
    the largest K, an iteration of K verifying the first K of them): still the target's law."""
    target, head = pair
    chosen = chaos([1, 3])
    backend = "cpp" if "cpp" in kernel_backends() else "torch"
    out, stats = specdec_fast.generate(target, PROMPT.expand(3000, -1), draft_head=head, do_sample=True, max_new_tokens=3,
                                       seed=321, backend=backend, num_assistant_tokens_schedule="adaptive",
                                       temperature=SETTINGS["temperature"], top_k=0, return_stats=True)
    new = out[:, PROMPT.shape[1]:]
    joint12, p3 = _expected(target)
    assert set(chosen) == {1, 3} and 0.2 < stats.alpha < 0.95
    assert chi_square_pvalue(new[:, 0] * VOCAB + new[:, 1], joint12) > P_VALUE_THRESHOLD
    assert chi_square_pvalue(new[:, 2], p3) > P_VALUE_THRESHOLD


def test_control_zero_instead_of_minus_inf_outside_the_draft_vocabulary_fails(pair, monkeypatch):
    target, head = pair
    propose = Eagle3Drafter.propose

    def buggy(self, k):
        drafts, logits = propose(self, k)  # sampled from the -inf rows, as the drafter does
        return drafts, logits.nan_to_num(neginf=0.0)  # ... but the verify sees 0 outside the mapped tokens

    monkeypatch.setattr(Eagle3Drafter, "propose", buggy)
    specdec_fast.release_engines()
    _, p12, p3 = _pvalues(target, head, "cpp" if "cpp" in kernel_backends() else "torch", 3000)
    specdec_fast.release_engines()
    assert min(p12, p3) < P_VALUE_THRESHOLD, (p12, p3)
