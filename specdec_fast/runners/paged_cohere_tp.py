"""TPPagedCohereRunner: a Cohere or Cohere 2 model (Command R / R+, Aya; Command R7B, Command A)
sharded over the ranks of a process group, on the paged KV cache (docs/architecture.md §10).

The layout is the Llama families' (runners/sharding.py): q / k / v and gate / up by this rank's
heads and columns, o and down row-parallel, the embedding and the tied LM head by vocabulary
rows, the norms whole, Command R+'s per-head q / k norms by heads. The math is PagedCohereRunner's
(runners/paged_cohere.py) over this rank's shards; the shared machinery (the agreement at
construction, the vocabulary-parallel embedding, the gathered logits) is TensorParallelRunner's.
A Cohere layer's attention and MLP both read one norm of x, so its two row-parallel partials
are summed in ONE all-reduce a layer (rank 0's carrying the residual): L + 1 all-reduces of
T x H values and one all-gather of the logits per forward, against the Llama runner's 2L + 1.
"""
from .paged_cohere import PagedCohereRunner
from .paged_llama_tp import TensorParallelRunner, sharded_reason
from .sharded_model import TP_COHERE_TYPES


def tp_cohere_unsupported_reason(model, max_tokens_per_row: int | None = None, backend=None) -> str | None:
    """Why TPPagedCohereRunner cannot run ``model`` (a ShardedCausalLM), or None when it can."""
    return sharded_reason(model, TP_COHERE_TYPES, max_tokens_per_row, backend)


class _TPCohereLayer:
    """One layer's shards (the attribute names of paged_cohere._CohereLayer); o and down carry
    their bias on rank 0 only (added once to the sum)."""

    moe = None  # (Cohere 2 MoE's experts: no TP runner yet, refused by name)

    def __init__(self, shards: dict, prefix: str, config, first_rank: bool, rope: bool):
        from transformers.activations import ACT2FN

        def get(name):
            return shards.get(prefix + name)

        eps = config.layer_norm_eps
        self.rope = rope
        self.norm = (get("input_layernorm.weight"), eps)
        self.q, self.k, self.v = ((get(f"self_attn.{p}_proj.weight"), get(f"self_attn.{p}_proj.bias")) for p in "qkv")
        self.o = (get("self_attn.o_proj.weight"), get("self_attn.o_proj.bias") if first_rank else None)
        q_norm, k_norm = get("self_attn.q_norm.weight"), get("self_attn.k_norm.weight")
        self.q_norm = None if q_norm is None else (q_norm, eps)  # this rank's heads' rows [Hq/N, D]
        self.k_norm = None if k_norm is None else (k_norm, eps)
        self.gate = (get("mlp.gate_proj.weight"), get("mlp.gate_proj.bias"))
        self.up = (get("mlp.up_proj.weight"), get("mlp.up_proj.bias"))
        self.down = (get("mlp.down_proj.weight"), get("mlp.down_proj.bias") if first_rank else None)
        self.act = ACT2FN[config.hidden_act]


class TPPagedCohereRunner(TensorParallelRunner, PagedCohereRunner):
    """Runner (runners/base.py) for one rank's ShardedCausalLM of a Cohere family: PagedCohereRunner's
    interface and sizes; logits over the whole vocabulary, equal on every rank."""

    unsupported_reason = staticmethod(tp_cohere_unsupported_reason)

    def _bind(self, model) -> None:
        config, shards = model.config, model.shards
        self._bind_shard(model)
        if config.model_type == "cohere2":  # as PagedCohereRunner: only the sliding layers rotate
            rotates = [kind == "sliding_attention" for kind in config.layer_types]
        else:
            rotates = [True] * config.num_hidden_layers
        self.layers = [_TPCohereLayer(shards, f"model.layers.{i}.", config, self.first_rank, rope)
                       for i, rope in enumerate(rotates)]
        self.final_norm = (shards["model.norm.weight"], config.layer_norm_eps)
        self.lm_head = shards["lm_head.weight"]
        self.logit_scale = config.logit_scale
        self.inv_freq = model.inv_freq.to(device=self.device)
        self.rope_scaling = model.rope_scaling

    def _parallel_add(self, x, attn, mlp):
        """x + attn + mlp, the two partials (and rank 0's residual) summed in one all-reduce."""
        return self._sum_partials(attn + mlp + x if self.first_rank else attn + mlp)
