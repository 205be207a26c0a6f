"""PagedRunnerBase: the architecture-independent half of the paged runners.

A subclass (runners/paged_llama.py: Llama family; runners/paged_gpt2.py: GPT-2) supplies only the
model's math: ``unsupported_reason`` (a static method), ``_bind(model)`` (keeps references to
the model's tensors and sets layers / lm_head / num_heads / num_kv_heads / head_dim) and
``_decode(flat, positions, cu, attn_lens, max_query_len)`` (embedding, the layer loop calling
``self._attend`` per layer -- or, when it wrote the layer's K/V itself (the Llama runner's fused
RoPE + append on the Triton path), ``self._attention`` -- and the final norm). Everything else
lives here once: the cache allocation, the packing, prefill / score / commit / compact, the
tentative-token accounting and the direct C++ / Triton dispatch of append_kv + paged_attention.

Packing (static sizes, no host sync): a call with tokens [B, N] runs T = B*N token rows. Real
tokens are packed first, row by row (row b's at cu[b] .. cu[b+1], cu from num_valid), and the
in-call left padding goes to the tail T - cu[B] .. T-1. The kernels only touch rows < cu[B]:
append_kv writes nothing for the padding, paged_attention gives it no output rows (their
values are unspecified, so their logits are garbage, as the runner interface allows). Without
num_valid the packing is the identity (no gather). ``positions`` [T] is each real token's index
in its row's unpadded context (RoPE angle or learned-position index).

Lengths: ``cache.seq_lens`` [B] = committed tokens; ``self.length`` [B] = committed + tentative
(score appends at self.length). Each row reserves its whole budget at prefill:
prompt width + max_new_tokens + K + 1 tokens. Between two commits at most K + 1 tentative
tokens are appended (target: one call of K+1; draft: 1 or 2 pending + K-1 single tokens); this
is checked on the host from the static call widths. The engine feeds a finished row 0 real
tokens (batch > 1) and commits 0; a row that keeps being scored after it finished (batch 1, or
another caller) has commit cap its committed length at reservation - (K+1) so its writes stay
inside its blocks. A live row never reaches the cap (its committed length is
<= prompt + max_new_tokens - 2).
"""
import math
import weakref

import torch

from .hidden_capture import HiddenCapture
from .paged_cache import PagedKVCache
from ..kernels._backend import resolve_backend
from ..kernels._workspace import KernelWorkspace
from ..kernels.attention import paged_attention
from ..kernels.cache_ops import append_kv, compact_kv
from ._linear import linear
from .sliding_window import windows_per_layer
from .wrapped import unwrapped

FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def _check_int(name: str, value, low: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(f"{name} must be an int >= {low}, got {value!r}")


def _check_sizes(*, max_new_tokens, num_draft_tokens) -> None:
    """max_new_tokens (None: given later) >= 1 and num_draft_tokens (K, None: unchanged) >= 0."""
    if max_new_tokens is not None:
        _check_int("max_new_tokens", max_new_tokens, 1)
    if num_draft_tokens is not None:
        _check_int("num_draft_tokens", num_draft_tokens, 0)


def device_reason(model) -> str | None:
    """Why the model's parameters cannot feed one paged cache (spread over devices), or None."""
    devices = {p.device for p in model.parameters()}
    if len(devices) != 1:
        return f"the parameters are spread over {len(devices)} devices"
    return None


def decoder_reason(model, model_types: tuple, layers_path: str, expected: str, projections_of) -> str | None:
    """The checks every family's unsupported_reason starts with, or None when they pass: config.
    model_type in ``model_types``; the decoder layers at ``layers_path`` (attributes from the model:
    "model.layers", "gpt_neox.layers", "transformer.h", ...) and an lm_head (else the message names
    ``expected``, e.g. "an Olmo2ForCausalLM"); one device (device_reason); plain float projections
    (plain_projections_reason with ``projections_of``)."""
    model_type = getattr(getattr(model, "config", None), "model_type", None)
    if model_type not in model_types:
        names = repr(model_types[0]) if len(model_types) == 1 else f"one of {model_types}"
        return f"model_type {model_type!r} is not {names}"
    layers = model
    for name in layers_path.split("."):
        layers = getattr(layers, name, None)
    if layers is None or model.get_output_embeddings() is None:
        return f"the model has no .{layers_path} / lm_head (expected {expected})"
    return device_reason(model) or plain_projections_reason(layers, projections_of)


def position_table_reason(max_tokens_per_row: int | None, positions: int, name: str) -> str | None:
    """Why rows of up to max_tokens_per_row tokens (None: unknown) do not fit a learned position
    table of ``positions`` rows (the config field ``name``), or None (GPT-2, OPT, GPT-BigCode)."""
    if max_tokens_per_row is not None and max_tokens_per_row > positions:
        return (f"a row needs up to {max_tokens_per_row} positions (prompt + max_new_tokens + K + 1) but the model has "
                f"{name} {positions}")
    return None


def plain_projections_reason(layers, projections_of) -> str | None:
    """Why some layer's projection is not a plain float nn.Linear, or None: quantized or
    adapter-wrapped linears (bitsandbytes, peft) have a forward of their own, not plain weights.
    projections_of(layer) -> that layer's projection modules."""
    for i, layer in enumerate(layers):
        if any(type(m).forward is not torch.nn.Linear.forward or m.weight.dtype not in FLOAT_DTYPES
               for m in projections_of(layer)):
            return f"layer {i} has a projection that is not a plain float nn.Linear"
    return None


def head_dim_reason(head_dim: int, backend) -> str | None:
    """The triton attention kernel's head_dim rule: any head_dim up to 512 (padded to a power of 2
    inside the kernel: kernels/attention/triton.py MAX_HEAD_DIM); the C++ and torch kernels take any head_dim."""
    if backend == "triton" and head_dim > 512:
        return f"backend='triton' paged attention takes head_dim <= 512, got {head_dim}"
    return None


def _transformers_class(model):
    """The model's class for the sliding-window rule (whether its code reads a sliding_window: a
    Llama-class model under another model_type reads none) when transformers defines it, else None
    (the rule then reads transformers' code for config.model_type: a ShardedCausalLM's)."""
    klass = type(unwrapped(model))
    return klass if klass.__module__.startswith("transformers.") else None


def ring_blocks_for(window: int, written: int, block_size: int) -> int:
    """Blocks a ring cache needs per row (runners/paged_cache.py) so that no position a sliding
    window of ``window`` can read is overwritten by a call that writes ``written`` positions past
    the committed length L: position p shares its slot with p + R * block_size only; a call reads
    keys from L - window + 1 on and has written up to L + written - 1 (its own tokens, or an earlier
    call's rejected ones), so R * block_size >= window + written - 1."""
    return math.ceil((window + written - 1) / block_size)


def ring_span(ring: int, window: int, block_size: int) -> int:
    """The most positions one call may write past the committed length with a ring of ``ring``
    blocks per row and a window of ``window`` (ring_blocks_for solved for them)."""
    return ring * block_size - window + 1


class PagedRunnerBase:
    """Runner (see runners/base.py) over a PagedKVCache; weights shared with the model.

    max_new_tokens and num_draft_tokens (K; 0 for plain decoding) size each row's reservation:
    prompt width + max_new_tokens + K + 1. backend: kernel backend (None = automatic).
    fuse_projections (Llama family; GPT-2's c_attn already is one product): run q/k/v and
    gate/up as one matrix product each over a concatenated weight that the model's own
    parameters are re-pointed into (runners/_fused_weights.py: no second copy; the model's
    forward is unchanged). None = on where the Triton kernels run (CUDA), off elsewhere.
    Subclasses set ``max_positions`` (int) when the model has a position limit (learned
    positions; a RoPE whose frequencies change past a length: ``positions_limit`` names which):
    prefill then refuses a reservation longer than it.
    """

    max_positions: int | None = None
    positions_limit = "position embeddings"  # what max_positions counts, for the refusals
    # Each layer's sliding window (None: full attention), from the config (runners/sliding_window.py);
    # empty for the heads' runners, which set no window. The kernels apply a window only where a
    # row can reach it (_allocate: self._windows), so rows inside it run as full attention.
    layer_windows: tuple = ()
    # Each layer's attention chunk (None: not chunked): Llama 4's RoPE layers see keys from the start of
    # their query's chunk, (position // C) * C, on (kernels/attention chunk=; a tree's nodes and their
    # ancestors by their depths). Like a window, applied only where a row can cross a chunk boundary
    # (_allocate: self._chunks), and a chunked layer reads at most C keys back, so it takes the ring cache
    # as a window of C would.
    layer_chunks: tuple = ()
    attn_softcap: float | None = None  # attention logit soft-capping (Gemma 2), in the kernels
    attn_sinks: tuple = ()  # per layer: float32 [Hq] attention sinks (GPT-OSS), in the kernels; empty: none
    _windows: tuple = ()
    _chunks: tuple = ()
    # Whether the layers of a sliding window keep only the blocks their window can still read (a
    # ring cache: runners/paged_cache.py) where that holds fewer blocks than a row's budget; prefill
    # then runs in chunks of at most ring_chunk tokens (the ring is sized for one chunk). Off for
    # the block drafters, whose block sits past the context in the same cache (paged_dflash.py).
    ring_windows = True
    ring_chunk = 1024  # not measured: a prefill chunk long enough to keep a GPU busy, short beside long rows
    # Whether a layer's key is its value (MLA's latent: runners/paged_mla.py): such a layer takes one
    # plane of the pool, not two -- layers 2j and 2j + 1 share cache entry j, the K and V planes of
    # the other layers' layout (kv_entries), so compact_kv and the kernels run unchanged.
    kv_latent = False
    _ring_layers: tuple = ()  # the layers on the ring cache (empty: every layer on self.cache)
    _tree_mask = None  # int64 [B*N] during a tree-scoring forward (score(tree=...)), else None
    _prefilling = False  # True during prefill's forward (eager, never captured: it may wait on the device)
    hidden_capture = None  # a HiddenCapture when a drafter reads the hidden states (capture_hidden_states)
    # score / commit update length, cache.seq_lens and the KV cache in place with static shapes per
    # (B, N); the _full_cu index tensors are built on first use (a warm-up call) and then reused.
    # The host-side tentative-token check runs at capture only; every replay repeats the captured
    # calls, so it holds for the replays too.
    graph_safe = True

    @staticmethod
    def unsupported_reason(model, max_tokens_per_row: int | None = None, backend=None) -> str | None:
        raise NotImplementedError

    @classmethod
    def from_pretrained(cls, path, *, max_new_tokens: int, num_draft_tokens: int, dtype=None, device=None,
                        block_size: int = 16, backend=None, fuse_projections: bool | None = None):
        """A runner for the checkpoint directory ``path`` (config.json + safetensors): the model is
        loaded by transformers (AutoModelForCausalLM, ``dtype``: None = the checkpoint's), moved
        to ``device`` and kept as ``runner.model``; the runner uses its tensors, no copy. On a
        family's class (runners/registry.py: paged_runner_from_pretrained picks the family)."""
        if cls.unsupported_reason is PagedRunnerBase.unsupported_reason:
            raise TypeError("PagedRunnerBase.from_pretrained needs a family's class; "
                            "specdec_fast.runners.paged_runner_from_pretrained(path) picks it from the checkpoint")
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(path, dtype="auto" if dtype is None else dtype)
        model = model.to(device if device is not None else "cpu").eval()
        runner = cls(model, max_new_tokens=max_new_tokens, num_draft_tokens=num_draft_tokens, block_size=block_size,
                     backend=backend, fuse_projections=fuse_projections)
        runner.owned_model = model  # the runner loaded it: nothing else holds it (runner.model is weak)
        return runner

    def __init__(self, model, *, max_new_tokens: int | None = None, num_draft_tokens: int = 0, block_size: int = 16,
                 backend=None, fuse_projections: bool | None = None):
        reason = self.unsupported_reason(model, backend=backend)
        if reason is not None:
            raise ValueError(f"{type(self).__name__} cannot run this model: {reason}; use runner='hf'")
        _check_sizes(max_new_tokens=max_new_tokens, num_draft_tokens=num_draft_tokens)
        _check_int("block_size", block_size, 1)
        # The model itself is held weakly (runner.model): an engine cached per model must not keep
        # it alive (api.py's cache is keyed weakly by the model); its tensors are held here.
        self._model_ref, self.config = weakref.ref(model), model.config
        self.max_new_tokens, self.max_tentative = max_new_tokens, num_draft_tokens + 1
        self.block_size, self.backend = block_size, backend
        embed = model.get_input_embeddings().weight
        self.device, self.dtype = embed.device, embed.dtype
        # The kernels of the decoding loop: "triton" (CUDA, or backend='triton' under the
        # interpreter) takes the fused Triton layer math; elsewhere C++ (CPU) or torch.
        self.kernels = resolve_backend(backend, self.device, "paged_attention")
        self.fuse_projections = self.kernels == "triton" if fuse_projections is None else bool(fuse_projections)
        self._bind(model)
        self.layer_windows = self._layer_windows(model)
        self.vocab_size = int(self.lm_head.shape[0])
        self.cache = None
        self.pooled = False  # True after allocate(): the pool outlives prefill / release (an engine's)

    def _init_head(self, head, weight: torch.Tensor, *, num_draft_tokens: int, block_size: int, backend,
                   min_draft_tokens: int = 0) -> None:
        """The state a draft head's runner (EAGLE-3, MTP, DFlash) sets in place of __init__'s: the head
        held weakly as the model, its config; no max_new_tokens (the drafter gives budgets);
        num_draft_tokens + 1 tentative entries; the device, dtype and kernels of ``weight`` (one of
        its tensors); no pool yet. The runner then binds its tensors."""
        _check_int("num_draft_tokens", num_draft_tokens, min_draft_tokens)
        _check_int("block_size", block_size, 1)
        self._model_ref, self.config = weakref.ref(head), head.config
        self.max_new_tokens, self.max_tentative = None, num_draft_tokens + 1
        self.block_size, self.backend = block_size, backend
        self.device, self.dtype = weight.device, weight.dtype
        self.kernels = resolve_backend(backend, self.device, "paged_attention")
        self.cache = None
        self.pooled = False

    @property
    def model(self):
        """The model this runner runs (held weakly; None once it is gone)."""
        return self._model_ref()

    def _bind(self, model) -> None:
        """Sets layers, lm_head [V, H], num_heads, num_kv_heads, head_dim (and the model's own tensors)."""
        raise NotImplementedError

    def _bind_heads(self, config) -> None:
        """num_heads, num_kv_heads, head_dim (the config's, else hidden_size / heads) and scale =
        head_dim**-0.5 (transformers' scaling in these families, to the last bit: it may differ
        from 1 / sqrt(head_dim) there) of a decoder config with separate KV heads."""
        self.num_heads, self.num_kv_heads = config.num_attention_heads, config.num_key_value_heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        self.scale = self.head_dim**-0.5

    def _decode(self, flat, positions, cu, attn_lens, max_query_len: int) -> torch.Tensor:
        """Packed tokens [T] at positions [T] -> final-norm hidden states [T, H]; layer i calls
        self._attend(i, ...) once (which writes the real tokens' K/V at self.length)."""
        raise NotImplementedError

    def _embed(self, flat: torch.Tensor) -> torch.Tensor:
        """ids [T] (-1 pads) -> embeddings [T, H]: the lookup of self.embed (a family with a scale or other input
        overrides it; a tensor-parallel runner's is vocabulary-parallel: TensorParallelRunner)."""
        return torch.nn.functional.embedding(flat.clamp(min=0), self.embed)

    def _sum_partials(self, partial: torch.Tensor) -> torch.Tensor:
        """A row-parallel product's output as every rank's partial summed: here the one (a tensor-parallel runner
        all-reduces it: TensorParallelRunner)."""
        return partial

    # -- the KV pool: per call, or once for an engine -------------------------------------
    def allocate(self, max_batch: int, max_tokens_per_row: int, num_blocks: int | None = None) -> None:
        """The KV pool, allocated once (an engine's runner): max_batch slots, each able to hold
        max_tokens_per_row tokens (prompt + max_new_tokens + K + 1), num_blocks blocks in all
        (default: every slot full). Later calls admit their rows into it (prefill) and return the
        blocks at release(); the pool's tensors never move, so CUDA graphs captured over them stay
        valid from call to call. Without allocate(), prefill sizes a pool for its own call."""
        _check_int("max_batch", max_batch, 1)
        _check_int("max_tokens_per_row", max_tokens_per_row, 1)
        self._allocate(max_batch, max_tokens_per_row, num_blocks)
        self.pooled = True

    def _allocate(self, max_batch: int, max_tokens_per_row: int, num_blocks: int | None) -> None:
        if self.max_positions is not None and max_tokens_per_row > self.max_positions:
            raise ValueError(f"a row of {max_tokens_per_row} tokens (prompt + max_new_tokens + K + 1) would exceed the "
                             f"model's {self.max_positions} {self.positions_limit}")
        self._windows = self._windows_for(max_tokens_per_row)
        self._chunks = self._chunks_for(max_tokens_per_row)
        per_row = math.ceil(max_tokens_per_row / self.block_size)
        blocks = max_batch * per_row if num_blocks is None else num_blocks
        self._ring_layers, ring = self._ring_plan(max_tokens_per_row)
        reaches = [w for w in self._reaches_for(max_tokens_per_row) if w is not None]
        self._ring_span = ring_span(ring, max(reaches), self.block_size) if self._ring_layers else 0
        full = [i for i in range(self.kv_layer_count) if i not in self._ring_layers]
        kw = dict(block_size=self.block_size, max_batch=max_batch, max_blocks_per_row=per_row, dtype=self.dtype,
                  device=self.device)
        # The full layers' caches (the first, self.cache, keeps the admissions' bookkeeping; the others admit the
        # same rows into as many blocks), then the ring's (every row holds its ring: admission never fails on it
        # once the full one did); one cache per (KV heads, head dim) of its layers (kv_shape: Gemma 4's two)
        groups = [([i for i in layers if self.kv_shape(i) == shape], shape, ring_blocks)
                  for layers, ring_blocks in ((full, 0), (list(self._ring_layers), ring))
                  for shape in dict.fromkeys(self.kv_shape(i) for i in layers)]
        self.caches = [PagedKVCache(self.kv_entries(len(layers)), *shape, **kw,
                                    **({"num_blocks": max_batch * ring_blocks, "ring_blocks": ring_blocks} if ring_blocks
                                       else {"num_blocks": blocks}))
                       for layers, shape, ring_blocks in groups]
        self.cache = self.caches[0]
        # layer i -> (its cache's index in self.caches, its index among that cache's layers)
        self._layer_cache = [None] * self.kv_layer_count
        for c, (layers, _, _) in enumerate(groups):
            for j, i in enumerate(layers):
                self._layer_cache[i] = (c, j)
        # its K and V planes: kv[j, 0] / kv[j, 1]; a latent layer's one plane, kv[j // 2, j % 2], for both
        planes = [(c, j // 2, j % 2, j % 2) if self.kv_latent else (c, j, 0, 1) for c, j in self._layer_cache]
        self.k_caches = [self.caches[c].kv[e, k] for c, e, k, _ in planes]
        self.v_caches = [self.caches[c].kv[e, v] for c, e, _, v in planes]
        # Per-slot lengths and commit caps; a call of B rows works on the views [:B] (the same
        # addresses every call of B rows: graph safe).
        self._length_all = torch.zeros(max_batch, dtype=torch.int32, device=self.device)
        self._cap_all = torch.zeros(max_batch, dtype=torch.int32, device=self.device)
        self._full_cu, self._plans = {}, {}
        # The Triton attention's tickets (its in-kernel split merge, when a plan takes it): one
        # workspace for the runner's whole life, so the captured graphs keep reading the same buffers.
        self._attn_workspace = KernelWorkspace()

    def kv_shape(self, i: int) -> tuple:
        """(KV heads, head dim) of KV layer i's cache: the runner's for every layer, but in a family whose layers
        differ (Gemma 4's sliding and full layers: runners/paged_gemma4.py)."""
        return self.num_kv_heads, self.head_dim

    def _windows_for(self, max_tokens_per_row: int) -> tuple:
        """Each layer's window where rows of this length reach it, else None (full attention: q - k
        <= max_tokens_per_row - 1 < window)."""
        return tuple(w if w is not None and w < max_tokens_per_row else None
                     for w in (self.layer_windows or (None,) * self.kv_layer_count))

    def _chunks_for(self, max_tokens_per_row: int) -> tuple:
        """Each layer's attention chunk where rows of this length cross a chunk boundary, else None."""
        return tuple(c if c is not None and c < max_tokens_per_row else None
                     for c in (self.layer_chunks or (None,) * self.kv_layer_count))

    def _reaches_for(self, max_tokens_per_row: int) -> tuple:
        """How far back each layer's queries read for rows of this length (its window, or its chunk: a
        query reads at most C - 1 keys before its own), None for a layer that reads the whole row."""
        return tuple(w if w is not None else c
                     for w, c in zip(self._windows_for(max_tokens_per_row), self._chunks_for(max_tokens_per_row)))

    def _ring_plan(self, max_tokens_per_row: int) -> tuple:
        """(the layers that take a ring cache, its blocks per row) for rows of this length: the
        windowed and chunked layers, where their ring (ring_blocks_for, sized for a prefill chunk or a
        call's tentative tokens) is smaller than a row's blocks; else ((), 0)."""
        windowed = {i: w for i, w in enumerate(self._reaches_for(max_tokens_per_row)) if w is not None}
        if not (self.ring_windows and windowed):
            return (), 0
        ring = ring_blocks_for(max(windowed.values()), max(self.ring_chunk, self.max_tentative), self.block_size)
        if ring >= math.ceil(max_tokens_per_row / self.block_size):
            return (), 0
        return tuple(windowed), ring

    def kv_sizes(self, max_batch: int, max_tokens_per_row: int) -> tuple:
        """(bytes a pooled token takes in the layers on the full cache, bytes of the ring cache of
        max_batch rows of this length: fixed, whatever the pool's tokens): what an engine sizes its
        pool by before allocate()."""
        ring_layers, ring = self._ring_plan(max_tokens_per_row)
        element = torch.finfo(self.dtype).bits // 8

        def token_bytes(layers) -> int:  # the caches _allocate makes for these layers: per shape, its entries' planes
            shapes = [self.kv_shape(i) for i in layers]
            return sum(self.kv_entries(shapes.count(shape)) * 2 * shape[0] * shape[1] * element
                       for shape in dict.fromkeys(shapes))

        full = [i for i in range(self.kv_layer_count) if i not in ring_layers]
        return token_bytes(full), token_bytes(ring_layers) * max_batch * ring * self.block_size

    def _layer_windows(self, model) -> tuple:
        """Each layer's sliding window (None: full attention), by the one rule (runners/sliding_window.py)."""
        return windows_per_layer(self.config, len(self.layers), _transformers_class(model))

    @property
    def kv_layer_count(self) -> int:
        """Layers with a KV cache: every layer, but a hybrid model's recurrent ones (runners/paged_qwen3_next.py),
        which keep states instead; its attention layers are numbered 0.. among themselves (_attend's i)."""
        return len(self.layers)

    def kv_entries(self, layers: int) -> int:
        """Entries of a PagedKVCache (each a K and a V plane) that hold ``layers`` layers: one each, or
        half as many where the key is the value (kv_latent)."""
        return math.ceil(layers / 2) if self.kv_latent else layers

    @property
    def kv_bytes(self) -> int:
        """Bytes of the KV pool (0 before one exists)."""
        return 0 if self.cache is None else sum(c.kv.numel() * c.kv.element_size() for c in self.caches)

    def release(self) -> None:
        """Returns every admitted slot's blocks to the pool (after a call; prefill does it too)."""
        if self.cache is None:
            return
        for cache in self.caches:
            cache.free_all()

    # -- the runner interface --------------------------------------------------------------
    @torch.no_grad()
    def prefill(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None, *, budgets=None,
                max_new_tokens: int | None = None, num_draft_tokens: int | None = None) -> torch.Tensor:
        """input_ids [B, P], attention_mask [B, P] (left padding) -> logits [B, V] of the last position.

        Row b takes slot b of the pool and reserves budgets[b] tokens (default: P + max_new_tokens
        + K + 1; 0: an unused row, e.g. a bucket's padding, with no blocks and no real token).
        max_new_tokens / num_draft_tokens override the constructor's for this call. With
        capture_hidden_states on, the prompt's hidden states are kept for take_prefill_hidden()."""
        num_valid = self._admit(input_ids, attention_mask, budgets, max_new_tokens, num_draft_tokens)
        # The prefill goes through the kernels' public entry points (static checks of every shape);
        # score calls the C++ ops / Triton launchers directly when both resolve to one backend: the
        # entry points' Python checks and dispatch were ~10% of a decoding step of the demo pair on
        # CPU (cProfile).
        self._direct = None
        hidden = self._prefill_forward(input_ids, num_valid)
        self._end_prefill()
        return self._logits(hidden[:, -1])

    def _prefill_forward(self, tokens: torch.Tensor, num_valid) -> torch.Tensor:
        """The prompt's forward -> hidden states of its last chunk [B, C, H] (the last column is the
        prompt's last position). At once, or, with a ring cache, in chunks of at most ring_chunk
        columns (its ring is sized for one): each row's real tokens of a chunk are its last ones
        (left padding), so a chunk is a score-like call with per-row counts; a captured prefill's
        hidden states are joined."""
        width = tokens.shape[1]
        if not self._ring_layers or width <= self.ring_chunk:
            return self._forward(tokens, num_valid, prefill=True)
        pad = None if num_valid is None else width - num_valid.to(self.device)
        parts = []
        for start in range(0, width, self.ring_chunk):
            stop = min(start + self.ring_chunk, width)
            count = None if pad is None else (stop - pad.clamp(min=start)).clamp(min=0)
            hidden = self._forward(tokens[:, start:stop], count, prefill=True)
            if self.hidden_capture is not None:
                parts.append(self.hidden_capture.take_prefill())
        if self.hidden_capture is not None:
            self.hidden_capture.join_prefill(parts)
        return hidden

    def _admit(self, input_ids: torch.Tensor, attention_mask, budgets, max_new_tokens, num_draft_tokens):
        """prefill's first half: sizes, the pool, each row's slot and reservation, lengths 0 and
        the commit caps. Returns num_valid [B] (None without a mask)."""
        batch, width = input_ids.shape
        if max_new_tokens is not None or num_draft_tokens is not None:
            _check_sizes(max_new_tokens=max_new_tokens, num_draft_tokens=num_draft_tokens)
            self.max_new_tokens = self.max_new_tokens if max_new_tokens is None else max_new_tokens
            self.max_tentative = self.max_tentative if num_draft_tokens is None else num_draft_tokens + 1
        if budgets is None:
            if self.max_new_tokens is None:
                raise ValueError("prefill needs max_new_tokens (here or at construction) or explicit budgets")
            budgets = [width + self.max_new_tokens + self.max_tentative] * batch
        budgets = [int(b) for b in budgets]
        if len(budgets) != batch:
            raise ValueError(f"budgets must hold one entry per row ({batch}), got {len(budgets)}")
        if not self.pooled:  # a pool for this call alone
            self._allocate(batch, max(max(budgets), 1), None)
        elif batch > self.cache.max_batch:
            raise ValueError(f"{batch} rows exceed the pool's {self.cache.max_batch} slots (max_batch_size)")
        self.release()
        if self.max_positions is not None and max(budgets) > self.max_positions:
            raise ValueError(f"a row of {max(budgets)} tokens (prompt + max_new_tokens + K + 1) would exceed the "
                             f"model's {self.max_positions} {self.positions_limit}")
        if self._ring_layers and self.max_tentative > self._ring_span:
            raise ValueError(f"{self.max_tentative} tentative tokens per call exceed what this runner's ring cache of "
                             f"windowed layers keeps ({self._ring_span}); allocate it with num_draft_tokens this large")
        used = [b for b in range(batch) if budgets[b] > 0]
        self.cache.admit_batch(used, [budgets[b] for b in used])  # OutOfBlocksError / ValueError: nothing admitted
        for cache in self.caches[1:]:  # the ring: max_batch rings in its pool, never short
            cache.admit_batch(used, [budgets[b] for b in used])
        self.block_table, self.seq_lens = self.cache.block_table[:batch], self.cache.seq_lens[:batch]
        tables = [cache.block_table[:batch] for cache in self.caches]
        self._tables = [tables[c] for c, _ in self._layer_cache]  # layer i's block table
        self.length = self._length_all[:batch]
        self.length.zero_()
        # A row's commit cap: its reserved slots less the K + 1 tentative ones (0 for an unused row).
        caps = [max(self.cache.blocks_needed(budgets[b]) * self.block_size - self.max_tentative, 0) if budgets[b] else 0
                for b in range(batch)]
        self.caps = self._cap_all[:batch]
        self.caps.copy_(torch.tensor(caps, dtype=torch.int32, device="cpu"))  # host values, one copy
        return None if attention_mask is None else attention_mask.to(self.device).sum(1)

    def _end_prefill(self) -> None:
        """prefill's second half: the direct kernel dispatch of score, the prompt committed."""
        chosen = {resolve_backend(self.backend, self.device, op) for op in ("append_kv", "paged_attention")}
        self._direct = chosen.pop() if len(chosen) == 1 and self.kernels in ("cpp", "triton") else None
        if self._direct == "triton":  # imported here: triton is optional on CPU machines
            from ..kernels.attention.triton import paged_attention_triton, plan_launch
            from ..kernels.cache_ops.triton import append_kv_triton

            self._triton = (append_kv_triton, paged_attention_triton, plan_launch)
        self.seq_lens.copy_(self.length)
        self._tentative = 0

    @torch.no_grad()
    def score(self, tokens: torch.Tensor, num_valid: torch.Tensor | None = None, *, tree=None,
              rows: torch.Tensor | None = None) -> torch.Tensor:
        """tokens [B, N] (only the last num_valid[b] real) -> logits [B, N, V].
        tree: (mask int64 [N] or [B, N] (one tree per row), depths int [N]) scores the N tokens as
        a token tree in one pass: token i sits at position length + depths[i] and sees the context
        and the call's tokens whose bit is set in mask[i] (its ancestors and itself; N <= 64, no
        num_valid). rows: int64 [R] indices among the N tokens -> logits [B, R, V] of those alone
        (every token is fed and cached as without it; the lm_head product runs on R rows)."""
        if tree is not None and (num_valid is not None or tokens.shape[1] > 64):
            raise ValueError("tree scoring takes at most 64 tokens per row and no num_valid")
        if tree is not None and tuple(tree[0].shape) not in ((tokens.shape[1],), tuple(tokens.shape)):
            raise ValueError(f"tree: the mask must have shape [N] or [B, N] = {list(tokens.shape)}, got {list(tree[0].shape)}")
        if tree is not None and any(w is not None and w < tokens.shape[1] for w in self._windows):
            raise ValueError(f"tree scoring of {tokens.shape[1]} tokens with a sliding window of {min(w for w in self._windows if w)} "
                             "that rows reach: a tree's window must cover its nodes (kernels/attention)")
        self._tentative += tokens.shape[1]
        if self._tentative > self.max_tentative:
            raise RuntimeError(f"{self._tentative} tentative tokens since the last commit exceed the reserved "
                               f"K + 1 = {self.max_tentative} (num_draft_tokens given to {type(self).__name__})")
        hidden = self._forward(tokens, num_valid, tree)
        return self._logits(hidden if rows is None else hidden.index_select(1, rows))

    lm_head_bias = None  # [V] where the LM head has one (ERNIE 4.5's use_bias), else None

    def _logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [..., H] (final-norm hidden states) -> logits [..., V] (the lm_head product, + its bias)."""
        return linear(hidden, self.lm_head, self.lm_head_bias)

    def commit(self, keep: torch.Tensor) -> None:
        """The first keep[b] real tentative tokens become committed; the others are dropped."""
        new = torch.minimum(self.seq_lens + keep.to(torch.int32), self.caps)
        self.seq_lens.copy_(new)
        self.length.copy_(new)
        self._tentative = 0

    def commit_path(self, path: torch.Tensor, keep: torch.Tensor) -> None:
        """After tree scoring: the tentative tokens at call positions path[b, :keep[b]] (int32 [B, P],
        -1 padded) move to the first keep[b] tentative slots (compact_kv, every layer) and are
        committed, in that order; the others are dropped."""
        self._compact_path(path)
        self.commit(keep)

    def _compact_path(self, path: torch.Tensor) -> None:
        """commit_path's K/V move: every cache's tentative tokens at call positions path[b] to its first slots."""
        for cache in self.caches:
            compact_kv(cache.kv, cache.block_table[:self.seq_lens.shape[0]], self.seq_lens, path, backend=self.backend,
                       check=False)

    def compact(self, max_len_bound: int) -> None:
        """No-op: rejected tokens leave no holes (they are overwritten by the next score)."""

    # -- the forward -------------------------------------------------------------------------
    def _pack(self, tokens: torch.Tensor, num_valid, depths=None):
        """Packed tokens [T], positions [T], cu [B+1] int32, per-row real counts [B] int32 and
        the unpack index [B*N] (None for the identity). depths [N]: tree positions (no num_valid)."""
        batch, n = tokens.shape
        dev = self.device
        steps = torch.arange(n, device=dev, dtype=torch.int32) if depths is None else depths.to(torch.int32)
        if num_valid is None:
            cu = self._full_cu.get((batch, n))
            if cu is None:
                cu = self._full_cu[(batch, n)] = torch.arange(batch + 1, device=dev, dtype=torch.int32) * n
            positions = (self.length[:, None] + steps).reshape(-1)
            return tokens.reshape(-1), positions, cu, n, None
        count = num_valid.to(torch.int32)
        pad = n - count
        cu = torch.zeros(batch + 1, dtype=torch.int32, device=dev)
        cu[1:] = count.cumsum(0)
        offset = steps[None, :] - pad[:, None]  # index among the row's real tokens; < 0 = padding
        real = offset >= 0
        pad_rank = (~real).reshape(-1).long().cumsum(0).view(batch, n) - 1
        dest = torch.where(real, cu[:-1, None].long() + offset, cu[-1].long() + pad_rank).reshape(-1)
        packed = torch.empty(batch * n, dtype=torch.long, device=dev).scatter_(0, dest, tokens.reshape(-1).long())
        row_pos = (self.length[:, None] + offset.clamp(min=0)).reshape(-1)
        positions = torch.empty_like(row_pos).scatter_(0, dest, row_pos)
        return packed, positions, cu, count, dest

    def _row_index(self, cu: torch.Tensor, total: int, n: int) -> tuple:
        """A packed call's tokens as rows [B, n] again, each row's real tokens last (as the call gave them):
        (packed index [B, n] int64, ``total`` where padding: a spare row past the packed ones; real [B, n]
        bool). The runners that run a row's tokens together (paged_mla's expanded prefill, paged_qwen3_next's
        recurrence) read them through it."""
        count = cu[1:] - cu[:-1]
        step = torch.arange(n, device=self.device)
        pad = (n - count)[:, None]
        real = step[None, :] >= pad
        return torch.where(real, cu[:-1, None].long() + step[None, :] - pad, total), real

    def _forward(self, tokens: torch.Tensor, num_valid, tree=None, prefill: bool = False) -> torch.Tensor:
        """tokens [B, N] -> final-norm hidden states [B, N, H]; appends the real tokens' K/V at
        self.length and advances it. tree: (mask [N], depths [N]) as in score. With a
        hidden_capture, the chosen hidden states land in its buffers (hidden_capture.py)."""
        batch, n = tokens.shape
        flat, positions, cu, count, unpack = self._pack(tokens, num_valid, None if tree is None else tree[1])
        attn_lens = self.length + count  # the kernel's seq_lens include the new tokens
        # _attend reads the tree mask from here (the subclasses' _decode passes no mask).
        self._tree_mask = None if tree is None else (tree[0].repeat(batch) if tree[0].dim() == 1 else tree[0].reshape(-1))
        self._prefilling = prefill
        capture = self.hidden_capture
        if capture is not None:
            capture.begin(batch, n, unpack is not None, prefill)
        try:
            x = self._decode(flat, positions, cu, attn_lens, n)
        except BaseException:
            if capture is not None:
                capture.abort()
            raise
        finally:
            self._tree_mask, self._prefilling = None, False
        if capture is not None:
            capture.end(unpack, prefill)
        self.length.copy_(attn_lens)
        if unpack is not None:
            x = x.index_select(0, unpack)
        return x.view(batch, n, -1)

    # -- hidden states for the drafters that read them (runners/hidden_capture.py) --------------
    def capture_hidden_states(self, indices) -> None:
        """Keep hidden states ``indices`` (transformers' output_hidden_states numbering: 0 the
        embeddings, i + 1 layer i's output, L the final norm's) at every position prefill and
        score run; None turns it off (the default). Set it before the engine's first call: the
        buffers are allocated at the first call of each shape."""
        self.hidden_capture = None if indices is None else HiddenCapture(
            indices, num_layers=len(self.layers), hidden_size=int(self.lm_head.shape[1]), dtype=self.dtype,
            device=self.device)

    def hidden_states(self, batch: int, n: int) -> torch.Tensor:
        """[B, N, W] (W = len(indices) * H): the hidden states of the last score call of shape
        [B, N], in place in a buffer of fixed address (graph safe)."""
        if self.hidden_capture is None:
            raise RuntimeError("hidden states are not captured: call capture_hidden_states(indices) first")
        return self.hidden_capture.buffer(batch, n)

    def take_prefill_hidden(self) -> torch.Tensor:
        """[B, P, W]: the last prefill's hidden states (handed over once)."""
        if self.hidden_capture is None:
            raise RuntimeError("hidden states are not captured: call capture_hidden_states(indices) first")
        return self.hidden_capture.take_prefill()

    def _keep(self, j: int, x: torch.Tensor) -> None:
        """The family's _decode: x [T, H] is hidden state j of this forward (a no-op when off)."""
        if self.hidden_capture is not None:
            self.hidden_capture.keep(j, x)

    def _attend(self, i: int, q, k, v, attn_lens, cu, max_query_len: int, scale: float) -> torch.Tensor:
        """Layer i: writes k, v [T, Hkv, D] at self.length, then attention of q [T, Hq, D] over
        the row's cache (new tokens included) -> [T, Hq, D]. q, k, v may be strided views
        (stride(-1) == 1), e.g. slices of a fused QKV product."""
        self._append(i, k, v, cu)
        return self._attention(i, q, attn_lens, cu, max_query_len, scale)

    def _append(self, i: int, k, v, cu, start=None) -> None:
        """Writes layer i's new k, v [T, Hkv, D] at self.length (or at ``start`` [B] int32), rows packed by cu."""
        start = self.length if start is None else start
        if self._direct == "cpp":
            torch.ops.specdec_fast.append_kv(k, v, self.k_caches[i], self.v_caches[i], self._tables[i], start, cu)
        elif self._direct == "triton":
            self._triton[0](k, v, self.k_caches[i], self.v_caches[i], self._tables[i], start, cu)
        else:
            append_kv(k, v, self.k_caches[i], self.v_caches[i], self._tables[i], start, cu,
                      backend=self.backend, check=False)

    def _attention(self, i: int, q, attn_lens, cu, max_query_len: int, scale: float, causal: bool = True,
                   pdl: bool = False) -> torch.Tensor:
        """Attention of q [T, Hq, D] over layer i's cache, whose new tokens' K/V are already
        written (attn_lens [B] counts them) -> [T, Hq, D]. causal=False: the block mask (the
        row's new tokens see each other both ways: kernels/attention). pdl: the Triton path's
        launches as programmatic dependent launches (on CUDA; the GEMV layer's chain)."""
        window, softcap = self._windows[i], self.attn_softcap
        sinks = self.attn_sinks[i] if self.attn_sinks else None
        chunk = self._chunks[i] if self._chunks else None
        if self._direct == "cpp":
            # The C++ op needs a contiguous q; contiguous() returns q itself when it already is.
            return torch.ops.specdec_fast.paged_attention(q.contiguous(), self.k_caches[i], self.v_caches[i],
                                                          self._tables[i], attn_lens, cu, self._tree_mask, scale, causal,
                                                          window or 0, softcap or 0.0, sinks, chunk or 0)
        if self._direct == "triton":
            return self._triton[1](q, self.k_caches[i], self.v_caches[i], self._tables[i], attn_lens, cu,
                                   max_query_len=max_query_len, tree_mask=self._tree_mask, scale=scale,
                                   plan=self._plan(max_query_len, i, q.shape[1]), causal=causal, workspace=self._attn_workspace,
                                   pdl=pdl, window=window, softcap=softcap, sinks=sinks, chunk=chunk)
        return paged_attention(q, self.k_caches[i], self.v_caches[i], self._tables[i], attn_lens, cu,
                               max_query_len=max_query_len, tree_mask=self._tree_mask, scale=scale, causal=causal,
                               window=window, softcap=softcap, sinks=sinks, chunk=chunk, backend=self.backend,
                               check=False)

    def _plan(self, max_query_len: int, i: int = 0, heads: int | None = None):
        """The Triton attention launch shape of a call (static per call width) over layer i's KV shape
        (kv_shape) for ``heads`` query heads (default num_heads; Laguna's layers differ): chosen once a shape."""
        table = self.block_table
        kv_heads, head_dim = self.kv_shape(i)
        heads = self.num_heads if heads is None else heads
        key = (table.shape[0], max_query_len, kv_heads, head_dim, heads)
        plan = self._plans.get(key)
        if plan is None:
            plan = self._plans[key] = self._triton[2](
                self.device, table.shape[0], kv_heads, heads // kv_heads, head_dim,
                max_query_len, table.shape[1] * self.block_size, element_size=self.k_caches[0].element_size())
        return plan
