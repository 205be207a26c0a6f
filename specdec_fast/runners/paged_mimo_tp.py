"""TPPagedMimoRunner: MiMo-V2-Flash (sharded_model.TP_MIMO_TYPES) sharded over the ranks of a process group
(docs/architecture.md §10).

The layout is the Llama families' (runners/sharding.py) by each layer's own KV heads (sharding.layer_dims_of: the
sliding layers' twice the full ones'; where a layer has fewer KV heads than ranks they are replicated) and the
value heads' own width (the plan's value_dim: v_proj's rows and o_proj's columns by v_head_dim): q / k / v by this
rank's heads, o and the dense MLP's down row-parallel, the sliding layers' sinks by query heads, every expert by
its width with the float32 router and its correction bias whole (runners/sharding_moe.py), the embedding and the
LM head by vocabulary rows. The branches' partials are summed by one all-reduce each, as the Llama runner's. The
checkpoint's MTP layers are not read (sharding.NOT_READ). The math is PagedMimoRunner's over this rank's shards.
"""
from .paged_llama_tp import TensorParallelRunner, unbiased_shard_reason
from .paged_mimo import PagedMimoRunner
from .sharded_model import TP_MIMO_TYPES
from .sharding_moe import layer_mlp


def tp_mimo_unsupported_reason(model, max_tokens_per_row: int | None = None, backend=None) -> str | None:
    """Why TPPagedMimoRunner cannot run ``model`` (a ShardedCausalLM), or None when it can."""
    return unbiased_shard_reason(model, TP_MIMO_TYPES, "MiMo-V2-Flash", backend)


class _TPLayer:
    """One layer's shards (the attribute names of paged_mimo._Layer): its KV heads this rank's (from k's rows), its
    sinks this rank's query heads' (float32)."""

    def __init__(self, shards: dict, prefix: str, config, first_rank: bool, kernels: str):
        def get(name):
            return shards.get(prefix + name)

        eps = config.rms_norm_eps
        self.q, self.k, self.v, self.o = ((get(f"self_attn.{p}_proj.weight"), None) for p in "qkvo")
        self.kv_heads = self.k[0].shape[0] // config.head_dim
        sinks = get("self_attn.sinks")
        self.sinks = None if sinks is None else sinks.float().contiguous()
        self.v_scale = config.attention_value_scale if config.attention_value_scale is not None else 1.0
        self.input, self.post_attention = (get("input_layernorm.weight"), eps), (get("post_attention_layernorm.weight"), eps)
        self.moe, self.mlp, self.act = layer_mlp(shards, prefix, first_rank, config, kernels)


class TPPagedMimoRunner(TensorParallelRunner, PagedMimoRunner):
    """Runner (runners/base.py) for one rank's ShardedCausalLM of MiMo-V2-Flash: PagedMimoRunner's interface and
    sizes; logits over the whole vocabulary, equal on every rank."""

    unsupported_reason = staticmethod(tp_mimo_unsupported_reason)

    def _bind(self, model) -> None:
        config, shards = model.config, model.shards
        self._bind_shard(model)
        self.layers = [_TPLayer(shards, f"model.layers.{i}.", config, self.first_rank, self.kernels)
                       for i in range(config.num_hidden_layers)]
        self.v_head_dim = config.v_head_dim
        if any(layer.sinks is not None for layer in self.layers):
            self.attn_sinks = tuple(layer.sinks for layer in self.layers)
        self.final_norm = (shards["model.norm.weight"], config.rms_norm_eps)
        self.lm_head = shards["lm_head.weight"]
        self.rope_tables = {key: (inv_freq.to(device=self.device), scaling)
                            for key, (inv_freq, scaling, _) in model.rope_tables.items()}
        self.rope_keys = model.rope_keys
