"""HiddenCapture: the target's hidden states at the positions a paged runner scores, for the
drafters that read them (EAGLE-3 heads, block drafters: drafters/eagle3.py, drafters/block.py).

Indices follow transformers' ``output_hidden_states``: j = 0 is the embedding output, j = i + 1
layer i's output (the residual stream after layer i, before any norm) for i < L - 1, and j = L
the final-norm output (what the LM head reads: transformers' hidden_states[-1] is normed). So
EAGLE-1/2 and MTP read j = L, EAGLE-3 three of them (vLLM's eagle_aux_hidden_state_layer_ids use
the same numbers), DFlash's target_layer_ids i are j = i + 1.

Buffers (runner dtype, W = len(indices) * H, index c's columns c*H .. (c+1)*H - 1, in the order
given):
    score:   one [B, N, W] tensor per call shape (B rows, N tokens), allocated at the first call of
             that shape (a warm-up call, before any capture) and overwritten in place by every
             later call: fixed address, static shape (CUDA-graph safe). A call with num_valid
             (packed rows) writes a [B*N, W] scratch in packed order and unpacks it into the
             buffer with one index_select(out=): the only copy beyond the layer writes.
    prefill: a [B, P, W] tensor per prefill call (outside the graphs), handed over once by
             take_prefill() and forgotten (a tensor kept across calls would read as a moved
             state tensor to the graph checks).
Padding slots (in-call left padding, unused rows) hold unspecified values, as their logits do.
Off (the runner's ``hidden_capture`` is None) the family's ``_keep`` calls return at once.
"""
import torch


class HiddenCapture:
    """Which hidden states a runner keeps, and the buffers it keeps them in."""

    def __init__(self, indices, *, num_layers: int, hidden_size: int, dtype: torch.dtype, device):
        indices = tuple(indices)
        if not indices or any(isinstance(j, bool) or not isinstance(j, int) for j in indices):
            raise ValueError(f"hidden-state indices must be a non-empty sequence of ints, got {indices!r}")
        bad = [j for j in indices if not 0 <= j <= num_layers]
        if bad:
            raise ValueError(f"hidden-state indices must lie in [0, {num_layers}] (0 = embeddings, i + 1 = layer i's "
                             f"output, {num_layers} = the final norm's), got {bad}")
        self.indices, self.hidden_size, self.dtype, self.device = indices, hidden_size, dtype, device
        self.width = len(indices) * hidden_size
        self._columns = {}  # j -> [column slices] (an index may be asked for twice)
        for c, j in enumerate(indices):
            self._columns.setdefault(j, []).append(slice(c * hidden_size, (c + 1) * hidden_size))
        self._buffers = {}  # (B, N) -> [B, N, W]
        self._scratch = {}  # (B, N) -> [B*N, W] (packed calls)
        self._target = None  # [T, W] the running forward writes into (None outside a forward)
        self._out = None
        self._prefill = None

    def buffer(self, batch: int, n: int) -> torch.Tensor:
        """The [B, N, W] buffer of score calls of this shape (allocated at the first)."""
        out = self._buffers.get((batch, n))
        if out is None:
            out = self._buffers[(batch, n)] = torch.zeros(batch, n, self.width, dtype=self.dtype, device=self.device)
        return out

    def begin(self, batch: int, n: int, packed: bool, prefill: bool) -> None:
        """Before a forward over [B, N] tokens (packed: with num_valid)."""
        if prefill:
            self._out = torch.empty(batch, n, self.width, dtype=self.dtype, device=self.device)
        else:
            self._out = self.buffer(batch, n)
        target = self._out.view(batch * n, self.width)
        if packed:
            if prefill:
                target = torch.empty_like(target)
            else:
                target = self._scratch.get((batch, n))
                if target is None:
                    target = self._scratch[(batch, n)] = torch.zeros_like(self._out.view(batch * n, self.width))
        self._target = target

    def keep(self, j: int, x: torch.Tensor) -> None:
        """x [T, H]: hidden state j of the forward's T packed tokens."""
        for cols in self._columns.get(j, ()):
            self._target[:, cols].copy_(x)

    def end(self, unpack: torch.Tensor | None, prefill: bool) -> None:
        """After the forward: packed rows back into row order; a prefill's result kept for take_prefill."""
        out, target = self._out, self._target
        self._out = self._target = None
        if unpack is not None:
            torch.index_select(target, 0, unpack, out=out.view(-1, self.width))
        if prefill:
            self._prefill = out

    def abort(self) -> None:
        self._out = self._target = None

    def join_prefill(self, parts: list) -> None:
        """A prefill run in chunks (a ring cache's: runners/paged_base.py): its chunks' [B, P_c, W]
        side by side become the prefill's [B, P, W]."""
        self._prefill = torch.cat(parts, 1)

    def take_prefill(self) -> torch.Tensor:
        """[B, P, W]: the last prefill's hidden states (once; then forgotten)."""
        out, self._prefill = self._prefill, None
        if out is None:
            raise RuntimeError("no prefill hidden states to take: capture was off at the prefill, or they were taken")
        return out
