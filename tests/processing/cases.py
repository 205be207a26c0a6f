"""Random speculative prefixes and the per-row, per-position transformers oracle.

A case: B = 3 rows of a left-padded prompt (width P) then gen_len generated tokens (different per
row, 0 included), garbage after end (never read), N scored positions and N - 1 drafts with -1
pads from a random point in some rows. Tokens come from a small alphabet (default 8 ids) inside
a larger vocabulary, so n-grams and biased sequences repeat often."""
from dataclasses import dataclass

import torch

PAD = 0


@dataclass
class Case:
    seq: torch.Tensor     # int64 [B, T]
    end: torch.Tensor     # int64 [B]
    start: torch.Tensor   # int64 [B] first real prompt slot
    drafts: torch.Tensor  # int64 [B, D]
    logits: torch.Tensor  # float32 [B, N, V]
    prompt_width: int

    @property
    def n(self) -> int:
        return self.logits.shape[1]

    def prefix(self, b: int, i: int):
        """transformers' input_ids [1, L] at row b, position i, or None when it holds a padded draft."""
        seen = self.drafts.shape[1] - self.n + 1 + i
        drafts = self.drafts[b, :seen]
        if (drafts < 0).any():
            return None
        return torch.cat([self.seq[b, : int(self.end[b])], drafts])[None, :]


def random_case(seed: int, *, vocab: int = 50, n: int = 4, prompt_lengths=(6, 3, 1), max_gen: int = 9,
                alphabet: int = 8, extra_drafts: int = 0, gen_lens=None) -> Case:
    g = torch.Generator().manual_seed(seed)
    batch, width = len(prompt_lengths), max(prompt_lengths)
    total = width + max_gen + n + 2
    seq = torch.randint(1, alphabet, (batch, total), generator=g)  # garbage past end too
    start = torch.tensor([width - p for p in prompt_lengths])
    for b in range(batch):
        seq[b, : int(start[b])] = PAD
    if gen_lens is None:
        gen_lens = torch.randint(0, max_gen + 1, (batch,), generator=g).tolist()
        gen_lens[0] = 0  # the first generated position is always in a case (begin_suppress_tokens)
    end = width + torch.tensor(gen_lens)
    num_drafts = n - 1 + extra_drafts
    drafts = torch.randint(1, alphabet, (batch, num_drafts), generator=g)
    if num_drafts:
        cut = int(torch.randint(0, num_drafts, (1,), generator=g))
        drafts[1, cut:] = -1  # row 1: padding from a random draft on
    logits = torch.randn(batch, n, vocab, generator=g) * 3
    return Case(seq, end, start, drafts, logits, width)


def oracle(make_processors, case: Case):
    """(expected [B, N, V], valid [B, N] bool): transformers' processors called per row and per
    position on that position's exact input_ids [1, L] and a float32 copy of its logits.
    make_processors(b) -> a callable (input_ids, scores) -> scores, fresh per row."""
    expected = case.logits.clone()
    valid = torch.zeros(case.logits.shape[:2], dtype=torch.bool)
    for b in range(case.logits.shape[0]):
        processors = make_processors(b)
        for i in range(case.n):
            ids = case.prefix(b, i)
            if ids is None:
                continue
            expected[b, i] = processors(ids, case.logits[b, i][None, :].clone())[0]
            valid[b, i] = True
    return expected, valid


def assert_same(ours: torch.Tensor, expected: torch.Tensor, valid: torch.Tensor, *, atol=1e-5, rtol=1e-5):
    """Same -inf / +inf set and equal finite values (fp32 tolerance) at every valid position."""
    a, e = ours[valid], expected[valid]
    assert torch.equal(torch.isneginf(a), torch.isneginf(e)), "the -inf sets differ"
    assert torch.equal(torch.isposinf(a), torch.isposinf(e))
    finite = torch.isfinite(e)
    torch.testing.assert_close(a[finite], e[finite], atol=atol, rtol=rtol)
    assert valid.any()
