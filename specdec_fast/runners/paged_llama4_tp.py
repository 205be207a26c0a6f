"""TPPagedLlama4Runner: Llama 4's text decoder (llama4_text) sharded over the ranks of a process group
(docs/architecture.md §10), PagedLlama4Runner's layers on the Llama tensor-parallel runner's loop.

The layout is the Llama one (runners/sharding.py; Llama 4's `feed_forward` names read as `mlp`,
sharding.layout_name): q / k / v by heads, o by their columns, a dense MLP (intermediate_size_mlp)
by its width, every expert ([E, H, 2I] gate | up columns, [E, I, H] down rows) and the shared
expert by theirs, the router replicated (top-1 sigmoid, the same choice on every rank: each rank's
slice of the chosen expert reads the token scaled alike, so the partials sum to the expert's output).
Per layer, as runners/paged_llama4.py: the chunked RoPE layers' chunks (the kernels'), each rank's
heads' q / k columns reordered for the interleaved pairs, the weightless q/k norm per head (a head
lies wholly on one rank), the NoPE layers' query temperature (a function of the position only).
"""
from .paged_llama4 import LLAMA4_MODEL_TYPES, PagedLlama4Runner, as_llama4_layer, llama4_config_reason, llama4_layer_chunks
from .paged_llama_tp import TensorParallelRunner, TPPagedLlamaRunner, shard_reason


def tp_llama4_unsupported_reason(model, max_tokens_per_row: int | None = None, backend=None) -> str | None:
    """Why TPPagedLlama4Runner cannot run ``model`` (a ShardedCausalLM of llama4_text), or None."""
    reason = shard_reason(model, LLAMA4_MODEL_TYPES)
    if reason is not None:
        return reason
    return llama4_config_reason(model.config, model.rope_type, max_tokens_per_row, backend,
                                rotary_dims=2 * model.inv_freq.numel())


class TPPagedLlama4Runner(TensorParallelRunner, PagedLlama4Runner):
    """Runner (runners/base.py) for one rank's ShardedCausalLM of Llama 4: PagedLlama4Runner's interface
    and layers over this rank's shards (TensorParallelRunner: the embedding, the row-parallel sums and the
    gathered logits)."""

    unsupported_reason = staticmethod(tp_llama4_unsupported_reason)

    def _bind(self, model) -> None:
        TPPagedLlamaRunner._bind(self, model)  # the Llama layers of this rank's shards (rope by no_rope_layers)
        for layer in self.layers:
            as_llama4_layer(layer, model.config)
        self.layer_chunks = llama4_layer_chunks(model.config)
