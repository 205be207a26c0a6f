"""Every verify backend token-for-token against the torch reference (the spec).

The parameter space (batch, K, vocab, dtype, sampling mode, draft logits or not, ragged rows)
is covered pairwise rather than as a full product: every pair of values of any two
parameters appears in at least one case (a greedy covering built at import, deterministic).
Exact equality is asserted everywhere. Decisions that compare floats (ratio test, top-p /
min-p boundaries, Gumbel argmax) could in principle differ by float rounding between
backends; the inputs are continuous random logits, so no decision sits within rounding of
its boundary and no tolerance is needed.
"""
import itertools

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from specdec_fast.kernels import make_sampling_tensors
from specdec_fast.kernels.verify import chain_verify, chain_verify_reference, sample, sample_reference

from .backends import kernel_backends

BACKENDS = [b for b in kernel_backends() if b != "torch"]
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def _modes(batch: int, device="cpu") -> dict:
    """Sampling modes; "mixed" gives every row its own parameters (tensors [B] on device)."""
    cycle = lambda values, dtype: torch.tensor([values[r % len(values)] for r in range(batch)], dtype=dtype, device=device)  # noqa: E731
    return {
        "plain": {},
        "temperature": dict(temperature=0.7),
        "top_k": dict(top_k=5),
        "top_p": dict(top_p=0.8),
        "min_p": dict(min_p=0.1),
        "combined": dict(temperature=1.3, top_k=20, top_p=0.9, min_p=0.02),
        "greedy": dict(temperature=0.0),
        "mixed": dict(
            temperature=cycle([0.0, 0.5, 1.0, 2.0, 0.9], torch.float32),
            top_k=cycle([0, 3, 0, 50, 7], torch.int32),
            top_p=cycle([1.0, 0.9, 0.5, 1.0, 0.95], torch.float32),
            min_p=cycle([0.0, 0.0, 0.1, 0.05, 0.2], torch.float32),
        ),
    }


AXES = {
    "batch": [1, 3, 17],
    "k": [1, 4, 7],
    "vocab": [111, 1000, 32000],
    "dtype": list(DTYPES),
    "mode": list(_modes(1)),
    "draft_logits": [True, False],
    "ragged": [True, False],
}


def _affordable(case: dict) -> bool:
    """Keep interpreter runs short: at most ~300k logits per call."""
    return case["batch"] * (case["k"] + 1) * case["vocab"] <= 300_000


def _pairs(case: dict) -> set:
    return {(a, case[a], b, case[b]) for a, b in itertools.combinations(AXES, 2)}


def _pairwise_cases() -> list[dict]:
    """Greedy pairwise covering of the affordable part of AXES (first best: deterministic).
    Pairs are bits of an int so that scoring all candidates stays fast."""
    candidates = [dict(zip(AXES, values)) for values in itertools.product(*AXES.values())]
    candidates = [c for c in candidates if _affordable(c)]
    bit = {}
    masks = [sum(1 << bit.setdefault(pair, len(bit)) for pair in _pairs(c)) for c in candidates]
    uncovered = (1 << len(bit)) - 1
    chosen = []
    while uncovered:
        best = max(range(len(candidates)), key=lambda i: (masks[i] & uncovered).bit_count())
        chosen.append(candidates[best])
        uncovered &= ~masks[best]
    return chosen


CASES = _pairwise_cases()


def _case_id(c: dict) -> str:
    return f"B{c['batch']}-K{c['k']}-V{c['vocab']}-{c['dtype']}-{c['mode']}-{'draft' if c['draft_logits'] else 'nodraft'}{'-ragged' if c['ragged'] else ''}"


def _problem(batch, k, vocab, dtype, with_draft, ragged, seed, mode, device):
    """Random logits (target with a few -inf), drafts sampled from the draft distribution
    (or from the target's for draft_logits=None), -1 padding on ragged rows. Built on the CPU
    (one generator, the same problem on every machine), returned on ``device``."""
    kw = _modes(batch)[mode]
    g = torch.Generator().manual_seed(seed)
    target = torch.randn(batch, k + 1, vocab, generator=g) * 2.5
    target[:, :, 1::37] = float("-inf")  # tokens the target never emits
    draft = target[:, :k] + torch.randn(batch, k, vocab, generator=g)
    target, draft = target.to(dtype), draft.to(dtype)
    params = make_sampling_tensors(batch, "cpu", seed=seed, **kw)
    from specdec_fast.kernels.verify import standardise

    source = draft if with_draft else target[:, :k]
    probs = torch.softmax(standardise(source, params), -1).reshape(-1, vocab)
    drafts = torch.multinomial(probs, 1, generator=g).reshape(batch, k)
    wrong = torch.randint(0, vocab, (batch, k), generator=g)  # some drafts the target dislikes
    drafts = torch.where(torch.rand(batch, k, generator=g) < 0.2, wrong, drafts)
    if ragged:
        for row in range(batch):
            drafts[row, row % (k + 1):] = -1
    offsets = torch.randint(0, 2**40, (batch,), generator=g)
    return (target.to(device), draft.to(device) if with_draft else None, drafts.to(device), offsets.to(device))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case", CASES, ids=_case_id)
def test_chain_verify_matches_the_reference(case, backend, device):
    batch, k, vocab = case["batch"], case["k"], case["vocab"]
    kw = _modes(batch, device)[case["mode"]]
    seed = 1000 + CASES.index(case)
    target, draft, drafts, offsets = _problem(batch, k, vocab, DTYPES[case["dtype"]], case["draft_logits"], case["ragged"],
                                              seed, case["mode"], device)
    common = dict(seed=seed, offset=offsets, **kw)
    expected = chain_verify(target, draft, drafts, backend="torch", **common)
    got = chain_verify(target, draft, drafts, backend=backend, **common)
    assert got[0].dtype == torch.int32 and got[1].dtype == torch.int32
    assert torch.equal(got[1], expected[1]), (got[1], expected[1])
    assert torch.equal(got[0], expected[0]), (got[0], expected[0])


def test_the_covering_table_is_pairwise_and_small():
    """Every pair of values that some affordable case can hold is held by a chosen case."""
    everything = [dict(zip(AXES, v)) for v in itertools.product(*AXES.values())]
    wanted = set().union(*(_pairs(c) for c in everything if _affordable(c)))
    assert wanted <= set().union(*(_pairs(c) for c in CASES))
    assert len(CASES) <= 40


SAMPLE_CASES = [
    # batch, vocab, dtype, mode, position (int or per-row), stream
    (1, 32000, "float32", "combined", 0, 2),
    (1, 1000, "bfloat16", "top_p", 7, 2),
    (5, 111, "float16", "mixed", "rows", 1),
    (5, 32000, "bfloat16", "plain", 3, 2),
    (33, 1000, "float32", "greedy", "rows", 2),
    (33, 111, "float32", "top_k", 2**32 - 1, 200),
    (9, 1000, "float16", "min_p", "rows", 0),
    (9, 111, "bfloat16", "temperature", 1, 2),
]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("batch,vocab,dtype,mode,position,stream", SAMPLE_CASES)
def test_sample_matches_the_reference(batch, vocab, dtype, mode, position, stream, backend, device):
    g = torch.Generator().manual_seed(batch * vocab)
    logits = (torch.randn(batch, vocab, generator=g) * 3).to(DTYPES[dtype]).to(device)
    if position == "rows":
        position = torch.randint(0, 2**32, (batch,), generator=g).to(device)
    offset = torch.randint(0, 2**56, (batch,), generator=g).to(device)
    kw = dict(seed=vocab, offset=offset, position=position, stream=stream, **_modes(batch, device)[mode])
    expected = sample(logits, backend="torch", **kw)
    got = sample(logits, backend=backend, **kw)
    assert got.dtype == torch.int32 and torch.equal(got, expected), (got, expected)


# The Triton kernels' own tiling knobs: several vocab chunks per row, several blocks per
# chunk and a partial last block, so the chunk merges and the multi-block bisection paths
# (taken on a GPU for vocabularies above one block) run on small inputs.
@pytest.mark.parametrize("vocab,block_v,num_chunks,mode", [
    (200, 64, 3, "combined"), (111, 32, 2, "mixed"), (150, 64, 1, "top_k"), (300, 128, 3, "plain"),
])
def test_triton_vocab_splits_match_the_reference(vocab, block_v, num_chunks, mode, device):
    from specdec_fast.kernels.verify.triton import chain_verify_triton, sample_triton

    batch, k = 5, 2
    kw = _modes(batch, device)[mode]
    target, draft, drafts, offsets = _problem(batch, k, vocab, torch.float32, True, True, vocab + block_v, mode, device)
    params = make_sampling_tensors(batch, device, seed=5, offset=offsets, **kw)
    expected = chain_verify_reference(target, draft, drafts, params)
    got = chain_verify_triton(target, draft, drafts, params, block_v=block_v, num_chunks=num_chunks)
    assert torch.equal(got[0], expected[0]) and torch.equal(got[1], expected[1])
    positions = torch.arange(batch, dtype=torch.int64, device=device) * 3
    assert torch.equal(sample_triton(target[:, 0], params, positions, 2, block_v=block_v, num_chunks=num_chunks),
                       sample_reference(target[:, 0], params, positions, 2))


@pytest.mark.parametrize("backend", BACKENDS)
def test_strided_and_expanded_inputs(backend, device):
    """A batch expanded with stride 0, a vocab-strided view and int32 drafts."""
    g = torch.Generator().manual_seed(3)
    batch, k, vocab = 6, 2, 50
    base = torch.randn(1, k + 1, vocab, generator=g).to(device)
    target = base.expand(batch, -1, -1)
    draft = torch.randn(batch, vocab, k, generator=g).to(device).transpose(1, 2)  # vocab stride k
    drafts = torch.randint(0, vocab, (batch, k), generator=g, dtype=torch.int32).to(device)
    expected = chain_verify(target, draft, drafts, seed=2, top_p=0.9, backend="torch")
    got = chain_verify(target, draft, drafts, seed=2, top_p=0.9, backend=backend)
    assert torch.equal(got[0], expected[0]) and torch.equal(got[1], expected[1])


@pytest.mark.parametrize("backend", BACKENDS)
def test_empty_batch(backend, device):
    tokens, accepted = chain_verify(torch.randn(0, 3, 10, device=device), None, torch.zeros(0, 2, dtype=torch.int64, device=device),
                                    backend=backend)
    assert tokens.shape == (0, 3) and accepted.shape == (0,)


@st.composite
def _verify_problems(draw):
    batch = draw(st.integers(1, 5))
    k = draw(st.integers(0, 4))
    vocab = draw(st.integers(1, 120))
    per_row = lambda s: draw(st.lists(s, min_size=batch, max_size=batch))  # noqa: E731
    kw = dict(
        temperature=torch.tensor(per_row(st.one_of(st.just(0.0), st.floats(0.05, 3.0))), dtype=torch.float32),
        top_k=torch.tensor(per_row(st.one_of(st.just(0), st.integers(1, vocab + 2))), dtype=torch.int32),
        top_p=torch.tensor(per_row(st.one_of(st.just(1.0), st.floats(0.05, 1.0))), dtype=torch.float32),
        min_p=torch.tensor(per_row(st.one_of(st.just(0.0), st.floats(0.0, 0.6))), dtype=torch.float32),
    )
    dtype = draw(st.sampled_from(list(DTYPES.values())))
    seed = draw(st.integers(-(2**63), 2**63 - 1))
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**31)))
    scale = draw(st.sampled_from([0.1, 1.0, 4.0]))
    target = (torch.randn(batch, k + 1, vocab, generator=g) * scale).to(dtype)
    draft = (torch.randn(batch, k, vocab, generator=g) * scale).to(dtype) if draw(st.booleans()) else None
    drafts = torch.randint(-1, vocab, (batch, k), generator=g)
    offsets = torch.randint(0, 2**56, (batch,), generator=g)
    block = draw(st.sampled_from([None, None, 64]))  # 64: the multi-block / multi-chunk paths
    return target, draft, drafts, dict(seed=seed, offset=offsets, **kw), block


@pytest.mark.parametrize("backend", BACKENDS)
@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(problem=_verify_problems())
def test_property_chain_verify_and_sample_match_the_reference(backend, problem):
    from tests.conftest import on_device
    from tests.kernels.backends import TEST_DEVICE as device  # hypothesis' @given does not mix with fixtures

    target, draft, drafts, kw, block = problem
    target, draft, drafts = (None if t is None else on_device(device, t) for t in (target, draft, drafts))
    kw = {name: on_device(device, v) for name, v in kw.items()}
    expected = chain_verify(target, draft, drafts, backend="torch", **kw)
    if backend == "triton" and block is not None:
        from specdec_fast.kernels.verify.triton import chain_verify_triton

        params = make_sampling_tensors(target.shape[0], device, **kw)
        got = chain_verify_triton(target, draft, drafts, params, block_v=block, num_chunks=3)
    else:
        got = chain_verify(target, draft, drafts, backend=backend, **kw)
    assert torch.equal(got[1], expected[1]) and torch.equal(got[0], expected[0])
    logits = target[:, 0]
    assert torch.equal(sample(logits, backend=backend, position=5, **kw), sample(logits, backend="torch", position=5, **kw))
