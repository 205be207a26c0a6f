"""The emission's Gumbel-max keys weighted by exp(std - m) (_triton_plan.EMIT_SAMPLER_EXP_KEYS, the plan's
emit_exp_keys; on for the draft sampler, K = 0): argmax(exp(std - m) / E) is argmax(prob / E), the row's sum
being a positive constant, and so the reference's argmax(std + G). Token for token against the torch reference,
sample_triton and chain_verify_triton with the keys forced each way, through the per-lane pass and the block
loop: T = 1, another temperature, top-k, min-p, every kind of row in one tile (greedy rows among them), penalties,
masked (-inf) logits. Control: keys weighted by exp(2 (std - m)) (the probabilities squared: another
distribution) give other tokens, so the table would catch a wrong weight."""
import pytest
import torch
import triton
import triton.language as tl

from specdec_fast.kernels import make_sampling_tensors
from specdec_fast.kernels.verify import _triton_emit, _triton_plan
from specdec_fast.kernels.verify._triton_emit import noise_weight

from .test_verify_backends import _modes, _problem
from .test_verify_emit_lanes import check_against_the_reference, random_penalties

CASES = [  # (batch, k, vocab, mode, draft logits, block_v, num_chunks, penalties): 2-13 blocks a chunk
    (5, 2, 200, "plain", True, 16, 1, False),
    (4, 2, 300, "temperature", False, 32, 2, False),
    (3, 1, 150, "top_k", True, 16, 2, True),
    (3, 3, 111, "mixed", True, 16, 2, False),
    (4, 1, 97, "min_p", False, 16, 3, False),
]


def _check(case, device, exp_keys, lanes, shift=0, masked=False):
    batch, k, vocab, mode, with_draft, block_v, chunks, with_pen = case
    target, draft, drafts, offsets = _problem(batch, k, vocab, torch.float32, with_draft, True, 13 * vocab + shift,
                                              "plain", device)
    if masked:  # a processor's -inf entries: never a candidate
        target[:, :, ::5] = float("-inf")
        if draft is not None:
            draft[:, :, ::5] = float("-inf")
        drafts = torch.where(drafts % 5 == 0, (drafts + 1) % vocab, drafts)
    params = make_sampling_tensors(batch, device, seed=3 + shift, offset=offsets, **_modes(batch, device)[mode])
    pen = random_penalties(batch, vocab, vocab + shift, device) if with_pen else None
    return check_against_the_reference(target, draft, drafts, params, pen, 3, block_v=block_v, num_chunks=chunks,
                                       emit_exp_keys=exp_keys, emit_lanes=lanes)


@pytest.mark.parametrize("lanes", [True, False], ids=["lanes", "block_loop"])
@pytest.mark.parametrize("exp_keys", [True, False], ids=["exp_keys", "prob_keys"])
@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[3]}-B{c[0]}-K{c[1]}-V{c[2]}")
def test_both_weights_give_the_reference_tokens(case, exp_keys, lanes, device):
    _check(case, device, exp_keys, lanes)


def test_masked_logits(device):
    for lanes in (True, False):
        _check((3, 2, 140, "plain", True, 16, 2, False), device, True, lanes, masked=True)


def test_the_plan_takes_exp_keys_for_the_sampler_alone():
    def plan(k, **kw):
        return _triton_plan.plan_launches(64, k, 128256, k > 0, num_sms=132, interpreting=False,
                                          modes=frozenset({"plain"}), **kw)

    assert _triton_plan.EMIT_SAMPLER_EXP_KEYS
    assert plan(0).emit_exp_keys and not plan(4).emit_exp_keys
    assert not plan(0, emit_exp_keys=False).emit_exp_keys and plan(4, emit_exp_keys=True).emit_exp_keys


@triton.jit
def _squared_weight(std_q, q, m, EXP_KEYS: tl.constexpr):
    return noise_weight(std_q, tl.exp(2.0 * (std_q - m)))


def test_control_a_wrong_weight_changes_the_tokens(device, monkeypatch):
    if device != "cpu":
        pytest.skip("the control patches a module function, which only the interpreter looks up at run time")
    monkeypatch.setattr(_triton_emit, "_q_weight", _squared_weight)
    with pytest.raises(AssertionError):
        for shift in range(3):
            _check(CASES[0], device, True, True, shift)
