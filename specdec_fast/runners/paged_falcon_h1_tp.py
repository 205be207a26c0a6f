"""TPPagedFalconH1Runner: Falcon-H1 (sharded_model.TP_FALCON_H1_TYPES: 0.5B-34B, Falcon-H1R) sharded over the ranks of a
process group (docs/architecture.md §10).

The layout (runners/sharding.py): each layer's Mamba2 mixer by heads (runners/mamba2_tp.py: this rank's heads' states
and windows, B / C of its groups or of the one group it shares, whose gated norm sums over those ranks) and its
attention by heads as the Llama layout's, side by side: their partials summed by one all-reduce; the MLP by its width;
the embedding and the LM head by vocabulary rows. The μP vector of the mixer's projection (transformers' buffer,
computed from the config, in no checkpoint) is built here for this rank's in_proj rows: each of [z | x | B | C | dt]
times its ssm_multipliers entry. The math is PagedFalconH1Runner's over this rank's shards.
"""
import torch

from .mamba2_tp import tp_mamba2
from .paged_falcon_h1 import PagedFalconH1Runner
from .paged_llama_tp import TensorParallelRunner, unbiased_shard_reason
from .sharded_model import TP_FALCON_H1_TYPES


def tp_falcon_h1_unsupported_reason(model, max_tokens_per_row: int | None = None, backend=None) -> str | None:
    """Why TPPagedFalconH1Runner cannot run ``model`` (a ShardedCausalLM), or None when it can."""
    reason = unbiased_shard_reason(model, TP_FALCON_H1_TYPES, "Falcon-H1", backend)
    if reason is not None:
        return reason
    if model.config.hidden_act != "silu":
        return f"hidden_act {model.config.hidden_act!r}: the Mamba2 convolution here takes silu"
    return None


def local_mup_vector(config, plan, device) -> torch.Tensor:
    """This rank's part of transformers' compute_mup_vector: [its z rows | x rows | B rows | C rows | dt rows] of
    in_proj, each part times its ssm_multipliers entry, float32 [rows]."""
    heads, head_dim, _, state = plan.mamba2
    first, last = plan.mamba2_groups
    inner, width = heads // plan.world * head_dim, (last - first) * state
    sizes = (inner, inner, width, width, heads // plan.world)
    return torch.cat([torch.full((size,), float(m), device=device) for size, m in zip(sizes, config.ssm_multipliers)])


class _TPLayer:
    """One layer's shards (the attribute names of paged_falcon_h1._Layer's)."""

    kind = "both"

    def __init__(self, shards: dict, index: int, config, tp, plan):
        from transformers.activations import ACT2FN

        prefix = f"model.layers.{index}."

        def get(name):
            return shards.get(prefix + name)

        eps = config.rms_norm_eps
        self.ln_in, self.ln_ff = (get("input_layernorm.weight"), eps), (get("pre_ff_layernorm.weight"), eps)
        device = get("mamba.in_proj.weight").device
        self.mixer = tp_mamba2(get, config, tp, plan, eps, norm_before_gate=bool(config.mamba_norm_before_gate),
                               ssm_in_multiplier=config.ssm_in_multiplier,
                               mup_vector=local_mup_vector(config, plan, device))
        self.q, self.k, self.v, self.o = ((get(f"self_attn.{p}_proj.weight"), None) for p in "qkvo")
        self.gate, self.up, self.down = ((get(f"mlp.{p}_proj.weight"), None) for p in ("gate", "up", "down"))
        self.act = ACT2FN[config.hidden_act]


class TPPagedFalconH1Runner(TensorParallelRunner, PagedFalconH1Runner):
    """Runner (runners/base.py) for one rank's ShardedCausalLM of Falcon-H1: PagedFalconH1Runner's interface and sizes;
    logits over the whole vocabulary, equal on every rank."""

    unsupported_reason = staticmethod(tp_falcon_h1_unsupported_reason)

    def _bind(self, model) -> None:
        config, shards, plan = model.config, model.shards, model.plan
        self._bind_shard(model)
        self.layers = [_TPLayer(shards, i, config, self.tp, plan) for i in range(config.num_hidden_layers)]
        self._index_layers()
        self.final_norm = (shards["model.final_layernorm.weight"], config.rms_norm_eps)
        self.lm_head = shards["lm_head.weight"]
        self.multipliers = dict(embedding=config.embedding_multiplier, lm_head=config.lm_head_multiplier,
                                key=config.key_multiplier, attention_in=config.attention_in_multiplier,
                                attention_out=config.attention_out_multiplier, ssm_out=config.ssm_out_multiplier)
        self.gate_multiplier, self.down_multiplier = config.mlp_multipliers
        self.rope = (model.inv_freq, model.rope_scaling)
