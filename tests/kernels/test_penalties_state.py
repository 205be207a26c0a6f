"""The penalty state and its spec (kernels/penalties): make_penalty_tensors (prompt bits, active
penalties, validation), add_tokens (equal to a recount, no host sync), and the reference against
transformers' RepetitionPenaltyLogitsProcessor and vLLM's frequency / presence formula, position
by position with the drafts before each position in the context."""
import pytest
import torch
from transformers.generation.logits_process import RepetitionPenaltyLogitsProcessor

from specdec_fast.kernels.penalties import (COUNT_MASK, PROMPT_BIT, PenaltyTensors, add_tokens, make_penalty_tensors,
                                            penalised_logits)
from specdec_fast.kernels.penalties.reference import count_tokens

from .test_public_calls_no_sync import PackageOps

PAD = 0  # the pad id of the prompts below: left pads are tokens of the context, as in transformers


def _prompt(batch: int, length: int, vocab: int, g: torch.Generator) -> torch.Tensor:
    """Left-padded prompts [B, P]: row b starts with b pads."""
    ids = torch.randint(1, vocab, (batch, length), generator=g)
    for b in range(batch):
        ids[b, :min(b, length)] = PAD
    return ids


# ---- make_penalty_tensors -----------------------------------------------------------------------
def test_prompt_bits_include_left_pads_and_ignore_ids_outside_the_vocabulary(device):
    ids = torch.tensor([[0, 0, 5, 7, 5], [3, 9, 12, -1, 2]], device=device)  # 12 >= V and -1: not tokens
    pen = make_penalty_tensors(ids, 10, repetition_penalty=1.2)
    assert pen.counts.dtype == torch.int32 and pen.counts.shape == (2, 10) and pen.counts.is_contiguous()
    prompt = (pen.counts.cpu() & PROMPT_BIT) != 0
    assert prompt[0].nonzero().flatten().tolist() == [0, 5, 7]
    assert prompt[1].nonzero().flatten().tolist() == [2, 3, 9]
    assert int((pen.counts & COUNT_MASK).sum()) == 0
    assert pen.repetition.tolist() == pytest.approx([1.2, 1.2]) and pen.frequency.tolist() == [0.0, 0.0]
    assert pen.active == {"repetition"} and pen.batch == 2 and pen.vocab == 10
    assert make_penalty_tensors(ids[:, :0], 10).counts.sum() == 0  # an empty prompt


@pytest.mark.parametrize("kw,active", [
    ({}, set()),
    (dict(repetition_penalty=1.0, frequency_penalty=0.0, presence_penalty=0.0), set()),
    (dict(frequency_penalty=-0.5), {"frequency"}),
    (dict(repetition_penalty=0.8, presence_penalty=2.0), {"repetition", "presence"}),
])
def test_active_penalties_of_scalars_are_exact(kw, active):
    assert make_penalty_tensors(torch.zeros(2, 3, dtype=torch.int64), 8, **kw).active == frozenset(active)


def test_active_penalties_of_tensors_exact_when_read_else_every_named_one():
    ids = torch.zeros(3, 2, dtype=torch.int64)
    rep = torch.tensor([1.0, 1.3, 1.0])
    assert make_penalty_tensors(ids, 8, repetition_penalty=rep).active == {"repetition"}
    assert make_penalty_tensors(ids, 8, repetition_penalty=torch.ones(3)).active == frozenset()  # read: all off
    assert make_penalty_tensors(ids, 8, repetition_penalty=torch.ones(3), check=False).active == {"repetition"}
    assert make_penalty_tensors(ids, 8, frequency_penalty=torch.zeros(3), presence_penalty=0.5,
                                check=False).active == {"frequency", "presence"}
    with pytest.raises(ValueError, match="unknown penalties"):
        PenaltyTensors(torch.zeros(1, 2, dtype=torch.int32), *(torch.ones(1),) * 3, active={"temperature"})


@pytest.mark.parametrize("kw,error,match", [
    (dict(repetition_penalty=0.0), ValueError, "repetition_penalty"),
    (dict(repetition_penalty=-1.2), ValueError, "repetition_penalty"),
    (dict(repetition_penalty=float("inf")), ValueError, "repetition_penalty"),
    (dict(repetition_penalty=float("nan")), ValueError, "repetition_penalty"),
    (dict(repetition_penalty="1.1"), TypeError, "repetition_penalty"),
    (dict(repetition_penalty=True), TypeError, "repetition_penalty"),
    (dict(frequency_penalty=2.5), ValueError, "frequency_penalty"),
    (dict(frequency_penalty=float("nan")), ValueError, "frequency_penalty"),
    (dict(presence_penalty=-3.0), ValueError, "presence_penalty"),
    (dict(presence_penalty=torch.tensor([0.1, 9.0])), ValueError, "presence_penalty"),
    (dict(repetition_penalty=torch.tensor([1.1, 1.2, 1.3])), ValueError, "repetition_penalty"),
    (dict(frequency_penalty=torch.tensor([True, False])), TypeError, "frequency_penalty"),
])
def test_bad_parameters_raise_naming_the_argument(kw, error, match):
    with pytest.raises(error, match=match):
        make_penalty_tensors(torch.zeros(2, 3, dtype=torch.int64), 8, **kw)


def test_bad_prompt_and_vocab_raise():
    with pytest.raises(ValueError, match="input_ids"):
        make_penalty_tensors(torch.zeros(2, 3), 8)
    with pytest.raises(ValueError, match="input_ids"):
        make_penalty_tensors(torch.zeros(3, dtype=torch.int64), 8)
    with pytest.raises(ValueError, match="vocab"):
        make_penalty_tensors(torch.zeros(2, 3, dtype=torch.int64), 0)
    if torch.cuda.is_available():
        with pytest.raises(ValueError, match="repetition_penalty is on"):
            make_penalty_tensors(torch.zeros(2, 3, dtype=torch.int64), 8,
                                 repetition_penalty=torch.ones(2, device="cuda"))


# ---- add_tokens -----------------------------------------------------------------------------------
def test_add_tokens_equals_a_recount_after_random_appends(device):
    g = torch.Generator().manual_seed(3)
    batch, vocab = 3, 33
    prompt = _prompt(batch, 9, vocab, g)
    pen = make_penalty_tensors(prompt.to(device), vocab, frequency_penalty=0.3)
    appended = []
    for step in range(6):
        width = 1 + step % 4
        tokens = torch.randint(-1, vocab, (batch, width), generator=g)  # -1: not a token
        tokens[0, 0] = tokens[1, -1] = 5  # repeats, across rows and steps
        mask = torch.rand(batch, width, generator=g) < 0.7  # finished rows, rejected positions
        counts = add_tokens(pen.counts, tokens.to(device), mask.to(device))
        assert counts is pen.counts  # in place
        appended.append(torch.where(mask, tokens, -1))
    add_tokens(pen.counts, torch.tensor([[vocab + 3], [-5], [2]], device=device))  # mask None: only 2 counts
    appended.append(torch.tensor([[-1], [-1], [2]]))
    expected = count_tokens(torch.cat(appended, 1), vocab) | (count_tokens(prompt, vocab) > 0).int() * PROMPT_BIT
    assert torch.equal(pen.counts.cpu(), expected)
    assert int((pen.counts & COUNT_MASK).sum()) == int((torch.cat(appended, 1) >= 0).sum())


def test_add_tokens_reads_nothing_back(device):
    pen = make_penalty_tensors(torch.zeros(2, 4, dtype=torch.int64, device=device), 50, presence_penalty=0.5)
    tokens = torch.tensor([[3, 4, -1], [7, 7, 49]], device=device)
    mask = tokens >= 0
    with PackageOps() as ops:
        add_tokens(pen.counts, tokens, mask)
        add_tokens(pen.counts, tokens)
    assert ops.syncs() == [], ops.syncs()
    assert (pen.counts & COUNT_MASK).sum().item() == 10


@pytest.mark.parametrize("args,match", [
    (lambda c, t, m: (c.long(), t, m), "counts"),
    (lambda c, t, m: (c[0], t, m), "counts"),
    (lambda c, t, m: (c, t.float(), m), "tokens"),
    (lambda c, t, m: (c, t[:1], m), "tokens"),
    (lambda c, t, m: (c, t, m.int()), "mask"),
    (lambda c, t, m: (c, t, m[:, :1]), "mask"),
])
def test_add_tokens_checks_its_arguments(args, match):
    counts = torch.zeros(2, 8, dtype=torch.int32)
    tokens = torch.zeros(2, 3, dtype=torch.int64)
    with pytest.raises(ValueError, match=match):
        add_tokens(*args(counts, tokens, tokens >= 0))


# ---- the reference against transformers and vLLM ---------------------------------------------
def _context(batch=3, vocab=41, k=4, seed=0):
    """Prompt [B, P] with left pads, generated tokens [B, G] (with repeats), drafts [B, K] (some
    repeating the context, a ragged row padded with -1) and logits [B, K+1, V] of both signs."""
    g = torch.Generator().manual_seed(seed)
    prompt = _prompt(batch, 8, vocab, g)
    generated = torch.randint(0, vocab, (batch, 6), generator=g)
    generated[:, 3] = generated[:, 0]
    drafts = torch.randint(0, vocab, (batch, k), generator=g)
    drafts[:, 1] = generated[:, 2]
    drafts[:, 3] = drafts[:, 0]
    drafts[-1, 2:] = -1
    logits = torch.randn(batch, k + 1, vocab, generator=g) * 3
    logits[:, :, 1::9] = float("-inf")
    return prompt, generated, drafts, logits


@pytest.mark.parametrize("penalty", [1.3, 0.7])
def test_repetition_matches_transformers_position_by_position(penalty):
    """input_ids for position i = the prompt (left pads included) + the generated tokens + the
    drafts x_0..x_{i-1}, as transformers would see them had it generated those tokens."""
    prompt, generated, drafts, logits = _context()
    pen = make_penalty_tensors(prompt, logits.shape[-1], repetition_penalty=penalty)
    add_tokens(pen.counts, generated)
    ours = penalised_logits(logits, pen, drafts)
    processor = RepetitionPenaltyLogitsProcessor(penalty=penalty)
    for row in range(logits.shape[0]):
        for i in range(logits.shape[1]):
            before = drafts[row, :i]
            context = torch.cat([prompt[row], generated[row], before[before >= 0]])[None]
            theirs = processor(context, logits[row:row + 1, i].clone())
            assert torch.equal(ours[row, i], theirs[0]), (row, i)
    changed = ours != logits  # the drafts before a position change later positions only
    assert bool(changed.any()) and not torch.equal(changed[:, 0], changed[:, -1])


def test_frequency_and_presence_follow_vllm_over_generated_tokens_only():
    """vLLM's apply_penalties: repetition over prompt + output tokens, then logits -= f * counts
    and -= pr * (counts > 0) over the output tokens only (the prompt is not counted)."""
    prompt, generated, drafts, logits = _context(seed=4)
    vocab = logits.shape[-1]
    rep, f, pr = torch.tensor([1.0, 1.4, 0.9]), torch.tensor([0.5, 0.0, -0.7]), torch.tensor([0.25, 1.5, 0.0])
    pen = make_penalty_tensors(prompt, vocab, repetition_penalty=rep, frequency_penalty=f, presence_penalty=pr)
    add_tokens(pen.counts, generated)
    ours = penalised_logits(logits, pen, drafts)
    for row in range(logits.shape[0]):
        for i in range(logits.shape[1]):
            before = drafts[row, :i]
            output = torch.cat([generated[row], before[before >= 0]])
            counts = torch.bincount(output, minlength=vocab).float()
            seen = (counts > 0) | (torch.bincount(prompt[row], minlength=vocab) > 0)
            z = logits[row, i].clone()
            z = torch.where(seen, torch.where(z > 0, z / rep[row], z * rep[row]), z)
            z = z - f[row] * counts
            z = z - pr[row] * (counts > 0).float()
            assert torch.equal(ours[row, i], z), (row, i)


def test_no_active_penalty_changes_nothing():
    prompt, generated, drafts, logits = _context(seed=2)
    pen = make_penalty_tensors(prompt, logits.shape[-1])
    add_tokens(pen.counts, generated)
    assert torch.equal(penalised_logits(logits, pen, drafts), logits)
