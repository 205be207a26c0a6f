"""PromptLookupDrafter: drafts copied from the row's own context (prompt lookup decoding), no model.

Protocol: see drafters/model.py (start / propose / commit / compact).
"""
import torch


class PromptLookupDrafter:
    """N-gram copy from the row's own context (prompt lookup decoding): no model.

    For n = max_ngram .. 1, the last n tokens of the row are looked up in its earlier context;
    the latest earlier occurrence with a continuation gives the drafts (the tokens after it,
    up to k, -1 where the context ends). Rows with no match draft nothing (all -1). Drafts are
    deterministic: draft_logits is None (p = one-hot in the verify).
    """

    graph_safe = True  # no state: propose is a pure function of state.seq / start / end

    def __init__(self, max_ngram: int = 2):
        if isinstance(max_ngram, bool) or not isinstance(max_ngram, int) or max_ngram < 1:
            raise ValueError(f"max_ngram must be an int >= 1, got {max_ngram!r}")
        self.max_ngram = max_ngram
        self.vocab_size = None

    def start(self, state, prompt=None) -> None:
        self.state = state

    def propose(self, k: int):
        seq, start, end = self.state.seq, self.state.start, self.state.end
        batch, width = seq.shape
        device = seq.device
        have = torch.zeros(batch, dtype=torch.bool, device=device)
        cont = torch.zeros(batch, dtype=torch.long, device=device)
        for n in range(self.max_ngram, 0, -1):
            if n >= width:
                continue
            suffix = seq.gather(1, (end[:, None] - n + torch.arange(n, device=device)).clamp(min=0))
            windows = seq.unfold(1, n, 1)  # [B, W, n]
            w = torch.arange(windows.shape[1], device=device)
            match = (windows == suffix[:, None, :]).all(-1)
            match &= (w[None, :] >= start[:, None]) & (w[None, :] + n < end[:, None]) & (end - n >= start)[:, None]
            latest = (match.long() * (w[None, :] + 1)).amax(1) - 1
            found = latest >= 0
            cont = torch.where(~have & found, latest + n, cont)
            have |= found
        pos = cont[:, None] + torch.arange(k, device=device)
        drafts = seq.gather(1, pos.clamp(max=width - 1))
        ok = have[:, None] & (pos < end[:, None])
        return torch.where(ok, drafts, torch.full_like(drafts, -1)), None

    def commit(self, num_accepted: torch.Tensor, draft_tokens: torch.Tensor) -> None:
        pass

    def compact(self, max_len_bound: int) -> None:
        pass
