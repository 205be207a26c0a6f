"""PagedOPTRunner: an OPT decoder (model_type opt: OPT-125M .. OPT-66B, Galactica) run layer by layer
over a PagedKVCache with the project's append_kv / paged_attention kernels (the machinery is
shared: runners/paged_base.py). OPT-125M drafting a larger OPT is a classic pair of the
speculative-decoding literature.

Weights are the model's own parameters (no copy): model.decoder.embed_tokens and embed_positions
(learned, offset 2: position p reads row p + 2), project_in / project_out (OPT-350M), per layer
self_attn.{q,k,v,out}_proj (+ biases), self_attn_layer_norm, fc1 / fc2, final_layer_norm, then
the decoder's final_layer_norm and lm_head (tied). The math is transformers 5.24's OPTDecoder
(modeling_opt.py), eval mode (dropouts off):
    x = project_in(embed(ids)) + embed_positions(p + 2)
    pre-LN (do_layer_norm_before, every size but 350M):
        x = x + out_proj(attention(q_proj(h) * head_dim^-0.5, ...)), h = self_attn_layer_norm(x)
        x = x + fc2(act(fc1(final_layer_norm(x))))
    post-LN (350M): x = self_attn_layer_norm(x + attn(x)); x = final_layer_norm(x + fc2(act(fc1(x))))
    out = project_out(decoder.final_layer_norm(x))   (the final norm only pre-LN)
The query is scaled before the product and the attention then unscaled, in OPT's order. Rows
must fit the position table (max_position_embeddings), as GPT-2's. One path on every backend,
as the GPT-2 runner: the attention and KV append through the kernels, the rest torch ops. No
tensor-parallel runner.
"""
import torch
import torch.nn.functional as F

from ._layer_math import layer_norm_params, linear_params
from ._linear import linear
from .paged_base import PagedRunnerBase, decoder_reason, head_dim_reason, position_table_reason

POSITION_OFFSET = 2  # OPTLearnedPositionalEmbedding.offset


def _projections(layer) -> tuple:
    attn = layer.self_attn
    return attn.q_proj, attn.k_proj, attn.v_proj, attn.out_proj, layer.fc1, layer.fc2


def opt_unsupported_reason(model, max_tokens_per_row: int | None = None, backend=None) -> str | None:
    """Why PagedOPTRunner cannot run ``model`` with rows of up to max_tokens_per_row tokens and
    kernel ``backend``, or None when it can."""
    reason = decoder_reason(model, ("opt",), "model.decoder.layers", "an OPTForCausalLM", _projections)
    if reason is not None:
        return reason
    config, positions = model.config, model.model.decoder.embed_positions.weight.shape[0] - POSITION_OFFSET
    return (position_table_reason(max_tokens_per_row, positions, "max_position_embeddings")
            or head_dim_reason(config.hidden_size // config.num_attention_heads, backend))


class _OPTLayer:
    """One OPTDecoderLayer's parameters (references to the model's tensors, not copies)."""

    def __init__(self, layer):
        attn = layer.self_attn
        self.q, self.k, self.v, self.o = linear_params(attn.q_proj, attn.k_proj, attn.v_proj, attn.out_proj)
        self.ln_attn = layer_norm_params(layer.self_attn_layer_norm)
        self.ln_ffn = layer_norm_params(layer.final_layer_norm)
        self.fc1, self.fc2 = linear_params(layer.fc1, layer.fc2)
        self.act = layer.activation_fn
        self.pre_norm = bool(layer.do_layer_norm_before)


class PagedOPTRunner(PagedRunnerBase):
    """Runner (see runners/base.py) for an OPTForCausalLM instance (weights shared); the
    arguments are PagedRunnerBase's (rows must fit max_position_embeddings)."""

    unsupported_reason = staticmethod(opt_unsupported_reason)

    def _bind(self, model) -> None:
        config, decoder = model.config, model.model.decoder
        self.embed, self.positions = decoder.embed_tokens.weight, decoder.embed_positions.weight
        self.max_positions = int(self.positions.shape[0]) - POSITION_OFFSET
        # OPT-350m's projections between its 512-wide embedding and its 1024-wide decoder; None elsewhere
        self.project_in, self.project_out = (None if m is None else linear_params(m)[0]
                                             for m in (decoder.project_in, decoder.project_out))
        self.layers = [_OPTLayer(layer) for layer in decoder.layers]
        final = decoder.final_layer_norm
        self.final_norm = None if final is None else layer_norm_params(final)
        self.lm_head = model.get_output_embeddings().weight
        self.hidden = config.hidden_size
        self.num_heads = self.num_kv_heads = config.num_attention_heads
        self.head_dim = config.hidden_size // config.num_attention_heads
        self.scale = self.head_dim**-0.5  # applied to the query, before the product (OPTAttention)

    def _decode(self, flat, positions, cu, attn_lens, n) -> torch.Tensor:
        """Packed tokens [T] at positions [T] -> the hidden states the lm_head reads [T, H']."""
        total, heads, dim, width = flat.shape[0], self.num_heads, self.head_dim, (self.hidden,)
        x = F.embedding(flat.clamp(min=0), self.embed)
        if self.project_in is not None:
            x = linear(x, *self.project_in)
        # rows the engine has finished may run on past the table (their tokens are discarded): clamped
        where = positions.clamp(max=self.max_positions - 1) + POSITION_OFFSET
        x = x + F.embedding(where, self.positions)
        self._keep(0, x)
        for i, layer in enumerate(self.layers):
            h = F.layer_norm(x, width, *layer.ln_attn) if layer.pre_norm else x
            q = (linear(h, *layer.q) * self.scale).view(total, heads, dim)
            k, v = linear(h, *layer.k).view(total, heads, dim), linear(h, *layer.v).view(total, heads, dim)
            x = x + linear(self._attend(i, q, k, v, attn_lens, cu, n, 1.0).reshape(total, heads * dim), *layer.o)
            if not layer.pre_norm:
                x = F.layer_norm(x, width, *layer.ln_attn)
            h = F.layer_norm(x, width, *layer.ln_ffn) if layer.pre_norm else x
            x = x + linear(layer.act(linear(h, *layer.fc1)), *layer.fc2)
            if not layer.pre_norm:
                x = F.layer_norm(x, width, *layer.ln_ffn)
            if i + 1 < len(self.layers):
                self._keep(i + 1, x)
        if self.final_norm is not None:
            x = F.layer_norm(x, width, *self.final_norm)
        if self.project_out is not None:
            x = linear(x, *self.project_out)
        self._keep(len(self.layers), x)
        return x

    def capture_hidden_states(self, indices) -> None:
        """As PagedRunnerBase's; refused where project_in / project_out change the width between
        the layers and the lm_head (OPT-350M: a drafter's buffers would have two widths)."""
        if indices is not None and self.project_out is not None:
            raise ValueError("hidden-state capture needs one width: this OPT projects its layers' "
                             f"{self.hidden} to the lm_head's {int(self.lm_head.shape[1])} (project_out)")
        super().capture_hidden_states(indices)
