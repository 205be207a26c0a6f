"""The runner interface: what the engine and the drafters need from a model.

A runner owns one model's KV cache for a batch of B rows. Each row has a committed context
(tokens whose K/V are in the cache and are final) and, between two commits, tentative tokens
appended by ``score``. Every method runs without a host sync: nothing reads tensor values on
the host.

    prefill(input_ids [B, P], attention_mask [B, P] or None, *, budgets=None, max_new_tokens=None,
        num_draft_tokens=None) -> logits [B, V] of the last position. attention_mask is left
        padding (0s then 1s). After prefill every row's committed context is its unpadded
        prompt. budgets: each row's KV reservation in tokens (0: an unused row, all-zero mask);
        max_new_tokens / num_draft_tokens (K) size the reservation for this call.
    release() -> None. After a call: the KV memory the call held goes back (a paged runner's
        blocks to its pool, which outlives calls when allocate() made it: an engine's).
    score(tokens [B, N], num_valid [B] int or None) -> logits [B, N, V]. Appends N tentative
        slots per row; when num_valid is given only the last num_valid[b] tokens of row b are
        real (left padding inside the call; their logits are garbage). Real tokens take the
        positions that follow the row's context, committed and tentative, in order.
        num_valid[b] may be 0: row b appends nothing (the engine feeds finished rows nothing,
        then commits 0 for them).
    commit(keep [B] int) -> None. Of the real tentative tokens appended since the last commit
        (in order), the first keep[b] become committed; the others are discarded (rollback).
    compact(max_len_bound: int) -> None. Hint from the engine, at poll time, to runners whose
        attribute needs_compact is True (default False: never called): every row's committed
        length is <= max_len_bound. A runner that leaves holes may reclaim them.

Optional attribute graph_safe (default False): score / commit keep every tensor that outlives a
call in place (copy_, never rebinding) with static shapes per (B, N), and read no device value
on the host, so the engine may capture them in CUDA graphs (engine/loop.py, engine/graphs.py). compact runs
between graph replays: a graph-safe runner's compact must be a no-op or purely in place.

A paged runner (PagedKVCache + paged_attention) implements the same four methods: score writes
K/V at seq_lens + (i - (N - num_valid)), commit advances seq_lens by keep, compact is a no-op.
Paged runners also score token trees (engine/tree_loop.py): score(tokens, tree=(mask, depths)) scores
N nodes in one tree-masked pass, commit_path(path, keep) keeps the accepted path (compact_kv).
"""
from typing import Protocol

import torch


class Runner(Protocol):
    vocab_size: int
    device: torch.device

    def prefill(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None) -> torch.Tensor: ...

    def score(self, tokens: torch.Tensor, num_valid: torch.Tensor | None = None) -> torch.Tensor: ...

    def commit(self, keep: torch.Tensor) -> None: ...

    def compact(self, max_len_bound: int) -> None: ...
