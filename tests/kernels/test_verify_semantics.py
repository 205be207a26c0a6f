"""chain_verify and sample semantics on every backend: exactness (chi-square against the
standardised target), greedy, edge cases, determinism, and bad input."""
import pytest
import torch

from specdec_fast.kernels import chain_verify, make_sampling_tensors, sample, standardise

from .backends import kernel_backends
from .stats import P_VALUE_THRESHOLD, chi_square_pvalue

BACKENDS = kernel_backends()

SAMPLING_MODES = {
    "plain": dict(),
    "temperature": dict(temperature=0.7),
    "top_k": dict(top_k=5),
    "top_p": dict(top_p=0.8),
    "min_p": dict(min_p=0.08),
    "all": dict(temperature=1.3, top_k=9, top_p=0.9, min_p=0.02),
}


def _probs(logits: torch.Tensor, **mode) -> torch.Tensor:
    """Standardised probabilities of logits [N, V] -> [N, V] (from the reference)."""
    params = make_sampling_tensors(logits.shape[0], logits.device, **mode)
    return torch.softmax(standardise(logits[:, None], params)[:, 0], -1)


def _problem(vocab: int, k: int, seed: int, sharp: float = 2.0):
    g = torch.Generator().manual_seed(seed)
    target = torch.randn(k + 1, vocab, generator=g) * sharp
    draft = target[:k] + torch.randn(k, vocab, generator=g)  # correlated, like a real draft
    target[0, 3] = float("-inf")  # a token the target never emits
    return target, draft


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("mode", list(SAMPLING_MODES))
def test_emitted_tokens_follow_the_target_distribution(backend, mode, device):
    """Chen et al. Theorem 1: with drafts x_i ~ p_i, token 0 ~ q_0 and, given x_0 accepted, token 1 ~ q_1."""
    vocab, k, rows = 24, 2, 6000 if backend == "triton" else 20000
    target, draft = _problem(vocab, k, seed=11)
    kw = SAMPLING_MODES[mode]
    p = _probs(draft, **kw)
    q = _probs(target, **kw)
    g = torch.Generator().manual_seed(5)
    drafts = torch.stack([torch.multinomial(p[i], rows, replacement=True, generator=g) for i in range(k)], 1)
    tokens, accepted = chain_verify(
        target.expand(rows, -1, -1).to(device), draft.expand(rows, -1, -1).to(device), drafts.to(device),
        seed=123, backend=backend, **kw,
    )
    tokens, accepted = tokens.cpu(), accepted.cpu()
    assert chi_square_pvalue(tokens[:, 0], q[0]) > P_VALUE_THRESHOLD
    first_accepted = accepted >= 1
    assert first_accepted.sum() > rows // 10
    assert chi_square_pvalue(tokens[first_accepted, 1], q[1]) > P_VALUE_THRESHOLD


@pytest.mark.parametrize("backend", BACKENDS)
def test_deterministic_drafts_follow_the_target_distribution(backend, device):
    """draft_logits=None (prompt lookup): p = one-hot(x); the output is still ~ q."""
    vocab, rows = 17, 6000 if backend == "triton" else 20000
    target, _ = _problem(vocab, 1, seed=3)
    drafts = torch.full((rows, 1), 5, dtype=torch.int64)
    drafts[rows // 2:] = 3  # half the rows propose a zero-probability token
    tokens, accepted = chain_verify(target.expand(rows, -1, -1).to(device), None, drafts.to(device), seed=9, backend=backend)
    q = _probs(target)
    for half in (slice(0, rows // 2), slice(rows // 2, rows)):
        assert chi_square_pvalue(tokens[half, 0].cpu(), q[0]) > P_VALUE_THRESHOLD
    assert not bool(accepted[rows // 2:].any())


@pytest.mark.parametrize("backend", BACKENDS)
def test_sample_follows_the_standardised_distribution(backend, device):
    vocab, rows = 30, 6000 if backend == "triton" else 20000
    logits = torch.randn(1, vocab, generator=torch.Generator().manual_seed(2)) * 2
    for mode in ("plain", "all"):
        kw = SAMPLING_MODES[mode]
        # seed 5: at seed 4 the noise drawing four vocab indices from one Philox call (kernels/rng, 2026-11-28)
        # gave the plain case p = 0.00078 (threshold 0.001), while 10 seeds pooled (1M rows, C++) gave p = 0.80
        # (plain) / 0.19 (all) and 200 seeds' p-values no departure from uniform (KS D 0.087): a one-in-a-
        # thousand draw at one seed, not a bias
        out = sample(logits.expand(rows, -1).to(device), seed=5, position=1, backend=backend, **kw)
        assert out.dtype == torch.int32 and out.shape == (rows,)
        assert chi_square_pvalue(out.cpu(), _probs(logits, **kw)[0]) > P_VALUE_THRESHOLD


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("with_draft_logits", [True, False])
def test_greedy_is_exact_argmax(backend, with_draft_logits, device):
    g = torch.Generator().manual_seed(0)
    batch, k, vocab = 5, 4, 111
    target = torch.randn(batch, k + 1, vocab, generator=g)
    draft = torch.randn(batch, k, vocab, generator=g)
    best = target.argmax(-1)
    drafts = best[:, :k].clone()
    drafts[1, 0] = (drafts[1, 0] + 1) % vocab  # row 1 rejects at 0, row 2 at 2, row 3 padded after 1
    drafts[2, 2] = (drafts[2, 2] + 1) % vocab
    drafts[3, 1:] = -1
    if with_draft_logits:  # a greedy draft proposes its own argmax: make the drafts exactly that
        draft.scatter_(-1, drafts.clamp(min=0)[..., None], 100.0)
    tokens, accepted = chain_verify(
        target.to(device), draft.to(device) if with_draft_logits else None, drafts.to(device),
        temperature=0.0, seed=1, backend=backend,
    )
    assert accepted.tolist() == [4, 0, 2, 1, 4]
    for row, n in enumerate(accepted.tolist()):
        assert tokens[row, : n + 1].tolist() == best[row, : n + 1].tolist()
        assert tokens[row, n + 1:].tolist() == [-1] * (k - n)


@pytest.mark.parametrize("backend", BACKENDS)
def test_greedy_drafts_need_no_draft_logits(backend, device):
    """Every row greedy, each draft = sample() of its draft logits at temperature 0 (what
    ModelDrafter proposes): the verify gives the same tokens without the draft logits (p =
    one-hot(draft)) as with them (p = one-hot(argmax)), ties in both logits included; this is
    why ModelDrafter.propose returns no logits for an all-greedy batch."""
    g = torch.Generator().manual_seed(5)
    batch, k, vocab = 6, 3, 97
    target = torch.randint(0, 4, (batch, k + 1, vocab), generator=g).float().to(device)  # ties everywhere
    draft = torch.randint(0, 4, (batch, k, vocab), generator=g).float().to(device)
    draft[:3] = target[:3, :k]  # rows 0-2 agree with the target (long accepted runs)
    drafts = torch.stack([sample(draft[:, i], temperature=0.0, seed=2, backend=backend) for i in range(k)], 1).long()
    drafts[4, 1:] = -1
    with_logits = chain_verify(target, draft, drafts, temperature=0.0, seed=1, backend=backend)
    without = chain_verify(target, None, drafts, temperature=0.0, seed=1, backend=backend)
    assert torch.equal(with_logits[0], without[0]) and torch.equal(with_logits[1], without[1])
    assert with_logits[1][:3].tolist() == [k] * 3


@pytest.mark.parametrize("backend", BACKENDS)
def test_greedy_tie_takes_the_lowest_index(backend, device):
    target = torch.zeros(2, 1, 9)
    target[:, 0, 4] = target[:, 0, 7] = 1.0
    tokens, _ = chain_verify(target.to(device), None, torch.zeros(2, 0, dtype=torch.int64, device=device), temperature=0.0, backend=backend)
    assert tokens[:, 0].tolist() == [4, 4]


@pytest.mark.parametrize("backend", BACKENDS)
def test_equal_distributions_accept_everything(backend, device):
    g = torch.Generator().manual_seed(1)
    batch, k, vocab = 64, 5, 50
    logits = torch.randn(batch, k + 1, vocab, generator=g)
    p = torch.softmax(logits[:, :k], -1)
    drafts = torch.multinomial(p.reshape(-1, vocab), 1, generator=g).reshape(batch, k)
    _, accepted = chain_verify(logits.to(device), logits[:, :k].contiguous().to(device), drafts.to(device), seed=3, backend=backend)
    assert accepted.tolist() == [k] * batch


@pytest.mark.parametrize("backend", BACKENDS)
def test_draft_outside_the_target_support_is_rejected(backend, device):
    g = torch.Generator().manual_seed(4)
    batch, vocab = 200, 40
    target = torch.randn(batch, 2, vocab, generator=g)
    draft = torch.randn(batch, 1, vocab, generator=g)
    drafts = target[:, 0].argsort(-1)[:, :1]  # the target's least likely token: outside top-k=5
    tokens, accepted = chain_verify(target.to(device), draft.to(device), drafts.to(device), top_k=5, backend=backend)
    assert not bool(accepted.any())
    top5 = target[:, 0].topk(5).indices
    assert bool((top5 == tokens[:, :1].cpu().long()).any(-1).all())


@pytest.mark.parametrize("backend", BACKENDS)
def test_all_padding_samples_the_bonus_from_position_zero(backend, device):
    target = torch.full((3, 4, 12), float("-inf"))
    target[:, 0, 7] = 0.0  # one-hot at position 0
    target[:, 1:, 2] = 0.0  # (later positions must be valid distributions too)
    drafts = torch.full((3, 3), -1, dtype=torch.int32)
    drafts[2, 1] = 5  # a token after the first -1 is still padding
    tokens, accepted = chain_verify(target.to(device), None, drafts.to(device), backend=backend)
    assert accepted.tolist() == [0, 0, 0]
    assert tokens.tolist() == [[7, -1, -1, -1]] * 3


@pytest.mark.parametrize("backend", BACKENDS)
def test_vocab_of_one(backend, device):
    target = torch.randn(2, 3, 1)
    tokens, accepted = chain_verify(target.to(device), torch.randn(2, 2, 1).to(device), torch.zeros(2, 2, dtype=torch.int64, device=device), backend=backend)
    assert accepted.tolist() == [2, 2] and tokens.tolist() == [[0, 0, 0]] * 2


@pytest.mark.parametrize("backend", BACKENDS)
def test_one_hot_target_rejects_other_tokens_and_emits_its_token(backend, device):
    vocab = 20
    target = torch.full((4, 2, vocab), float("-inf"))
    target[:, 0, 6] = 0.0
    target[:, 1, 2] = 0.0
    draft = torch.randn(4, 1, vocab)
    drafts = torch.tensor([[6], [1], [6], [0]])
    tokens, accepted = chain_verify(target.to(device), draft.to(device), drafts.to(device), seed=5, backend=backend)
    assert accepted.tolist() == [1, 0, 1, 0]
    assert tokens.tolist() == [[6, 2], [6, -1], [6, 2], [6, -1]]


@pytest.mark.parametrize("backend", BACKENDS)
def test_same_seed_same_output_and_rows_independent_of_batch_slot(backend, device):
    g = torch.Generator().manual_seed(8)
    batch, k, vocab = 6, 3, 64
    target = torch.randn(batch, k + 1, vocab, generator=g)
    draft = torch.randn(batch, k, vocab, generator=g)
    drafts = torch.randint(0, vocab, (batch, k), generator=g)
    seeds = torch.arange(100, 100 + batch, dtype=torch.int64)
    offsets = torch.arange(batch, dtype=torch.int64) * 7
    args = [t.to(device) for t in (target, draft, drafts)]
    kw = dict(seed=seeds.to(device), offset=offsets.to(device), backend=backend, temperature=0.9)
    a = chain_verify(*args, **kw)
    b = chain_verify(*args, **kw)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    perm = torch.tensor([3, 0, 5, 1, 4, 2])
    c = chain_verify(*(t[perm.to(device)] for t in args), seed=seeds[perm].to(device), offset=offsets[perm].to(device), backend=backend, temperature=0.9)
    assert torch.equal(c[0], a[0][perm.to(device)]) and torch.equal(c[1], a[1][perm.to(device)])


@pytest.mark.parametrize("backend", BACKENDS)
def test_per_row_parameters_match_rows_run_alone(backend, device):
    g = torch.Generator().manual_seed(12)
    batch, k, vocab = 4, 2, 33
    target = torch.randn(batch, k + 1, vocab, generator=g) * 2
    draft = torch.randn(batch, k, vocab, generator=g) * 2
    drafts = torch.randint(0, vocab, (batch, k), generator=g)
    per_row = dict(temperature=[0.0, 0.5, 1.0, 2.0], top_k=[0, 3, 0, 10], top_p=[1.0, 0.9, 0.5, 1.0], min_p=[0.0, 0.0, 0.1, 0.05])
    seeds = torch.tensor([11, 12, 13, 14])
    together = chain_verify(
        target.to(device), draft.to(device), drafts.to(device), seed=seeds.to(device), backend=backend,
        **{n: torch.tensor(v).to(device) for n, v in per_row.items()},
    )
    for row in range(batch):
        alone = chain_verify(
            target[row:row + 1].to(device), draft[row:row + 1].to(device), drafts[row:row + 1].to(device),
            seed=seeds[row:row + 1].to(device), backend=backend, **{n: v[row] for n, v in per_row.items()},
        )
        assert torch.equal(alone[0][0], together[0][row]) and alone[1][0] == together[1][row]


def _valid(device, batch=2, k=3, vocab=10):
    return torch.randn(batch, k + 1, vocab, device=device), torch.randn(batch, k, vocab, device=device), torch.zeros(batch, k, dtype=torch.int64, device=device)


@pytest.mark.parametrize(
    "mutate,error,match",
    [
        (lambda t, d, x: (t[:, :3], d, x), ValueError, "draft_tokens"),
        (lambda t, d, x: (t, d[:, :2], x), ValueError, "draft_logits"),
        (lambda t, d, x: (t, d[..., :9], x), ValueError, "vocab mismatch"),
        (lambda t, d, x: (t, d.half(), x), TypeError, "draft_logits dtype"),
        (lambda t, d, x: (t.long(), d, x), TypeError, "target_logits"),
        (lambda t, d, x: (t[0], d, x), ValueError, "target_logits"),
        (lambda t, d, x: (t, d, x.float()), TypeError, "draft_tokens"),
        (lambda t, d, x: (t, d, x + 10), ValueError, "draft_tokens must lie"),
        (lambda t, d, x: (t, d, x - 2), ValueError, "draft_tokens must lie"),
        (lambda t, d, x: (t.index_fill(2, torch.tensor([1], device=t.device), float("nan")), d, x), ValueError, "target_logits contains NaN"),
        (lambda t, d, x: (t, d.index_fill(2, torch.tensor([1], device=d.device), float("inf")), x), ValueError, "draft_logits contains NaN"),
        (lambda t, d, x: (torch.full_like(t, float("-inf")), d, x), ValueError, "every logit is -inf"),
    ],
)
def test_bad_tensors_raise_naming_the_argument(mutate, error, match, device):
    with pytest.raises(error, match=match):
        chain_verify(*mutate(*_valid(device)), backend="torch")


@pytest.mark.parametrize(
    "kw,error,match",
    [
        (dict(temperature=-0.1), ValueError, "temperature"),
        (dict(temperature=float("nan")), ValueError, "temperature"),
        (dict(top_p=0.0), ValueError, "top_p"),
        (dict(top_p=1.5), ValueError, "top_p"),
        (dict(top_k=-1), ValueError, "top_k"),
        (dict(top_k=2.5), TypeError, "top_k"),
        (dict(min_p=1.1), ValueError, "min_p"),
        (dict(min_p=torch.tensor([0.0, -0.5])), ValueError, "min_p"),
        (dict(temperature=torch.tensor([1.0, 1.0, 1.0])), ValueError, "temperature"),
        (dict(seed=1.5), TypeError, "seed"),
        (dict(seed=torch.tensor([1.0, 2.0])), TypeError, "seed"),
        (dict(offset=-1), ValueError, "offset"),
        (dict(offset=1 << 60), ValueError, "offset"),
        (dict(top_k=torch.tensor([1, 2**40])), ValueError, "top_k"),  # would wrap in int32
        (dict(backend="cuda"), ValueError, "backend"),
    ],
)
def test_bad_parameters_raise_naming_the_argument(kw, error, match, device):
    kw = {name: value.to(device) if isinstance(value, torch.Tensor) else value for name, value in kw.items()}
    with pytest.raises(error, match=match):
        chain_verify(*_valid(device), **kw)


def test_int32_parameter_tensors_are_checked_in_int64(device):
    """An int32 offset tensor is valid (its bounds are checked in int64, not wrapped to int32)."""
    t, d, x = _valid(device)
    tokens, _ = chain_verify(t, d, x, offset=torch.tensor([0, 7], dtype=torch.int32, device=device),
                             top_k=torch.tensor([3, 0], dtype=torch.int64, device=device), backend="torch")
    assert tokens.shape == (2, 4)


def test_mixed_devices_raise(device):
    if device == "cpu":
        t, d, x = _valid("cpu")
        with pytest.raises(ValueError, match="draft_tokens is on meta"):
            chain_verify(t, d, x.to("meta"), backend="torch")
    else:
        t, d, x = _valid(device)
        with pytest.raises(ValueError, match="draft_logits is on cpu"):
            chain_verify(t, d.cpu(), x)


def test_sample_rejects_bad_position_and_stream(device):
    logits = torch.randn(2, 10, device=device)
    with pytest.raises(ValueError, match="position"):
        sample(logits, position=-1)
    with pytest.raises(ValueError, match="stream"):
        sample(logits, stream=300)
    with pytest.raises(ValueError, match="logits"):
        sample(logits[0])


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("mode", [dict(temperature=0.0), dict(), dict(top_k=5)])
def test_nan_rows_without_checks_give_vocabulary_indices(backend, mode, device):
    """check=False on rows holding NaN (an all-NaN row, a NaN run, one NaN): the tokens are
    unspecified, but each is -1 (a pad) or an index of the vocabulary, on every backend, for the
    small-vocabulary kernel and the streaming path (the engine feeds them to an embedding: a
    finished row's logits come from unwritten memory)."""
    g = torch.Generator().manual_seed(8)
    for vocab in (40, 5000):  # one tile; the streaming + merging kernels (V > CAP on Triton)
        logits = torch.randn(3, 3, vocab, generator=g)
        logits[0] = float("nan")
        logits[1, :, :10] = float("nan")
        logits[2, :, 7] = float("nan")
        drafts = torch.randint(0, vocab, (3, 2), generator=g)
        sampled = sample(logits[:, 0].to(device), backend=backend, check=False, seed=1, **mode)
        tokens, _ = chain_verify(logits.to(device), None, drafts.to(device), backend=backend, check=False, seed=1, **mode)
        assert bool(((sampled >= 0) & (sampled < vocab)).all()), sampled
        assert bool(((tokens >= -1) & (tokens < vocab)).all()), tokens
