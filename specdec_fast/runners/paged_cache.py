"""PagedKVCache: block-paged K/V storage for all layers, device-side lengths, a host block pool.

Storage is ONE tensor ``kv`` [num_layers, 2, num_blocks, block_size, Hkv, D], uninitialised:
``kv[l, 0]`` and ``kv[l, 1]`` are layer l's K and V caches, each a contiguous [num_blocks,
block_size, Hkv, D] view (the layout the attention kernel reads). One tensor, so compact_kv
moves the accepted tree path of every layer in a single launch from one base pointer, and one
allocation.

block_table [max_batch, max_blocks_per_row] int32 and seq_lens [max_batch] int32 live on the
device. Entries of block_table past a request's reservation (and the rows of free slots) are -1;
readers must only follow entries for positions < seq_lens (attention) or that they write, and
read only slots written before (what a slot holds before its first write is undefined).
A request reserves every block of its budget (prompt + max_new_tokens + K + 1) at admission,
so the decoding loop never allocates: commit / append / compact touch device tensors only and
never sync. Rollback of rejected drafts is not advancing seq_lens.

A ring cache (ring_blocks=R: the layers of a sliding window W) reserves at most R physical blocks
per row and repeats them along the row's table: logical block j is physical block
blocks[j % R]. Position p then shares its slot with p +- R * block_size only, and a write at p
overwrites position p - R * block_size. The table is written once at admission, so the kernels
run unchanged and the loop still never allocates. It is exact while every position a reader
follows was not overwritten since it was written: for readers that see only the last W positions
up to a query (a sliding window) and calls that write at most N positions past the committed
length (a prefill chunk, or K + 1 tentative tokens), R * block_size >= W + N - 1 suffices
(runners/paged_base.py ring_blocks_for). gather() of such a cache returns what the slots hold now.
"""
import math

import torch

from ..kernels._backend import canonical_device
from ..kernels.cache_ops import CACHE_DTYPES, append_kv, compact_kv


class OutOfBlocksError(RuntimeError):
    """Admission asked for more blocks than the pool has free; the cache is unchanged."""


def _positive_int(name: str, value, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}, got {value!r}")
    return value


class PagedKVCache:
    def __init__(
        self,
        num_layers: int,
        num_kv_heads: int,
        head_dim: int,
        *,
        num_blocks: int,
        block_size: int = 16,
        max_batch: int,
        max_blocks_per_row: int,
        dtype: torch.dtype = torch.float16,
        device="cpu",
        ring_blocks: int | None = None,
    ):
        self.num_layers = _positive_int("num_layers", num_layers)
        self.num_kv_heads = _positive_int("num_kv_heads", num_kv_heads)
        self.head_dim = _positive_int("head_dim", head_dim)
        self.num_blocks = _positive_int("num_blocks", num_blocks)
        self.block_size = _positive_int("block_size", block_size)
        self.max_batch = _positive_int("max_batch", max_batch)
        self.max_blocks_per_row = _positive_int("max_blocks_per_row", max_blocks_per_row)
        self.ring_blocks = None if ring_blocks is None else _positive_int("ring_blocks", ring_blocks)
        if dtype not in CACHE_DTYPES:
            raise TypeError(f"dtype must be float32, float16 or bfloat16, got {dtype}")
        self.dtype = dtype
        # Normalised once ("cuda" -> cuda:0): tensors report their device with its index, and
        # commit() compares them with this one (the H100 run: "n_emitted is on cuda:0 but the cache is on cuda").
        self.device = canonical_device(device)
        # Uninitialised: a slot is written (append, compact) before any reader follows it, and no
        # reader follows a position >= seq_lens (tests/engine/test_kv_pool_uninitialised.py fills
        # the pool with NaN). torch.zeros wrote every page of a pool sized for max_seq_len rows, a
        # cost on the CPU where the calls use a fraction of it: three sampling test files (3000-row
        # engines of 256-token rows for ~20-token calls) took 127.6 s and 11.4 GB of RSS with it,
        # 114.2 s and 2.0 GB without (1 thread, this 2-core machine).
        self.kv = torch.empty(
            num_layers, 2, num_blocks, block_size, num_kv_heads, head_dim, dtype=dtype, device=self.device
        )
        self.block_table = torch.full((max_batch, max_blocks_per_row), -1, dtype=torch.int32, device=self.device)
        self.seq_lens = torch.zeros(max_batch, dtype=torch.int32, device=self.device)
        # Host side: the free pool (a stack: freed blocks are reused first) and each slot's blocks.
        self._free = list(range(num_blocks - 1, -1, -1))
        self._blocks: list[list[int] | None] = [None] * max_batch

    # ---- views for the attention kernel -------------------------------------------------
    def k_cache(self, layer: int) -> torch.Tensor:
        """Layer ``layer``'s K cache [num_blocks, block_size, Hkv, D] (a view)."""
        return self.kv[self._layer(layer), 0]

    def v_cache(self, layer: int) -> torch.Tensor:
        """Layer ``layer``'s V cache [num_blocks, block_size, Hkv, D] (a view)."""
        return self.kv[self._layer(layer), 1]

    @property
    def num_free_blocks(self) -> int:
        return len(self._free)

    def blocks_of(self, slot: int) -> list[int]:
        """The physical blocks reserved by ``slot`` (host copy; empty when the slot is free; a ring
        cache: at most ring_blocks, which its table repeats)."""
        return list(self._blocks[self._slot(slot)] or [])

    def is_admitted(self, slot: int) -> bool:
        return self._blocks[self._slot(slot)] is not None

    def blocks_needed(self, num_tokens_budget: int) -> int:
        return math.ceil(_positive_int("num_tokens_budget", num_tokens_budget) / self.block_size)

    # ---- admission (host side, outside the decoding loop) -------------------------------
    def admit(self, slot: int, num_tokens_budget: int) -> None:
        """Reserves ceil(budget / block_size) blocks for ``slot`` and sets its seq_len to 0.

        budget = prompt + max_new_tokens + K + 1 tokens. Raises OutOfBlocksError (pool too
        small now) or ValueError (bad slot/budget) with the cache unchanged.
        """
        self.admit_batch([slot], [num_tokens_budget])

    def admit_batch(self, slots, budgets) -> None:
        """Admits several requests, all or none (same errors as admit, cache unchanged on error)."""
        slots, budgets = list(slots), list(budgets)
        if len(slots) != len(budgets):
            raise ValueError(f"slots and budgets must have the same length, got {len(slots)} and {len(budgets)}")
        self._check_distinct(slots)
        needs = []
        for slot, budget in zip(slots, budgets):
            if self._blocks[self._slot(slot)] is not None:
                raise ValueError(f"slot {slot} is already admitted; free it first")
            need = self.blocks_needed(budget)
            if need > self.max_blocks_per_row:
                raise ValueError(
                    f"num_tokens_budget {budget} needs {need} blocks of {self.block_size} tokens, "
                    f"more than max_blocks_per_row = {self.max_blocks_per_row}"
                )
            needs.append(need)
        held = [need if self.ring_blocks is None else min(need, self.ring_blocks) for need in needs]
        if sum(held) > len(self._free):
            raise OutOfBlocksError(
                f"admitting slots {slots} needs {sum(held)} blocks ({budgets} tokens at {self.block_size} per block), "
                f"only {len(self._free)} of {self.num_blocks} blocks are free"
            )
        # One host table of the admitted rows and one copy into the device's (their lengths reset
        # in one launch): per-slot writes were two device ops and a host-to-device copy a row. CPU,
        # 400 rows (the sampling tests' calls), admission + free_all, best of 20: 13.9 ms -> 1.1-1.9 ms.
        table = []
        for slot, need, count in zip(slots, needs, held):
            blocks = [self._free.pop() for _ in range(count)]
            self._blocks[slot] = blocks
            table.append([blocks[j % count] for j in range(need)] + [-1] * (self.max_blocks_per_row - need))
        self._write_rows(slots, torch.tensor(table, dtype=torch.int32, device="cpu"), 0)

    def free(self, slot: int) -> None:
        """Returns ``slot``'s blocks to the pool; its table row becomes -1 and its seq_len 0."""
        self.free_batch([slot])

    def free_batch(self, slots) -> None:
        """free() of several slots, in their order (all or none: ValueError naming a free one)."""
        slots = [self._slot(slot) for slot in slots]
        self._check_distinct(slots)
        for slot in slots:
            if self._blocks[slot] is None:
                raise ValueError(f"slot {slot} is not admitted")
        for slot in slots:
            self._free.extend(reversed(self._blocks[slot]))
            self._blocks[slot] = None
        self._write_rows(slots, -1, 0)

    def free_all(self) -> None:
        """free() of every admitted slot, lowest first (a call's end)."""
        self.free_batch([slot for slot, blocks in enumerate(self._blocks) if blocks is not None])

    def _write_rows(self, slots: list, rows, length: int) -> None:
        """block_table[slots] = rows (host int32 [len(slots), max_blocks_per_row], or one int for
        every entry: a fill, no copy) and seq_lens[slots] = length: one copy or fill of the rows
        and one fill of the lengths (slots 0..n-1, a call's usual rows: on views; others through
        an index)."""
        if not slots:
            return
        if slots == list(range(len(slots))):
            table = self.block_table[: len(slots)]
            if isinstance(rows, int):
                table.fill_(rows)
            else:
                table.copy_(rows)
            self.seq_lens[: len(slots)].fill_(length)
            return
        index = torch.tensor(slots, dtype=torch.long, device="cpu").to(self.device)
        if isinstance(rows, int):
            self.block_table.index_fill_(0, index, rows)
        else:
            self.block_table.index_copy_(0, index, rows.to(self.device))
        self.seq_lens.index_fill_(0, index, length)

    # ---- the decoding loop (device only, no sync) ---------------------------------------
    def commit(self, n_emitted: torch.Tensor) -> None:
        """seq_lens += n_emitted ([max_batch] int32 on the device); not advancing = rollback."""
        if not isinstance(n_emitted, torch.Tensor):
            raise TypeError(f"n_emitted must be a torch.Tensor, got {type(n_emitted).__name__}")
        if n_emitted.dtype != torch.int32 or tuple(n_emitted.shape) != (self.max_batch,):
            raise ValueError(f"n_emitted must be int32 [max_batch] = [{self.max_batch}], got {n_emitted.dtype} {tuple(n_emitted.shape)}")
        if n_emitted.device != self.device:
            raise ValueError(f"n_emitted is on {n_emitted.device} but the cache is on {self.device}")
        self.seq_lens.add_(n_emitted)

    def append(self, layer: int, k_new: torch.Tensor, v_new: torch.Tensor, cu_query_lens: torch.Tensor, *, backend=None, check: bool = False) -> None:
        """Writes the new tokens' K/V [T, Hkv, D] of ``layer`` at seq_lens[b] + i (cu_query_lens [max_batch+1])."""
        layer = self._layer(layer)
        append_kv(
            k_new, v_new, self.kv[layer, 0], self.kv[layer, 1], self.block_table, self.seq_lens, cu_query_lens,
            backend=backend, check=check,
        )

    def compact(self, path_positions: torch.Tensor, *, backend=None, check: bool = False) -> None:
        """Moves each row's accepted tree path [max_batch, P] (node indices, -1 padded) to seq_lens + 0..len-1."""
        compact_kv(self.kv, self.block_table, self.seq_lens, path_positions, backend=backend, check=check)

    # ---- tests / debugging (syncs) ------------------------------------------------------
    def gather(self, layer: int, slot: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Dense copies (K, V), each [seq_len, Hkv, D], of ``slot``'s committed tokens in ``layer``."""
        layer, slot = self._layer(layer), self._slot(slot)
        length = int(self.seq_lens[slot])
        reserved = int((self.block_table[slot] >= 0).sum()) * self.block_size  # logical blocks (a ring repeats)
        if length > reserved:
            raise RuntimeError(f"slot {slot} has seq_len {length}, beyond its {reserved} reserved token slots")
        pos = torch.arange(length, device=self.device)
        table = self.block_table[slot].long()  # what the kernels follow
        slots = table[pos // self.block_size] * self.block_size + pos % self.block_size
        flat = self.kv[layer].reshape(2, self.num_blocks * self.block_size, self.num_kv_heads, self.head_dim)
        return flat[0].index_select(0, slots), flat[1].index_select(0, slots)

    def _layer(self, layer: int) -> int:
        if isinstance(layer, bool) or not isinstance(layer, int) or not 0 <= layer < self.num_layers:
            raise ValueError(f"layer must be an int in [0, {self.num_layers}), got {layer!r}")
        return layer

    @staticmethod
    def _check_distinct(slots: list) -> None:
        if len(set(slots)) != len(slots):
            raise ValueError(f"slots must be distinct, got {slots}")

    def _slot(self, slot: int) -> int:
        if isinstance(slot, bool) or not isinstance(slot, int) or not 0 <= slot < self.max_batch:
            raise ValueError(f"slot must be an int in [0, {self.max_batch}), got {slot!r}")
        return slot
