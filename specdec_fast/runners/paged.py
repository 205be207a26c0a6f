"""PagedRunner: a Llama-family decoder (Llama, Mistral, Qwen2, Qwen3) run layer by layer over a
PagedKVCache with the project's append_kv / paged_attention kernels.

Weights are the transformers model's own parameters (no copy): embed_tokens, each layer's
input_layernorm, self_attn.{q,k,v,o}_proj (+ bias when present: Qwen2), q_norm / k_norm
(Qwen3), post_attention_layernorm, mlp.{gate,up,down}_proj, model.norm, lm_head. RoPE uses the
model's rotary module's inv_freq and attention_scaling with the same float32 math as
transformers 5.x (``position * inv_freq``, cat(freqs, freqs), cos/sin * scaling, cast to
the model dtype), so any rope_type with static frequencies (default, linear, llama3, yarn)
matches; dynamic and longrope (frequencies that change with the length) are refused.

Packing (static sizes, no host sync): a call with tokens [B, N] runs T = B*N token rows. Real
tokens are packed first, row by row (row b's at cu[b] .. cu[b+1], cu from num_valid), and the
in-call left padding goes to the tail T - cu[B] .. T-1. The kernels only touch rows < cu[B]:
append_kv writes nothing for the padding, paged_attention gives it no output rows (their
values are unspecified, so their logits are garbage, as the runner interface allows). Without
num_valid the packing is the identity (no gather).

Lengths: ``cache.seq_lens`` [B] = committed tokens; ``self.length`` [B] = committed + tentative
(score appends at self.length). Each row reserves its whole budget at prefill:
prompt width + max_new_tokens + K + 1 tokens. Between two commits at most K + 1 tentative
tokens are appended (target: one call of K+1; draft: 1 or 2 pending + K-1 single tokens); this
is checked on the host from the static call widths. A row the engine has finished keeps being
scored (its tokens are discarded); commit caps its committed length at reservation - (K+1) so
its writes stay inside its blocks. A live row never reaches the cap (its committed length is
<= prompt + max_new_tokens - 2).
"""
import math

import torch
import torch.nn.functional as F

from specdec_fast.cache import PagedKVCache
from specdec_fast.kernels._backend import resolve_backend
from specdec_fast.kernels.attention import paged_attention
from specdec_fast.kernels.cache_ops import append_kv
from specdec_fast.runners._layer_math import fused_layer_math, gated_act, rms_norm, rope_cos_sin, rotate_qk
from specdec_fast.runners._linear import layer_linears, linear

SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3")
_DYNAMIC_ROPE = ("dynamic", "longrope")
_FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def _sliding_window_in_use(config, max_tokens_per_row):
    """The window size when some layer uses a sliding window that a row of max_tokens_per_row
    tokens (None: unknown) could exceed, else None. Keys are masked when q - k >= window."""
    window = getattr(config, "sliding_window", None)
    if window is None:
        return None
    layer_types = getattr(config, "layer_types", None)
    if config.model_type != "mistral" and layer_types is not None and "sliding_attention" not in layer_types:
        return None
    if config.model_type != "mistral" and layer_types is None and not getattr(config, "use_sliding_window", False):
        return None
    if max_tokens_per_row is not None and max_tokens_per_row <= window:
        return None
    return window


def paged_unsupported_reason(model, max_tokens_per_row: int | None = None, backend=None) -> str | None:
    """Why PagedRunner cannot run ``model`` with kernel ``backend`` (a string), or None when it can."""
    config = getattr(model, "config", None)
    model_type = getattr(config, "model_type", None)
    if model_type not in SUPPORTED_MODEL_TYPES:
        return f"model_type {model_type!r} is not one of {SUPPORTED_MODEL_TYPES}"
    inner = getattr(model, "model", None)
    if inner is None or not hasattr(inner, "layers") or model.get_output_embeddings() is None:
        return "the model has no .model.layers / lm_head (expected a *ForCausalLM)"
    devices = {p.device for p in model.parameters()}
    if len(devices) != 1:
        return f"the parameters are spread over {len(devices)} devices"
    for i, layer in enumerate(inner.layers):
        mods = (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj, layer.self_attn.o_proj,
                layer.mlp.gate_proj, layer.mlp.up_proj, layer.mlp.down_proj)
        # Quantized / adapter-wrapped linears (bitsandbytes, peft) have their own forward: not plain weights.
        if any(type(m).forward is not torch.nn.Linear.forward or m.weight.dtype not in _FLOAT_DTYPES for m in mods):
            return f"layer {i} has a projection that is not a plain float nn.Linear"
    window = _sliding_window_in_use(config, max_tokens_per_row)
    if window is not None:
        return f"sliding_window {window} is in use (rows up to {max_tokens_per_row} tokens)"
    rotary = getattr(inner, "rotary_emb", None)
    rope_type = getattr(rotary, "rope_type", None)
    if rotary is None or not hasattr(rotary, "inv_freq"):
        return "the model has no rotary_emb with inv_freq"
    if not isinstance(rope_type, str) or any(name in rope_type for name in _DYNAMIC_ROPE):
        return f"rope_type {rope_type!r} changes its frequencies with the length"
    if getattr(config, "pretraining_tp", 1) not in (None, 1):
        return "pretraining_tp > 1"
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    if backend == "triton" and (head_dim & (head_dim - 1) or not 16 <= head_dim <= 256):
        return f"backend='triton' paged attention needs a power-of-2 head_dim in [16, 256], got {head_dim}"
    return None


class _Layer:
    """One decoder layer's parameters (references to the model's tensors, not copies)."""

    def __init__(self, layer):
        attn, mlp = layer.self_attn, layer.mlp
        self.ln_in = layer.input_layernorm.weight
        self.eps_in = layer.input_layernorm.variance_epsilon
        self.ln_post = layer.post_attention_layernorm.weight
        self.eps_post = layer.post_attention_layernorm.variance_epsilon
        self.q = (attn.q_proj.weight, attn.q_proj.bias)
        self.k = (attn.k_proj.weight, attn.k_proj.bias)
        self.v = (attn.v_proj.weight, attn.v_proj.bias)
        self.o = (attn.o_proj.weight, attn.o_proj.bias)
        q_norm, k_norm = getattr(attn, "q_norm", None), getattr(attn, "k_norm", None)
        self.qk_norm = None if q_norm is None else (q_norm.weight, q_norm.variance_epsilon, k_norm.weight, k_norm.variance_epsilon)
        self.gate = (mlp.gate_proj.weight, mlp.gate_proj.bias)
        self.up = (mlp.up_proj.weight, mlp.up_proj.bias)
        self.down = (mlp.down_proj.weight, mlp.down_proj.bias)
        self.qkv = ([self.q[0], self.k[0], self.v[0]], [self.q[1], self.k[1], self.v[1]])  # one call each
        self.gate_up = ([self.gate[0], self.up[0]], [self.gate[1], self.up[1]])
        self.act = mlp.act_fn


class PagedRunner:
    """Runner (see runners/base.py) for a Llama-family *ForCausalLM instance (weights shared).

    max_new_tokens and num_draft_tokens (K; 0 for plain decoding) size each row's reservation:
    prompt width + max_new_tokens + K + 1. backend: kernel backend (None = automatic).
    """

    def __init__(self, model, *, max_new_tokens: int, num_draft_tokens: int, block_size: int = 16, backend=None):
        reason = paged_unsupported_reason(model, backend=backend)
        if reason is not None:
            raise ValueError(f"PagedRunner cannot run this model: {reason}; use runner='hf'")
        for name, value, low in (("max_new_tokens", max_new_tokens, 1), ("num_draft_tokens", num_draft_tokens, 0),
                                 ("block_size", block_size, 1)):
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"{name} must be an int >= {low}, got {value!r}")
        config = model.config
        self.model, self.config = model, config
        self.max_new_tokens, self.max_tentative = max_new_tokens, num_draft_tokens + 1
        self.block_size, self.backend = block_size, backend
        inner = model.model
        self.embed = inner.embed_tokens.weight
        self.layers = [_Layer(layer) for layer in inner.layers]
        self.final_norm, self.final_eps = inner.norm.weight, inner.norm.variance_epsilon
        self.lm_head = model.get_output_embeddings().weight
        self.vocab_size = int(self.lm_head.shape[0])
        self.device, self.dtype = self.embed.device, self.embed.dtype
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        self.scale = self.head_dim**-0.5  # transformers' scaling (may differ from 1/sqrt(D) in the last bit)
        self.inv_freq = inner.rotary_emb.inv_freq.to(device=self.device, dtype=torch.float32)
        self.rope_scaling = float(inner.rotary_emb.attention_scaling)
        self.silu = config.hidden_act == "silu"  # F.silu directly: skips a module call per layer
        self.cache = None

    # -- the runner interface --------------------------------------------------------------
    @torch.no_grad()
    def prefill(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None) -> torch.Tensor:
        """input_ids [B, P], attention_mask [B, P] (left padding) -> logits [B, V] of the last position."""
        batch, width = input_ids.shape
        budget = width + self.max_new_tokens + self.max_tentative
        per_row = math.ceil(budget / self.block_size)
        self.cache = PagedKVCache(len(self.layers), self.num_kv_heads, self.head_dim, num_blocks=batch * per_row,
                                  block_size=self.block_size, max_batch=batch, max_blocks_per_row=per_row,
                                  dtype=self.dtype, device=self.device)
        self.cache.admit_batch(range(batch), [budget] * batch)
        self.k_caches = [self.cache.kv[i, 0] for i in range(len(self.layers))]
        self.v_caches = [self.cache.kv[i, 1] for i in range(len(self.layers))]
        self.cap = per_row * self.block_size - self.max_tentative
        self.length = torch.zeros(batch, dtype=torch.int32, device=self.device)
        self._full_cu = {}
        num_valid = None if attention_mask is None else attention_mask.to(self.device).sum(1)
        # The prefill goes through the kernels' public entry points (static checks of every shape);
        # score calls the C++ ops directly when both resolve to "cpp": the entry points' Python
        # checks and dispatch were ~10% of a decoding step of the demo pair on CPU (cProfile).
        self._direct_cpp = False
        hidden = self._forward(input_ids, num_valid)
        self._direct_cpp = all(resolve_backend(self.backend, self.device, op) == "cpp"
                               for op in ("append_kv", "paged_attention"))
        self.cache.seq_lens.copy_(self.length)
        self._tentative = 0
        return linear(hidden[:, -1], self.lm_head)

    @torch.no_grad()
    def score(self, tokens: torch.Tensor, num_valid: torch.Tensor | None = None) -> torch.Tensor:
        """tokens [B, N] (only the last num_valid[b] real) -> logits [B, N, V]."""
        self._tentative += tokens.shape[1]
        if self._tentative > self.max_tentative:
            raise RuntimeError(f"{self._tentative} tentative tokens since the last commit exceed the reserved "
                               f"K + 1 = {self.max_tentative} (num_draft_tokens given to PagedRunner)")
        return linear(self._forward(tokens, num_valid), self.lm_head)

    def commit(self, keep: torch.Tensor) -> None:
        """The first keep[b] real tentative tokens become committed; the others are dropped."""
        new = torch.clamp(self.cache.seq_lens + keep.to(torch.int32), max=self.cap)
        self.cache.seq_lens.copy_(new)
        self.length.copy_(new)
        self._tentative = 0

    def compact(self, max_len_bound: int) -> None:
        """No-op: rejected tokens leave no holes (they are overwritten by the next score)."""

    # -- the forward -------------------------------------------------------------------------
    def _pack(self, tokens: torch.Tensor, num_valid):
        """Packed tokens [T], positions [T], cu [B+1] int32, per-row real counts [B] int32 and
        the unpack index [B*N] (None for the identity)."""
        batch, n = tokens.shape
        dev = self.device
        steps = torch.arange(n, device=dev, dtype=torch.int32)
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

    def _linears(self, rows: int, x: torch.Tensor):
        """(linear, linears) for a forward over ``rows`` token rows like x: decided once per row
        count (runners/_linear.layer_linears: the raw C++ ops when they take every weight)."""
        cache = self.__dict__.setdefault("_linear_fns", {})
        if rows not in cache:
            weights = [p for layer in self.layers for p in (layer.q, layer.k, layer.v, layer.o, layer.gate, layer.up, layer.down)]
            cache[rows] = layer_linears(rows, x, [w for w, _ in weights], [b for _, b in weights])
        return cache[rows]

    def _forward(self, tokens: torch.Tensor, num_valid) -> torch.Tensor:
        """tokens [B, N] -> final-norm hidden states [B, N, H]; appends the real tokens' K/V at
        self.length and advances it."""
        batch, n = tokens.shape
        flat, positions, cu, count, unpack = self._pack(tokens, num_valid)
        total = flat.shape[0]
        attn_lens = self.length + count  # the kernel's seq_lens include the new tokens
        fused = fused_layer_math(self.dtype, self.device.type)  # C++ RMSNorm / RoPE / SwiGLU (CPU float32)
        cos, sin = rope_cos_sin(positions, self.inv_freq, self.rope_scaling, self.dtype, fused)  # [T, D], once per call
        x = F.embedding(flat.clamp(min=0), self.embed)
        table, heads, kv_heads, dim = self.cache.block_table, self.num_heads, self.num_kv_heads, self.head_dim
        direct, ops = self._direct_cpp, torch.ops.specdec_fast
        lin, lins = self._linears(total, x)
        for i, layer in enumerate(self.layers):
            h = rms_norm(x, layer.ln_in, layer.eps_in, fused)
            q, k, v = lins(h, *layer.qkv)
            q, k, v = q.view(total, heads, dim), k.view(total, kv_heads, dim), v.view(total, kv_heads, dim)
            if layer.qk_norm is not None:
                q = rms_norm(q, layer.qk_norm[0], layer.qk_norm[1], fused)
                k = rms_norm(k, layer.qk_norm[2], layer.qk_norm[3], fused)
            q, k = rotate_qk(q, k, cos, sin, fused)
            if direct:
                ops.append_kv(k, v, self.k_caches[i], self.v_caches[i], table, self.length, cu)
                o = ops.paged_attention(q, self.k_caches[i], self.v_caches[i], table, attn_lens, cu, None, self.scale)
            else:
                append_kv(k, v, self.k_caches[i], self.v_caches[i], table, self.length, cu, backend=self.backend, check=False)
                o = paged_attention(q, self.k_caches[i], self.v_caches[i], table, attn_lens, cu, max_query_len=n,
                                    scale=self.scale, backend=self.backend, check=False)
            x = lin(o.reshape(total, heads * dim), *layer.o, x)  # x + o-projection
            h = rms_norm(x, layer.ln_post, layer.eps_post, fused)
            act = gated_act(*lins(h, *layer.gate_up), layer.act, self.silu, fused)
            x = lin(act, *layer.down, x)
        self.length.copy_(attn_lens)
        x = rms_norm(x, self.final_norm, self.final_eps, fused)
        if unpack is not None:
            x = x.index_select(0, unpack)
        return x.view(batch, n, -1)
