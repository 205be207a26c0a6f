"""PagedGPT2Runner: a GPT2LMHeadModel run layer by layer over a PagedKVCache with the project's
append_kv / paged_attention kernels (the machinery is shared: runners/paged_base.py).

Weights are the model's own parameters (no copy): transformer.wte, transformer.wpe (learned
absolute positions, indexed by the token's position in its row's unpadded context), per block
ln_1, attn.c_attn, attn.c_proj, ln_2, mlp.c_fc, mlp.c_proj, then ln_f and lm_head (tied to wte).
GPT-2's Conv1D stores its weight as [in, out] and computes x @ W + b: it goes to ``linear`` as
the transposed view W.t() [out, in] (same storage).

The math is transformers 5.x's GPT2Block (modeling_gpt2.py), eval mode (dropout off):
    h = ln_1(x); q, k, v = split(c_attn(h)); x = x + c_proj(attn(q, k, v))   (MHA, no RoPE)
    x = x + mlp.c_proj(act(mlp.c_fc(ln_2(x))))                               act = ACT2FN[activation_function]
with the attention scale of GPT2Attention: head_dim**-0.5 when scale_attn_weights (else 1),
divided by (layer_idx + 1) when scale_attn_by_inverse_layer_idx. reorder_and_upcast_attn asks
(with eager attention only) for float32 scores and softmax; the kernels compute those in
float32 for every dtype, so in float32 it is the same math; in float16/bfloat16 transformers
also rounds the probabilities to the model dtype before P @ V, which the kernels do not: that
combination is refused. Cross-attention blocks (add_cross_attention) are skipped, as
transformers skips them without encoder_hidden_states (generate never passes any).

Positions: a row's reservation (prompt width + max_new_tokens + K + 1) must fit n_positions;
rows the engine has finished may run on past it (their tokens are discarded), so positions are
clamped to the table (as HFRunner does).
"""
import torch
import torch.nn.functional as F

from ._linear import linear
from .paged_base import FLOAT_DTYPES, PagedRunnerBase, device_reason, head_dim_reason, position_table_reason


def _conv1d_type():
    try:
        from transformers.pytorch_utils import Conv1D
    except ImportError:  # pragma: no cover - transformers is an optional dependency
        return None
    return Conv1D


def _plain_modules_reason(model) -> str | None:
    """Why some block's Conv1D / LayerNorm is not a plain float module (quantized, adapter-wrapped)."""
    conv1d = _conv1d_type()
    if conv1d is None:
        return "transformers is not importable (GPT-2's Conv1D)"
    blocks = model.transformer.h
    norms = [model.transformer.ln_f] + [ln for b in blocks for ln in (b.ln_1, b.ln_2)]
    for norm in norms:
        if (type(norm).forward is not torch.nn.LayerNorm.forward or norm.weight is None or norm.bias is None
                or norm.weight.dtype not in FLOAT_DTYPES):
            return "a layer norm is not a plain float nn.LayerNorm with weight and bias"
    for i, block in enumerate(blocks):
        mods = (block.attn.c_attn, block.attn.c_proj, block.mlp.c_fc, block.mlp.c_proj)
        # Quantized / adapter-wrapped projections have their own forward: not plain weights.
        if any(type(m).forward is not conv1d.forward or m.weight.dtype not in FLOAT_DTYPES for m in mods):
            return f"block {i} has a projection that is not a plain float transformers Conv1D"
    return None


def gpt2_unsupported_reason(model, max_tokens_per_row: int | None = None, backend=None) -> str | None:
    """Why PagedGPT2Runner cannot run ``model`` with rows of up to max_tokens_per_row tokens (None:
    unknown) and kernel ``backend`` (a string), or None when it can."""
    config = getattr(model, "config", None)
    model_type = getattr(config, "model_type", None)
    if model_type != "gpt2":
        return f"model_type {model_type!r} is not 'gpt2'"
    inner = getattr(model, "transformer", None)
    if (inner is None or not all(hasattr(inner, name) for name in ("wte", "wpe", "h", "ln_f"))
            or model.get_output_embeddings() is None):
        return "the model has no .transformer.{wte,wpe,h,ln_f} / lm_head (expected a GPT2LMHeadModel)"
    reason = device_reason(model) or _plain_modules_reason(model)
    if reason is not None:
        return reason
    dtype = inner.wte.weight.dtype
    if (getattr(config, "reorder_and_upcast_attn", False) and config._attn_implementation == "eager"
            and dtype != torch.float32):
        return (f"reorder_and_upcast_attn with eager attention in {dtype}: transformers rounds the float32 "
                "probabilities to the model dtype before P @ V, the paged kernels keep float32")
    if config.n_embd % config.n_head:
        return f"n_embd {config.n_embd} is not a multiple of n_head {config.n_head}"
    return (position_table_reason(max_tokens_per_row, inner.wpe.weight.shape[0], "n_positions")
            or head_dim_reason(config.n_embd // config.n_head, backend))


def attention_scale(config, layer_idx: int) -> float:
    """GPT2Attention's scaling, computed the same way (same float rounding)."""
    scale = 1.0
    if config.scale_attn_weights:
        scale = (config.n_embd // config.n_head) ** -0.5
    if config.scale_attn_by_inverse_layer_idx:
        scale /= float(layer_idx + 1)
    return scale


class _Block:
    """One GPT2Block's parameters (references and transposed views of the model's tensors)."""

    def __init__(self, block, layer_idx: int, config):
        attn, mlp = block.attn, block.mlp
        self.ln_1 = (block.ln_1.weight, block.ln_1.bias, block.ln_1.eps)
        self.ln_2 = (block.ln_2.weight, block.ln_2.bias, block.ln_2.eps)
        self.qkv = (attn.c_attn.weight.t(), attn.c_attn.bias)  # Conv1D [in, out] -> [out, in] view
        self.proj = (attn.c_proj.weight.t(), attn.c_proj.bias)
        self.fc = (mlp.c_fc.weight.t(), mlp.c_fc.bias)
        self.out = (mlp.c_proj.weight.t(), mlp.c_proj.bias)
        self.act = mlp.act  # ACT2FN[config.activation_function]: the model's own module
        self.scale = attention_scale(config, layer_idx)


class PagedGPT2Runner(PagedRunnerBase):
    """Runner (see runners/base.py) for a GPT2LMHeadModel instance (weights shared).

    max_new_tokens and num_draft_tokens (K; 0 for plain decoding) size each row's reservation:
    prompt width + max_new_tokens + K + 1 (<= n_positions). backend: kernel backend.
    """

    unsupported_reason = staticmethod(gpt2_unsupported_reason)

    def _bind(self, model) -> None:
        config, inner = model.config, model.transformer
        self.wte, self.wpe = inner.wte.weight, inner.wpe.weight
        self.max_positions = int(self.wpe.shape[0])
        self.layers = [_Block(block, i, config) for i, block in enumerate(inner.h)]
        self.ln_f = (inner.ln_f.weight, inner.ln_f.bias, inner.ln_f.eps)
        self.lm_head = model.get_output_embeddings().weight
        self.hidden = config.n_embd
        self.num_heads = self.num_kv_heads = config.n_head
        self.head_dim = config.n_embd // config.n_head

    def _decode(self, flat, positions, cu, attn_lens, n) -> torch.Tensor:
        """Packed tokens [T] at positions [T] -> ln_f hidden states [T, H]."""
        total, width, heads, dim = flat.shape[0], (self.hidden,), self.num_heads, self.head_dim
        x = F.embedding(flat.clamp(min=0), self.wte) + F.embedding(positions.clamp(max=self.max_positions - 1), self.wpe)
        self._keep(0, x)
        for i, layer in enumerate(self.layers):
            h = F.layer_norm(x, width, *layer.ln_1)
            q, k, v = linear(h, *layer.qkv).split(self.hidden, dim=-1)  # strided views of one product
            o = self._attend(i, q.view(total, heads, dim), k.view(total, heads, dim), v.view(total, heads, dim),
                             attn_lens, cu, n, layer.scale)
            x = x + linear(o.reshape(total, self.hidden), *layer.proj)
            h = F.layer_norm(x, width, *layer.ln_2)
            x = x + linear(layer.act(linear(h, *layer.fc)), *layer.out)
            if i + 1 < len(self.layers):
                self._keep(i + 1, x)
        out = F.layer_norm(x, width, *self.ln_f)
        self._keep(len(self.layers), out)
        return out
