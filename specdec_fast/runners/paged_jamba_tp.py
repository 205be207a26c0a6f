"""TPPagedJambaRunner: Jamba (sharded_model.TP_JAMBA_TYPES: Jamba 1.5 / 1.6 / 1.7 Mini and Large) sharded over the
ranks of a process group (docs/architecture.md §10).

The layout (runners/sharding.py): a Mamba1 layer by channels -- this rank's channels of in_proj's x and z rows, of the
convolution, dt_proj, A_log and D, their columns of x_proj and out_proj -- so each rank scans its own channels and
keeps their states and windows; x_proj's dt / B / C are summed over the ranks (one all-reduce of [T, R + 2N]) before
Jamba's norms, which every rank applies whole. The attention layers (no positions) as the Llama layout's, the dense
MLPs' columns, every expert by its width with the router whole (runners/sharding_moe.py), the embedding and the LM head
by vocabulary rows. Each branch's partials are summed by one all-reduce. The math is PagedJambaRunner's over this
rank's shards.
"""
from types import SimpleNamespace

from .paged_jamba import JAMBA_TYPES, PagedJambaRunner
from .paged_llama_tp import TensorParallelRunner, unbiased_shard_reason
from .mamba1 import Mamba1
from .paged_recurrent import padded_bias_reason
from .sharding_moe import layer_mlp


def tp_jamba_unsupported_reason(model, max_tokens_per_row: int | None = None, backend=None) -> str | None:
    """Why TPPagedJambaRunner cannot run ``model`` (a ShardedCausalLM), or None when it can."""
    config = getattr(model, "config", None)
    if getattr(config, "hidden_act", "silu") != "silu":
        return f"a Mamba convolution with activation {config.hidden_act!r}"
    if getattr(config, "sliding_window", None):
        return f"sliding_window {config.sliding_window}: Jamba's attention layers here are full"
    return padded_bias_reason(config, "mamba_proj_bias") or unbiased_shard_reason(model, JAMBA_TYPES, "Jamba", backend)


def _mixer(get, config) -> Mamba1:
    """A Mamba1 mixer of this rank's channels from its shards (the module attributes Mamba1 reads)."""
    def linear(name, bias=False):
        return SimpleNamespace(weight=get(f"mamba.{name}.weight"), bias=get(f"mamba.{name}.bias") if bias else None)

    def norm(name):
        return SimpleNamespace(weight=get(f"mamba.{name}_layernorm.weight"), variance_epsilon=config.rms_norm_eps)

    dt_proj = linear("dt_proj", bias=True)
    return Mamba1(SimpleNamespace(
        in_proj=linear("in_proj"), x_proj=linear("x_proj"), out_proj=linear("out_proj"), conv1d=linear("conv1d", True),
        dt_proj=dt_proj, A_log=get("mamba.A_log"), D=get("mamba.D"), time_step_rank=dt_proj.weight.shape[1],
        ssm_state_size=config.mamba_d_state, dt_layernorm=norm("dt"), b_layernorm=norm("b"), c_layernorm=norm("c")))


class _TPLayer:
    """One layer's shards (the attribute names of paged_jamba._Layer's)."""

    def __init__(self, shards: dict, index: int, config, tp, first_rank: bool, kernels: str):
        prefix = f"model.layers.{index}."

        def get(name):
            return shards.get(prefix + name)

        if get("mamba.in_proj.weight") is not None:
            self.kind = "linear_attention"
            self.mixer = _mixer(get, config)
            self.mixer.reduce = tp.all_reduce_  # dt / B / C: every rank's channels' products summed
        else:
            self.kind = "full_attention"
            self.q, self.k, self.v, self.o = ((get(f"self_attn.{p}_proj.weight"), None) for p in "qkvo")
        eps = config.rms_norm_eps
        self.input, self.pre_ff = (get("input_layernorm.weight"), eps), (get("pre_ff_layernorm.weight"), eps)
        self.moe, mlp, self.act = layer_mlp(shards, prefix, first_rank, config, kernels)
        self.gate, self.up, self.down = mlp or (None, None, None)


class TPPagedJambaRunner(TensorParallelRunner, PagedJambaRunner):
    """Runner (runners/base.py) for one rank's ShardedCausalLM of Jamba: PagedJambaRunner's interface and sizes;
    logits over the whole vocabulary, equal on every rank."""

    unsupported_reason = staticmethod(tp_jamba_unsupported_reason)

    def _bind(self, model) -> None:
        config, shards = model.config, model.shards
        self._bind_shard(model)
        self.layers = [_TPLayer(shards, i, config, self.tp, self.first_rank, self.kernels)
                       for i in range(config.num_hidden_layers)]
        self._index_layers()
        self.final_norm = (shards["model.final_layernorm.weight"], config.rms_norm_eps)
        self.lm_head = shards["lm_head.weight"]
