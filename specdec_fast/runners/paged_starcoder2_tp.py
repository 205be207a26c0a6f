"""TPPagedStarcoder2Runner: a StarCoder2 model (sharded_model.TP_STARCODER2_TYPES: StarCoder2 3B / 7B / 15B) sharded
over the ranks of a process group (docs/architecture.md §10).

The layout is the Llama families' (runners/sharding.py): q / k / v (+ biases) by this rank's heads, o_proj by
their columns, the MLP's c_fc rows (+ bias) and c_proj columns by the width, the embedding and the LM head by
vocabulary rows, the LayerNorms whole; o_proj's and c_proj's biases are added once, by rank 0's partial.
Each branch's partials are summed by one all-reduce before the residual add. The math is
PagedStarcoder2Runner's over this rank's shards; the agreement, the vocabulary-parallel lookup and the
gathered logits are TensorParallelRunner's.
"""
from .paged_llama_tp import TensorParallelRunner, sharded_reason
from .paged_starcoder2 import PagedStarcoder2Runner
from .sharded_model import TP_STARCODER2_TYPES


def tp_starcoder2_unsupported_reason(model, max_tokens_per_row: int | None = None, backend=None) -> str | None:
    """Why TPPagedStarcoder2Runner cannot run ``model`` (a ShardedCausalLM), or None when it can."""
    return sharded_reason(model, TP_STARCODER2_TYPES, max_tokens_per_row, backend)


class _TPStarcoder2Layer:
    """One layer's shards (the attribute names of paged_starcoder2._Starcoder2Layer); o_proj's and c_proj's
    biases on rank 0 only."""

    gate = q_norm = k_norm = None  # StarCoder2's MLP is ungated, its heads unnormed (Nemotron / StableLM: no TP yet)

    def __init__(self, shards: dict, prefix: str, config, first_rank: bool):
        from transformers.activations import ACT2FN

        def get(name):
            return shards.get(prefix + name)

        def linear(name, row_parallel=False):
            bias = get(f"{name}.bias")
            return get(f"{name}.weight"), None if row_parallel and not first_rank else bias

        eps = config.norm_epsilon
        self.q, self.k, self.v = (linear(f"self_attn.{p}_proj") for p in "qkv")
        self.o = linear("self_attn.o_proj", row_parallel=True)
        self.ln_in = (get("input_layernorm.weight"), get("input_layernorm.bias"), eps)
        self.ln_post = (get("post_attention_layernorm.weight"), get("post_attention_layernorm.bias"), eps)
        self.fc, self.proj = linear("mlp.c_fc"), linear("mlp.c_proj", row_parallel=True)
        self.act = ACT2FN[config.hidden_act]


class TPPagedStarcoder2Runner(TensorParallelRunner, PagedStarcoder2Runner):
    """Runner (runners/base.py) for one rank's ShardedCausalLM of StarCoder2: PagedStarcoder2Runner's interface and
    sizes; logits over the whole vocabulary, equal on every rank."""

    unsupported_reason = staticmethod(tp_starcoder2_unsupported_reason)

    def _bind(self, model) -> None:
        config, shards = model.config, model.shards
        self._bind_shard(model)
        self.layers = [_TPStarcoder2Layer(shards, f"model.layers.{i}.", config, self.first_rank)
                       for i in range(config.num_hidden_layers)]
        self.final_norm = (shards["model.norm.weight"], shards["model.norm.bias"], config.norm_epsilon)
        self.lm_head = shards["lm_head.weight"]
        self.hidden = config.hidden_size
        self.inv_freq = model.inv_freq.to(device=self.device)
        self.rope_scaling = model.rope_scaling
