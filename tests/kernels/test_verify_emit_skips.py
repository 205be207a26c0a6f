"""The emission's identity skips (kernels/verify/_triton_common.py identity_skips, chain_verify_triton /
sample_triton emit_skip_identities=True; _triton_plan.EMIT_SKIP_IDENTITIES): a program whose rows all
have T = 1 does not divide each value by T, and one whose rows have no min-p does not run min-p's
test. Token for token against the torch reference: T = 1 (both skipped), another temperature
(min-p's test skipped), min-p at T = 1 (the division skipped), rows of every kind in one tile
(nothing skipped), greedy rows, penalties, draft logits or the one-hot draft, the sampler, and
masked (-inf) logits. Controls: a program that skips the division or min-p's test where a row
needs it gives other tokens, so the table would catch a wrong skip."""
import pytest
import torch
import triton
import triton.language as tl

from specdec_fast.kernels import make_sampling_tensors
from specdec_fast.kernels.verify import _triton_emit
from specdec_fast.kernels.verify._triton_common import identity_skips

from .test_verify_backends import _modes, _problem
from .test_verify_emit_lanes import check_against_the_reference, random_penalties

CASES = [  # (batch, k, vocab, mode, draft logits, block_v, num_chunks, penalties)
    (4, 3, 200, "plain", True, 32, 2, False),
    (3, 2, 150, "temperature", False, 32, 2, True),
    (3, 2, 160, "min_p_t1", True, 32, 1, False),
    (5, 2, 111, "mixed", True, 16, 2, False),
    (3, 1, 96, "greedy", True, 32, 1, False),
]
MAX_SEEDS = 4


def _sampling(mode, batch, device):
    if mode == "min_p_t1":
        return dict(min_p=0.2)
    return _modes(batch, device)[mode]


def _check(case, device, shift, masked=False):
    """One problem of case (seed moved by shift) with the skips on, token for token against the
    reference (chain_verify and sample); returns whether some row rejected a draft it had."""
    batch, k, vocab, mode, with_draft, block_v, chunks, with_pen = case
    target, draft, drafts, offsets = _problem(batch, k, vocab, torch.float32, with_draft, True, 31 * vocab + shift,
                                              "plain", device)
    if masked:  # a processor's -inf entries: tokens masked out of every position
        target[:, :, ::7] = float("-inf")
        if draft is not None:
            draft[:, :, ::7] = float("-inf")
        drafts = torch.where(drafts % 7 == 0, (drafts + 1) % vocab, drafts)
    params = make_sampling_tensors(batch, device, seed=5 + shift, offset=offsets, **_sampling(mode, batch, device))
    pen = random_penalties(batch, vocab, vocab + shift, device) if with_pen else None
    return check_against_the_reference(target, draft, drafts, params, pen, 3, block_v=block_v, num_chunks=chunks,
                                       emit_skip_identities=True)


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[3]}-B{c[0]}-K{c[1]}-V{c[2]}")
def test_the_skips_give_the_reference_tokens(case, device):
    """Sampled cases move on to the next seed until a row rejects a draft (the residual reads the
    draft's probabilities through the same skips): at most MAX_SEEDS, each checked."""
    for shift in range(MAX_SEEDS):
        if _check(case, device, shift) or case[3] == "greedy":
            return
    pytest.fail(f"no row rejected a draft in {MAX_SEEDS} seeds: the residual path never ran")


def test_the_skips_with_masked_logits(device):
    """-inf logits (a logits processor's mask): e = 0 there, kept or not as without the skips."""
    _check((3, 2, 140, "plain", True, 32, 2, False), device, 0, masked=True)


@triton.jit
def _skip_everything(temp, min_p, SKIP_IDENTITIES: tl.constexpr):
    return False, False


@triton.jit
def _skip_min_p_only(temp, min_p, SKIP_IDENTITIES: tl.constexpr):
    return True, False


@pytest.mark.parametrize("wrong,case", [(_skip_everything, CASES[1]), (_skip_min_p_only, CASES[2])],
                         ids=["division-skipped-at-T=0.7", "min-p-skipped-with-min-p"])
def test_control_a_wrong_skip_changes_the_tokens(device, monkeypatch, wrong, case):
    if device != "cpu":
        pytest.skip("the control patches a module function, which only the interpreter looks up at run time")
    monkeypatch.setattr(_triton_emit, "identity_skips", wrong)
    with pytest.raises(AssertionError):
        for shift in range(MAX_SEEDS):
            _check(case, device, shift)


@triton.jit
def _flags_kernel(temp_ptr, min_p_ptr, out_ptr, BLOCK_R: tl.constexpr, SKIP_IDENTITIES: tl.constexpr):
    r = tl.arange(0, BLOCK_R)
    divide, by_min_p = identity_skips(tl.load(temp_ptr + r), tl.load(min_p_ptr + r), SKIP_IDENTITIES)
    zero = tl.zeros([2], tl.int32)  # the flags are scalars, or Python bools without SKIP_IDENTITIES
    tl.store(out_ptr + tl.arange(0, 2), tl.where(tl.arange(0, 2) == 0, zero + divide, zero + by_min_p))


@pytest.mark.cpu_only  # a 4-row kernel through the interpreter: the flags the emission's programs compute
@pytest.mark.parametrize("temps,min_ps,flags", [
    ([1.0, 1.0, 1.0, 1.0], [0.0, 0.0, 0.0, 0.0], [0, 0]),  # T = 1 (greedy rows run at 1 too), no min-p
    ([1.0, 0.7, 1.0, 1.0], [0.0, 0.0, 0.0, 0.0], [1, 0]),  # one row's temperature: every row divides
    ([1.0, 1.0, 1.0, 1.0], [0.0, 0.0, 0.05, 0.0], [0, 1]),  # one row's min-p: every row tests
])
def test_the_flags_skip_only_what_every_row_allows(temps, min_ps, flags):
    out = torch.empty(2, dtype=torch.int32)
    for skip, expected in ((True, flags), (False, [1, 1])):
        _flags_kernel[(1,)](torch.tensor(temps), torch.tensor(min_ps), out, BLOCK_R=4, SKIP_IDENTITIES=skip)
        assert out.tolist() == expected, (skip, out.tolist())
