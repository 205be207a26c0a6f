"""ShardedCausalLM: one rank's shard of a causal LM (TP_MODEL_TYPES), standing in for the model
wherever the engine takes one (docs/architecture.md §10).

    ShardedCausalLM.from_pretrained(path, process_group)   each rank reads only its slices of
                                                           the checkpoint (runners/sharding.py)
    ShardedCausalLM.from_model(model, process_group)       each rank copies its slices of a model
                                                           it has loaded whole
It holds the shards (``shards``: checkpoint name -> tensor; the embedding slice is also its one
parameter, so that device / dtype / fingerprints read as for a model), ``config``, ``generation_config``,
the rank's ``plan`` (sharding.LlamaShardPlan), the group (``tp``: a TensorParallelGroup) and the
model's RoPE frequencies (``inv_freq`` float32, ``rope_scaling``). It has no forward: the
tensor-parallel paged runner (runners/paged_llama_tp.py) runs it. The vocabulary is the
config's (``get_output_embeddings()`` is None: no rank holds the whole head).
"""
import importlib

import torch

from ..distributed import as_tp_group
from .sharding import LlamaShardPlan, shards_from_safetensors, shards_from_state

# The Llama families whose layer is Llama's as runners/sharding.py splits it (separate q/k/v and
# gate/up by rows), each tested on 2 CPU ranks: CWM and Ministral 3 bring sliding layers (their
# windows in the kernels) and Ministral 3 its query temperature, Ministral its window by layer_types,
# SmolLM3 its NoPE layers (paged_llama.rotates); the MoE families split every expert by its width
# (runners/sharding_moe.py), GPT-OSS its sinks by heads; Phi-3's fused projections are read as this
# rank's rows of each part (sharding.slice_of's tuples); Granite's residual multiplier scales the
# summed branch on every rank; OLMoE's and MiniMax-M2's q/k norms over the whole projection take their
# statistics over every rank's slice; EXAONE 3.x, InternLM3 and IQuest-Coder are Llama's model under other names.
TP_LLAMA_TYPES = ("llama", "mistral", "qwen2", "qwen3", "cwm", "ministral", "ministral3", "smollm3", "phi3", "granite",
                  "granitemoe",  # Granite 3 MoE: its block_sparse_moe read as the MoE's names (CHECKPOINT_RENAMES)
                  "seed_oss", "mixtral", "qwen2_moe", "qwen3_moe", "gpt_oss", "glm4_moe", "exaone_moe", "solar_open",
                  # Kolibri-1 (its published router bias and post-branch norms read as transformers renames them), Flint
                  # (its published sinks likewise; a shared expert without a gate)
                  "kolibri1", "flint",
                  # q/k norms over the whole projection: its statistics over every rank's slice (one more
                  # all-reduce of [T, 1] each)
                  "olmoe", "minimax_m2",
                  # RoPE on interleaved pairs: each rank reorders its heads' q / k columns (paged_llama.INTERLEAVED_ROPE)
                  "ernie4_5", "ernie4_5_moe", "helium",
                  # transformers' LlamaForCausalLM under their own model_type (EXAONE 3.x's published checkpoints under
                  # their original names: sharding.CHECKPOINT_RENAMES)
                  "exaone", "internlm3", "iquestcoder",
                  # GLM-4 / GLM-4-0414: interleaved half rotation, fused gate_up_proj (Phi-3's split), the post-branch
                  # norms (GLM-4-0414) whole on every rank, after the branch's all-reduce
                  "glm", "glm4",
                  # HunYuan: per-head q/k norms after the rotation (whole on every rank); A13B's experts and its shared
                  # MLP by their width, its router (gate.wg) replicated
                  "hunyuan_v1_dense", "hunyuan_v1_moe",
                  # dots.llm1: GLM-4.5's MoE under Qwen3's attention
                  "dots1",
                  # Apertus: an ungated MLP (up rows, down columns) with xIELU, whose parameters every rank reads whole
                  "apertus",
                  # Arcee AFM: Llama's layer with an ungated ReLU² MLP
                  "arcee",
                  # Granite 4.0's dense transformers: shared_mlp's fused input_linear read as Phi-3's gate_up_proj
                  # (sharding.CHECKPOINT_RENAMES), Granite's scalars
                  "granitemoehybrid",
                  # Hy3: Qwen3's attention, its experts and shared MLP by their width, the router and correction whole
                  "hy_v3")
# Cohere (Command R / R+, Aya) and Cohere 2 (Command R7B, Command A): the same layout, their own
# runner (runners/paged_cohere_tp.py); Command R+'s per-head q/k norms split by heads.
TP_COHERE_TYPES = ("cohere", "cohere2", "cohere2_moe")
# Multi-head latent attention (runners/paged_mla_tp.py): heads split, the latent replicated; the MoE
# experts by their width; DeepSeek-V3.2's and GLM-5's indexers whole on every rank.
# (paged_mla.MLA_MODEL_TYPES: not imported here, below the runners.)
TP_MLA_TYPES = ("deepseek_v2", "deepseek_v3", "glm4_moe_lite", "deepseek_v32", "glm_moe_dsa", "youtu", "axk1")
# Hybrid recurrent models (runners/paged_qwen3_next_tp.py): Gated DeltaNet layers by heads (each rank its
# heads' states), gated attention layers by heads. (paged_qwen3_next.QWEN3_NEXT_TYPES.)
TP_HYBRID_TYPES = ("qwen3_next", "qwen3_5_text", "qwen3_5_moe_text")
# Gemma 1 / 2 / 3 (runners/paged_gemma_tp.py): the Llama layout, each branch's partials summed before its norm;
# Gemma 3's per-head q/k norms whole on every rank, a RoPE per layer type (and its multimodal checkpoints' text
# decoder: TEXT_DECODER_OF)
TP_GEMMA_TYPES = ("gemma", "gemma2", "gemma3_text", "vaultgemma")
# OLMo 2 / 3 (runners/paged_olmo2_tp.py): q/k norms over the whole projection (statistics over every rank's
# slice), each branch's partials summed before its norm; OLMo 3's RoPE per layer type
TP_OLMO_TYPES = ("olmo2", "olmo3", "exaone4", "flex_olmo")  # EXAONE 4.0: OLMo 2's layer with per-head q/k norms (whole on each rank)
# Llama 4 (runners/paged_llama4_tp.py): the Llama layout under its own names (sharding.layout_name), every
# expert and the shared one by their width; a multimodal checkpoint's text decoder (TEXT_DECODER_OF)
TP_LLAMA4_TYPES = ("llama4_text",)
# StarCoder2 (runners/paged_starcoder2_tp.py): the Llama layout with LayerNorms, biases and a plain MLP (c_fc rows,
# c_proj columns)
TP_STARCODER2_TYPES = ("starcoder2",)
# Gemma 4's text decoder (runners/paged_gemma4_tp.py): each layer split by its own head width and KV heads
# (sharding.layer_dims_of); its per-layer inputs whole on every rank
TP_GEMMA4_TYPES = ("gemma4_text", "gemma4_unified_text")
# AFMoE and Laguna (runners/paged_gated_attention_tp.py): the Llama layout, the attention's output gate split by the
# query heads, the experts and shared experts by their width; AFMoE's branch partials summed before its norms,
# Laguna's layers split by their own query heads
TP_GATED_TYPES = ("afmoe", "laguna")
# MiMo-V2-Flash (runners/paged_mimo_tp.py): each layer by its own KV heads (sharding.layer_dims_of), the values by
# their own width (the plan's value_dim), the sinks by query heads, the experts by their width
TP_MIMO_TYPES = ("mimo_v2_flash",)
# OLMo Hybrid (runners/paged_olmo_hybrid_tp.py): Qwen3.5's DeltaNet layout with its projections apart, OLMo 3's
# attention layers (whole-projection q/k norms' statistics over every rank's slice)
TP_OLMO_HYBRID_TYPES = ("olmo_hybrid",)
# MiniMax-Text-01 / M1 (runners/paged_minimax_tp.py): lightning layers by heads (each head's [q | k | v] rows,
# output_gate's rows, out_proj's columns, the output norm's weights; each rank its heads' states, the norm's mean
# square over every rank's), the attention layers and experts as the Llama / Mixtral layout
TP_MINIMAX_TYPES = ("minimax",)
# Jamba (runners/paged_jamba_tp.py): the Mamba1 layers by channels (each rank its channels' states and windows; x_proj's
# dt / B / C summed over the ranks before their norms), the attention layers (no positions) and experts as the Llama /
# MoE layout
TP_JAMBA_TYPES = ("jamba",)
# Kimi Linear (runners/paged_kimi_linear_tp.py): the KDA layers by heads (each rank its heads' states and windows), the
# latent attention as the MLA layout (heads split, the latent whole on every rank), the experts by their width
TP_KIMI_LINEAR_TYPES = ("kimi_linear",)
# Nemotron-H (runners/paged_nemotron_h_tp.py): the Mamba2 layers by heads (each rank its heads' states and windows, the
# B / C of its groups or of the one group it shares), attention without positions and relu² MLPs as Llama's; the dense
# models (its MoE blocks refused)
TP_NEMOTRON_H_TYPES = ("nemotron_h",)
# Granite 4.0-H without experts (granitemoehybrid with Mamba2 layers: registry.TP_BY_CONFIG; its dense transformers are
# TP_LLAMA_TYPES') and Bamba (runners/paged_granite_hybrid_tp.py): the Mamba2 layers as Nemotron-H's, attention and the
# MLP as Llama's
TP_GRANITE_HYBRID_TYPES = ("granitemoehybrid", "bamba")
# Falcon-H1 (runners/paged_falcon_h1_tp.py): the Mamba2 mixer beside the attention in every layer, both by heads, their
# partials summed by one all-reduce; the μP vector of each rank's in_proj rows from the config's multipliers
TP_FALCON_H1_TYPES = ("falcon_h1",)
TP_MODEL_TYPES = (TP_LLAMA_TYPES + TP_COHERE_TYPES + TP_MLA_TYPES + TP_HYBRID_TYPES + TP_GEMMA_TYPES + TP_OLMO_TYPES
                  + TP_LLAMA4_TYPES + TP_STARCODER2_TYPES + TP_GEMMA4_TYPES + TP_GATED_TYPES + TP_MIMO_TYPES
                  + TP_OLMO_HYBRID_TYPES + TP_MINIMAX_TYPES + TP_JAMBA_TYPES + TP_KIMI_LINEAR_TYPES + TP_NEMOTRON_H_TYPES
                  + ("bamba",) + TP_FALCON_H1_TYPES)


# model_types whose modeling module is another's (a multimodal family's text decoder)
MODULE_OF = {"qwen3_5_text": "qwen3_5", "qwen3_5_moe_text": "qwen3_5_moe", "llama4_text": "llama4", "gemma3_text": "gemma3",
             "gemma4_text": "gemma4", "gemma4_unified_text": "gemma4_unified",
             # transformers' LlamaForCausalLM under another model_type: Llama's rotary module
             "exaone": "llama", "internlm3": "llama", "iquestcoder": "llama"}
# multimodal checkpoints read as their text decoder (config.text_config; sharding.layout_name: its tensors)
TEXT_DECODER_OF = ("llama4", "gemma3", "gemma4", "gemma4_unified")


def text_config(config):
    """The config a tensor-parallel rank runs: a multimodal model's text_config (TEXT_DECODER_OF), else ``config``."""
    return config.text_config if getattr(config, "model_type", None) in TEXT_DECODER_OF else config


class _Embedding:
    def __init__(self, weight):
        self.weight = weight


def rotary_of(config):
    """The model family's own rotary module for ``config`` (transformers' *RotaryEmbedding: its
    inv_freq and attention_scaling are what the model itself would use); None where the model builds none (an OLMo
    Hybrid config without a rope_theta: every attention layer NoPE, as OlmoHybridModel.rotary_emb is None)."""
    if config.model_type == "olmo_hybrid" and (getattr(config, "rope_parameters", None) or {}).get("rope_theta") is None:
        return None
    if config.model_type in TP_JAMBA_TYPES + TP_KIMI_LINEAR_TYPES + TP_NEMOTRON_H_TYPES:  # attention without positions
        return None
    package = MODULE_OF.get(config.model_type, config.model_type)
    module = importlib.import_module(f"transformers.models.{package}.modeling_{package}")
    classes = sorted((getattr(module, name) for name in dir(module) if name.endswith("RotaryEmbedding")),
                     key=lambda klass: "Vision" in klass.__name__)  # a multimodal family: its text decoder's first
    if not classes:
        raise ValueError(f"transformers has no rotary embedding for model_type {config.model_type!r}")
    return classes[0](config=config)


class ShardedCausalLM(torch.nn.Module):
    """See the module docstring. Build it with from_pretrained / from_model."""

    def __init__(self, config, shards: dict, plan, group, rotary, generation_config=None):
        super().__init__()
        self.config, self.plan, self.tp = config, plan, group
        self.generation_config = generation_config
        self.shards = shards  # the runner may replace entries by views of its fused weights (one copy)
        embed = shards["model.embed_tokens.weight"]
        # The one registered parameter (never fused): device, dtype and the engine cache's fingerprint.
        self.embed_shard = torch.nn.Parameter(embed, requires_grad=False)
        # one RoPE table (inv_freq / rope_scaling / rope_type), or one per layer type (OLMo 3's: rope_tables keyed
        # by config.layer_types, inv_freq None); both as rope_tables {key: (inv_freq, scaling, rope_type)}, rope_keys
        if rotary is None:  # a model without positions in its attention (rotary_of's None)
            self.inv_freq = self.rope_scaling = self.rope_type = None
            self.rope_tables, self.rope_keys = {}, [None] * config.num_hidden_layers
        elif hasattr(rotary, "inv_freq"):
            self.inv_freq = rotary.inv_freq.detach().to(device=embed.device, dtype=torch.float32)
            self.rope_scaling = float(rotary.attention_scaling)
            self.rope_type = getattr(rotary, "rope_type", None)
            self.rope_tables = {None: (self.inv_freq, self.rope_scaling, self.rope_type)}
            self.rope_keys = [None] * config.num_hidden_layers
        else:
            kinds = sorted(set(config.layer_types))
            self.inv_freq, self.rope_scaling, self.rope_type = None, None, rotary.rope_type
            self.rope_tables = {kind: (getattr(rotary, f"{kind}_inv_freq").detach().to(device=embed.device,
                                                                                       dtype=torch.float32),
                                       float(getattr(rotary, f"{kind}_attention_scaling")), rotary.rope_type.get(kind))
                                for kind in kinds}
            self.rope_keys = list(config.layer_types[:config.num_hidden_layers])

    @classmethod
    def from_pretrained(cls, path, process_group=None, *, dtype=None, device=None, timeout=None) -> "ShardedCausalLM":
        """Each rank reads its slices of the checkpoint in ``path`` (config.json + safetensors),
        cast to ``dtype`` (None: as stored) on ``device`` (None: the CPU, or the current CUDA device
        under NCCL). process_group: a ProcessGroup (None: the default group) or a TensorParallelGroup."""
        from transformers import AutoConfig, GenerationConfig

        config = text_config(AutoConfig.from_pretrained(path))  # a multimodal checkpoint: its text decoder's
        group = as_tp_group(process_group if process_group is not None else _default_group(), timeout=timeout)
        plan = _plan(config, group)
        device = device if device is not None else group.device
        error = None
        try:  # a rank that cannot read its slices tells the others (failures.py), instead of leaving them waiting
            shards = shards_from_safetensors(path, plan, dtype=dtype, device=device)
            _tie(shards, config)
            try:
                generation_config = GenerationConfig.from_pretrained(path)
            except OSError:
                generation_config = GenerationConfig.from_model_config(config)
            rotary = rotary_of(config)
        except Exception as exc:  # noqa: BLE001 - raised on every rank by agree()
            error = exc
        group.agree(f"loading {path}", {}, error)
        return cls(config, shards, plan, group, rotary, generation_config)

    @classmethod
    def from_model(cls, model, process_group=None, *, timeout=None) -> "ShardedCausalLM":
        """This rank's shard of ``model`` (a Llama-family *ForCausalLM loaded whole on this rank):
        contiguous copies, so the shard does not keep the whole model alive."""
        group = as_tp_group(process_group if process_group is not None else _default_group(), timeout=timeout)
        config = text_config(model.config)  # a multimodal model (Gemma 3 4B-27B): its text decoder
        plan = _plan(config, group)
        error = shards = None
        try:
            shards = shards_from_state(model.state_dict(), plan)
            _tie(shards, config)
        except Exception as exc:  # noqa: BLE001 - raised on every rank by agree()
            error = exc
        group.agree("sharding the model", {}, error)
        rotary = getattr(model.model, "rotary_emb", None) or rotary_of(config)  # the multimodal model's: built anew
        return cls(config, shards, plan, group, rotary, getattr(model, "generation_config", None))

    def get_input_embeddings(self):
        return _Embedding(self.shards["model.embed_tokens.weight"])

    def get_output_embeddings(self):
        return None

    def forward(self, *args, **kwargs):
        raise NotImplementedError("a ShardedCausalLM runs through specdec_fast (generate / SpeculativeEngine / its "
                                  "paged runner), not by calling it")


def _default_group():
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_initialized():
        raise ValueError("tensor parallelism needs torch.distributed initialised (torch.distributed.init_process_group, "
                         "or run under torchrun)")
    return dist.group.WORLD


def _plan(config, group) -> LlamaShardPlan:
    if config.model_type not in TP_MODEL_TYPES:
        raise ValueError(f"tensor parallelism supports model_type {TP_MODEL_TYPES}, got {config.model_type!r}")
    return LlamaShardPlan.for_config(config, group.size, group.rank)


def _tie(shards: dict, config) -> None:
    """Tied embeddings: the vocab-parallel head IS this rank's embedding slice (one tensor)."""
    if "lm_head.weight" not in shards or getattr(config, "tie_word_embeddings", False):
        shards["lm_head.weight"] = shards["model.embed_tokens.weight"]
