"""The emission's ratio test in one tile (kernels/verify/_triton_emit.py _ratio_test) against the
loop over positions it replaced (emit_ratio_loop=True) and the torch reference: the same accepted
counts and tokens, over K not a power of two, drafts that stop early (-1 pads, after any number of drafts), greedy rows beside
sampled ones, rows without draft logits, several rows a program, and the draft sampler (K = 0)."""
import pytest
import torch

from specdec_fast.kernels import make_sampling_tensors
from specdec_fast.kernels.verify import chain_verify_reference, sample_reference

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")

CASES = [  # (B, K, V, draft logits, sampling)
    pytest.param(5, 3, 97, True, dict(temperature=0.9), id="K3"),
    pytest.param(4, 4, 300, True, dict(temperature=torch.tensor([0.0, 1.0, 0.5, 2.0]), top_k=40), id="mixed-greedy"),
    pytest.param(3, 1, 64, True, dict(top_p=0.9), id="K1"),
    pytest.param(6, 5, 129, False, dict(min_p=0.05), id="no-draft-logits"),
    pytest.param(2, 7, 33, True, {}, id="K7"),
]


def _problem(batch, k, vocab, seed, close):
    g = torch.Generator().manual_seed(seed)
    target = torch.randn(batch, k + 1, vocab, generator=g) * 2
    # close drafts: most positions accepted, so rejections fall at every position across rows
    draft = target[:, :k] + close * torch.randn(batch, k, vocab, generator=g)
    drafts = torch.multinomial(torch.softmax(draft.reshape(-1, vocab), -1), 1, generator=g).reshape(batch, k)
    for row in range(0, batch, 2):  # every other row stops its drafts early, after 0, 1, ... drafts
        drafts[row, (row // 2) % k:] = -1
    return target, draft, drafts


@pytest.mark.parametrize("batch,k,vocab,has_draft,kw", CASES)
def test_tile_and_loop_accept_the_same_drafts(device, batch, k, vocab, has_draft, kw):
    from specdec_fast.kernels.verify.triton import chain_verify_triton

    kw = {name: v.to(device) if isinstance(v, torch.Tensor) else v for name, v in kw.items()}
    accepted_at = set()
    for seed, close in ((vocab + k, 0.3), (vocab + k + 1, 1.0), (vocab + k + 2, 0.05)):
        target, draft, drafts = (t.to(device) for t in _problem(batch, k, vocab, seed, close))
        draft = draft if has_draft else None
        params = make_sampling_tensors(batch, device, seed=seed, **kw)
        tile = chain_verify_triton(target, draft, drafts, params)
        loop = chain_verify_triton(target, draft, drafts, params, emit_ratio_loop=True)
        expected = chain_verify_reference(target, draft, drafts, params)
        for got in (tile, loop):
            assert torch.equal(got[1], expected[1]), (got[1], expected[1])
            assert torch.equal(got[0], expected[0]), (got[0], expected[0])
        accepted_at |= set(tile[1].tolist())
    assert len(accepted_at) >= 2  # rejections at more than one position (the control of what is compared)


def test_the_draft_sampler_has_no_ratio_test(device):
    from specdec_fast.kernels.verify.triton import sample_triton

    g = torch.Generator().manual_seed(4)
    logits = (torch.randn(5, 211, generator=g) * 2).to(device)
    positions = torch.arange(5, dtype=torch.int64, device=device)
    params = make_sampling_tensors(5, device, seed=9, top_k=30)
    expected = sample_reference(logits, params, positions, 2)
    assert torch.equal(sample_triton(logits, params, positions, 2), expected)
    assert torch.equal(sample_triton(logits, params, positions, 2, emit_ratio_loop=True), expected)
