"""The spec of paged attention for N new queries per row, in plain torch (also the oracle).

Layout (per layer): k_cache, v_cache [num_blocks, block_size, Hkv, D]; block_table [B, max_blocks]
int32 (row b's logical block i is physical block block_table[b, i]); seq_lens [B] int32 counts
row b's tokens INCLUDING its n_b new ones (already appended). q [T, Hq, D] packs the rows'
queries: row b owns q[cu[b]:cu[b+1]], n_b = cu[b+1] - cu[b]; its prefix P_b = seq_lens[b] - n_b;
new query i sits at position P_b + i.

Mask: every query sees the whole prefix. Among the new tokens, query i sees token j iff j <= i
(causal) and, with a tree, bit j of tree_mask[t] is set (t = cu[b] + i: its ancestors and
itself, nodes in BFS order). causal=False is the block mask (DFlash's draft block): every query
sees every new token of its row, both ways. Softmax in fp32; output [T, Hq, D] in q's dtype.
"""
import math

import torch


def gather_row_kv(cache: torch.Tensor, block_table_row: torch.Tensor, length: int) -> torch.Tensor:
    """The first ``length`` tokens of one row as a dense [length, Hkv, D] tensor."""
    block_size = cache.shape[1]
    num_blocks = -(-length // block_size)
    pages = cache[block_table_row[:num_blocks].long()]  # [nb, bs, Hkv, D]
    return pages.reshape(-1, *cache.shape[2:])[:length]


def new_token_mask(query_len: int, tree_bits: torch.Tensor | None, causal: bool = True) -> torch.Tensor:
    """[n, n] bool: query i may see new token j (causal, AND the tree bits when given; every j with
    causal=False: the block mask)."""
    idx = torch.arange(query_len, device="cpu" if tree_bits is None else tree_bits.device)
    allowed = idx[None, :] <= idx[:, None] if causal else torch.ones(query_len, query_len, dtype=torch.bool,
                                                                     device=idx.device)
    if tree_bits is not None:
        bits = (tree_bits.to(torch.int64)[:, None] >> idx[None, :]) & 1
        allowed = allowed & bits.bool()
    return allowed


def paged_attention_reference(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_table: torch.Tensor,
    seq_lens: torch.Tensor,
    cu_query_lens: torch.Tensor,
    tree_mask: torch.Tensor | None = None,
    scale: float | None = None,
    causal: bool = True,
) -> torch.Tensor:
    """out [T, Hq, D] (q's dtype). Reads tensor values on the host: a spec, not a fast path."""
    T, Hq, D = q.shape
    Hkv = k_cache.shape[2]
    group = Hq // Hkv
    scale = 1.0 / math.sqrt(D) if scale is None else float(scale)
    out = torch.zeros_like(q)
    cu = cu_query_lens.tolist()
    lens = seq_lens.tolist()
    for b in range(len(lens)):
        lo, hi = cu[b], cu[b + 1]
        n, length = hi - lo, lens[b]
        if n == 0:
            continue
        prefix = length - n
        k = gather_row_kv(k_cache, block_table[b], length).float().repeat_interleave(group, dim=1)
        v = gather_row_kv(v_cache, block_table[b], length).float().repeat_interleave(group, dim=1)
        qb = q[lo:hi].float()  # [n, Hq, D]
        scores = torch.einsum("ihd,jhd->hij", qb, k) * scale  # [Hq, n, L]
        visible = torch.ones(n, length, dtype=torch.bool, device=q.device)
        tree_bits = None if tree_mask is None else tree_mask[lo:hi]
        visible[:, prefix:] = new_token_mask(n, tree_bits, causal).to(q.device)
        scores = scores.masked_fill(~visible[None], float("-inf"))
        probs = torch.softmax(scores, dim=-1)
        out[lo:hi] = torch.einsum("hij,jhd->ihd", probs, v).to(q.dtype)
    return out
