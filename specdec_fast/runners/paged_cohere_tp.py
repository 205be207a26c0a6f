"""TPPagedCohereRunner: a Cohere or Cohere 2 model (Command R / R+, Aya; Command R7B, Command A)
sharded over the ranks of a process group, on the paged KV cache (docs/architecture.md §10).

The layout is the Llama families' (runners/sharding.py): q / k / v and gate / up by this rank's
heads and columns, o and down row-parallel, the embedding and the tied LM head by vocabulary
rows, the norms whole, Command R+'s per-head q / k norms by heads. The math is PagedCohereRunner's
(runners/paged_cohere.py) over this rank's shards; the shared machinery (the agreement at
construction, the vocabulary-parallel embedding, the gathered logits) is TensorParallelRunner's.
A Cohere layer's attention and MLP both read one norm of x, so its two row-parallel partials
are summed in ONE all-reduce a layer (rank 0's carrying the residual): L + 1 all-reduces of
T x H values and one all-gather of the logits per forward, against the Llama runner's 2L + 1. Cohere 2 MoE's
experts are each split by their width, the router whole on every rank (runners/sharding_moe.py), its dense prefix
layers' MLP by their own width (sharding.layer_dims_of).
"""
from .paged_cohere import PagedCohereRunner, cohere_rms, cohere_rotates
from .paged_llama_tp import TensorParallelRunner, sharded_reason
from .sharded_model import TP_COHERE_TYPES
from .sharding_moe import layer_mlp


def tp_cohere_unsupported_reason(model, max_tokens_per_row: int | None = None, backend=None) -> str | None:
    """Why TPPagedCohereRunner cannot run ``model`` (a ShardedCausalLM), or None when it can."""
    return sharded_reason(model, TP_COHERE_TYPES, max_tokens_per_row, backend)


class _TPCohereLayer:
    """One layer's shards (the attribute names of paged_cohere._CohereLayer); o and down carry
    their bias on rank 0 only (added once to the sum)."""

    def __init__(self, shards: dict, prefix: str, config, first_rank: bool, rope: bool, kernels: str):
        def get(name):
            return shards.get(prefix + name)

        eps = config.rms_norm_eps if cohere_rms(config) else config.layer_norm_eps
        self.rope = rope
        self.norm = (get("input_layernorm.weight"), eps)
        self.q, self.k, self.v = ((get(f"self_attn.{p}_proj.weight"), get(f"self_attn.{p}_proj.bias")) for p in "qkv")
        self.o = (get("self_attn.o_proj.weight"), get("self_attn.o_proj.bias") if first_rank else None)
        q_norm, k_norm = get("self_attn.q_norm.weight"), get("self_attn.k_norm.weight")
        self.q_norm = None if q_norm is None else (q_norm, eps)  # this rank's heads' rows [Hq/N, D]
        self.k_norm = None if k_norm is None else (k_norm, eps)
        # Cohere 2 MoE's experts (each split by its width, the router whole), or the dense MLP's columns / rows (down's
        # bias on rank 0 only)
        self.moe, mlp, self.act = layer_mlp(shards, prefix, first_rank, config, kernels)
        self.gate, self.up, self.down = mlp or (None, None, None)


class TPPagedCohereRunner(TensorParallelRunner, PagedCohereRunner):
    """Runner (runners/base.py) for one rank's ShardedCausalLM of a Cohere family: PagedCohereRunner's
    interface and sizes; logits over the whole vocabulary, equal on every rank."""

    unsupported_reason = staticmethod(tp_cohere_unsupported_reason)

    def _bind(self, model) -> None:
        config, shards = model.config, model.shards
        self._bind_shard(model)
        self.rms = cohere_rms(config)
        self.layers = [_TPCohereLayer(shards, f"model.layers.{i}.", config, self.first_rank, rope, self.kernels)
                       for i, rope in enumerate(cohere_rotates(config))]
        self.final_norm = (shards["model.norm.weight"], config.rms_norm_eps if self.rms else config.layer_norm_eps)
        self.lm_head = shards["lm_head.weight"]
        self.logit_scale = config.logit_scale
        self.inv_freq = model.inv_freq.to(device=self.device)
        self.rope_scaling = model.rope_scaling

    def _parallel_add(self, x, attn, mlp):
        """x + attn + mlp, the two partials (and rank 0's residual) summed in one all-reduce."""
        return self._sum_partials(attn + mlp + x if self.first_rank else attn + mlp)
