"""PagedRecurrentRunner: the part of a hybrid decoder's runner that its recurrent layers need -- Qwen3-Next's and
OLMo Hybrid's Gated DeltaNet layers (runners/paged_qwen3_next.py, paged_olmo_hybrid.py), the Mamba2 layers of
Nemotron-H, Granite 4.0-H and Falcon-H1 (runners/paged_nemotron_h.py, ...), LFM2's gated short convolutions (whose
state is the convolution's window alone: runners/paged_lfm2.py) -- with speculative decoding's rollback of their
states.

A paged KV cache rolls back a rejected draft by not advancing a length. A recurrent layer has no such thing:
its state after the K + 1 scored tokens has absorbed them all. So the runner keeps, per recurrent layer and
row, the committed state (the convolution's last K - 1 inputs [C, K - 1] in the model dtype, the recurrence's
state in float32) and a snapshot after every tentative token ([max_tentative + 1, ...]: the last slot takes
padded positions' writes); a score call starts each row from the committed state or its last snapshot
(_row_layout says which, and where each token's snapshot goes), and commit(keep) makes snapshot keep - 1 the
committed state (keep 0: unchanged) -- a gather, no host sync, static shapes, as SGLang and vLLM keep
per-draft states for these layers. The attention layers use the paged cache as every family does
(kv_layer_count: those layers only). A token tree's call (score(tree=...)) runs each node from its parent's states
(RowLayout.parent: the last ancestor in its mask; the convolution's window along its ancestors and the recurrence
through RecurrentStates.conv_steps / steps, whose kernels read the parent's snapshots) and keeps every node's snapshot;
commit_path makes the accepted path's last node's the committed one.

A family's runner binds self.layers, each with a ``kind`` ("full_attention", "linear_attention": a recurrent
layer, whose ``mixer.shapes`` are (conv state shape (C, K - 1), recurrent state shape), or another kind with
neither), then calls _index_layers; its _decode reads self.states[self._recurrent_index[i]] (RecurrentStates) for
recurrent layer i and attends on KV layer self._attention_index[i].
"""
from typing import NamedTuple

import torch
import torch.nn.functional as F

from .paged_base import PagedRunnerBase


class RowLayout(NamedTuple):
    """A call's tokens as rows again (PagedRecurrentRunner._row_layout), each row's real tokens last."""

    index: torch.Tensor  # [B, n] int64: the packed token of each column (the spare row past them where padding)
    real: torch.Tensor  # [B, n] bool
    slot: torch.Tensor  # [B, n] int64: the tentative slot each column's snapshot goes to (padding: the spare one)
    start: torch.Tensor  # [B] int64: the snapshot each row starts from, -1 the committed state
    parent: torch.Tensor | None = None  # [B, n] int64 in a token tree: each node's parent among the call's, -1 none


def layer_kinds_reason(config, kinds: tuple, field: str = "layer_types") -> str | None:
    """Why config.<field> (the hybrid's list of layer kinds) names a kind outside ``kinds`` (the runner's), or None."""
    listed = set(getattr(config, field, None) or ())
    if listed - set(kinds):
        return f"{field} {sorted(listed)}: this runner takes {kinds}"
    return None


def padded_bias_reason(config, field: str) -> str | None:
    """Why a recurrent layer's input projection bias (config.<field> set) is refused, or None: transformers zeroes a
    padded position's input, so that bias would reach the convolution from it, where here padded positions reach
    nothing (the checkpoints of LFM2, Mamba and Jamba set none)."""
    if getattr(config, field, False):
        return f"{field}: a padded position's biased projection would reach the convolution (transformers' left padding)"
    return None


class RecurrentStates:
    """One recurrent layer's states for max_batch rows: committed conv [B, C, K - 1] (model dtype) and state
    [B, *rec] (float32), and a snapshot after each of max_tentative tentative tokens ([B, max_tentative + 1,
    ...]: the last slot takes a score call's padded positions' writes, which then never land on a real
    token's)."""

    def __init__(self, conv: tuple, rec: tuple, max_batch: int, tentative: int, dtype, device, fused: bool = False):
        self.conv = torch.zeros(max_batch, *conv, dtype=dtype, device=device)
        self.rec = torch.zeros(max_batch, *rec, dtype=torch.float32, device=device)
        self.conv_tent = torch.zeros(max_batch, tentative + 1, *conv, dtype=dtype, device=device)
        self.rec_tent = torch.zeros(max_batch, tentative + 1, *rec, dtype=torch.float32, device=device)
        # a score call's convolution and recurrence through their Triton kernels (the runner's Triton path:
        # conv_steps(), steps()); else their torch forms and the layers' block forms (a few large ops a call)
        self.fused = fused

    def start_rec(self, batch: int, start: torch.Tensor) -> torch.Tensor:
        """Each row's recurrent state a score call starts from [B, ...]: the committed one where start < 0, else
        snapshot start (_row_layout's). (steps() and conv_steps() read the starting states in their kernels.)"""
        ids = torch.arange(batch, device=start.device)
        fresh = (start < 0).view(-1, *(1,) * (self.rec.dim() - 1))
        return torch.where(fresh, self.rec[:batch], self.rec_tent[ids, start.clamp(min=0)])

    def conv_steps(self, x: torch.Tensor, weight: torch.Tensor, bias, rows: "RowLayout", silu: bool) -> torch.Tensor:
        """A score call's causal depthwise convolution (kernels/causal_conv.conv_steps: its Triton kernel where the
        runner's path is Triton, else its torch form) over x [B, n, C] (the call's inputs as rows, each row's real
        tokens last) from each row's starting window, a chain's or a token tree's, every token's window written to its
        slot -> y [B, n, C] in weight's dtype (silu applied where asked)."""
        from ..kernels.causal_conv import conv_steps

        return conv_steps(x, weight, bias, self.conv, self.conv_tent, rows.start, rows.slot, rows.real,
                          parent=rows.parent, silu=silu, backend="triton" if self.fused else "torch")

    def steps(self, q, k, v, g, rows: RowLayout, **options) -> torch.Tensor:
        """A score call's recurrence (kernels/recurrent.recurrent_steps: its Triton kernel where the runner's path is
        Triton, else its torch form, which a token tree's call on the CPU backends takes) from each row's starting
        state, a token tree's nodes each from its parent's, every token's snapshot written to its slot -> o [B, n, Hv,
        Dv] float32. options: recurrent_steps' beta, qk_norm, scale, layout."""
        from ..kernels.recurrent import recurrent_steps

        rec, tent = self.rec, self.rec_tent
        if rec.dim() == 3:  # Mamba1's [C, N] state: one head whose state is stored [Dv, Dk] (layout "vk")
            rec, tent = rec.unsqueeze(-3), tent.unsqueeze(-3)
        return recurrent_steps(q, k, v, g, rec, tent, rows.start, rows.slot, rows.real, parent=rows.parent,
                               backend="triton" if self.fused else "torch", **options)

    def chunk_scan(self, qd, kd, a, u, decay, state, w=None) -> torch.Tensor:
        """A prefill's state carried across its chunks (kernels/chunk_scan.chunk_scan: its Triton kernel where the
        runner's path is Triton, else its torch loop; runners/chunked_prefill.py makes the operands) -> o [B, H, C, L,
        Dv] float32; state written in place. The kernel's products in tf32 for a bf16 / fp16 model (finer than its
        own rounding), float32's precision for a float32 one."""
        from ..kernels.chunk_scan import chunk_scan

        precision = "tf32x3" if self.conv.dtype == torch.float32 else "tf32"
        return chunk_scan(qd, kd, a, u, decay, state, w=w, precision=precision,
                          backend="triton" if self.fused else "torch")

    def by_steps(self, rows: RowLayout) -> bool:
        """Whether a score call's recurrence goes through steps(): on the Triton path, and for every token tree (the
        layers' block forms take chains only)."""
        return self.fused or rows.parent is not None


class PagedRecurrentRunner(PagedRunnerBase):
    """PagedRunnerBase with recurrent layers' states (module docstring)."""

    states = ()  # per recurrent layer: RecurrentStates (allocated with the pool)
    recurrent_shapes = ()

    def _index_layers(self) -> None:
        """Each layer's number among the attention / recurrent layers, and the recurrent ones' state shapes."""
        attention = [i for i, layer in enumerate(self.layers) if layer.kind == "full_attention"]
        recurrent = [i for i, layer in enumerate(self.layers) if layer.kind == "linear_attention"]
        self._attention_index = {i: j for j, i in enumerate(attention)}
        self._recurrent_index = {i: j for j, i in enumerate(recurrent)}
        self.recurrent_shapes = [self.layers[i].mixer.shapes for i in recurrent]

    @property
    def kv_layer_count(self) -> int:
        """The attention layers (at least one: the pool's admission bookkeeping lives on its cache, so a
        decoder cut to recurrent layers alone -- assistant_early_exit=1 -- keeps one unused layer's KV)."""
        return max(len(self._attention_index), 1)

    def _layer_windows(self, model) -> tuple:
        """No sliding window (the families' attention layers are full; the rule refuses recurrent layer types)."""
        return (None,) * self.kv_layer_count

    def _allocate(self, max_batch: int, max_tokens_per_row: int, num_blocks: int | None) -> None:
        super()._allocate(max_batch, max_tokens_per_row, num_blocks)
        self._allocate_states(max_batch)

    def _allocate_states(self, max_batch: int) -> None:
        self.states = [RecurrentStates(conv, rec, max_batch, self.max_tentative, self.dtype, self.device,
                                       fused=self.kernels == "triton") for conv, rec in self.recurrent_shapes]
        self._tentative_capacity = self.max_tentative

    def kv_sizes(self, max_batch: int, max_tokens_per_row: int) -> tuple:
        """As PagedRunnerBase.kv_sizes, the recurrent states counted in the fixed part (they do not grow
        with the pool's tokens): per recurrent layer and row, 2 + max_tentative conv windows and states
        (the committed one, a snapshot a tentative token, the spare slot)."""
        per_token, fixed = super().kv_sizes(max_batch, max_tokens_per_row)
        element = torch.finfo(self.dtype).bits // 8
        per_row = sum(torch.Size(conv).numel() * element + torch.Size(rec).numel() * 4
                      for conv, rec in self.recurrent_shapes)
        return per_token, fixed + max_batch * (2 + self.max_tentative) * per_row

    @property
    def kv_bytes(self) -> int:
        """The KV pool's bytes and the recurrent states'."""
        return super().kv_bytes + sum(t.numel() * t.element_size() for st in self.states
                                      for t in (st.conv, st.rec, st.conv_tent, st.rec_tent))

    def _admit(self, input_ids, attention_mask, budgets, max_new_tokens, num_draft_tokens):
        num_valid = super()._admit(input_ids, attention_mask, budgets, max_new_tokens, num_draft_tokens)
        if self.max_tentative > self._tentative_capacity:  # a call with more drafts than the pool was made for
            self._allocate_states(self.cache.max_batch)
        return num_valid

    def commit(self, keep: torch.Tensor) -> None:
        """As PagedRunnerBase.commit, and each recurrent layer's committed state becomes its snapshot
        after the last kept token (unchanged where none is kept)."""
        self._keep_states(keep)
        super().commit(keep)

    def commit_path(self, path: torch.Tensor, keep: torch.Tensor) -> None:
        """As PagedRunnerBase.commit_path (after a token tree's score call: call positions path[b, :keep[b]]), and each
        recurrent layer's committed state becomes the snapshot after the path's last kept node."""
        self._keep_states(keep, path)
        self._compact_path(path)
        super().commit(keep)  # PagedRunnerBase's: the states are chosen above

    def _keep_states(self, keep: torch.Tensor, path: torch.Tensor | None = None) -> None:
        """Each row's committed conv window and state <- the snapshot after its last kept token: tentative slot
        keep - 1 of a chain, or the path's node path[b, keep - 1] of a tree (unchanged where none is kept)."""
        batch = self.seq_lens.shape[0]
        kept = (torch.minimum(self.seq_lens + keep.to(torch.int32), self.caps) - self.seq_lens).long()  # as committed
        slot = (kept - 1).clamp(min=0)
        if path is not None:
            slot = path.long().gather(1, slot[:, None])[:, 0].clamp(min=0)
        rows = torch.arange(batch, device=self.device)
        take = kept > 0
        for st in self.states:
            conv, rec = st.conv[:batch], st.rec[:batch]
            conv.copy_(torch.where(take[:, None, None], st.conv_tent[rows, slot], conv))
            rec.copy_(torch.where(take.view(-1, *(1,) * (rec.dim() - 1)), st.rec_tent[rows, slot], rec))

    def _row_layout(self, cu, total: int, n: int) -> RowLayout:
        """The call's tokens as rows [B, n] again (each row's real tokens last, as the call gave them): the packed
        index [B, n] (total where padding: a spare row), real [B, n] bool, the tentative slot each real token's
        snapshot goes to [B, n], each row's starting slot - 1 [B] (-1: the committed state); in a token tree's
        call each node's parent (tree_parents)."""
        index, real = self._row_index(cu, total, n)
        batch = real.shape[0]
        # a real token's place among the row's tentative tokens: those already there, then its rank in the call
        before = self.length[:batch] - self.seq_lens  # [B]; 0 in a prefill
        rank = real.long().cumsum(1) - 1
        slot = torch.where(real, (before[:, None] + rank).clamp(0, max(self._tentative_capacity - 1, 0)),
                           self._tentative_capacity)  # padding: the spare slot
        parent = None if self._tree_mask is None else tree_parents(self._tree_mask.view(batch, n))
        return RowLayout(index, real, slot, before.long() - 1, parent)


def tree_parents(mask: torch.Tensor) -> torch.Tensor:
    """A token tree's masks [B, N] int64 (bit a of mask[b, i]: node a is node i's ancestor or i itself), its nodes in
    an order where every ancestor precedes its descendants (TokenTree's breadth-first order) -> each node's parent
    [B, N] int64: its last ancestor other than itself (the deepest: it descends from all the others), -1 where it has
    none in the call (a root: it continues the row's starting state)."""
    n = mask.shape[1]
    nodes = torch.arange(n, device=mask.device)
    bits = ((mask[:, :, None] >> nodes) & 1).bool() & (nodes[:, None] != nodes)[None]  # [B, i, a]: a above i
    return torch.where(bits, nodes, -1).max(-1).values


# -- a recurrent layer's causal depthwise convolution over a prefill's rows (a score call's: RecurrentStates.conv_steps)
def prefill_conv(x: torch.Tensor, weight: torch.Tensor, bias, kernel: int) -> tuple:
    """A prefill's convolution over each row at once: x [B, C, n] (each row's padding first, zeros) ->
    (outputs [B, C, n] in the weight's dtype, the rows' last K - 1 inputs [B, C, K - 1]: the state to commit)."""
    n = x.shape[-1]
    y = F.conv1d(x.to(weight.dtype), weight[:, None, :], bias, padding=kernel - 1, groups=x.shape[1])[..., :n]
    return y, F.pad(x, (kernel - 1, 0))[..., -(kernel - 1):]
