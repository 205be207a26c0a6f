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

A token tree's nodes (tree_prefixes) are the same rule on rows of their own: node i of row b is
row b * N + i, one position, whose drafts are its ancestor path (depth 1 .. depth(i)) and which
sees depth(i) of them (``seen``); its ``group`` of N rows shares row b's seq, end and start.

Device code only: gathers and wheres on static shapes, no host read (docs/architecture.md §3).
"""
import torch

NO_TOKEN = -1  # outside the prefix, or a padded draft: equal to no token id (ids are >= 0)


class Prefixes:
    """The prefixes of logits [B, N, V]'s positions (module docstring).

    seq int64 [B, T] (left-padded prompt of width P, then generated tokens), end int64 [B]
    (= P + gen_len), drafts int64 [B, D] (D >= N - 1, -1 pads), n = N, start int64 [B] (the
    first real prompt slot: what repetition_penalty skips, as generate() does) or None.
    seen int64 [B, N]: the drafts each position sees (position i sees drafts[b, :seen[b, i]]);
    None: the chain's D - (N - 1) + i. group: rows come in groups of this many consecutive rows
    that share seq, end and start (a tree's nodes: tree_prefixes), so what depends on those
    alone is computed once per group.
    lengths int64 [B, N]: each position's prefix length (transformers' input_ids.shape[-1]).
    """

    def __init__(self, seq: torch.Tensor, end: torch.Tensor, drafts: torch.Tensor, n: int, start=None, *,
                 seen: torch.Tensor | None = None, group: int = 1):
        if seq.dim() != 2 or end.shape != seq.shape[:1] or drafts.dim() != 2 or drafts.shape[0] != seq.shape[0]:
            raise ValueError(f"seq [B, T], end [B], drafts [B, D] expected, got {tuple(seq.shape)}, "
                             f"{tuple(end.shape)}, {tuple(drafts.shape)}")
        if seen is None and drafts.shape[1] < n - 1:
            raise ValueError(f"{n} positions need at least {n - 1} drafts, got drafts {tuple(drafts.shape)}")
        if seen is not None and seen.shape != (seq.shape[0], n):
            raise ValueError(f"seen must be [B, N] = {(seq.shape[0], n)}, got {tuple(seen.shape)}")
        if group < 1 or seq.shape[0] % group:
            raise ValueError(f"group must divide the {seq.shape[0]} rows, got {group}")
        self.seq, self.end, self.drafts, self.n = seq, end.long(), drafts.long(), n
        self.start = start  # int64 [B] first real prompt slot (left pads before it), or None
        self.device, self.group = seq.device, group
        if seen is None:
            first = drafts.shape[1] - (n - 1)  # drafts seen by position 0 (position i: first + i)
            seen = (first + torch.arange(n, device=self.device))[None, :].expand(seq.shape[0], -1)
        self.seen = seen.long()  # [B, N]
        self.lengths = self.end[:, None] + self.seen  # [B, N]
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


def node_paths(tokens: torch.Tensor, parents: torch.Tensor, depths: torch.Tensor, depth: int,
               nodes: torch.Tensor | None = None) -> torch.Tensor:
    """int64 [B, E, depth]: the ancestor path below the root, node included, of nodes [E] (None:
    every node, E = N) of tokens [B, N] (node 0 the root): depth 1 .. depth(i), NO_TOKEN after
    it. parents int64 [B, N] or [N] (-1 at the root), depths [N] (the root 0), depth: at least
    the deepest of those nodes' (static shapes: ``depth`` gathers of [B, E], no host read). Only
    the tokens of those nodes and their ancestors are read."""
    batch, n = tokens.shape
    parents = parents.long().expand(batch, n)
    node = torch.arange(n, device=tokens.device) if nodes is None else nodes.long()
    steps = (depths.long() if nodes is None else depths.long().index_select(0, node))[:, None] - 1 - \
        torch.arange(depth, device=tokens.device)[None, :]  # [E, depth]: path slot j is that many steps up
    node = node[None, :].expand(batch, -1)
    upward = []  # upward[s]: the token s steps above each node (s = 0: the node itself)
    for _ in range(depth):
        upward.append(tokens.gather(1, node))
        node = parents.gather(1, node).clamp(min=0)
    if not upward:
        return torch.full((batch, node.shape[1], 0), NO_TOKEN, dtype=torch.long, device=tokens.device)
    path = torch.stack(upward, 2).gather(2, steps.clamp(min=0)[None].expand(batch, -1, -1))  # [B, E, depth]
    return torch.where(steps[None] >= 0, path, NO_TOKEN)


def tree_prefixes(seq: torch.Tensor, end: torch.Tensor, tokens: torch.Tensor, parents: torch.Tensor,
                  depths: torch.Tensor, depth: int, start=None, nodes: torch.Tensor | None = None) -> Prefixes:
    """The prefixes of a token tree's nodes (tokens [B, N], node 0 the last emitted token; parents,
    depths, depth, nodes as node_paths) as B * E rows of one position each (logits [B, E, V] viewed
    as [B * E, 1, V]): row b * E + e sees seq[b, :end[b]] ++ the ancestor path of node nodes[e]
    (None: every node, E = N)."""
    batch = tokens.shape[0]
    paths = node_paths(tokens, parents, depths, depth, nodes)  # [B, E, depth]
    count = paths.shape[1]
    seen = (depths if nodes is None else depths.index_select(0, nodes)).long()
    seen = seen[None, :].expand(batch, count).reshape(batch * count, 1)
    start = None if start is None else start.repeat_interleave(count)
    return Prefixes(seq.repeat_interleave(count, 0), end.repeat_interleave(count), paths.reshape(batch * count, -1), 1,
                    start=start, seen=seen, group=count)
