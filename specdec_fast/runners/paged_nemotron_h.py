"""PagedNemotronHRunner: NVIDIA's Nemotron-H hybrids (model_type nemotron_h: Nemotron-H 8B / 47B / 56B,
Nemotron Nano 9B / 12B v2, Nemotron 3 Nano 30B-A3B) -- Mamba2 layers with a few attention layers between
them -- on the paged KV cache,
with speculative decoding's rollback of the Mamba2 states (runners/paged_recurrent.py).

The math is transformers 5.24's NemotronHBlock (modeling_nemotron_h.py), eval mode: each layer is one mixer
after its own norm, added to the residual stream,
    x = x + mixer(norm(x))        norm: NemotronHRMSNorm (float32 statistics, the weight multiplied in float32)
with the mixer one of config.layers_block_type's:
    "linear_attention"   a Mamba2 mixer (runners/mamba2.py)
    "full_attention"     attention without positions (no RoPE: the Mamba2 layers carry the order), q/k/v/o
                         without biases, head_dim^-0.5, on the paged cache
    "mlp"                down(relu(up(x))^2) (mlp_hidden_act, relu2 in the checkpoints)
    "moe"                Nemotron 3 Nano's: GLM-4.5's sigmoid routing with a correction bias, ungated relu^2
                         experts (in a latent width where moe_latent_size is set) and an ungated shared MLP
                         (runners/_moe.py's "ungated" layout: torch products, the MoE kernels fuse gated experts)
and norm_f before the LM head. Token trees: each node from its parent's states (runners/paged_recurrent.py). Left padding: transformers
zeroes a padded position's input to a Mamba2 layer (its state stays zero until the row's first token); here
padded positions do not touch the states at all, the same thing for a state that starts at zero.
Tensor parallelism: runners/paged_nemotron_h_tp.py (the Mamba2 layers by heads). Not timed on a GPU.
"""
import torch

from ._layer_math import linear_params
from ._linear import linear
from ._moe import MoE, moe_reason
from .mamba2 import Mamba2, mamba2_forward
from .paged_base import decoder_reason, head_dim_reason
from .paged_recurrent import PagedRecurrentRunner, layer_kinds_reason

NEMOTRON_H_TYPES = ("nemotron_h",)
BLOCK_KINDS = ("linear_attention", "full_attention", "mlp", "moe")


def _projections(layer) -> tuple:
    """A Nemotron-H block's projection modules (for plain_projections_reason)."""
    mixer = layer.mixer
    if layer.block_type == "linear_attention":
        return mixer.in_proj, mixer.out_proj
    if layer.block_type == "full_attention":
        return mixer.q_proj, mixer.k_proj, mixer.v_proj, mixer.o_proj
    if layer.block_type == "mlp":
        return mixer.up_proj, mixer.down_proj
    shared = mixer.shared_experts  # a MoE block: its shared MLP and latent projections (the experts are 3-D tensors)
    latent = tuple(m for m in (mixer.fc1_latent_proj, mixer.fc2_latent_proj) if isinstance(m, torch.nn.Linear))
    return (shared.up_proj, shared.down_proj) + latent


def nemotron_h_unsupported_reason(model, max_tokens_per_row: int | None = None, backend=None) -> str | None:
    """Why PagedNemotronHRunner cannot run ``model``, or None when it can."""
    config = getattr(model, "config", None)
    kinds = set(getattr(config, "layers_block_type", None) or ())
    reason = layer_kinds_reason(config, BLOCK_KINDS, "layers_block_type") or decoder_reason(
        model, NEMOTRON_H_TYPES, "model.layers", "a NemotronHForCausalLM", _projections)
    if reason is not None:
        return reason
    for i, layer in enumerate(model.model.layers):
        reason = moe_reason(layer.mixer, config) if layer.block_type == "moe" else None
        if reason is not None:
            return f"layer {i}: {reason}"
    if getattr(config, "mamba_hidden_act", "silu") != "silu":
        return f"a Mamba2 convolution with activation {config.mamba_hidden_act!r}"
    if getattr(config, "sliding_window", None):
        return f"sliding_window {config.sliding_window}: Nemotron-H's attention layers here are full"
    if "full_attention" in kinds:
        return head_dim_reason(config.head_dim, backend)
    return None


class _Block:
    """One Nemotron-H block: its kind, norm (weight, eps), and its mixer's tensors."""

    def __init__(self, layer, config, kernels: str):
        self.kind = layer.block_type
        self.norm = (layer.norm.weight, layer.norm.variance_epsilon)
        mixer = layer.mixer
        if self.kind == "linear_attention":
            self.mixer = Mamba2(mixer)
        elif self.kind == "full_attention":
            self.q, self.k, self.v, self.o = linear_params(mixer.q_proj, mixer.k_proj, mixer.v_proj, mixer.o_proj)
        elif self.kind == "moe":
            self.moe = MoE(mixer, config, kernels)
        else:
            (self.up, self.down), self.act = linear_params(mixer.up_proj, mixer.down_proj), mixer.act_fn


def nemotron_norm(x: torch.Tensor, norm) -> torch.Tensor:
    """NemotronHRMSNorm: float32 statistics, the weight multiplied in float32, then x's dtype."""
    weight, eps = norm
    x32 = x.float()
    return (weight.float() * (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps))).to(x.dtype)


class PagedNemotronHRunner(PagedRecurrentRunner):
    """Runner (see runners/base.py) for a NemotronHForCausalLM instance (weights shared); the arguments are
    PagedRunnerBase's. Token trees: each node from its parent's states."""

    unsupported_reason = staticmethod(nemotron_h_unsupported_reason)

    def _bind(self, model) -> None:
        inner, config = model.model, model.config
        self.embed = inner.embeddings.weight
        self.layers = [_Block(layer, config, self.kernels) for layer in inner.layers]
        self.final_norm = (inner.norm_f.weight, inner.norm_f.variance_epsilon)
        self.lm_head = model.get_output_embeddings().weight
        self._index_layers()
        self.num_heads, self.num_kv_heads, self.head_dim = (config.num_attention_heads, config.num_key_value_heads,
                                                            config.head_dim)
        self.scale = self.head_dim ** -0.5

    def _decode(self, flat, positions, cu, attn_lens, n) -> torch.Tensor:
        """Packed tokens [T] at positions [T] -> final-norm hidden states [T, H]."""
        total, heads, kv_heads, dim = flat.shape[0], self.num_heads, self.num_kv_heads, self.head_dim
        rows = self._row_layout(cu, total, n)
        x = self._embed(flat)
        self._keep(0, x)
        sum_ = self._sum_partials  # a tensor-parallel rank's branch partials summed (identity on one process)
        for i, block in enumerate(self.layers):
            h = nemotron_norm(x, block.norm)
            if block.kind == "linear_attention":
                out = mamba2_forward(block.mixer, self.states[self._recurrent_index[i]], h, rows, self._prefilling)
            elif block.kind == "full_attention":
                q = linear(h, *block.q).view(total, heads, dim)
                k, v = (linear(h, *p).view(total, kv_heads, dim) for p in (block.k, block.v))
                o = self._attend(self._attention_index[i], q, k, v, attn_lens, cu, n, self.scale)
                out = linear(o.reshape(total, -1), *block.o)
            elif block.kind == "moe":
                out = block.moe(h, self._prefilling)
            else:
                out = linear(block.act(linear(h, *block.up)), *block.down)
            x = x + sum_(out)
            if i + 1 < len(self.layers):
                self._keep(i + 1, x)
        out = nemotron_norm(x, self.final_norm)
        self._keep(len(self.layers), out)
        return out
