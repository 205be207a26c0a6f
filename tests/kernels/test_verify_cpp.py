"""The C++ backend (csrc/verify.cpp) against the torch reference, token for token.

Same seeds -> same random numbers (Philox is bit-exact), so every accept decision and every
emitted token must agree. The logits are continuous random draws, so no decision sits within
float rounding of its boundary: exact ties (equal logits, bf16 duplicates) have defined
semantics both sides implement identically, and near-ties at the 1-ulp level have probability
~1e-7 per decision.
"""
import pytest
import torch

from specdec_fast.kernels import make_sampling_tensors, standardise
from specdec_fast.kernels.verify.reference import chain_verify_reference, sample_reference

from .backends import kernel_backends

pytestmark = pytest.mark.skipif("cpp" not in kernel_backends(), reason="C++ backend not tested on this machine")

MODES = {
    "plain": dict(),
    "temperature": dict(temperature=0.6),
    "top_k": dict(top_k=7),
    "top_p": dict(top_p=0.85),
    "min_p": dict(min_p=0.05),
    "combined": dict(temperature=1.4, top_k=40, top_p=0.9, min_p=0.01),
    "greedy": dict(temperature=0.0),
    "per_row": "per_row",  # each row its own mode, greedy rows included
}

# (B, K, V, dtype, mode, with draft logits, ragged -1 padding): covers every value of each axis
# and the awkward corners (V=111 not a multiple of any vector width, K=7, B=17, big V).
CASES = [
    (1, 1, 111, torch.float32, "plain", True, False),
    (1, 4, 111, torch.float16, "greedy", False, False),
    (3, 4, 111, torch.float32, "top_k", True, True),
    (3, 7, 111, torch.bfloat16, "top_p", False, True),
    (17, 1, 111, torch.float32, "min_p", True, False),
    (17, 4, 111, torch.float16, "combined", True, True),
    (17, 7, 111, torch.float32, "per_row", False, True),
    (1, 7, 1000, torch.bfloat16, "temperature", True, False),
    (3, 1, 1000, torch.float32, "greedy", True, True),
    (3, 4, 1000, torch.float16, "plain", False, False),
    (17, 4, 1000, torch.bfloat16, "per_row", True, True),
    (17, 7, 1000, torch.float32, "top_p", True, False),
    (17, 1, 1000, torch.bfloat16, "combined", False, True),
    (3, 7, 1000, torch.float32, "min_p", False, True),
    (1, 4, 32000, torch.float32, "combined", True, False),
    (1, 1, 32000, torch.bfloat16, "per_row", False, False),
    (3, 4, 32000, torch.bfloat16, "plain", True, True),
    (3, 1, 32000, torch.float16, "top_p", True, False),
    (3, 7, 32000, torch.float32, "top_k", False, True),
    (1, 7, 32000, torch.float16, "min_p", True, True),
    (5, 1, 32000, torch.float32, "temperature", True, True),
]


def _mode_kwargs(mode: str, batch: int) -> dict:
    if mode != "per_row":
        return MODES[mode]
    rows = [MODES[m] for m in ("plain", "greedy", "top_k", "top_p", "min_p", "combined", "temperature")]
    rows = [rows[b % len(rows)] for b in range(batch)]
    defaults = dict(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0)
    return {
        name: torch.tensor([r.get(name, default) for r in rows], dtype=torch.int32 if name == "top_k" else torch.float32)
        for name, default in defaults.items()
    }


def _problem(batch, k, vocab, dtype, kw, with_draft, ragged, seed):
    """Target/draft logits, and drafts drawn from the draft's own standardised distribution
    (so many are accepted and later positions get exercised)."""
    g = torch.Generator().manual_seed(seed)
    target = torch.randn(batch, k + 1, vocab, generator=g) * 2.5
    draft = target[:, :k] + torch.randn(batch, k, vocab, generator=g)
    target, draft = target.to(dtype), draft.to(dtype)
    params = make_sampling_tensors(batch, "cpu", seed=seed, **kw)
    source = draft if with_draft else target[:, :k]
    p = torch.softmax(standardise(source, params), -1).reshape(-1, vocab)
    tokens = torch.multinomial(p, 1, generator=g).reshape(batch, k) if k else torch.zeros(batch, 0, dtype=torch.int64)
    if ragged and k:
        cut = torch.randint(0, k + 1, (batch,), generator=g)
        tokens[torch.arange(k)[None, :] >= cut[:, None]] = -1
        tokens[0, :] = -1  # a row that is all padding
    params = make_sampling_tensors(batch, "cpu", seed=seed + 1, offset=torch.arange(batch) * 1000 + seed, **kw)
    return target, (draft if with_draft else None), tokens, params


@pytest.mark.parametrize("batch,k,vocab,dtype,mode,with_draft,ragged", CASES)
def test_cpp_chain_verify_matches_the_reference_token_for_token(batch, k, vocab, dtype, mode, with_draft, ragged):
    from specdec_fast.kernels.verify.cpp import chain_verify_cpp

    kw = _mode_kwargs(mode, batch)
    for trial in range(2):
        target, draft, tokens, params = _problem(batch, k, vocab, dtype, kw, with_draft, ragged, seed=100 * trial + vocab % 97)
        got_tokens, got_accepted = chain_verify_cpp(target, draft, tokens, params)
        want_tokens, want_accepted = chain_verify_reference(target, draft, tokens, params)
        assert got_tokens.dtype == torch.int32 and got_accepted.dtype == torch.int32
        assert torch.equal(got_accepted, want_accepted), (trial, got_accepted, want_accepted)
        assert torch.equal(got_tokens, want_tokens), (trial, got_tokens, want_tokens)


@pytest.mark.parametrize(
    "vocab,dtype,mode",
    [(111, torch.float32, "plain"), (111, torch.float16, "per_row"), (1000, torch.bfloat16, "combined"),
     (1000, torch.float32, "per_row"), (32000, torch.float16, "plain"), (32000, torch.bfloat16, "combined")],
)
def test_cpp_sample_matches_the_reference(vocab, dtype, mode):
    from specdec_fast.kernels.verify.cpp import sample_cpp

    batch = 7
    g = torch.Generator().manual_seed(vocab)
    logits = (torch.randn(batch, vocab, generator=g) * 3).to(dtype)
    params = make_sampling_tensors(batch, "cpu", seed=3, offset=torch.arange(batch) * 5, **_mode_kwargs(mode, batch))
    positions = torch.arange(batch, dtype=torch.int64) * 2**29
    for stream in (1, 2, 200):
        assert torch.equal(sample_cpp(logits, params, positions, stream), sample_reference(logits, params, positions, stream))


def test_cpp_takes_strided_inputs_and_int32_tokens():
    """Views (a slice of a bigger batch, a transposed vocab) go through the public API unchanged."""
    from specdec_fast.kernels import chain_verify

    g = torch.Generator().manual_seed(7)
    big = torch.randn(6, 4, 300, generator=g)
    target = big[::2]  # non-contiguous batch
    draft = torch.randn(3, 300, 3, generator=g).transpose(1, 2)  # non-contiguous vocab
    tokens = torch.randint(0, 300, (3, 3), generator=g, dtype=torch.int32)
    got = chain_verify(target, draft, tokens, seed=4, top_p=0.95, backend="cpp")
    want = chain_verify(target.contiguous(), draft.contiguous(), tokens.long(), seed=4, top_p=0.95, backend="torch")
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


def test_cpp_op_rejects_out_of_range_tokens_without_reading_out_of_bounds():
    """check=False skips the Python value checks; the op still refuses a token >= V."""
    from specdec_fast.kernels.verify.cpp import chain_verify_cpp

    params = make_sampling_tensors(1, "cpu")
    with pytest.raises(RuntimeError, match="draft_tokens"):
        chain_verify_cpp(torch.randn(1, 2, 10), None, torch.tensor([[10]]), params)
