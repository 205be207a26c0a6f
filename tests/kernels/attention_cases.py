"""Builds paged-attention test cases from dense per-row K/V (the oracle's view) scattered into
a paged cache through a shuffled block table, with NaN in every slot no row owns."""
import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass
class PagedCase:
    q: torch.Tensor
    k_cache: torch.Tensor
    v_cache: torch.Tensor
    block_table: torch.Tensor
    seq_lens: torch.Tensor
    cu_query_lens: torch.Tensor
    tree_mask: torch.Tensor | None
    dense_k: list  # per row [L, Hkv, D]
    dense_v: list
    max_query_len: int

    def args(self):
        return (self.q, self.k_cache, self.v_cache, self.block_table, self.seq_lens, self.cu_query_lens)


def random_bfs_tree(n: int, gen: torch.Generator) -> torch.Tensor:
    """[n] int64 ancestor bitmasks of a random tree in BFS order (node 0 is the root)."""
    masks = [1]
    parent_prev = 0
    for i in range(1, n):
        parent = int(torch.randint(parent_prev, i, (1,), generator=gen))  # non-decreasing parents = BFS
        parent_prev = parent
        masks.append(masks[parent] | (1 << i))
    # bit 63 makes the int64 negative: store the two's complement value
    return torch.tensor([m - (1 << 64) if m >= 1 << 63 else m for m in masks], dtype=torch.int64)


def make_case(seq_lens, query_lens, hq, hkv, head_dim, block_size, dtype, *, tree=False, seed=0,
              strided=False, max_query_len=None, device="cpu") -> PagedCase:
    gen = torch.Generator().manual_seed(seed)
    B = len(seq_lens)
    blocks_per_row = [-(-L // block_size) for L in seq_lens]
    max_blocks = max(blocks_per_row) + 1  # one spare column, never read
    num_blocks = sum(blocks_per_row) + 3  # spare physical blocks, never read
    width = 2 * head_dim if strided else head_dim
    k_store = torch.full((num_blocks, block_size, hkv, width), float("nan"), dtype=dtype)
    v_store = torch.full_like(k_store, float("nan"))
    k_cache, v_cache = k_store[..., :head_dim], v_store[..., :head_dim]
    phys = torch.randperm(num_blocks, generator=gen)
    table = torch.full((B, 2 * max_blocks), -1, dtype=torch.int32)
    dense_k, dense_v, used = [], [], 0
    for b, L in enumerate(seq_lens):
        k = torch.randn(L, hkv, head_dim, generator=gen).to(dtype)
        v = torch.randn(L, hkv, head_dim, generator=gen).to(dtype)
        dense_k.append(k)
        dense_v.append(v)
        for i in range(blocks_per_row[b]):
            p = int(phys[used])
            used += 1
            table[b, 2 * i] = p
            n = min(block_size, L - i * block_size)
            k_cache[p, :n] = k[i * block_size:i * block_size + n]
            v_cache[p, :n] = v[i * block_size:i * block_size + n]
    block_table = table[:, ::2] if strided else table[:, ::2].contiguous()
    T = sum(query_lens)
    q = torch.randn(hq, T, head_dim, generator=gen).to(dtype).transpose(0, 1)  # non-contiguous view
    if not strided:
        q = q.contiguous()
    cu = torch.tensor([0] + list(torch.tensor(query_lens).cumsum(0).tolist()), dtype=torch.int32)
    tree_mask = None
    if tree:
        tree_mask = torch.cat([random_bfs_tree(n, gen) for n in query_lens if n > 0])
    mql = max_query_len or max(query_lens)
    to = lambda x: x.to(device)  # noqa: E731
    return PagedCase(to(q), to(k_cache), to(v_cache), to(block_table), to(torch.tensor(seq_lens, dtype=torch.int32)),
                     to(cu), None if tree_mask is None else to(tree_mask), dense_k, dense_v, mql)


def sdpa_oracle(case: PagedCase, scale=None, causal: bool = True, window: int | None = None,
                softcap: float | None = None, sinks: torch.Tensor | None = None, mask_of=None) -> torch.Tensor:
    """float64 SDPA per row on the dense K/V with an explicit boolean mask: [T, Hq, D]
    (causal=False: the block mask, every new token visible to every query of its row).
    window: a query at position p (prefix + i, or prefix + its tree depth: its ancestors) sees no
    key at p - window or before. softcap: scores s -> softcap * tanh(s / softcap), written out
    (SDPA has no soft-capping). sinks [Hq]: one more logit per head in each softmax, weighing no
    value (GPT-OSS), written out too. mask_of(lo, hi, L) -> [hi - lo, L] bool: the row's mask
    written out by the caller instead (the chunked attention tests')."""
    q = case.q.cpu().double()
    T, Hq, D = q.shape
    out = torch.zeros(T, Hq, D, dtype=torch.float64)
    cu = case.cu_query_lens.tolist()
    for b, L in enumerate(case.seq_lens.tolist()):
        lo, hi = cu[b], cu[b + 1]
        n = hi - lo
        if n == 0:
            continue
        prefix = L - n
        k, v = case.dense_k[b].double(), case.dense_v[b].double()
        group = Hq // k.shape[1]
        k = k.repeat_interleave(group, 1).transpose(0, 1)  # [Hq, L, D]
        v = v.repeat_interleave(group, 1).transpose(0, 1)
        mask = torch.ones(n, L, dtype=torch.bool) if mask_of is None else mask_of(lo, hi, L)
        for i in range(n if mask_of is None else 0):
            for j in range(n):
                if case.tree_mask is not None:
                    bit = (int(case.tree_mask[lo + i]) >> j) & 1
                    mask[i, prefix + j] = bool(bit)
                else:
                    mask[i, prefix + j] = j <= i or not causal
            if window is not None:
                depth = i if case.tree_mask is None else bin(int(case.tree_mask[lo + i]) & (2 ** 64 - 1)).count("1") - 1
                mask[i, : max(0, prefix + depth - window + 1)] = False
        qr, sc = q[lo:hi].transpose(0, 1), scale if scale is not None else 1 / math.sqrt(D)
        if softcap is None and sinks is None:
            o = F.scaled_dot_product_attention(qr, k, v, attn_mask=mask, scale=sc)
        else:
            scores = qr @ k.transpose(1, 2) * sc
            if softcap is not None:
                scores = torch.tanh(scores / softcap) * softcap
            scores = scores.masked_fill(~mask, float("-inf"))
            if sinks is not None:
                sink = sinks.double().cpu()[:, None, None].expand(-1, n, 1)
                o = torch.softmax(torch.cat([scores, sink], dim=-1), dim=-1)[..., :-1] @ v
            else:
                o = torch.softmax(scores, dim=-1) @ v
        out[lo:hi] = o.transpose(0, 1)
    return out
