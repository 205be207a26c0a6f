"""TPPagedMlaRunner: a multi-head latent attention model (DeepSeek-V2 / V3 / R1, GLM-4.7-Flash,
DeepSeek-V3.2 and GLM-5: sharded_model.TP_MLA_TYPES) sharded over the ranks of a process group, on the paged KV cache
(docs/architecture.md §10).

The layout (runners/sharding.py): each rank holds its query heads' rows of q_proj / q_b_proj and
kv_b_proj and their columns of o_proj; the latent's projections (q_a_proj, kv_a_proj_with_mqa) and
norms whole, so every rank computes the same latent [c, k_rot] and keeps it in its own cache for
its own heads (the cache is replicated: as vLLM's MLA under tensor parallelism); the MLP's columns
(dense layers) or every expert's width (runners/sharding_moe.py, the router whole); the embedding
and the LM head by vocabulary rows. Per layer two all-reduces of T x H values: o_proj's partials
and the MLP's (the residual stream, replicated, is added after each). The math is
PagedMlaRunner's over this rank's heads; the agreement at construction, the vocabulary-parallel
embedding and the gathered logits are TensorParallelRunner's.
"""
from .paged_llama_tp import TensorParallelRunner, sharded_reason
from .paged_mla import PagedMlaRunner, attention_config, latent_reason, mla_scale, rope_form
from .sharded_model import TP_MLA_TYPES, ShardedCausalLM
from .sharding_moe import layer_mlp
from .sparse_mla import Indexer


def tp_mla_unsupported_reason(model, max_tokens_per_row: int | None = None, backend=None) -> str | None:
    """Why TPPagedMlaRunner cannot run ``model`` (a ShardedCausalLM), or None when it can."""
    reason = sharded_reason(model, TP_MLA_TYPES, max_tokens_per_row, backend, config=attention_config(model.config))
    if reason is not None or not isinstance(model, ShardedCausalLM):
        return reason
    from ..kernels._backend import resolve_backend

    return latent_reason(model.config, resolve_backend(backend, model.embed_shard.device, "paged_attention"))


class _TPMlaLayer:
    """One MLA layer's shards (the attribute names of paged_mla._MlaLayer): this rank's heads' rows of
    the query and kv_b projections and columns of o_proj (its bias on rank 0 only: added once to the
    sum), the latent's projections and norms whole; a dense MLP's columns, or every expert's."""

    def __init__(self, shards: dict, prefix: str, config, plan, first_rank: bool, kernels: str):
        def get(name):
            return shards.get(prefix + name)

        eps = config.rms_norm_eps
        self.ln_in, self.ln_post = (get("input_layernorm.weight"), eps), (get("post_attention_layernorm.weight"), eps)
        attn = "self_attn."
        if get(attn + "q_proj.weight") is not None:
            self.q, self.q_a = (get(attn + "q_proj.weight"), get(attn + "q_proj.bias")), None
        else:
            self.q_a = (get(attn + "q_a_proj.weight"), get(attn + "q_a_proj.bias"))
            self.q_a_norm = (get(attn + "q_a_layernorm.weight"), eps)
            self.q = (get(attn + "q_b_proj.weight"), get(attn + "q_b_proj.bias"))
        self.kv_a = (get(attn + "kv_a_proj_with_mqa.weight"), get(attn + "kv_a_proj_with_mqa.bias"))
        self.kv_a_norm = (get(attn + "kv_a_layernorm.weight"), eps)
        self.o = (get(attn + "o_proj.weight"), get(attn + "o_proj.bias") if first_rank else None)
        per_head = get(attn + "kv_b_proj.weight").view(plan.local_heads, plan.mla[1], config.kv_lora_rank)
        dn = config.qk_nope_head_dim
        self.w_uk, self.w_uv = per_head[:, :dn], per_head[:, dn:]
        self.indexer = Indexer.from_shards(get, attn + "indexer.", config)  # DSA's, whole on every rank (or None)
        self.moe, mlp, self.act = layer_mlp(shards, prefix, first_rank, config, kernels)
        self.gate, self.up, self.down = mlp or (None, None, None)
        out_norm = get("mlp.post_mlp_layernorm.weight")  # A.X-K1's norm of its MoE block's output (whole)
        self.moe_out_norm = (out_norm, eps) if self.moe is not None and out_norm is not None else None


class TPPagedMlaRunner(TensorParallelRunner, PagedMlaRunner):
    """Runner (runners/base.py) for one rank's ShardedCausalLM of an MLA family: PagedMlaRunner's
    interface and sizes; logits over the whole vocabulary, equal on every rank."""

    unsupported_reason = staticmethod(tp_mla_unsupported_reason)

    def _bind(self, model) -> None:
        config, shards, plan = model.config, model.shards, model.plan
        self._bind_shard(model)
        self.layers = [_TPMlaLayer(shards, f"model.layers.{i}.", config, plan, self.first_rank, self.kernels)
                       for i in range(config.num_hidden_layers)]
        self.final_norm = (shards["model.norm.weight"], config.rms_norm_eps)
        self.lm_head = shards["lm_head.weight"]
        self.num_heads, self.num_kv_heads, self.head_dim = plan.local_heads, 1, config.kv_lora_rank + config.qk_rope_head_dim
        self.rank, self.nope_dims = int(config.kv_lora_rank), int(config.qk_nope_head_dim)
        self.scale = mla_scale(config)
        self.rope_form = rope_form(config)
        self._bind_indexers(config)
        self.inv_freq = model.inv_freq.to(device=self.device)
        self.rope_scaling = model.rope_scaling
        self.silu = config.hidden_act == "silu"
