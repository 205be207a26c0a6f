"""TPPagedLlamaRunner: a Llama-family model (sharded_model.TP_LLAMA_TYPES) sharded over the
ranks of a process group, Megatron layout, on the paged KV cache (docs/architecture.md §10).

Each rank runs this runner over its ShardedCausalLM (runners/sharded_model.py; the layout:
runners/sharding.py). Per forward over T packed token rows (TensorParallelGroup's collectives):
    x = all_reduce(embedding of the ids in this rank's vocabulary slice, 0 elsewhere)   [T, H]
    per layer:  q, k, v of this rank's heads -> RoPE -> KV append + paged attention on this
                rank's KV heads (its own cache: the pool holds local KV heads only)
                x = all_reduce(o_proj partial (+ residual and bias on rank 0))          [T, H]
                x = all_reduce(down_proj(act(gate) * up) partial (+ residual, bias on rank 0))
                    (a MoE layer: the router on every rank alike, each chosen expert over this
                    rank's slice of its width: runners/sharding_moe.py; the same all-reduce)
    logits = gather_vocab(final norm -> this rank's lm_head rows)            [T, V/N] -> [T, V]
So 2L + 1 all-reduces of T x H values and one all-gather of T x V / N values per forward; every
rank then holds the same full logits and runs the same verify (engine/loop.py unchanged), so
every rank emits the same tokens whatever the reduction order of its all-reduces.

Why gather the logits rather than verify on the shards (all-gathers of each row's max, sum of
exp, logit of the draft, argmax, then residual candidates: bench/tp_sharded_verify.py, which
gives chain_verify's tokens): the gather is one collective round and keeps ONE verify exact in
every sampling mode, with the logits processors and penalties (processing/, which read whole
rows); the sharded verify needs two rounds for temperature-only rows and more for top-k / top-p
/ min-p, and a second implementation per backend. Priced for NVLink (bench/tp_model.py, a
prediction; K = 4, V = 128256, 70B on 8 GPUs): B = 1, gather + verify ~49 us against ~58 us
sharded (the gather is faster where speculative decoding pays most); B = 8 / 32, the sharded
verify would save ~40 / ~200 us per scoring step, 0.4% / 1.8% of it. Measured on CPU ranks
(gloo over loopback TCP, bench/results/tp_cpu_avx512.json) the sharded statistics are far
cheaper (B = 32: two rounds ~0.5 ms against a 0.2-0.4 s gather of 78 MiB) -- CPU ranks exist
for CI, not for speed.
So the gather stays; the sharded verify is the candidate for large batches on GPUs.

The math is PagedLlamaRunner's (same helpers, same op order per shard); only the embedding, the
two row-parallel products per layer and the head differ. The single-process runner is not
touched by any of this: it is another class.

CUDA graphs: the collectives are capture-safe (static shapes, no host read, NCCL with
async_op=False); the decoding loop's polls run in lockstep on every rank (run_ahead.py,
``lockstep_polls``) so every rank runs the same iterations. Not run on a multi-GPU machine
(none available); the CPU static twin (cuda_graphs="static") passes with gloo.
"""
import torch
import torch.nn.functional as F

from .paged_base import FLOAT_DTYPES
from .paged_llama import (GRANITE_SCALARS, GRANITE_TYPES, INTERLEAVED_ROPE, POST_BRANCH_NORMS, QK_NORM_AFTER_ROPE,
                          PagedLlamaRunner, interleaved_order, llama_config_reason, rotates)
from ._rotary import rotary_dims
from .sharded_model import TP_LLAMA_TYPES, ShardedCausalLM
from .sharding import WHOLE_PROJECTION_NORMS
from .sharding_moe import layer_moe


def shard_reason(model, model_types: tuple) -> str | None:
    """The checks every tensor-parallel runner's unsupported_reason starts with, or None: a
    ShardedCausalLM of one of ``model_types`` with float shards."""
    if not isinstance(model, ShardedCausalLM):
        return f"the tensor-parallel runner runs a ShardedCausalLM (from_pretrained / from_model), got {type(model).__name__}"
    if model.config.model_type not in model_types:
        return f"model_type {model.config.model_type!r} is not one of {model_types}"
    if any(t.dtype not in FLOAT_DTYPES for t in model.shards.values()):
        return ("a shard is not a float tensor (quantized checkpoints are not supported; GPT-OSS's MXFP4 experts and "
                "block FP8 weights are dequantized on read)")
    return None


def unbiased_shard_reason(model, model_types: tuple, family: str, backend=None) -> str | None:
    """shard_reason, then what the tensor-parallel runners that read no projection bias and rotate with static
    tables refuse (OLMo 2 / 3, AFMoE / Laguna, MiMo-V2-Flash, OLMo Hybrid): a projection bias (an expert's aside), a
    RoPE table whose frequencies change with the length (ShardedCausalLM.rope_tables), a head_dim the backend does
    not take; ``family`` names the model in the bias refusal."""
    from ._rotary import static_rope_reason
    from .paged_base import head_dim_reason

    reason = shard_reason(model, model_types)
    if reason is not None:
        return reason
    # (an expert's bias aside, and a Mamba1 mixer's dt_proj bias, which the mixer reads: Jamba's)
    if any(name.endswith("_proj.bias") and ".experts." not in name and not name.endswith("mamba.dt_proj.bias")
           for name in model.shards):
        return f"{family} projections with biases (attention_bias): not read by this runner"
    for _, _, rope_type in model.rope_tables.values():
        reason = static_rope_reason(rope_type)
        if reason is not None:
            return reason
    return head_dim_reason(model.plan.head_dim, backend)


def sharded_reason(model, model_types: tuple, max_tokens_per_row: int | None = None, backend=None,
                   config=None) -> str | None:
    """shard_reason, then the Llama runner's config checks (static RoPE, windows, head_dim) on the
    ShardedCausalLM's rotary frequencies and ``config`` (default model.config)."""
    reason = shard_reason(model, model_types)
    if reason is not None:
        return reason
    return llama_config_reason(model.config if config is None else config, model.rope_type, max_tokens_per_row, backend,
                               rotary_dims=2 * model.inv_freq.numel())


def tp_llama_unsupported_reason(model, max_tokens_per_row: int | None = None, backend=None) -> str | None:
    """Why TPPagedLlamaRunner cannot run ``model`` (a ShardedCausalLM), or None when it can."""
    if isinstance(model, ShardedCausalLM) and model.plan.moe_layout == "swiglu" and \
            any(name.endswith("experts.gate_up_proj_bias") for name in model.shards):
        return "MoE experts with biases"
    return sharded_reason(model, TP_LLAMA_TYPES, max_tokens_per_row, backend)


class _TPLayer:
    """One decoder layer's shards (the attribute names of paged_llama._Layer). o and down carry
    their bias on rank 0 only (added once to the sum). fuse: q/k/v and gate/up also as one
    concatenated weight each, the separate weights being views of it (one copy in memory). A MoE
    layer's MLP is `moe` (runners/_moe.py over this rank's slice of every expert:
    runners/sharding_moe.py; gate / up / down None); GPT-OSS's sinks are this rank's heads'."""

    scaled_query = True  # as paged_llama._Layer's: the runner's query temperature (if any) scales it
    gated = True  # as paged_llama._Layer's: act(gate) * up, or Apertus' act(up)

    def __init__(self, shards: dict, prefix: str, config, fuse: bool, first_rank: bool, kernels: str = "torch",
                 rope: bool = True):
        def get(name):
            return shards.get(prefix + name)

        from transformers.activations import ACT2FN

        eps = config.rms_norm_eps
        self.ln_in, self.eps_in = _either(get, "input_layernorm.weight", "attention_layernorm.weight"), eps  # (Apertus')
        self.ln_post, self.eps_post = _either(get, "post_attention_layernorm.weight", "feedforward_layernorm.weight"), eps
        self.moe = layer_moe(shards, prefix, first_rank, config, kernels)
        q, k, v = (get(f"self_attn.{p}_proj.weight") for p in "qkv")
        bq, bk, bv = (get(f"self_attn.{p}_proj.bias") for p in "qkv")
        gate, up = get("mlp.gate_proj.weight"), get("mlp.up_proj.weight")
        bgate, bup = get("mlp.gate_proj.bias"), get("mlp.up_proj.bias")
        self.w_qkv = self.b_qkv = self.w_gate_up = self.b_gate_up = None
        if fuse:  # the shards dict then holds the views: the separate tensors are freed
            (q, k, v), self.w_qkv = _fused(shards, prefix, "self_attn.{}_proj.weight", "qkv")
            if self.moe is None and gate is not None:  # (Apertus' ungated MLP: nothing to fuse)
                (gate, up), self.w_gate_up = _fused(shards, prefix, "mlp.{}_proj.weight", ("gate", "up"))
            if bq is not None and bk is not None and bv is not None:
                (bq, bk, bv), self.b_qkv = _fused(shards, prefix, "self_attn.{}_proj.bias", "qkv")
            if bgate is not None and bup is not None:
                (bgate, bup), self.b_gate_up = _fused(shards, prefix, "mlp.{}_proj.bias", ("gate", "up"))
        self.q, self.k, self.v = (q, bq), (k, bk), (v, bv)
        self.o = (get("self_attn.o_proj.weight"), get("self_attn.o_proj.bias") if first_rank else None)
        q_norm = get("self_attn.q_norm.weight") if get("self_attn.q_norm.weight") is not None else \
            get("self_attn.query_layernorm.weight")  # HunYuan's names
        k_norm = get("self_attn.k_norm.weight") if get("self_attn.k_norm.weight") is not None else \
            get("self_attn.key_layernorm.weight")
        norms = None if q_norm is None else (q_norm, eps, k_norm, eps)
        # per head ([D]: Qwen3's), or this rank's slice of a whole-projection norm (OLMoE's, MiniMax-M2's: the
        # runner's _projection_norm takes the statistics over every rank's slice)
        whole = q_norm is not None and config.model_type in WHOLE_PROJECTION_NORMS
        self.qk_norm, self.qk_norm_full = (None, norms) if whole else (norms, None)
        self.qk_norm_after_rope = config.model_type in QK_NORM_AFTER_ROPE  # HunYuan's: rotate, then norm
        self.clip_qkv = getattr(config, "clip_qkv", None)  # OLMoE: q / k / v clamped after the norms
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        self.rope_order = interleaved_order(q.shape[0], k.shape[0], head_dim, q.device, rotary_dims(config, head_dim)) \
            if config.model_type in INTERLEAVED_ROPE else None  # ERNIE 4.5, GLM: this rank's heads, each reordered
        # GLM-4-0414's norms of each branch's output (whole on every rank: they norm the summed branch)
        self.post_attn_norm, self.post_mlp_norm = (None if get(f"{name}.weight") is None else (get(f"{name}.weight"), eps)
                                                   for name in POST_BRANCH_NORMS)
        self.qkv = ([q, k, v], [bq, bk, bv])
        self.q_cols, self.kv_cols = q.shape[0], k.shape[0]
        if self.moe is None:
            self.gate, self.up = (gate, bgate), (up, bup)
            self.down = (get("mlp.down_proj.weight"), get("mlp.down_proj.bias") if first_rank else None)
            self.gate_up = ([gate, up], [bgate, bup])
            self.gated, self.inter, self.act = gate is not None, up.shape[0], _activation(shards, prefix, config, ACT2FN)
        else:
            self.gate = self.up = self.down = self.gate_up = self.inter = self.act = None
        self.rope = rope  # paged_llama.rotates: EXAONE MoE's full layers are NoPE (SmolLM3's: not sharded)
        sinks = get("self_attn.sinks")  # GPT-OSS: this rank's heads' logits, float32 for the kernels
        self.sinks = None if sinks is None else sinks.detach().float().contiguous()


def _either(get, name: str, other: str):
    """The shard ``name``, else ``other`` (a family's own name for the same tensor)."""
    tensor = get(name)
    return tensor if tensor is not None else get(other)


def _activation(shards: dict, prefix: str, config, act2fn):
    """The MLP's activation: transformers' ACT2FN[hidden_act], or Apertus' xIELU, a module whose parameters
    (alpha_p, alpha_n, beta, eps under mlp.act_fn.) are read from the shards (whole on every rank)."""
    if config.hidden_act != "xielu":
        return act2fn[config.hidden_act]
    from transformers.activations import ACT2CLS

    weights = {name[len(prefix + "mlp.act_fn."):]: tensor for name, tensor in shards.items()
               if name.startswith(prefix + "mlp.act_fn.")}
    act = ACT2CLS["xielu"](dtype=weights["alpha_p"].dtype)
    act.load_state_dict(weights)
    return act.to(weights["alpha_p"].device)


def _split_fused(shards: dict, prefix: str, q_rows: int) -> None:
    """Phi-3's local qkv_proj [this rank's q | k | v rows] and gate_up_proj [gate | up rows] become
    views under the separate projections' names, which the rest of the layer reads (fused again
    below when fuse is on: one concatenation, as for the other families). q_rows: this rank's
    query rows (local heads x head_dim); k and v split the rest in halves."""
    qkv = shards.pop(prefix + "self_attn.qkv_proj.weight", None)
    if qkv is not None:
        kv_rows = (qkv.shape[0] - q_rows) // 2
        for name, start, rows in (("q", 0, q_rows), ("k", q_rows, kv_rows), ("v", q_rows + kv_rows, kv_rows)):
            shards[f"{prefix}self_attn.{name}_proj.weight"] = qkv[start:start + rows]
    gate_up = shards.pop(prefix + "mlp.gate_up_proj.weight", None)
    if gate_up is not None:
        half = gate_up.shape[0] // 2
        shards[prefix + "mlp.gate_proj.weight"], shards[prefix + "mlp.up_proj.weight"] = gate_up[:half], gate_up[half:]


def _fused(shards: dict, prefix: str, pattern: str, parts):
    """The shards prefix + pattern.format(part) concatenated (dim 0) -> (their views of the
    concatenation, the concatenation); the shards dict is re-pointed at the views."""
    names = [prefix + pattern.format(part) for part in parts]
    fused = torch.cat([shards[name] for name in names])
    views, start = [], 0
    for name in names:
        rows = shards[name].shape[0]
        shards[name] = fused[start:start + rows]
        views.append(shards[name])
        start += rows
    return views, fused


class TensorParallelRunner:
    """What every tensor-parallel paged runner shares (mixed in before its family's single-process
    runner): construction ending with an agreement of every rank (same world size, config, dtype
    and kernels, or one clear error on every rank: distributed/failures.py), logits gathered over
    the vocabulary, the vocabulary-parallel embedding and the all-reduce of row-parallel partials.
    The family's _bind calls _bind_shard first (tp, plan, first_rank, the embedding's vocabulary slice,
    this rank's heads)."""

    lockstep_polls = True  # engine/run_ahead.py: every rank reads the same polls (same iterations)
    # NCCL collectives inside CUDA graphs: capture-safe by construction, NOT run on a multi-GPU
    # machine (none was available), so cuda_graphs=None decodes eagerly; cuda_graphs=True captures.
    graphs_by_default = False
    graphs_note = ("tensor parallelism: CUDA graphs with NCCL inside were not run on a multi-GPU machine yet; "
                   "pass cuda_graphs=True to capture them")

    def __init__(self, model, **kwargs):
        if not isinstance(model, ShardedCausalLM):
            raise ValueError(self.unsupported_reason(model))
        error = None
        try:
            super().__init__(model, **kwargs)
            self.vocab_size = self.plan.vocab
        except Exception as exc:  # noqa: BLE001 - every rank learns of it in the agreement below
            error = exc
        config = model.config
        facts = None if error else {
            "world size": model.tp.size, "model": (config.model_type, config.num_hidden_layers, config.hidden_size,
                                                    config.num_attention_heads, self.plan.kv_heads,
                                                    config.intermediate_size, config.vocab_size),
            "dtype": str(self.dtype), "kernels": self.kernels, "block_size": self.block_size}
        model.tp.agree("building the tensor-parallel runner", facts or {}, error)

    @classmethod
    def from_pretrained(cls, path, *, process_group=None, max_new_tokens: int | None = None, num_draft_tokens: int = 0,
                        dtype=None, device=None, block_size: int = 16, backend=None, fuse_projections=None, timeout=None):
        """Each rank reads only its slices of the checkpoint in ``path`` (ShardedCausalLM.from_pretrained);
        the runner keeps the ShardedCausalLM as ``owned_model``."""
        sharded = ShardedCausalLM.from_pretrained(path, process_group, dtype=dtype, device=device, timeout=timeout)
        runner = cls(sharded, max_new_tokens=max_new_tokens, num_draft_tokens=num_draft_tokens, block_size=block_size,
                     backend=backend, fuse_projections=fuse_projections)
        runner.owned_model = sharded
        return runner

    def _bind_shard(self, model) -> None:
        """The group, plan, vocabulary slice, heads and default softmax scale of a ShardedCausalLM (each family's
        _bind calls it first)."""
        self.tp, self.plan, self.first_rank = model.tp, model.plan, model.plan.rank == 0
        self._carries_residual = self.first_rank  # the layer loops: rank 0 adds the residual once
        self.embed = model.shards["model.embed_tokens.weight"]
        self.vocab_start, self.vocab_part = model.plan.vocab_start, model.plan.vocab_part
        # this rank's heads, and the softmax scale head_dim^-0.5 (a family with another sets its own after: Gemma,
        # Granite, latent attention)
        plan = model.plan
        self.num_heads, self.num_kv_heads, self.head_dim = plan.local_heads, plan.local_kv_heads, plan.head_dim
        self.scale = self.head_dim ** -0.5

    # -- logits over the whole vocabulary ---------------------------------------------------------
    def prefill(self, input_ids, attention_mask, **kwargs) -> torch.Tensor:
        """As PagedRunnerBase.prefill: logits [B, V] (gathered from every rank's slice)."""
        return self.tp.gather_vocab(super().prefill(input_ids, attention_mask, **kwargs))

    def score(self, tokens, num_valid=None, *, tree=None, rows=None) -> torch.Tensor:
        """As PagedRunnerBase.score: logits [B, N, V] (or [B, R, V]: rows), gathered from every rank's slice."""
        return self.tp.gather_vocab(super().score(tokens, num_valid, tree=tree, rows=rows))

    # -- the forward ------------------------------------------------------------------------------
    def _embed(self, flat: torch.Tensor) -> torch.Tensor:
        """Vocab-parallel embedding: ids [T] -> [T, H], each rank looking up the ids of its slice
        (zeros elsewhere), summed by one all-reduce (exact: one nonzero term per row)."""
        local = flat.clamp(min=0) - self.vocab_start
        outside = (local < 0) | (local >= self.vocab_part)
        x = F.embedding(local.clamp(0, self.vocab_part - 1), self.embed).masked_fill_(outside[:, None], 0)
        x = self.tp.all_reduce_(x)
        multiplier = getattr(self, "embedding_multiplier", 1.0)  # Granite's
        return x if multiplier == 1.0 else x * multiplier

    def _sum_partials(self, partial: torch.Tensor) -> torch.Tensor:
        """A row-parallel product: every rank's partial summed by one all-reduce (rank 0's partial
        alone carries the residual and the bias: _carries_residual)."""
        return self.tp.all_reduce_(partial)

    def _projection_norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        """An RMSNorm over a whole q / k projection (OLMoE's, MiniMax-M2's) of which x [T, w] is this rank's
        slice and weight [w] its weights: the mean square over every rank's slice (one all-reduce of [T, 1]
        float32 sums; KV heads replicated over ranks count as often as each other, so the mean stands),
        then rms_norm_reference's op order."""
        h = x.float()
        total = self.tp.all_reduce_(h.pow(2).sum(-1, keepdim=True))
        h = h * torch.rsqrt(total / (self.plan.world * x.shape[-1]) + eps)
        return weight * h.to(x.dtype)


class TPPagedLlamaRunner(TensorParallelRunner, PagedLlamaRunner):
    """Runner (runners/base.py) for one rank's ShardedCausalLM of a Llama family: the same
    interface and sizes as PagedLlamaRunner (max_new_tokens, num_draft_tokens, block_size, backend,
    fuse_projections); logits come back over the whole vocabulary [.., V], equal on every rank.
    ``tp``: the TensorParallelGroup; ``plan``: this rank's LlamaShardPlan (TensorParallelRunner)."""

    unsupported_reason = staticmethod(tp_llama_unsupported_reason)

    def _bind(self, model) -> None:
        config, shards, plan = model.config, model.shards, model.plan
        self._bind_shard(model)
        for i in range(config.num_hidden_layers):  # Phi-3's fused projections -> the separate names
            _split_fused(shards, f"model.layers.{i}.", plan.local_heads * plan.head_dim)
        self.layers = [_TPLayer(shards, f"model.layers.{i}.", config, self.fuse_projections, self.first_rank,
                                self.kernels, rotates(config, i)) for i in range(config.num_hidden_layers)]
        if any(layer.sinks is not None for layer in self.layers):
            self.attn_sinks = tuple(layer.sinks for layer in self.layers)
        self.post_branch_norms = any(layer.post_attn_norm is not None for layer in self.layers)
        self.final_norm, self.final_eps = shards["model.norm.weight"], config.rms_norm_eps
        self.lm_head, self.lm_head_bias = shards["lm_head.weight"], shards.get("lm_head.bias")  # this rank's rows
        if config.model_type in GRANITE_TYPES:  # its four scalars, as PagedLlamaRunner binds them
            for field, attribute in GRANITE_SCALARS.items():
                setattr(self, attribute, float(getattr(config, field)))
        self.inv_freq = model.inv_freq.to(device=self.device)
        self.rope_scaling = model.rope_scaling
        self.silu = config.hidden_act == "silu"
        self._bind_query_temperature(config)
        if self.kernels == "triton":  # imported here: triton is optional on CPU machines
            from ..kernels.cache_ops.triton_rope import rope_append_kv_triton
            from ..kernels.llama_ops.triton import add_rms_norm_triton, silu_mul_triton

            self._ops = (add_rms_norm_triton, rope_append_kv_triton, silu_mul_triton)
            self._next_norm = [(nxt.ln_in, nxt.eps_in) for nxt in self.layers[1:]] + [(self.final_norm, self.final_eps)]
