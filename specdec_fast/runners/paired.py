"""PairedRunner: the runner interface of the draft heads that are fed (token, hidden state) pairs
(EAGLE-3: runners/paged_eagle3.py; a target's MTP layer: runners/paged_mtp.py), on top of
PagedRunnerBase's cache, packing, admission and commit.

Entry t of a head's cache pairs a token with a feature row: for context entries the target's
hidden states, for draft steps the head's own previous output (the drafters: drafters/eagle3.py).
A subclass supplies ``_head_decode(flat, feats, positions, cu, attn_lens, n, project)`` (packed
entries -> (the rows the logits read [T, H], the output a draft step feeds back [T, H])) and
``_head_logits(normed)`` (-> logits [..., V]).
"""
import torch


class PairedRunner:
    """prefill_pairs / score_pairs / commit (runners/base.py's contract with pairs instead of
    tokens). Mixed in before PagedRunnerBase (or a family's runner): its plain prefill / score refuse."""

    position_offset = 0  # added to each entry's position (RoPE): an MTP layer's entry t sits at t + 1

    @torch.no_grad()
    def prefill_pairs(self, tokens: torch.Tensor, features: torch.Tensor, attention_mask: torch.Tensor | None, *,
                      budgets, num_draft_tokens: int | None = None) -> None:
        """Context entries tokens [B, P], target features [B, P, F] (left padding: the mask's
        real entries are each row's last ones; P may be 0) become each row's committed context;
        row b reserves budgets[b] entries (0: an unused row)."""
        num_valid = self._admit(tokens, attention_mask, budgets, None, num_draft_tokens)
        self._direct = None
        if tokens.shape[1]:
            self._prefilling = True
            try:
                self._pairs(tokens, features, num_valid, True)
            finally:
                self._prefilling = False
        self._end_prefill()

    @torch.no_grad()
    def score_pairs(self, tokens: torch.Tensor, features: torch.Tensor, num_valid: torch.Tensor | None = None, *,
                    project: bool, tree=None, last_only: bool = False, rows: torch.Tensor | None = None):
        """tokens [B, N], features [B, N, F] (target features with project=True, the head's own
        output with project=False) appended as tentative entries (only the last num_valid[b] real)
        -> (logits [B, N, V], g [B, N, H]). tree: (mask, depths) as PagedRunnerBase.score.
        last_only: logits [B, 1, V] of the last entry only (the drafters' pending feed reads no
        other: the LM head, the head's largest matrix, then runs on one row per row, not N);
        rows: int64 [R] entries -> logits [B, R, V] of those alone (a tree level's expanding
        nodes, as PagedRunnerBase.score(rows=)); g stays [B, N, H]."""
        self._tentative += tokens.shape[1]
        if self._tentative > self.max_tentative:
            raise RuntimeError(f"{self._tentative} tentative entries since the last commit exceed the reserved "
                               f"K + 1 = {self.max_tentative}")
        normed, g = self._pairs(tokens, features, num_valid, project, tree)
        if last_only:
            normed = normed[:, -1:]
        elif rows is not None:
            normed = normed.index_select(1, rows)
        return self._head_logits(normed), g

    def prefill(self, *args, **kwargs):
        raise TypeError(f"{type(self).__name__} is fed (token, hidden state) pairs: use prefill_pairs")

    def score(self, *args, **kwargs):
        raise TypeError(f"{type(self).__name__} is fed (token, hidden state) pairs: use score_pairs")

    def _pairs(self, tokens, features, num_valid, project: bool, tree=None):
        batch, n = tokens.shape
        flat, positions, cu, count, unpack = self._pack(tokens, num_valid, None if tree is None else tree[1])
        if self.position_offset:
            positions = positions + self.position_offset
        attn_lens = self.length + count
        feats = features.reshape(batch * n, features.shape[-1])
        if feats.dtype != self.dtype:
            feats = feats.to(self.dtype)
        if unpack is not None:  # the features follow the tokens' packing
            feats = torch.empty_like(feats).index_copy_(0, unpack, feats)
        self._tree_mask = None if tree is None else (tree[0].repeat(batch) if tree[0].dim() == 1 else tree[0].reshape(-1))
        try:
            normed, g = self._head_decode(flat, feats, positions, cu, attn_lens, n, project)
        finally:
            self._tree_mask = None
        self.length.copy_(attn_lens)
        if unpack is not None:
            normed, g = normed.index_select(0, unpack), g.index_select(0, unpack)
        return normed.view(batch, n, -1), g.view(batch, n, -1)
