"""Which slice of each checkpoint tensor a rank holds (the Megatron layout), and reading those
slices: from a model already loaded, or from the checkpoint's safetensors without reading
anything else (docs/architecture.md §10).

Llama family (sharded_model.TP_LLAMA_TYPES), N ranks, rank r:
    q_proj, k_proj, v_proj (+ biases)   column-parallel: the rows of this rank's heads
    gate_proj, up_proj                  column-parallel: rows [r I/N, (r+1) I/N)
    o_proj, down_proj                   row-parallel: the matching columns; the partial products
                                        are summed by one all-reduce each; a bias is added once
                                        (rank 0's product carries it, with the residual)
    embed_tokens, lm_head               vocab-parallel: rows [r V/N, (r+1) V/N) (tied: one tensor)
    norms (input, post-attention, final, Qwen3's q_norm / k_norm)   replicated
    Command R+'s per-head q_norm / k_norm ([H, D])   the rows of this rank's heads
    OLMoE's / MiniMax-M2's whole-projection q_norm / k_norm ([H D])   this rank's heads' part, as q / k
    Phi-3's qkv_proj / gate_up_proj (fused rows)   this rank's rows of each part, concatenated:
                                        the local q | k | v and gate | up, fused as on one process
    Kimi Linear's KDA layers           by heads: q / k / v / f_b / g_b rows, dt_bias, b_proj and A_log by heads, the
                                        convolution's rows of each [q | k | v] part, o_proj's columns; f_a / g_a and
                                        the per-head norm whole (its latent attention as MLA's; runners/paged_kimi_linear_tp.py)
    Jamba's Mamba1 layers              by channels: in_proj's rows of each of [x | z], the convolution's, dt_proj's,
                                        A_log's and D's rows, x_proj's columns (dt / B / C summed over the ranks,
                                        then normed whole), out_proj's columns (runners/paged_jamba_tp.py)
    Mamba2 layers (Nemotron-H,         by heads: in_proj's rows of z, x and dt by heads, of B and C by groups (G
    Granite 4.0-H, Bamba, Falcon-H1)    groups over N ranks: G / N each, or one group shared by N / G ranks), the
                                        convolution's [x | B | C] rows likewise, dt_bias / A_log / D and the gated
                                        norm's weights by heads, out_proj's columns (runners/mamba2_tp.py)
    MiniMax's lightning layers         by heads: qkv_proj's rows (each head's [q | k | v]), output_gate's rows
                                        and the output norm's weights, out_proj's columns (runners/paged_minimax_tp.py)
    AFMoE's / Laguna's output gate     column-parallel: the rows of this rank's heads (gate_rows a head:
    (gate_proj / g_proj)               head_dim, or Laguna's one per head); Laguna's layers by their own
                                       query heads (layer_heads_of)
    MiMo-V2-Flash's v_proj / o_proj    by the value heads' own width (the plan's value_dim), each layer by
                                        its own KV heads (layer_dims_of: the sliding layers' twice the full)
Cohere / Cohere 2 (sharded_model.TP_COHERE_TYPES) take the same layout (runners/paged_cohere_tp.py).
Heads: rank r runs query heads [r Hq/N, (r+1) Hq/N). KV heads: Hkv >= N splits them, Hkv/N per
rank; GQA with fewer KV heads than ranks (Hkv < N, N a multiple of Hkv) REPLICATES them: rank r
holds the one KV head its query heads read (head r Hkv / N), so N / Hkv ranks hold the same
KV head's projections and cache (more KV memory in all, none more per rank).

Multi-head latent attention (DeepSeek-V2 / V3, GLM-4.7-Flash: sharded_model.TP_MLA_TYPES) by heads:
    q_proj or q_b_proj (+ bias)         column-parallel: this rank's heads' rows (dn + dr each)
    kv_b_proj                           column-parallel: this rank's heads' rows (dn + dv each)
    o_proj                              row-parallel: this rank's heads' columns (dv each)
    q_a_proj, kv_a_proj_with_mqa, their norms   replicated: every rank computes the same latent
                                        and caches it for its own heads (vLLM's MLA layout)

Hybrid recurrent models (Qwen3-Next, Qwen3.5: sharded_model.TP_HYBRID_TYPES; OLMo Hybrid's q / k / v, g, b, a and
o projections apart, split alike, its OLMo 3 attention as OLMo's), by heads:
    q_proj (each head's [q | gate] rows) this rank's heads; k_proj / v_proj as above; o_proj columns
    Gated DeltaNet: in_proj_qkvz / in_proj_ba (Qwen3-Next: rows grouped by key head) this rank's key
    heads' groups; in_proj_qkv and conv1d ([q | k | v] channels) this rank's rows of each part;
    in_proj_z / _b / _a, A_log, dt_bias this rank's value heads; out_proj their columns; the gated
    norm whole. Each rank keeps the recurrent states of its own heads.

Mixture-of-experts families (runners/_moe.MOE_FAMILIES): every expert split as a
dense MLP is, the router replicated (runners/sharding_moe.py); GPT-OSS's attention sinks follow
the query heads.

Llama 4 (llama4_text) is the Llama layout under other names (layout_name): its `feed_forward` block
is read as `mlp` (a dense MLP of intermediate_size_mlp, or the router, experts and shared expert).
A multimodal checkpoint (Llama 4's, Gemma 3's 4B-27B) is read as its text decoder: the names under
`language_model.` (as published) or `model.language_model.` (as transformers 5 saves them) as the
decoder's, its vision tower and projector not read.

Every size must divide: heads, KV heads (or N by them), intermediate size (and the experts' and
the shared expert's) and vocabulary by N, else ValueError naming which (raised on every rank
alike, before any collective).
"""
import dataclasses
import json
import os
import re
from dataclasses import dataclass

import torch

from .checkpoint_fp8 import SCALE_SUFFIX as FP8_SCALE_SUFFIX
from .checkpoint_fp8 import read_fp8
from .checkpoint_mxfp4 import SUFFIXES as MXFP4_SUFFIXES
from .checkpoint_mxfp4 import read_mxfp4
from .sharding_moe import LAYER as _LAYER
from .sharding_moe import gather_experts, moe_sizes, moe_slice_of

# Families whose q_norm / k_norm weigh the whole projection ([Hq D], [Hkv D]): split as q / k rows are, the
# statistics taken over every rank's slice (paged_llama_tp.TensorParallelRunner._projection_norm)
WHOLE_PROJECTION_NORMS = ("olmoe", "minimax_m2", "olmo2", "olmo3", "olmo_hybrid", "flex_olmo")
# The hybrid families whose attention q_proj holds each head's [q | gate] rows (Qwen3-Next's gated attention; OLMo
# Hybrid's attention is OLMo 3's, q alone)
QUERY_GATED_TYPES = ("qwen3_next", "qwen3_5_text", "qwen3_5_moe_text")
ROW_PARALLEL = ("self_attn.o_proj.weight", "mlp.down_proj.weight")
ROW_BIASES = ("self_attn.o_proj.bias", "mlp.down_proj.bias")  # replicated; added by rank 0 only
VOCAB = ("model.embed_tokens.weight", "lm_head.weight", "lm_head.bias")  # the LM head's bias: ERNIE 4.5's
# A multimodal checkpoint's parts that are not its text decoder (Llama 4's, Gemma 3's): not read
NOT_TEXT = ("vision_model.", "vision_tower.", "multi_modal_projector.", "model.vision_tower.", "model.multi_modal_projector.",
            # Gemma 4's
            "model.audio_tower.", "model.embed_vision.", "model.embed_audio.")
# A family's checkpoint tensors that no runner reads (MiMo-V2-Flash's MTP layers, which transformers does not load)
NOT_READ = {"mimo_v2_flash": ("model.mtp.",)}
# ... and by the end of their names: the decays transformers saves with a MiniMax model (its lightning layers'
# buffers; the TP runner computes the slopes, and diagonal_decay alone is H x block_size^2 floats a layer: 16 MB a layer
# at MiniMax-Text-01's 64 heads and blocks of 256, on every rank)
NOT_READ_SUFFIXES = {"minimax": tuple(f"self_attn.{b}" for b in ("slope_rate", "query_decay", "key_decay", "diagonal_decay"))}
# ... and where its text decoder's names sit: (prefix, what it stands for)
TEXT_PREFIXES = (("model.language_model.", "model."), ("language_model.", ""))
# A family's checkpoint names under the names this layout reads, as (pattern, replacement) regexes in order: EXAONE
# 3.x's original GPT-2-style names and Hy3's MoE names (which transformers renames on loading: its
# conversion_mapping.py), Granite 4.0's shared_mlp as Phi-3's fused MLP
CHECKPOINT_RENAMES = {"exaone": ((r"^transformer\.wte\.", "model.embed_tokens."), (r"^transformer\.h\.", "model.layers."),
                                 (r"^transformer\.ln_f\.", "model.norm."), (r"\.attn\.attention\.", ".self_attn."),
                                 (r"\.self_attn\.out_proj\.", ".self_attn.o_proj."),
                                 (r"\.ln_1\.", ".input_layernorm."), (r"\.ln_2\.", ".post_attention_layernorm."),
                                 (r"\.mlp\.c_fc_0\.", ".mlp.gate_proj."), (r"\.mlp\.c_fc_1\.", ".mlp.up_proj."),
                                 (r"\.mlp\.c_proj\.", ".mlp.down_proj.")),
                      # Hy3's published MoE names, as transformers renames them (conversion_mapping.py's hy_v3)
                      "hy_v3": ((r"\.mlp\.router\.gate\.weight$", ".mlp.gate.weight"),
                                (r"\.mlp\.expert_bias$", ".mlp.e_score_correction_bias"),
                                (r"\.mlp\.shared_mlp\.", ".mlp.shared_experts.")),
                      # A.X-K1's norm of the MoE block's output, published beside the layer's norms (every layer's:
                      # transformers reads the sparse layers' under the block, as its conversion_mapping.py renames it)
                      "axk1": ((r"(\.layers\.\d+)\.post_mlp_layernorm\.", r"\1.mlp.post_mlp_layernorm."),),
                      # MiMo-V2-Flash's sinks as published (transformers' conversion_mapping.py renames them)
                      "mimo_v2_flash": ((r"\.self_attn\.attention_sink_bias$", ".self_attn.sinks"),),
                      # Kolibri-1's and Flint's published names, as transformers' conversion_mapping.py renames them
                      "kolibri1": ((r"\.moe\.router\.expert_bias$", ".mlp.gate.e_score_correction_bias"),
                                   (r"\.post_attn_norm\.", ".post_self_attn_layernorm."),
                                   (r"\.post_ffn_norm\.", ".post_mlp_layernorm.")),
                      "flint": ((r"\.self_attn\.softmax_offset$", ".self_attn.sinks"),),
                      # Kimi Linear's published names (and save_pretrained's): the forget gate's tensors beside the
                      # attention's, every MLP under block_sparse_moe (the convolutions q_ / k_ / v_conv1d apart are read
                      # as they are: _kda_slice_of)
                      "kimi_linear": ((r"\.self_attn\.(f_a_proj|f_b_proj)\.", r".self_attn.forget_gate.\1."),
                                      (r"\.self_attn\.(dt_bias|A_log)$", r".self_attn.forget_gate.\1"),
                                      (r"\.block_sparse_moe\.", ".mlp.")),
                      # Granite 3 MoE's block (block_sparse_moe: transformers' names, and the published input_linear /
                      # output_linear / router.layer, as its conversion_mapping.py renames them) under the MoE's
                      "granitemoe": ((r"\.block_sparse_moe\.input_linear\.weight$", ".mlp.experts.gate_up_proj"),
                                     (r"\.block_sparse_moe\.output_linear\.weight$", ".mlp.experts.down_proj"),
                                     (r"\.block_sparse_moe\.router\.(layer\.)?weight$", ".mlp.gate.weight"),
                                     (r"\.block_sparse_moe\.", ".mlp.")),
                      # Nemotron-H: the published backbone.* names (and transformers' model.*) under the layout's:
                      # each block's mixer as self_attn / mlp / mamba by its tensors, its norm as input_layernorm
                      "nemotron_h": ((r"^backbone\.", "model."), (r"^model\.embeddings\.", "model.embed_tokens."),
                                     (r"^model\.norm_f\.", "model.norm."),
                                     (r"(\.layers\.\d+)\.norm\.", r"\1.input_layernorm."),
                                     (r"\.mixer\.(q_proj|k_proj|v_proj|o_proj)\.", r".self_attn.\1."),
                                     (r"\.mixer\.(up_proj|down_proj)\.", r".mlp.\1."),
                                     (r"\.mixer\.(gate|experts|shared_experts|fc1_latent_proj|fc2_latent_proj)\.",
                                      r".mlp.\1."),
                                     (r"\.mixer\.(in_proj|conv1d|out_proj|norm)\.", r".mamba.\1."),
                                     (r"\.mixer\.(dt_bias|A_log|D)$", r".mamba.\1")),
                      # Granite 4.0's dense MLP (shared_mlp: fused [gate | up] rows, as Phi-3's gate_up_proj)
                      "granitemoehybrid": ((r"\.shared_mlp\.input_linear\.", ".mlp.gate_up_proj."),
                                           (r"\.shared_mlp\.output_linear\.", ".mlp.down_proj."),
                                           # Granite 4.0-H Tiny / Small's experts beside it, as Granite 3 MoE's
                                           (r"\.block_sparse_moe\.input_linear\.weight$", ".mlp.experts.gate_up_proj"),
                                           (r"\.block_sparse_moe\.output_linear\.weight$", ".mlp.experts.down_proj"),
                                           (r"\.block_sparse_moe\.router\.(layer\.)?weight$", ".mlp.gate.weight"),
                                           (r"\.block_sparse_moe\.", ".mlp."))}


# Qwen3-Next's / Qwen3.5's MTP layer (mtp.*, vLLM's qwen3_next_mtp names; transformers does not load it) under
# GLM-4.5's names for its MTP layer (model.layers.{L}.*, L the decoder's layer count), which mtp_layer_shards reads:
# mtp.layers.{i}.* is the block of MTP layer L + i, the rest MTP layer L's own tensors
MTP_LAYER = re.compile(r"^mtp\.layers\.(\d+)\.")
MTP_OWN_NAMES = (("mtp.fc.", "eh_proj."), ("mtp.pre_fc_norm_embedding.", "enorm."), ("mtp.pre_fc_norm_hidden.", "hnorm."),
                 ("mtp.norm.", "shared_head.norm."))


def _mtp_layout_name(name: str, num_layers: int) -> str:
    """A Qwen3-Next / Qwen3.5 checkpoint's mtp.* name under GLM-4.5's MTP names (MTP_OWN_NAMES); a name of
    neither kind as it is."""
    match = MTP_LAYER.match(name)
    if match:
        return f"model.layers.{num_layers + int(match.group(1))}.{name[match.end():]}"
    for prefix, own in MTP_OWN_NAMES:
        if name.startswith(prefix):
            return f"model.layers.{num_layers}.{own}{name[len(prefix):]}"
    return name


def layout_name(name: str, model_type: str | None = None, num_layers: int | None = None) -> str | None:
    """A checkpoint or state_dict name under the names this layout reads (the shards' keys), or None for a
    tensor that is not the text decoder's: a multimodal checkpoint's text decoder read as a causal LM's
    (TEXT_PREFIXES), a family's published names as transformers renames them (CHECKPOINT_RENAMES, by
    ``model_type``), Qwen3-Next's / Qwen3.5's MTP layer (mtp.*) as the layer past the decoder's ``num_layers``
    (MTP_OWN_NAMES), and Llama 4's `feed_forward` block as `mlp` (no other family has a `.feed_forward.`
    tensor)."""
    if name.startswith(NOT_TEXT) or name.startswith(NOT_READ.get(model_type, ())) \
            or name.endswith(NOT_READ_SUFFIXES.get(model_type, ())):
        return None
    if num_layers is not None and name.startswith("mtp."):
        name = _mtp_layout_name(name, num_layers)
    for prefix, stands_for in TEXT_PREFIXES:
        if name.startswith(prefix):
            name = stands_for + name[len(prefix):]
            break
    for pattern, replacement in CHECKPOINT_RENAMES.get(model_type, ()):
        name = re.sub(pattern, replacement, name)
    return name.replace(".feed_forward.", ".mlp.")


@dataclass(frozen=True)
class Slice:
    """A rank's part of a tensor: [start, stop) along dim (0 rows, 1 columns; 2 for the experts'
    3-D tensors). slice_of may give a tuple of them along one dim: their parts concatenated."""

    dim: int
    start: int
    stop: int


@dataclass(frozen=True)
class LlamaShardPlan:
    """The layout above for one rank; sizes as the config gives them."""

    world: int
    rank: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    moe_layout: str | None = None  # "swiglu" / "swiglu_t" / "gpt_oss": a MoE family's experts (sharding_moe.py)
    expert_intermediate: int = 0  # an expert's width
    shared_intermediate: int = 0  # the shared MLP's width (Qwen2-MoE's shared expert, GLM-4.5's shared experts)
    num_layers: int | None = None  # the decoder's layers; a checkpoint's layers past them are not read
    head_norms: bool = False  # q_norm / k_norm weigh each head apart ([H, D]: Command R+'s): split by heads
    mla: tuple | None = None  # latent attention: a head's (query rows dn + dr, kv_b rows dn + dv, o columns dv)
    delta: tuple | None = None  # Gated DeltaNet layers: (key heads, value heads, key dim, value dim)
    projection_norms: bool = False  # q_norm / k_norm over the whole projection (WHOLE_PROJECTION_NORMS): as its rows
    model_type: str | None = None  # whose checkpoint names layout_name reads (CHECKPOINT_RENAMES)
    # each layer's (head_dim, KV heads, MLP width) where they differ by layer (Gemma 4's: layer_dims_of), else None
    layer_dims: tuple | None = None
    # the value heads' width where it is not head_dim (MiMo-V2-Flash's v_head_dim: v_proj's rows, o_proj's
    # columns), else None
    value_dim: int | None = None
    # each layer's query heads where they differ by layer (Laguna's num_attention_heads_per_layer), else None
    layer_heads: tuple | None = None
    # the attention output gate's rows a query head (Laguna's g_proj: 1 with a gate a head, head_dim with one an
    # element; AFMoE's gate_proj: head_dim)
    gate_rows: int | None = None
    # a Mamba1 mixer's channels (Jamba's mamba_expand x hidden_size: mamba_channels_of), else None
    mamba_channels: int | None = None
    # Kimi Delta Attention layers (Kimi Linear): (their indices, heads, head_dim) (kda_of), else None
    kda: tuple | None = None
    # Mamba2 layers (Nemotron-H, Granite 4.0-H, Bamba, Falcon-H1): (heads, head_dim, groups, state) (mamba2_of)
    mamba2: tuple | None = None

    @classmethod
    def for_config(cls, config, world: int, rank: int) -> "LlamaShardPlan":
        """The plan of ``rank`` of ``world`` for a Llama-family config; ValueError naming what does
        not divide."""
        if isinstance(world, bool) or not isinstance(world, int) or world < 1 or not 0 <= rank < world:
            raise ValueError(f"tensor parallelism needs 0 <= rank < world size >= 1, got rank {rank} of {world}")
        heads, layer_dims = config.num_attention_heads, layer_dims_of(config)
        if layer_dims is not None:  # widths by layer (Gemma 4's config refuses a global head_dim): layer 0's as the plan's
            head_dim, kv_heads = layer_dims[0][:2]
        else:
            kv_heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
            head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
        mla = None
        if getattr(config, "kv_lora_rank", None):  # latent attention (DeepSeek-V2 / V3): its per-head widths
            nope, rope, value = config.qk_nope_head_dim, config.qk_rope_head_dim, config.v_head_dim
            mla = (nope + rope, nope + value, value)
        delta = None
        if getattr(config, "linear_num_key_heads", None):  # Qwen3-Next / Qwen3.5's recurrent layers
            delta = (config.linear_num_key_heads, config.linear_num_value_heads, config.linear_key_head_dim,
                     config.linear_value_head_dim)
        # the dense MLPs' width (Llama 4's beside its MoE layers: intermediate_size_mlp; Granite 4.0's shared_mlp:
        # shared_intermediate_size, its intermediate_size being the experts')
        intermediate = getattr(config, "intermediate_size_mlp", None) or (
            config.shared_intermediate_size if getattr(config, "model_type", None) == "granitemoehybrid" else None) \
            or config.intermediate_size
        plan = cls(world, rank, heads, kv_heads, head_dim, intermediate, config.vocab_size,
                   *moe_sizes(config), getattr(config, "num_hidden_layers", None),
                   bool(getattr(config, "use_qk_norm", False)) and config.model_type == "cohere", mla, delta,
                   getattr(config, "model_type", None) in WHOLE_PROJECTION_NORMS, getattr(config, "model_type", None),
                   layer_dims, value_dim_of(config) if mla is None else None, layer_heads_of(config),
                   gate_rows_of(config, head_dim), mamba_channels_of(config), kda_of(config), mamba2_of(config))
        plan.check()
        return plan

    def check(self) -> None:
        n = self.world
        for name, size in (("num_attention_heads", self.heads), ("intermediate_size", self.intermediate),
                           ("vocab_size", self.vocab), ("the experts' width", self.expert_intermediate),
                           ("the shared MLP's width", self.shared_intermediate)):
            if size % n:
                raise ValueError(f"tensor parallelism over {n} ranks: {name} {size} is not divisible by {n}")
        if self.kda is not None and self.kda[1] % n:
            raise ValueError(f"tensor parallelism over {n} ranks: linear_num_heads {self.kda[1]} is not divisible by {n}")
        if self.mamba2 is not None:
            heads, _, groups, _ = self.mamba2
            if heads % n:
                raise ValueError(f"tensor parallelism over {n} ranks: the Mamba2 layers' {heads} heads are not divisible "
                                 f"by {n}")
            if groups % n and n % groups:
                raise ValueError(f"tensor parallelism over {n} ranks: the Mamba2 layers' n_groups {groups} neither "
                                 f"divides nor is divisible by {n}")
        if self.mamba_channels is not None and self.mamba_channels % n:
            raise ValueError(f"tensor parallelism over {n} ranks: the Mamba layers' {self.mamba_channels} channels are "
                             f"not divisible by {n}")
        if self.delta is not None:
            for name, size in (("linear_num_key_heads", self.delta[0]), ("linear_num_value_heads", self.delta[1])):
                if size % n:
                    raise ValueError(f"tensor parallelism over {n} ranks: {name} {size} is not divisible by {n}")
        if self.kv_heads % n and n % self.kv_heads:
            raise ValueError(f"tensor parallelism over {n} ranks: num_key_value_heads {self.kv_heads} neither divides "
                             f"nor is divisible by {n} (each rank's query heads must read whole KV heads)")
        for i, heads in enumerate(self.layer_heads or ()):
            if heads % n:
                raise ValueError(f"tensor parallelism over {n} ranks: layer {i}'s {heads} query heads do not split over {n}")
        for i, (_, kv_heads, width) in enumerate(self.layer_dims or ()):
            if (kv_heads % n and n % kv_heads) or width % n:
                raise ValueError(f"tensor parallelism over {n} ranks: layer {i}'s {kv_heads} KV heads or MLP width {width} "
                                 f"do not split over {n}")

    # -- sizes on this rank ---------------------------------------------------------------------
    @property
    def kv_replicated(self) -> bool:
        """Fewer KV heads than ranks: each KV head is held by world / kv_heads ranks."""
        return self.kv_heads < self.world

    @property
    def local_heads(self) -> int:
        return self.heads // self.world

    @property
    def local_kv_heads(self) -> int:
        return 1 if self.kv_replicated else self.kv_heads // self.world

    @property
    def kv_start(self) -> int:
        """The first KV head this rank holds."""
        return self.rank * self.kv_heads // self.world if self.kv_replicated else self.rank * self.local_kv_heads

    @property
    def vocab_part(self) -> int:
        return self.vocab // self.world

    @property
    def vocab_start(self) -> int:
        return self.rank * self.vocab_part

    def describe(self) -> str:
        kv = (f"KV heads replicated ({self.kv_heads} over {self.world} ranks: head {self.kv_start} here)"
              if self.kv_replicated else f"{self.local_kv_heads} of {self.kv_heads} KV heads")
        return (f"rank {self.rank} of {self.world}: {self.local_heads} of {self.heads} query heads, {kv}, "
                f"{self.intermediate // self.world} of {self.intermediate} MLP columns, "
                + (f"{self.expert_intermediate // self.world} of {self.expert_intermediate} columns of every expert, "
                   if self.moe_layout else "") + "vocabulary "
                f"[{self.vocab_start}, {self.vocab_start + self.vocab_part})")

    def layout_name(self, name: str) -> str | None:
        """layout_name for this plan's family."""
        return layout_name(name, self.model_type, self.num_layers)

    # -- the slice of each checkpoint tensor ----------------------------------------------------
    def slice_of(self, name: str) -> Slice | tuple | None:
        """This rank's slice of the checkpoint tensor ``name`` (a tuple: parts concatenated), or
        None (replicated: whole)."""
        if self.layer_dims is not None:  # a layer's tensors by that layer's widths
            match = _LAYER.match(name)
            if match:
                head_dim, kv_heads, width = self.layer_dims[int(match.group(1))]
                return dataclasses.replace(self, head_dim=head_dim, kv_heads=kv_heads, intermediate=width,
                                           layer_dims=None).slice_of(name)
        if self.layer_heads is not None:  # a layer's tensors by that layer's query heads
            match = _LAYER.match(name)
            if match:
                return dataclasses.replace(self, heads=self.layer_heads[int(match.group(1))],
                                           layer_heads=None).slice_of(name)
        expert, part = moe_slice_of(self, name, Slice)
        if expert:
            return part
        if self.kda is not None and ".self_attn." in name:  # Kimi Linear: its KDA layers' self_attn is not the MLA's
            match = _LAYER.match(name)
            if match and int(match.group(1)) in self.kda[0]:
                return self._kda_slice_of(name)
        if self.mla is not None and ".self_attn." in name:
            return self._mla_slice_of(name)
        if self.delta is not None and ".linear_attn." in name:
            return self._delta_slice_of(name)
        if self.mamba2 is not None and ".mamba." in name:
            return self._mamba2_slice_of(name)
        if self.mamba_channels is not None and ".mamba." in name:
            return self._mamba_slice_of(name)
        if self.model_type in QUERY_GATED_TYPES and name.endswith(".self_attn.q_proj.weight"):  # [q | gate] rows
            rows = 2 * self.head_dim
            return Slice(0, self.rank * self.local_heads * rows, (self.rank + 1) * self.local_heads * rows)
        d, i = self.head_dim, self.intermediate // self.world
        q = Slice(0, self.rank * self.local_heads * d, (self.rank + 1) * self.local_heads * d)
        kv = Slice(0, self.kv_start * d, (self.kv_start + self.local_kv_heads) * d)
        mlp = Slice(0, self.rank * i, (self.rank + 1) * i)
        if self.value_dim is not None:  # value heads of their own width: v_proj's rows, o_proj's columns by it
            vd = self.value_dim
            if name.endswith("self_attn.v_proj.weight"):
                return Slice(0, self.kv_start * vd, (self.kv_start + self.local_kv_heads) * vd)
            if name.endswith("self_attn.o_proj.weight"):
                return Slice(1, self.rank * self.local_heads * vd, (self.rank + 1) * self.local_heads * vd)
        if name in VOCAB:
            return Slice(0, self.vocab_start, self.vocab_start + self.vocab_part)
        if self.model_type == "minimax" and name.endswith(("self_attn.qkv_proj.weight", "self_attn.output_gate.weight",
                                                          "self_attn.out_proj.weight", "self_attn.norm.weight")):
            return self._lightning_slice_of(name)
        if "self_attn.qkv_proj." in name:  # Phi-3: q | k | v rows in one tensor -> this rank's rows of each
            q_rows, kv_rows = self.heads * d, self.kv_heads * d
            return (q, Slice(0, q_rows + kv.start, q_rows + kv.stop), Slice(0, q_rows + kv_rows + kv.start,
                                                                             q_rows + kv_rows + kv.stop))
        if name.endswith(("self_attn.gate_proj.weight", "self_attn.g_proj.weight")):  # the output gate's rows of
            # this rank's heads (AFMoE's and Laguna's per element: q's; Laguna's per head: a row each)
            rows = self.gate_rows
            return Slice(0, self.rank * self.local_heads * rows, (self.rank + 1) * self.local_heads * rows)
        if "mlp.gate_up_proj." in name:  # Phi-3: gate | up rows -> this rank's columns of each
            return mlp, Slice(0, self.intermediate + mlp.start, self.intermediate + mlp.stop)
        for suffix, part in (("self_attn.q_proj.", q), ("self_attn.k_proj.", kv), ("self_attn.v_proj.", kv),
                             ("mlp.gate_proj.", mlp), ("mlp.up_proj.", mlp)):
            if suffix in name:
                return part
        if name.endswith("self_attn.o_proj.weight"):
            return Slice(1, q.start, q.stop)
        if self.projection_norms and name.endswith("self_attn.q_norm.weight"):
            return q
        if self.projection_norms and name.endswith("self_attn.k_norm.weight"):
            return kv
        if name.endswith("self_attn.sinks") or (self.head_norms and name.endswith("self_attn.q_norm.weight")):
            return Slice(0, self.rank * self.local_heads, (self.rank + 1) * self.local_heads)  # per query head
        if self.head_norms and name.endswith("self_attn.k_norm.weight"):
            return Slice(0, self.kv_start, self.kv_start + self.local_kv_heads)
        if name.endswith("mlp.down_proj.weight") or name.endswith("mlp.c_proj.weight"):  # StarCoder2's c_proj too
            return Slice(1, mlp.start, mlp.stop)
        if ".mlp.c_fc." in name:  # StarCoder2's plain MLP: c_fc's rows (and bias), as gate / up's
            return mlp
        return None


    def _mamba_slice_of(self, name: str) -> Slice | tuple | None:
        """A Mamba1 mixer's tensor by this rank's channels: in_proj's rows of each of [x | z], the convolution's,
        dt_proj's, A_log's and D's rows, x_proj's and out_proj's columns (their products summed over the ranks);
        the dt / B / C norms whole."""
        c = self.mamba_channels
        first, last = self.rank * c // self.world, (self.rank + 1) * c // self.world
        if name.endswith("mamba.in_proj.weight"):
            return Slice(0, first, last), Slice(0, c + first, c + last)
        if name.endswith(("mamba.x_proj.weight", "mamba.out_proj.weight")):
            return Slice(1, first, last)
        if name.endswith(("mamba.conv1d.weight", "mamba.conv1d.bias", "mamba.dt_proj.weight", "mamba.dt_proj.bias",
                          "mamba.A_log", "mamba.D")):
            return Slice(0, first, last)
        return None  # Jamba's dt / B / C layernorms

    @property
    def mamba2_groups(self) -> tuple:
        """The Mamba2 groups [first, last) whose B / C this rank reads: G / N of its own, or (N a multiple of G) the
        one group its heads belong to, which N / G ranks share."""
        heads, _, groups, _ = self.mamba2
        if groups % self.world == 0:
            return self.rank * groups // self.world, (self.rank + 1) * groups // self.world
        first = self.rank * groups // self.world
        return first, first + 1

    def _mamba2_slice_of(self, name: str) -> Slice | tuple | None:
        """A Mamba2 mixer's tensor by this rank's heads: in_proj's [z | x | B | C | dt] rows (z, x, dt by heads, B
        and C by mamba2_groups), the convolution's [x | B | C] rows, dt_bias / A_log / D and the gated norm's
        weights by heads, out_proj's columns."""
        heads, p, groups, n = self.mamba2
        h0, h1 = self.rank * heads // self.world, (self.rank + 1) * heads // self.world
        g0, g1 = self.mamba2_groups
        inner, width = heads * p, groups * n

        def rows(base, first, last, size):
            return Slice(0, base + first * size, base + last * size)

        if name.endswith("mamba.in_proj.weight"):
            return (rows(0, h0, h1, p), rows(inner, h0, h1, p), rows(2 * inner, g0, g1, n),
                    rows(2 * inner + width, g0, g1, n), rows(2 * inner + 2 * width, h0, h1, 1))
        if name.endswith(("mamba.conv1d.weight", "mamba.conv1d.bias")):
            return rows(0, h0, h1, p), rows(inner, g0, g1, n), rows(inner + width, g0, g1, n)
        if name.endswith(("mamba.dt_bias", "mamba.A_log", "mamba.D")):
            return rows(0, h0, h1, 1)
        if name.endswith("mamba.norm.weight"):
            return rows(0, h0, h1, p)
        if name.endswith("mamba.out_proj.weight"):
            return Slice(1, h0 * p, h1 * p)
        return None

    def _kda_slice_of(self, name: str) -> Slice | tuple | None:
        """A Kimi Delta Attention tensor by this rank's heads: q / k / v / f_b / g_b rows, dt_bias and b_proj's rows,
        A_log's heads ([1, 1, H, 1]), the convolution's rows of each of its [q | k | v] parts, o_proj's columns; f_a /
        g_a and the per-head output norm whole."""
        _, heads, d = self.kda
        first, last = self.rank * heads // self.world, (self.rank + 1) * heads // self.world
        rows = Slice(0, first * d, last * d)
        if name.endswith(("q_proj.weight", "k_proj.weight", "v_proj.weight", "f_b_proj.weight", "g_b_proj.weight",
                          "forget_gate.dt_bias", "q_conv1d.weight", "k_conv1d.weight", "v_conv1d.weight")):
            return rows  # (a checkpoint's convolutions apart: each by its rows)
        if name.endswith("conv1d.weight"):
            return tuple(Slice(0, part * heads * d + first * d, part * heads * d + last * d) for part in range(3))
        if name.endswith("b_proj.weight"):
            return Slice(0, first, last)
        if name.endswith("forget_gate.A_log"):
            return Slice(2, first, last)
        if name.endswith("o_proj.weight"):
            return Slice(1, first * d, last * d)
        return None

    def _lightning_slice_of(self, name: str) -> Slice:
        """A MiniMax lightning layer's tensor by this rank's heads: qkv_proj's rows (a head's [q | k | v], 3 D
        rows), output_gate's rows and the output norm's weights (D a head), out_proj's columns."""
        first, last, d = self.rank * self.local_heads, (self.rank + 1) * self.local_heads, self.head_dim
        if name.endswith("qkv_proj.weight"):
            return Slice(0, first * 3 * d, last * 3 * d)
        return Slice(1 if name.endswith("out_proj.weight") else 0, first * d, last * d)

    def _mla_slice_of(self, name: str) -> Slice | None:
        """An MLA attention tensor's slice: this rank's heads' rows of q_proj / q_b_proj and
        kv_b_proj, their columns of o_proj; the latent's projections and norms whole."""
        first, last = self.rank * self.local_heads, (self.rank + 1) * self.local_heads
        query, kv_b, value = self.mla
        if ".self_attn.q_proj." in name or ".self_attn.q_b_proj." in name:
            return Slice(0, first * query, last * query)
        if ".self_attn.kv_b_proj." in name:
            return Slice(0, first * kv_b, last * kv_b)
        if name.endswith(".self_attn.o_proj.weight"):
            return Slice(1, first * value, last * value)
        return None  # q_a_proj, q_a_layernorm, kv_a_proj_with_mqa, kv_a_layernorm, o_proj's bias (rank 0 adds it)


    def _delta_slice_of(self, name: str) -> Slice | tuple | None:
        """A Gated DeltaNet tensor's slice: this rank's key heads of [q | k | v] (and of Qwen3-Next's groups),
        its value heads of v / z / b / a and out_proj's columns; the gated norm whole."""
        nk, nv, dk, dv = self.delta
        lk, lv = nk // self.world, nv // self.world
        key, value = (self.rank * lk, (self.rank + 1) * lk), (self.rank * lv, (self.rank + 1) * lv)
        if name.endswith("in_proj_qkvz.weight") or name.endswith("in_proj_ba.weight"):
            per_key = 2 * dk + 2 * (nv // nk) * dv if "qkvz" in name else 2 * (nv // nk)  # rows per key head's group
            return Slice(0, key[0] * per_key, key[1] * per_key)
        if name.endswith("in_proj_qkv.weight") or name.endswith("conv1d.weight"):  # [q | k | v] channels
            return (Slice(0, key[0] * dk, key[1] * dk), Slice(0, nk * dk + key[0] * dk, nk * dk + key[1] * dk),
                    Slice(0, 2 * nk * dk + value[0] * dv, 2 * nk * dk + value[1] * dv))
        if name.endswith(("linear_attn.q_proj.weight", "linear_attn.k_proj.weight")):  # OLMo Hybrid's, apart
            return Slice(0, key[0] * dk, key[1] * dk)
        if name.endswith(("in_proj_z.weight", "linear_attn.v_proj.weight", "linear_attn.g_proj.weight")):
            return Slice(0, value[0] * dv, value[1] * dv)
        if name.endswith(("in_proj_b.weight", "in_proj_a.weight", "linear_attn.b_proj.weight",
                          "linear_attn.a_proj.weight", ".A_log", ".dt_bias")):
            return Slice(0, *value)
        if name.endswith(("out_proj.weight", "linear_attn.o_proj.weight")):
            return Slice(1, value[0] * dv, value[1] * dv)
        return None  # the gated norm (over a head's dv), a conv bias (none in these models)


def layer_heads_of(config) -> tuple | None:
    """Each layer's query heads where a config lists them (Laguna's num_attention_heads_per_layer) and they differ
    from num_attention_heads somewhere, else None."""
    heads = getattr(config, "num_attention_heads_per_layer", None)
    if not heads or all(h == config.num_attention_heads for h in heads):
        return None
    return tuple(int(h) for h in heads)


def kda_of(config) -> tuple | None:
    """A Kimi Linear config's KDA layers: (their indices, linear_num_heads, linear_head_dim), else None."""
    if getattr(config, "model_type", None) != "kimi_linear":
        return None
    layers = tuple(i for i, kind in enumerate(config.layer_types) if kind == "linear_attention")
    return layers, int(config.linear_num_heads), int(config.linear_head_dim)


def mamba2_of(config) -> tuple | None:
    """The Mamba2 layers' sizes (heads, head_dim, groups, state) of a Nemotron-H or Falcon-H1 config, or of a Granite
    4.0-H / Bamba one with Mamba2 layers, else None."""
    model_type = getattr(config, "model_type", None)
    if model_type == "nemotron_h":
        return int(config.mamba_num_heads), int(config.mamba_head_dim), int(config.n_groups), int(config.ssm_state_size)
    if model_type == "falcon_h1" or (model_type in ("granitemoehybrid", "bamba")
                                     and "linear_attention" in (getattr(config, "layer_types", None) or ())):
        return int(config.mamba_n_heads), int(config.mamba_d_head), int(config.mamba_n_groups), int(config.mamba_d_state)
    return None


def mamba_channels_of(config) -> int | None:
    """A Jamba config's Mamba1 channels (mamba_expand x hidden_size), else None."""
    if getattr(config, "model_type", None) != "jamba":
        return None
    return int(config.mamba_expand * config.hidden_size)


def gate_rows_of(config, head_dim: int) -> int | None:
    """The attention output gate's rows a query head: Laguna's g_proj one (gating True / "per-head") or head_dim
    ("per-element"); AFMoE's gate_proj head_dim; None for a family without the gate."""
    model_type = getattr(config, "model_type", None)
    if model_type == "laguna":
        return 1 if config.gating in (True, "per-head") else head_dim
    return head_dim if model_type == "afmoe" else None


def value_dim_of(config) -> int | None:
    """The value heads' width where a (non-latent) config sets one apart from head_dim (MiMo-V2-Flash's v_head_dim),
    else None."""
    value = getattr(config, "v_head_dim", None)
    if not isinstance(value, int):  # (head_dim unread: Gemma 4's heterogeneous config raises on a global head_dim)
        return None
    head_dim = getattr(config, "head_dim", None)
    return value if head_dim is not None and value != head_dim else None


def layer_dims_of(config) -> tuple | None:
    """Gemma 4's (gemma4_text, gemma4_unified_text) per-layer widths: each layer's (head_dim, KV heads, MLP width) -- its full layers' heads
    global_head_dim wide and num_global_key_value_heads of them where set, a KV-sharing layer's MLP twice as wide where
    use_double_wide_mlp (transformers' per_layer_config and Gemma4TextMLP) --; MiMo-V2-Flash's (its sliding layers'
    KV heads twice the full ones': MiMoV2FlashAttention); Cohere 2 MoE's (its dense prefix layers'
    prefix_dense_intermediate_size); None for every other family."""
    if getattr(config, "model_type", None) == "cohere2_moe":  # its dense prefix layers' MLP width (None: intermediate)
        dense = config.prefix_dense_intermediate_size or config.intermediate_size
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        return tuple((int(head_dim), int(config.num_key_value_heads),
                      int(dense if kind == "dense" else config.intermediate_size)) for kind in config.mlp_layer_types)
    if getattr(config, "model_type", None) == "mimo_v2_flash":
        return tuple((int(config.head_dim), int(config.num_key_value_heads) * (2 if kind == "sliding_attention" else 1),
                      int(config.intermediate_size)) for kind in config.layer_types)
    if getattr(config, "model_type", None) not in ("gemma4_text", "gemma4_unified_text"):
        return None
    modes = config.kv_sharing_modes
    dims = []
    for i in range(config.num_hidden_layers):
        layer = config.per_layer_config[i]
        wide = 2 if config.use_double_wide_mlp and modes[i] == "reuse" else 1
        dims.append((int(layer.head_dim), int(layer.num_key_value_heads), int(config.intermediate_size) * wide))
    return tuple(dims)


def _parts(part) -> tuple:
    return part if isinstance(part, tuple) else (part,)


def take(tensor: torch.Tensor, part: Slice | tuple | None) -> torch.Tensor:
    """tensor's slice (a contiguous copy: the shard must not keep the whole tensor alive)."""
    if part is None:
        return tensor.detach().clone()
    views = [tensor.narrow(p.dim, p.start, p.stop - p.start) for p in _parts(part)]
    if len(views) > 1:
        return torch.cat(views, dim=_parts(part)[0].dim).detach()
    return views[0].detach().clone(memory_format=torch.contiguous_format)


def shards_from_state(state: dict, plan) -> dict:
    """layout name -> this rank's shard of every tensor of ``state`` (a model's state_dict) that is the text
    decoder's (layout_name)."""
    named = ((plan.layout_name(name), tensor) for name, tensor in state.items())
    return gather_experts({name: take(tensor, plan.slice_of(name)) for name, tensor in named if name is not None})


def checkpoint_files(path) -> dict:
    """name -> safetensors file of a checkpoint directory (model.safetensors or an index)."""
    index = os.path.join(path, "model.safetensors.index.json")
    if os.path.isfile(index):
        with open(index, encoding="utf-8") as f:
            weight_map = json.load(f)["weight_map"]
        return {name: os.path.join(path, file) for name, file in weight_map.items()}
    single = os.path.join(path, "model.safetensors")
    if not os.path.isfile(single):
        raise ValueError(f"no safetensors checkpoint in {path} (model.safetensors or model.safetensors.index.json)")
    from safetensors import safe_open

    with safe_open(single, framework="pt") as f:
        return {name: single for name in f.keys()}


def shards_from_safetensors(path, plan, *, dtype=None, device="cpu", select=None) -> dict:
    """layout name (layout_name) -> this rank's shard of every text-decoder tensor of the checkpoint in ``path``, each read as a
    slice (safe_open(...).get_slice(name)[rows] or [:, cols]: only those bytes are read), cast
    to ``dtype`` (None: as stored) and moved to ``device``. GPT-OSS's MXFP4 experts (name_blocks
    and name_scales) become the dequantized ``name`` (dtype None: bfloat16). select(name) -> bool:
    which tensors to read (default: all but the layers past the config's, a multi-token
    prediction layer, which mtp_layer_shards reads when asked). Block-quantized FP8 weights (with a
    <name>_scale_inv: DeepSeek-V3's, MiniMax-M2's, the Qwen3 FP8 releases') are read as this rank's slice
    of their bytes and scale blocks and dequantized (checkpoint_fp8.py; dtype None: bfloat16)."""
    from safetensors import safe_open

    files, by_file = checkpoint_files(path), {}
    select = select if select is not None else (lambda name: not _past_the_layers(name, plan))
    for name, file in files.items():
        local = plan.layout_name(name)  # the shard's key (None: not the text decoder's)
        if local is not None and select(local):
            by_file.setdefault(file, []).append((name, local))
    block = _fp8_block(path)
    shards = {}
    for file, names in by_file.items():
        with safe_open(file, framework="pt") as f:
            for name, local in names:
                if name.endswith(MXFP4_SUFFIXES):  # GPT-OSS's published experts: read with their scales
                    if name.endswith("_blocks"):
                        quantized = name[:-len("_blocks")]
                        shards[plan.layout_name(quantized)] = _read_mxfp4(f, file, files, quantized, plan, dtype).to(device)
                    continue
                if name.endswith(FP8_SCALE_SUFFIX):  # read with its FP8 weight
                    continue
                if name + FP8_SCALE_SUFFIX in files:  # a block-quantized FP8 weight (checkpoint_fp8.py)
                    shards[local] = _read_fp8(f, file, files, name, plan, block, dtype).to(device)
                    continue
                lazy, part = f.get_slice(name), plan.slice_of(local)
                if part is None:
                    tensor = lazy[:]
                else:
                    pieces = [lazy[(slice(None),) * p.dim + (slice(p.start, p.stop),)] for p in _parts(part)]
                    tensor = pieces[0] if len(pieces) == 1 else torch.cat(pieces, dim=_parts(part)[0].dim)
                shards[local] = tensor.to(device=device, dtype=dtype or tensor.dtype).contiguous()
    return gather_experts(shards)


# An MTP layer's tensors that are the target's own (the embedding and LM head, which the checkpoint
# may repeat inside the layer): not read.
MTP_SHARED = ("embed_tokens.weight", "shared_head.head.weight")


def mtp_layer_shards(path, plan, layer: int, *, dtype=None, device="cpu") -> dict:
    """This rank's slices of the multi-token prediction layer model.layers.{layer}.* in the
    checkpoint at ``path`` (GLM-4.5's; Qwen3-Next's / Qwen3.5's mtp.* under those names: layout_name), by
    the target's plan: its decoder block split as any layer (heads, every expert's width), enorm / hnorm /
    eh_proj / shared_head.norm whole."""
    prefix = f"model.layers.{layer}."
    shards = shards_from_safetensors(path, plan, dtype=dtype, device=device,
                                     select=lambda name: name.startswith(prefix) and not name.endswith(MTP_SHARED))
    if not shards:
        raise ValueError(f"the checkpoint at {path} has no MTP layer ({prefix}*)")
    return shards


def _past_the_layers(name: str, plan) -> bool:
    """A tensor of a layer the decoder does not have: GLM-4.5's and DeepSeek-V3's multi-token
    prediction layer (model.layers.{num_hidden_layers}.*, which transformers does not load either;
    Qwen3-Next's mtp.* read under that name)."""
    match = _LAYER.match(name)
    return plan.num_layers is not None and match is not None and int(match.group(1)) >= plan.num_layers


def _fp8_block(path) -> tuple:
    """The FP8 scale blocks' (rows, columns) of the checkpoint in ``path``: its config's
    quantization_config.weight_block_size (transformers' fp8 quant_method), 128 x 128 where it says none."""
    try:
        with open(os.path.join(path, "config.json"), encoding="utf-8") as f:
            quantization = json.load(f).get("quantization_config") or {}
    except OSError:
        quantization = {}
    rows, cols = quantization.get("weight_block_size") or (128, 128)
    return int(rows), int(cols)


def _read_fp8(f, file, files, name, plan, block, dtype):
    """The FP8 weight ``name`` (in the open file f, its scales in files' file for them) -> this rank's
    slice, dequantized (checkpoint_fp8.py)."""
    from safetensors import safe_open

    scales_file = files[name + FP8_SCALE_SUFFIX]
    if scales_file == file:
        return read_fp8(f.get_slice(name), f.get_slice(name + FP8_SCALE_SUFFIX), plan.slice_of(plan.layout_name(name)), block,
                        dtype)
    with safe_open(scales_file, framework="pt") as g:
        return read_fp8(f.get_slice(name), g.get_slice(name + FP8_SCALE_SUFFIX), plan.slice_of(plan.layout_name(name)), block,
                        dtype)


def _read_mxfp4(f, file, files, name, plan, dtype):
    """The MXFP4 tensor ``name`` (its _blocks in the open file f, its _scales in files' file for
    them) -> this rank's slice, dequantized (checkpoint_mxfp4.py)."""
    from safetensors import safe_open

    scales_file = files.get(name + "_scales")
    if scales_file is None:
        raise ValueError(f"the checkpoint has {name}_blocks but no {name}_scales")
    if scales_file == file:
        return read_mxfp4(f.get_slice(name + "_blocks"), f.get_slice(name + "_scales"), plan.slice_of(plan.layout_name(name)),
                          dtype)
    with safe_open(scales_file, framework="pt") as g:
        return read_mxfp4(f.get_slice(name + "_blocks"), g.get_slice(name + "_scales"), plan.slice_of(plan.layout_name(name)),
                          dtype)
