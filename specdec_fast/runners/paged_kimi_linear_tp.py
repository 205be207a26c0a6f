"""TPPagedKimiLinearRunner: Kimi Linear (sharded_model.TP_KIMI_LINEAR_TYPES) sharded over the ranks of a process group
(docs/architecture.md §10).

The layout (runners/sharding.py): a KDA layer by heads -- this rank's heads' rows of q / k / v, f_b and g_b, of the
convolution's [q | k | v] parts, of dt_bias, b_proj and A_log, its columns of o_proj; f_a / g_a and the per-head output
norm whole -- so each rank runs the rule of its own heads and keeps their states and windows; a latent attention layer
as the MLA layout's (this rank's heads' rows of q_proj and kv_b_proj and columns of o_proj, the latent's projection
and norm whole: every rank caches the same latent for its own heads); the dense MLP's columns, every expert's and the
shared expert's width with the router whole (runners/sharding_moe.py); the embedding and the LM head by vocabulary
rows. Each branch's partials are summed by one all-reduce. The math is PagedKimiLinearRunner's over this rank's
shards.
"""
import torch

from .kda import Kda
from .paged_kimi_linear import LAYER_KINDS, PagedKimiLinearRunner
from .paged_llama_tp import TensorParallelRunner, unbiased_shard_reason
from .paged_mla import latent_reason
from .paged_recurrent import layer_kinds_reason
from .sharded_model import TP_KIMI_LINEAR_TYPES
from .sharding_moe import layer_mlp


def tp_kimi_linear_unsupported_reason(model, max_tokens_per_row: int | None = None, backend=None) -> str | None:
    """Why TPPagedKimiLinearRunner cannot run ``model`` (a ShardedCausalLM), or None when it can."""
    config = getattr(model, "config", None)
    reason = layer_kinds_reason(config, LAYER_KINDS) or unbiased_shard_reason(model, TP_KIMI_LINEAR_TYPES,
                                                                             "Kimi Linear", backend)
    if reason is not None or not hasattr(model, "embed_shard"):
        return reason
    from ..kernels._backend import resolve_backend

    return latent_reason(config, resolve_backend(backend, model.embed_shard.device, "paged_attention"))


class _TPLayer:
    """One layer's shards (the attribute names of paged_kimi_linear._Layer's)."""

    def __init__(self, shards: dict, index: int, config, plan, first_rank: bool, kernels: str):
        prefix = f"model.layers.{index}."

        def get(name):
            return shards.get(prefix + name)

        def proj(name):
            return get(f"self_attn.{name}.weight"), None

        self.kind = config.layer_types[index]
        if self.kind == "linear_attention":
            _, heads, dim = plan.kda
            conv = get("self_attn.conv1d.weight")  # the model's [q | k | v] parts, or a checkpoint's three apart
            if conv is None:
                conv = torch.cat([get(f"self_attn.{p}_conv1d.weight") for p in "qkv"])
            self.mixer = Kda(proj("q_proj"), proj("k_proj"), proj("v_proj"), conv[:, 0],
                             proj("forget_gate.f_a_proj"), proj("forget_gate.f_b_proj"),
                             get("self_attn.forget_gate.A_log").reshape(-1), get("self_attn.forget_gate.dt_bias"),
                             proj("b_proj"), proj("g_a_proj"), proj("g_b_proj"),
                             (get("self_attn.o_norm.weight"), config.rms_norm_eps), proj("o_proj"),
                             heads // plan.world, dim)
        else:
            self.q = proj("q_proj") if get("self_attn.q_proj.weight") is not None else None
            if self.q is None:
                self.q_a, self.q_b = proj("q_a_proj"), proj("q_b_proj")
                self.q_a_norm = (get("self_attn.q_a_layernorm.weight"), 1e-6)  # KimiLinearRMSNorm's default eps
            self.kv_a, self.o = proj("kv_a_proj_with_mqa"), proj("o_proj")
            self.kv_a_norm = (get("self_attn.kv_a_layernorm.weight"), 1e-6)  # its default eps, not the config's
            kv_b = get("self_attn.kv_b_proj.weight").view(plan.local_heads, -1, config.kv_lora_rank)
            self.w_uk, self.w_uv = kv_b[:, :config.qk_nope_head_dim], kv_b[:, config.qk_nope_head_dim:]
        eps = config.rms_norm_eps
        self.input, self.post = (get("input_layernorm.weight"), eps), (get("post_attention_layernorm.weight"), eps)
        self.moe, mlp, self.act = layer_mlp(shards, prefix, first_rank, config, kernels)
        self.gate, self.up, self.down = mlp or (None, None, None)


class TPPagedKimiLinearRunner(TensorParallelRunner, PagedKimiLinearRunner):
    """Runner (runners/base.py) for one rank's ShardedCausalLM of Kimi Linear: PagedKimiLinearRunner's interface and
    sizes; logits over the whole vocabulary, equal on every rank."""

    unsupported_reason = staticmethod(tp_kimi_linear_unsupported_reason)

    def _bind(self, model) -> None:
        config, shards, plan = model.config, model.shards, model.plan
        self._bind_shard(model)
        self.layers = [_TPLayer(shards, i, config, plan, self.first_rank, self.kernels)
                       for i in range(config.num_hidden_layers)]
        self._index_layers()
        self.final_norm = (shards["model.norm.weight"], config.rms_norm_eps)
        self.lm_head = shards["lm_head.weight"]
        self.nope, self.rope, self.rank = config.qk_nope_head_dim, config.qk_rope_head_dim, config.kv_lora_rank
        self.num_heads, self.num_kv_heads = plan.local_heads, 1
        self.head_dim = self.rank + self.rope
        self.scale = (self.nope + self.rope) ** -0.5
