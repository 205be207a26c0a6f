"""Rows of non-finite logits give tokens inside the vocabulary, on every backend.

The runners leave the logits of padding rows unspecified (runners/base.py: a finished row is fed
nothing when the engine skips finished rows, its logits are whatever the buffers held), and the
engine runs the verify and the draft sampler over them all the same: their tokens are discarded,
but a draft token is fed back to the draft model's embedding. A Triton search over a row of NaN
finds no maximum (x == max is never true) and its sentinel BIG_INDEX (2**31 - 1) came out as the
token: the next embedding raised "IndexError: index out of range in self" on CPU (it would be a
device assert on CUDA). Seen as a flaky failure of the 2-rank Triton test, where the garbage
happened to be NaN; made certain here by writing NaN. The public chain_verify / sample refuse
non-finite logits (their checks): these tests call the engine's prepared impls.

Control: with found_or_zero (kernels/verify/_triton_common.py) made the identity, the Triton
NaN rows below give 2147483647."""
import pytest
import torch

from specdec_fast.kernels.tree_verify import prepared_tree_verify
from specdec_fast.kernels.verify import make_sampling_tensors, prepared_impls

from .backends import kernel_backends

MODES = {
    "greedy": dict(temperature=0.0),
    "T=1": dict(temperature=1.0),
    "top_k=50": dict(temperature=1.0, top_k=50),
    "top_k>V": dict(temperature=0.7, top_k=200),
    "top_p=0.9": dict(temperature=0.7, top_p=0.9),
    "min_p=0.1": dict(temperature=1.0, min_p=0.1),
    "top_k+top_p": dict(top_k=50, top_p=0.8),
}
POISONS = {"nan": float("nan"), "+inf": float("inf"), "-inf": float("-inf"), "3e38": 3e38}
B, K = 3, 3
pytestmark = pytest.mark.filterwarnings("ignore:All-NaN slice:RuntimeWarning")  # the interpreter's numpy max


def _poisoned(shape, value, seed):
    """Random logits with row 1 filled with ``value`` (every position of it)."""
    x = torch.randn(shape, generator=torch.Generator().manual_seed(seed))
    x[1] = value
    return x


@pytest.mark.parametrize("backend", kernel_backends())
@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("poison", list(POISONS))
@pytest.mark.parametrize("vocab", [128, 130])  # 128: one whole block (no masked -inf tail); 130: a tail
def test_chain_verify_and_sample_keep_non_finite_rows_in_the_vocabulary(device, backend, mode, poison, vocab):
    verify, sample = prepared_impls(backend, device)
    params = make_sampling_tensors(B, device, **MODES[mode])
    value = POISONS[poison]
    target = _poisoned((B, K + 1, vocab), value, 1).to(device)
    draft_logits = None if mode == "greedy" else _poisoned((B, K, vocab), value, 2).to(device)
    drafts = torch.randint(0, vocab, (B, K), generator=torch.Generator().manual_seed(3)).to(device)
    tokens, accepted = verify(target, draft_logits, drafts, params)
    tokens, accepted = tokens.cpu(), accepted.cpu()
    assert ((tokens >= -1) & (tokens < vocab)).all(), tokens
    for b in range(B):  # the final token of each row is a real token id, never a pad
        assert 0 <= int(tokens[b, int(accepted[b])]) < vocab, (b, tokens[b])
    drawn = sample(_poisoned((B, vocab), value, 4).to(device), params, torch.zeros(B, dtype=torch.long, device=device), 0)
    assert ((drawn >= 0) & (drawn < vocab)).all().item(), drawn


@pytest.mark.parametrize("backend", kernel_backends())
@pytest.mark.parametrize("mode", ["greedy", "T=1", "top_k=50"])
def test_tree_verify_keeps_a_nan_row_in_the_vocabulary(device, backend, mode):
    n, vocab = 5, 128
    verify = prepared_tree_verify(backend, device)
    params = make_sampling_tensors(B, device, **MODES[mode])
    target = _poisoned((B, n, vocab), float("nan"), 5).to(device)
    draft_logits = None if mode == "greedy" else _poisoned((B, n, vocab), float("nan"), 6).to(device)
    tokens = torch.randint(0, vocab, (B, n), generator=torch.Generator().manual_seed(7)).to(device)
    parents = torch.tensor([[-1, 0, 0, 1, 2]] * B, device=device)
    out, _, accepted = verify(target, draft_logits, tokens, parents, params)
    out, accepted = out.cpu(), accepted.cpu()
    assert ((out >= -1) & (out < vocab)).all(), out
    for b in range(B):
        assert 0 <= int(out[b, int(accepted[b])]) < vocab, (b, out[b])


@pytest.mark.slow  # ~10 s a case through the interpreter
@pytest.mark.parametrize("kw", [MODES["top_p=0.9"], dict(temperature=0.7, top_k=3000)], ids=["top_p=0.9", "top_k=3000"])
def test_the_large_vocabulary_path_ends_and_stays_in_the_vocabulary_on_a_nan_row(device, kw):
    """V above the candidate cap with several chunks a row (the streaming and finishing launches, the
    gathered interval and the exact sweeps): a NaN row's searches end and its tokens lie in [0, V)."""
    from specdec_fast.kernels.verify.triton import chain_verify_triton

    vocab = 5000
    params = make_sampling_tensors(B, device, **kw)
    target = _poisoned((B, K + 1, vocab), float("nan"), 8).to(device)
    draft_logits = _poisoned((B, K, vocab), float("nan"), 9).to(device)
    drafts = torch.randint(0, vocab, (B, K), generator=torch.Generator().manual_seed(10)).to(device)
    tokens, accepted = chain_verify_triton(target, draft_logits, drafts, params, cap=128, num_chunks=3, block_v=512)
    tokens, accepted = tokens.cpu(), accepted.cpu()
    assert ((tokens >= -1) & (tokens < vocab)).all(), tokens
    for b in range(B):
        assert 0 <= int(tokens[b, int(accepted[b])]) < vocab, (b, tokens[b])
