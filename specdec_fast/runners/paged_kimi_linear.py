"""PagedKimiLinearRunner: Moonshot's Kimi Linear (model_type kimi_linear: Kimi-Linear-48B-A3B) -- Kimi Delta Attention
layers (runners/kda.py) with a latent attention layer every few -- on the paged KV cache, with speculative decoding's
rollback of the KDA layers' states (runners/paged_recurrent.py).

The math is transformers 5.24's KimiLinearDecoderLayer (modeling_kimi_linear.py), eval mode; every RMSNorm Llama's:
    x = x + mixer(input_layernorm x);  x = x + mlp(post_attention_layernorm x)
    "linear_attention"  KDA (runners/kda.py)
    "full_attention"    DeepSeek-V2's multi-head latent attention WITHOUT positions (the rotary part of the key is
                        still shared by the heads, and nothing is rotated): q = q_proj x (or q_b(q_a_norm(q_a x))),
                        [c | k_r] = kv_a_proj_with_mqa x, c normed; per head [k_nope | v] = kv_b_proj c, the key
                        [k_nope | k_r], scale (nope + rope)^-0.5. Here it runs ABSORBED, as runners/paged_mla.py's:
                        the cache holds each token's latent [c | k_r] (one 576-wide head on K and V alike), each
                        head's query [W_UK^T q_nope | q_rope] scores it, W_UV maps the averaged latents back
                        (the MLA Triton kernel on the Triton path; the paged attention with the latent as K and V
                        elsewhere). The same logits but for rounding (the products reordered).
    mlp                 dense (mlp_layer_types "dense"), or experts: DeepSeek-V3's routing (sigmoid scores, the
                        correction bias and groups in the choice, renormalised, scaled) with shared experts
                        (runners/_moe.py)
    logits = lm_head(norm x)
The cache holds 2 (R + DR) values a token and attention layer (K and V planes alike: PagedMlaRunner's pairing of two
layers on one entry is not done here): 2304 bytes at Kimi-Linear-48B's 512 + 64 in bf16, where each head's key and
value would take 24576. Token trees: each node from its parent's states (runners/paged_recurrent.py). Tensor parallelism:
runners/paged_kimi_linear_tp.py. Not timed on a GPU.
"""
import torch

from ..kernels._backend import resolve_backend
from ._layer_math import linear_params, norm_params
from ._linear import linear
from ._moe import is_moe, moe_or_gated_mlp, layers_moe_reason, moe_or_mlp
from .kda import Kda, kda_forward
from .paged_base import decoder_reason
from .paged_mla import latent_reason, latent_triton_attention
from .paged_olmo2 import llama_rms_norm
from .paged_recurrent import PagedRecurrentRunner, layer_kinds_reason

KIMI_LINEAR_TYPES = ("kimi_linear",)
LAYER_KINDS = ("full_attention", "linear_attention")


def _projections(layer) -> tuple:
    """A layer's projection modules (for plain_projections_reason; the experts are 3-D tensors)."""
    attn, mlp = layer.self_attn, layer.mlp
    dense = () if is_moe(mlp) else (mlp.gate_proj, mlp.up_proj, mlp.down_proj)
    if hasattr(attn, "forget_gate"):
        return (attn.q_proj, attn.k_proj, attn.v_proj, attn.b_proj, attn.g_a_proj, attn.g_b_proj, attn.o_proj,
                attn.forget_gate.f_a_proj, attn.forget_gate.f_b_proj) + dense
    queries = (attn.q_proj,) if attn.q_proj is not None else (attn.q_a_proj, attn.q_b_proj)
    return queries + (attn.kv_a_proj_with_mqa, attn.kv_b_proj, attn.o_proj) + dense


def kimi_linear_unsupported_reason(model, max_tokens_per_row: int | None = None, backend=None) -> str | None:
    """Why PagedKimiLinearRunner cannot run ``model`` (a KimiLinearForCausalLM), or None when it can."""
    config = getattr(model, "config", None)
    reason = layer_kinds_reason(config, LAYER_KINDS) or decoder_reason(
        model, KIMI_LINEAR_TYPES, "model.layers", "a KimiLinearForCausalLM", _projections)
    if reason is not None:
        return reason
    if getattr(config, "attention_bias", False):
        return "attention_bias: the latent attention's projection biases are not read by this runner"
    if any(layer.self_attn.conv1d.bias is not None for layer in model.model.layers if hasattr(layer.self_attn, "conv1d")):
        return "a KDA convolution bias (a padded position's would reach the convolution)"
    reason = layers_moe_reason([layer.mlp for layer in model.model.layers], config)
    return reason or latent_reason(config, resolve_backend(backend, model.get_input_embeddings().weight.device,
                                                           "paged_attention"))


class _Layer:
    """One layer's kind, its mixer's tensors (references), norms and MLP."""

    def __init__(self, layer, config, kernels: str):
        attn = layer.self_attn
        self.kind = "linear_attention" if hasattr(attn, "forget_gate") else "full_attention"
        if self.kind == "linear_attention":
            self.mixer = Kda.of(attn)
        else:
            self.q = linear_params(attn.q_proj)[0] if attn.q_proj is not None else None
            if self.q is None:
                self.q_a, self.q_b = linear_params(attn.q_a_proj, attn.q_b_proj)
                self.q_a_norm = norm_params(attn.q_a_layernorm)
            self.kv_a, self.o = linear_params(attn.kv_a_proj_with_mqa, attn.o_proj)
            self.kv_a_norm = norm_params(attn.kv_a_layernorm)
            # kv_b_proj's rows per head [k_nope | v] over the latent: W_UK [H, dn, R] and W_UV [H, dv, R] (views)
            kv_b = attn.kv_b_proj.weight.view(config.num_attention_heads, -1, config.kv_lora_rank)
            self.w_uk, self.w_uv = kv_b[:, :config.qk_nope_head_dim], kv_b[:, config.qk_nope_head_dim:]
        self.input, self.post = norm_params(layer.input_layernorm), norm_params(layer.post_attention_layernorm)
        mlp = layer.mlp
        self.moe, dense, self.act = moe_or_gated_mlp(mlp, config, kernels)
        self.gate, self.up, self.down = dense or (None, None, None)


class PagedKimiLinearRunner(PagedRecurrentRunner):
    """Runner (see runners/base.py) for a KimiLinearForCausalLM instance (weights shared); the arguments are
    PagedRunnerBase's. Token trees: each node from its parent's states."""

    unsupported_reason = staticmethod(kimi_linear_unsupported_reason)

    def _bind(self, model) -> None:
        config, inner = model.config, model.model
        self.embed = inner.embed_tokens.weight
        self.layers = [_Layer(layer, config, self.kernels) for layer in inner.layers]
        self._index_layers()
        self.final_norm = norm_params(inner.norm)
        self.lm_head = model.get_output_embeddings().weight
        # the absorbed latent attention: the cache holds one head of the latent's width (R + DR) a token, every query
        # head of that width too; the softmax scale is the expanded head's (config.head_dim is the rope part's)
        self.nope, self.rope, self.rank = config.qk_nope_head_dim, config.qk_rope_head_dim, config.kv_lora_rank
        self.num_heads, self.num_kv_heads = config.num_attention_heads, 1
        self.head_dim = self.rank + self.rope
        self.scale = (self.nope + self.rope) ** -0.5

    def _attention(self, i: int, q, attn_lens, cu, max_query_len: int, scale: float, causal: bool = True,
                   pdl: bool = False) -> torch.Tensor:
        """The absorbed queries q [T, Hq, R + DR] over KV layer i's latents -> [T, Hq, R] (the value is the latent's
        first R dims): the MLA Triton kernel on the Triton path, else paged_base's with the latent as K and V."""
        if self.kernels == "triton":
            return latent_triton_attention(self, i, q, attn_lens, cu, max_query_len, scale)
        return super()._attention(i, q, attn_lens, cu, max_query_len, scale, causal, pdl)[..., :self.rank]

    def _latent_attention(self, i: int, layer: _Layer, h, attn_lens, cu, n) -> torch.Tensor:
        """A latent attention layer over h [T, hidden] -> its o_proj output [T, hidden], absorbed (module doc)."""
        total, heads = h.shape[0], self.num_heads
        if layer.q is not None:
            q = linear(h, *layer.q)
        else:
            q = linear(llama_rms_norm(linear(h, *layer.q_a), layer.q_a_norm), *layer.q_b)
        q = q.view(total, heads, self.nope + self.rope)
        c, k_rot = linear(h, *layer.kv_a).split([self.rank, self.rope], dim=-1)
        entry = torch.cat((llama_rms_norm(c, layer.kv_a_norm), k_rot), dim=-1)[:, None]  # [T, 1, R + DR]
        q_lat = torch.bmm(q[..., :self.nope].transpose(0, 1), layer.w_uk).transpose(0, 1)  # [T, Hq, R]
        o = self._attend(self._attention_index[i], torch.cat((q_lat, q[..., self.nope:]), dim=-1), entry, entry,
                         attn_lens, cu, n, self.scale)
        o = torch.bmm(o.transpose(0, 1), layer.w_uv.transpose(1, 2)).transpose(0, 1)  # [T, Hq, dv] = W_UV (p c)
        return linear(o.reshape(total, -1), *layer.o)

    def _decode(self, flat, positions, cu, attn_lens, n) -> torch.Tensor:
        """Packed tokens [T] at positions [T] (unread: no layer has positions) -> final-norm hidden states [T, H]."""
        rows = self._row_layout(cu, flat.shape[0], n)
        x = self._embed(flat)
        sum_ = self._sum_partials  # a tensor-parallel rank's branch partials summed (identity on one process)
        self._keep(0, x)
        for i, layer in enumerate(self.layers):
            h = llama_rms_norm(x, layer.input)
            if layer.kind == "linear_attention":
                x = x + sum_(kda_forward(layer.mixer, self.states[self._recurrent_index[i]], h, rows, self._prefilling))
            else:
                x = x + sum_(self._latent_attention(i, layer, h, attn_lens, cu, n))
            h = llama_rms_norm(x, layer.post)
            x = x + sum_(moe_or_mlp(layer, h, self._prefilling))
            if i + 1 < len(self.layers):
                self._keep(i + 1, x)
        out = llama_rms_norm(x, self.final_norm)
        self._keep(len(self.layers), out)
        return out
