"""PagedGPTBigCodeRunner: a GPT-BigCode decoder (model_type gpt_bigcode: StarCoder / StarCoderBase 1B
.. 15B, SantaCoder, WizardCoder, OctoCoder -- StarCoderBase-1B drafting StarCoder is one tokenizer)
run layer by layer over a PagedKVCache with the project's append_kv / paged_attention kernels (the
machinery is shared: runners/paged_base.py).

Weights are the model's own parameters (no copy): transformer.wte, transformer.wpe (learned
absolute positions, the token's position in its row's unpadded context), per block ln_1,
attn.c_attn (one product: multi-query [q (H D) | k (D) | v (D)], else each head's q | k | v),
attn.c_proj, ln_2, mlp.c_fc / mlp.c_proj, then ln_f and lm_head (tied). The math is transformers
5.24's GPTBigCodeBlock (modeling_gpt_bigcode.py), eval mode (dropouts off), GPT-2's with
nn.Linear projections and multi-query attention:
    x = x + c_proj(attention(split(c_attn(ln_1(x)))))    scale head_dim^-0.5 (scale_attn_weights)
    x = x + mlp.c_proj(act(mlp.c_fc(ln_2(x))))
    out = ln_f(x)
Rows must fit the position table (n_positions), as GPT-2's. Cross-attention blocks are refused
(generate never passes encoder states). One path on every backend, as the GPT-2 runner: the
attention and KV append through the kernels, the rest torch ops. No tensor-parallel runner.
"""
import torch
import torch.nn.functional as F

from ._layer_math import layer_norm_params, linear_params
from ._linear import linear
from .paged_base import PagedRunnerBase, decoder_reason, head_dim_reason, position_table_reason


def _projections(block) -> tuple:
    return block.attn.c_attn, block.attn.c_proj, block.mlp.c_fc, block.mlp.c_proj


def gpt_bigcode_unsupported_reason(model, max_tokens_per_row: int | None = None, backend=None) -> str | None:
    """Why PagedGPTBigCodeRunner cannot run ``model`` with rows of up to max_tokens_per_row tokens and
    kernel ``backend``, or None when it can."""
    reason = decoder_reason(model, ("gpt_bigcode",), "transformer.h", "a GPTBigCodeForCausalLM", _projections)
    if reason is not None:
        return reason
    config = model.config
    if getattr(config, "add_cross_attention", False):
        return "add_cross_attention (cross-attention blocks)"
    return (position_table_reason(max_tokens_per_row, model.transformer.wpe.weight.shape[0], "n_positions")
            or head_dim_reason(config.n_embd // config.n_head, backend))


class _BigCodeBlock:
    """One GPTBigCodeBlock's parameters (references to the model's tensors, not copies)."""

    def __init__(self, block):
        attn, mlp = block.attn, block.mlp
        self.ln_1, self.ln_2 = layer_norm_params(block.ln_1), layer_norm_params(block.ln_2)
        self.qkv, self.proj, self.fc, self.out = linear_params(attn.c_attn, attn.c_proj, mlp.c_fc, mlp.c_proj)
        self.act = mlp.act
        self.scale = attn.scaling  # head_dim^-0.5, or 1 without scale_attn_weights


class PagedGPTBigCodeRunner(PagedRunnerBase):
    """Runner (see runners/base.py) for a GPTBigCodeForCausalLM instance (weights shared); the
    arguments are PagedRunnerBase's (rows must fit n_positions)."""

    unsupported_reason = staticmethod(gpt_bigcode_unsupported_reason)

    def _bind(self, model) -> None:
        config, inner = model.config, model.transformer
        self.wte, self.wpe = inner.wte.weight, inner.wpe.weight
        self.max_positions = int(self.wpe.shape[0])
        self.layers = [_BigCodeBlock(block) for block in inner.h]
        self.ln_f = layer_norm_params(inner.ln_f)
        self.lm_head = model.get_output_embeddings().weight
        self.hidden = config.n_embd
        self.num_heads = config.n_head
        self.multi_query = bool(config.multi_query)
        self.num_kv_heads = 1 if self.multi_query else config.n_head
        self.head_dim = config.n_embd // config.n_head

    def _split(self, qkv, total: int):
        """One c_attn product [T, H D + 2 Hk D] -> q [T, H, D], k / v [T, Hk, D] (strided views)."""
        heads, dim = self.num_heads, self.head_dim
        if self.multi_query:  # [q (H D) | k (D) | v (D)]
            q, kv = qkv[:, :self.hidden].view(total, heads, dim), qkv[:, self.hidden:]
            return q, kv[:, :dim].view(total, 1, dim), kv[:, dim:].view(total, 1, dim)
        per_head = qkv.view(total, heads, 3 * dim)  # each head's q | k | v
        return per_head[..., :dim], per_head[..., dim:2 * dim], per_head[..., 2 * dim:]

    def _decode(self, flat, positions, cu, attn_lens, n) -> torch.Tensor:
        """Packed tokens [T] at positions [T] -> ln_f hidden states [T, H]."""
        total, width = flat.shape[0], (self.hidden,)
        # rows the engine has finished may run on past the table (their tokens are discarded): clamped
        where = positions.clamp(max=self.max_positions - 1)
        x = F.embedding(flat.clamp(min=0), self.wte) + F.embedding(where, self.wpe)
        self._keep(0, x)
        for i, layer in enumerate(self.layers):
            q, k, v = self._split(linear(F.layer_norm(x, width, *layer.ln_1), *layer.qkv), total)
            o = self._attend(i, q, k, v, attn_lens, cu, n, layer.scale)
            x = linear(o.reshape(total, self.hidden), *layer.proj) + x
            x = x + linear(layer.act(linear(F.layer_norm(x, width, *layer.ln_2), *layer.fc)), *layer.out)
            if i + 1 < len(self.layers):
                self._keep(i + 1, x)
        out = F.layer_norm(x, width, *self.ln_f)
        self._keep(len(self.layers), out)
        return out
