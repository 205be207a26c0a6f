"""TPPagedNemotronHRunner: Nemotron-H (sharded_model.TP_NEMOTRON_H_TYPES: Nemotron-H 8B / 47B / 56B, Nemotron Nano 9B /
12B v2 -- the dense ones) sharded over the ranks of a process group (docs/architecture.md §10).

The layout (runners/sharding.py): a Mamba2 layer by heads -- this rank's heads' rows of in_proj's z, x and dt, the
B and C rows of its groups (G / N groups of its own, or, with fewer groups than ranks, the one group its heads belong
to, read by the N / G ranks that share it), the convolution's [x | B | C] rows likewise, dt_bias / A_log / D and the
gated norm's weights by heads, out_proj's columns -- so each rank scans its own heads and keeps their states and
windows. The gated norm normalises each group's channels: a group of this rank's alone is normed here; a shared one
takes its sum of squares from every rank (one all-reduce of [T, G] a layer). Attention (no positions) as the Llama
layout's, the relu² MLPs' up rows and down columns, the embedding and the LM head by vocabulary rows. Each block's
partials are summed by one all-reduce. The math is PagedNemotronHRunner's over this rank's shards. Nemotron 3's MoE
blocks are refused (their ungated experts have no tensor-parallel layout yet).
"""
from types import SimpleNamespace

import torch

from .mamba2 import Mamba2
from .paged_llama_tp import TensorParallelRunner, unbiased_shard_reason
from .paged_nemotron_h import BLOCK_KINDS, PagedNemotronHRunner
from .paged_recurrent import layer_kinds_reason
from .sharded_model import TP_NEMOTRON_H_TYPES


def tp_nemotron_h_unsupported_reason(model, max_tokens_per_row: int | None = None, backend=None) -> str | None:
    """Why TPPagedNemotronHRunner cannot run ``model`` (a ShardedCausalLM), or None when it can."""
    config = getattr(model, "config", None)
    reason = layer_kinds_reason(config, BLOCK_KINDS, "layers_block_type") or unbiased_shard_reason(
        model, TP_NEMOTRON_H_TYPES, "Nemotron-H", backend)
    if reason is not None:
        return reason
    if "moe" in config.layers_block_type:
        return "Nemotron-H's MoE blocks (Nemotron 3) have no tensor-parallel layout here (their ungated experts)"
    if getattr(config, "mamba_hidden_act", "silu") != "silu":
        return f"a Mamba2 convolution with activation {config.mamba_hidden_act!r}"
    if getattr(config, "sliding_window", None):
        return f"sliding_window {config.sliding_window}: Nemotron-H's attention layers here are full"
    return None


def _group_sum(tp, plan):
    """The gated norm's sums of squares over a group whose channels several ranks hold (fewer groups than ranks), or
    None where each group is one rank's: this rank's sums [T, 1, 1] placed in its group's column of a [T, G, 1]
    tensor, summed over every rank by one all-reduce, its column read back."""
    groups = plan.mamba2[2]
    if groups % plan.world == 0:
        return None
    first = plan.mamba2_groups[0]

    def summed(partial: torch.Tensor) -> torch.Tensor:
        full = partial.new_zeros(*partial.shape[:-2], groups, 1)
        full[..., first:first + 1, :] = partial
        return tp.all_reduce_(full)[..., first:first + 1, :]

    return summed


def _mixer(get, config, tp, plan) -> Mamba2:
    """A Mamba2 mixer of this rank's heads from its shards (the module attributes Mamba2 reads)."""
    heads, head_dim, groups, state = plan.mamba2
    local_groups = plan.mamba2_groups[1] - plan.mamba2_groups[0]
    mixer = Mamba2(SimpleNamespace(
        in_proj=SimpleNamespace(weight=get("mamba.in_proj.weight"), bias=None),
        out_proj=SimpleNamespace(weight=get("mamba.out_proj.weight"), bias=None),
        conv1d=SimpleNamespace(weight=get("mamba.conv1d.weight"), bias=get("mamba.conv1d.bias")),
        dt_bias=get("mamba.dt_bias"), A_log=get("mamba.A_log"), D=get("mamba.D"),
        norm=SimpleNamespace(weight=get("mamba.norm.weight"), variance_epsilon=config.layer_norm_epsilon),
        num_heads=heads // plan.world, head_dim=head_dim, n_groups=local_groups, ssm_state_size=state,
        time_step_limit=config.time_step_limit))
    mixer.group_sum, mixer.group_width = _group_sum(tp, plan), heads * head_dim // groups
    return mixer


class _TPBlock:
    """One block's shards (the attribute names of paged_nemotron_h._Block's)."""

    def __init__(self, shards: dict, index: int, config, tp, plan):
        from transformers.activations import ACT2FN

        prefix = f"model.layers.{index}."

        def get(name):
            return shards.get(prefix + name)

        self.kind = config.layers_block_type[index]
        self.norm = (get("input_layernorm.weight"), config.layer_norm_epsilon)
        if self.kind == "linear_attention":
            self.mixer = _mixer(get, config, tp, plan)
        elif self.kind == "full_attention":
            self.q, self.k, self.v, self.o = ((get(f"self_attn.{p}_proj.weight"), None) for p in "qkvo")
        else:
            self.up, self.down = (get("mlp.up_proj.weight"), None), (get("mlp.down_proj.weight"), None)
            self.act = ACT2FN[config.mlp_hidden_act]


class TPPagedNemotronHRunner(TensorParallelRunner, PagedNemotronHRunner):
    """Runner (runners/base.py) for one rank's ShardedCausalLM of Nemotron-H: PagedNemotronHRunner's interface and
    sizes; logits over the whole vocabulary, equal on every rank."""

    unsupported_reason = staticmethod(tp_nemotron_h_unsupported_reason)

    def _bind(self, model) -> None:
        config, shards, plan = model.config, model.shards, model.plan
        self._bind_shard(model)
        self.layers = [_TPBlock(shards, i, config, self.tp, plan) for i in range(config.num_hidden_layers)]
        self._index_layers()
        self.final_norm = (shards["model.norm.weight"], config.layer_norm_epsilon)
        self.lm_head = shards["lm_head.weight"]
