"""Prefixes: what each of the N scored positions of a row has seen, as transformers' input_ids.

The target scores N = K+1 positions of a row in one pass; position i sees the row's prefix (the
left-padded prompt, pads included, then the generated tokens) plus this iteration's drafts
0..i-1. The draft model scores one position (N = 1) after the drafts so far. Both are one rule:
the N positions are the last N prefixes of the row's extended sequence

    ext[b] = seq[b, :end[b]] ++ drafts[b, :D]            drafts [B, D], D >= N - 1
    position i sees ext[b, :length[b, i]],   length[b, i] = end[b] + D - (N - 1) + i

so length is transformers' ``input_ids.shape[-1]`` at that step. A -1 draft (padding from the
first -1) is a token that matches nothing: positions whose prefix holds one are never emitted
and their result is unspecified (finite work, in-range indices, nothing raised).

Device code only: gathers and wheres on static shapes, no host read (docs/architecture.md §3).
"""
import torch

NO_TOKEN = -1  # outside the prefix, or a padded draft: equal to no token id (ids are >= 0)


class Prefixes:
    """The prefixes of logits [B, N, V]'s positions (module docstring).

    seq int64 [B, T] (left-padded prompt of width P, then generated tokens), end int64 [B]
    (= P + gen_len), drafts int64 [B, D] (D >= N - 1, -1 pads), n = N, start int64 [B] (the
    first real prompt slot: what repetition_penalty skips, as generate() does) or None.
    lengths int64 [B, N]: each position's prefix length (transformers' input_ids.shape[-1]);
    first: the drafts position 0 sees (position i sees drafts[:, :first + i]).
    """

    def __init__(self, seq: torch.Tensor, end: torch.Tensor, drafts: torch.Tensor, n: int, start=None):
        if seq.dim() != 2 or end.shape != seq.shape[:1] or drafts.dim() != 2 or drafts.shape[0] != seq.shape[0]:
            raise ValueError(f"seq [B, T], end [B], drafts [B, D] expected, got {tuple(seq.shape)}, "
                             f"{tuple(end.shape)}, {tuple(drafts.shape)}")
        if drafts.shape[1] < n - 1:
            raise ValueError(f"{n} positions need at least {n - 1} drafts, got drafts {tuple(drafts.shape)}")
        self.seq, self.end, self.drafts, self.n = seq, end.long(), drafts.long(), n
        self.start = start  # int64 [B] first real prompt slot (left pads before it), or None
        self.device = seq.device
        self.first = drafts.shape[1] - (n - 1)  # drafts seen by position 0 (position i: first + i)
        self.positions = torch.arange(n, device=self.device)  # [N]
        self.lengths = self.end[:, None] + self.first + self.positions[None, :]  # [B, N]
        self._ext = None

    @property
    def ext(self) -> torch.Tensor:
        """int64 [B, T + D]: seq[b, :end[b]] ++ drafts[b], NO_TOKEN after (built once per call)."""
        if self._ext is None:
            batch, width = self.seq.shape
            num_drafts = self.drafts.shape[1]
            index = torch.arange(width + num_drafts, device=self.device)[None, :]  # [1, T + D]
            from_seq = self.seq.long().gather(1, index.clamp(max=width - 1).expand(batch, -1))
            into_drafts = index - self.end[:, None]  # [B, T + D]
            if num_drafts:
                from_drafts = self.drafts.gather(1, into_drafts.clamp(0, num_drafts - 1))
            else:
                from_drafts = torch.full_like(from_seq, NO_TOKEN)
            ext = torch.where(into_drafts < 0, from_seq, torch.where(into_drafts < num_drafts, from_drafts, NO_TOKEN))
            self._ext = torch.where(ext < 0, NO_TOKEN, ext)  # every padded draft is NO_TOKEN
        return self._ext

    def last(self, width: int) -> torch.Tensor:
        """int64 [B, N, width]: the last ``width`` tokens of each position's prefix, NO_TOKEN where
        the prefix is shorter (transformers' ``input_ids[:, -width:]`` when it is long enough)."""
        ext = self.ext
        index = self.lengths[:, :, None] - width + torch.arange(width, device=self.device)  # [B, N, W]
        tokens = ext.gather(1, index.clamp(min=0).reshape(ext.shape[0], -1)).reshape(index.shape)
        return torch.where(index < 0, NO_TOKEN, tokens)
