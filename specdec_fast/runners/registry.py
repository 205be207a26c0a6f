"""The paged runner of each model family, in one table (model_type -> runner class), and its
tensor-parallel runner where one exists (TP_RUNNERS: a ShardedCausalLM's model_type -> class).

Adding a family = one file (a PagedRunnerBase subclass with ``_bind``, ``_decode`` and an
``unsupported_reason`` static method) + one row per model_type here (the Llama runner's rows come
from its own tuple, paged_llama.LLAMA_MODEL_TYPES, which its unsupported_reason also reads).
Nothing below this module imports it: paged_base.py knows no family, and the api, the tree
decoder and the tests ask here.
"""
from .hf import HFRunner, UnsupportedModelError, hf_refusal
from .paged_base import PagedRunnerBase
from .paged_cohere import PagedCohereRunner
from .paged_gemma import PagedGemmaRunner
from .paged_gemma4 import GEMMA4_MODEL_TYPES, PagedGemma4Runner
from .paged_gemma4_tp import TPPagedGemma4Runner
from .paged_gemma_tp import TPPagedGemmaRunner
from .paged_gpt2 import PagedGPT2Runner
from .paged_gpt_bigcode import PagedGPTBigCodeRunner
from .paged_gpt_neox import PagedGPTNeoXRunner
from .paged_jamba import JAMBA_TYPES, PagedJambaRunner
from .paged_jamba_tp import TPPagedJambaRunner
from .paged_kimi_linear import KIMI_LINEAR_TYPES, PagedKimiLinearRunner
from .paged_kimi_linear_tp import TPPagedKimiLinearRunner
from .paged_minimax import MINIMAX_TYPES, PagedMiniMaxRunner
from .paged_lfm2 import LFM2_TYPES, PagedLfm2Runner
from .paged_llama import LLAMA_MODEL_TYPES, PagedLlamaRunner
from .paged_mamba_lm import MAMBA_LM_TYPES, PagedMambaRunner
from .paged_nemotron_h_tp import TPPagedNemotronHRunner
from .paged_granite_hybrid_tp import TPPagedGraniteHybridRunner
from .paged_falcon_h1_tp import TPPagedFalconH1Runner
from .paged_llama4 import LLAMA4_MODEL_TYPES, PagedLlama4Runner
from .paged_llama4_tp import TPPagedLlama4Runner
from .paged_cohere_tp import TPPagedCohereRunner
from .paged_llama_tp import TPPagedLlamaRunner
from .paged_mla import MLA_MODEL_TYPES, PagedMlaRunner
from .paged_mimo import MIMO_TYPES, PagedMimoRunner
from .paged_mimo_tp import TPPagedMimoRunner
from .paged_minimax_tp import TPPagedMiniMaxRunner
from .paged_mla_tp import TPPagedMlaRunner
from .paged_falcon_h1 import FALCON_H1_TYPES, PagedFalconH1Runner
from .paged_granite_hybrid import PagedGraniteHybridRunner, granite_is_hybrid
from .paged_gated_attention import GATED_ATTENTION_TYPES, PagedGatedAttentionRunner
from .paged_gated_attention_tp import TPPagedGatedAttentionRunner
from .paged_nemotron_h import NEMOTRON_H_TYPES, PagedNemotronHRunner
from .paged_olmo import OLMO1_TYPES, PagedOlmoRunner
from .paged_phimoe import PHIMOE_TYPES, PagedPhimoeRunner
from .paged_olmo2 import PagedOlmo2Runner
from .paged_olmo_hybrid import OLMO_HYBRID_TYPES, PagedOlmoHybridRunner
from .paged_olmo_hybrid_tp import TPPagedOlmoHybridRunner
from .paged_olmo2_tp import TPPagedOlmo2Runner
from .paged_opt import PagedOPTRunner
from .paged_qwen3_next import QWEN3_NEXT_TYPES, PagedQwen3NextRunner
from .paged_qwen3_next_tp import TPPagedQwen3NextRunner
from .paged_starcoder2 import PagedStarcoder2Runner
from .paged_starcoder2_tp import TPPagedStarcoder2Runner
from .sharded_model import (TP_COHERE_TYPES, TP_GATED_TYPES, TP_GEMMA4_TYPES, TP_GEMMA_TYPES, TP_HYBRID_TYPES,
                            TP_JAMBA_TYPES, TP_KIMI_LINEAR_TYPES, TP_LLAMA4_TYPES, TP_LLAMA_TYPES, TP_MIMO_TYPES,
                            TP_MINIMAX_TYPES, TP_MLA_TYPES, TP_NEMOTRON_H_TYPES, TP_OLMO_HYBRID_TYPES, TP_OLMO_TYPES,
                            TP_STARCODER2_TYPES, ShardedCausalLM, text_config)

# The Llama runner's model types (paged_llama.LLAMA_MODEL_TYPES: Llama, Mistral, Qwen2, Qwen3, Phi-3 /
# Phi-4, Granite, SmolLM3, GLM-4, HunYuan, the MoE families, and Llama's layer under other names), Llama 4's
# (the Llama loop with chunked layers), then the families with runners of their own: OLMo 2 / 3 and EXAONE
# 4.0, Gemma 1 / 2 / 3 / 4, StarCoder2, GPT-NeoX, OPT, Cohere 1 / 2, GPT-BigCode, GPT-2, the MLA decoders
# (DeepSeek-V2 / V3 / V3.2, GLM-4.7-Flash, GLM-5), the hybrid recurrent ones (Qwen3-Next, Qwen3.5, Nemotron-H;
# Bamba, Falcon-H1, OLMo Hybrid, LFM2, Jamba, pure Mamba / Mamba2; Granite 4.0-H by BY_CONFIG), the gated-attention MoE ones (AFMoE, Laguna) and
# MiMo-V2-Flash.
PAGED_RUNNERS: dict[str, type[PagedRunnerBase]] = {
    **{model_type: PagedLlamaRunner for model_type in LLAMA_MODEL_TYPES},
    # Llama 4 Scout / Maverick: the Llama loop with chunked attention layers, NoPE layers' temperature, top-1 MoE
    **{model_type: PagedLlama4Runner for model_type in LLAMA4_MODEL_TYPES},
    **{model_type: PagedPhimoeRunner for model_type in PHIMOE_TYPES},  # Phi-3.5-MoE: LayerNorms, sparsemixer routing
    **{model_type: PagedOlmoRunner for model_type in OLMO1_TYPES},  # OLMo 1: weightless LayerNorms, clip_qkv
    "olmo2": PagedOlmo2Runner,
    "olmo3": PagedOlmo2Runner,  # OLMo 2's layer, sliding layers, a RoPE per layer type
    "exaone4": PagedOlmo2Runner,  # EXAONE 4.0: OLMo 2's layer with Llama's norms, per-head q/k norms, NoPE full layers
    "flex_olmo": PagedOlmo2Runner,  # FlexOlmo: OLMo 2's layer with OLMoE's experts as its MLP
    "gemma": PagedGemmaRunner,  # Gemma 1, CodeGemma: Llama's layer with Gemma's norms and embedding scale
    "gemma2": PagedGemmaRunner,  # Gemma 2 (attention soft-capping and sliding layers in the kernels)
    "vaultgemma": PagedGemmaRunner,  # VaultGemma: Gemma 2's layer without the norms of each branch's output
    "gemma3_text": PagedGemmaRunner,  # Gemma 3's text decoder (270M, 1B)
    "gemma3": PagedGemmaRunner,  # Gemma 3 4B / 12B / 27B (multimodal): its text decoder runs text prompts
    # Gemma 4 (its text decoder; gemma4: the multimodal model AutoModelForCausalLM loads): heads of two widths,
    # KV-sharing layers, per-layer inputs, a MoE block beside the MLP
    **{model_type: PagedGemma4Runner for model_type in GEMMA4_MODEL_TYPES},
    "starcoder2": PagedStarcoder2Runner,
    "nemotron": PagedStarcoder2Runner,  # Nemotron-4 / Minitron: LayerNorm1P, an ungated relu^2 MLP, a partial RoPE
    "stablelm": PagedStarcoder2Runner,  # StableLM 2: a gated MLP, per-head q / k LayerNorms, a parallel residual option
    "gpt_neox": PagedGPTNeoXRunner,  # Pythia, GPT-NeoX-20B, RedPajama-INCITE, ...
    "opt": PagedOPTRunner,
    "cohere": PagedCohereRunner,  # Command R / R+, Aya 23, Aya Expanse
    "cohere2": PagedCohereRunner,  # Command R7B, Command A: sliding RoPE layers, full NoPE ones
    "cohere2_moe": PagedCohereRunner,  # Cohere 2 MoE: Cohere 2's layer with experts, force_rope on the dense prefix
    "gpt_bigcode": PagedGPTBigCodeRunner,  # StarCoder 1, SantaCoder, WizardCoder
    "gpt2": PagedGPT2Runner,
    # multi-head latent attention, a latent cache entry per token: DeepSeek-V2 / V3 / R1, GLM-4.7-Flash; DeepSeek-V3.2
    # and GLM-5 (their sparse attention: runners/sparse_mla.py)
    **{model_type: PagedMlaRunner for model_type in MLA_MODEL_TYPES},
    # Qwen3-Next, Qwen3.5's text decoders: Gated DeltaNet layers (recurrent states rolled back) + attention
    **{model_type: PagedQwen3NextRunner for model_type in QWEN3_NEXT_TYPES},
    # Nemotron-H (8B / 47B / 56B, Nano 9B / 12B v2, Nemotron 3 Nano): Mamba2 layers (states rolled back) + attention,
    # MLP and MoE blocks
    **{model_type: PagedNemotronHRunner for model_type in NEMOTRON_H_TYPES},
    # Bamba (Bamba-9B): Granite 4.0-H's layer (Mamba2 / attention, a SwiGLU MLP) without its scalars
    "bamba": PagedGraniteHybridRunner,
    # Falcon-H1 (0.5B-34B, Falcon-H1R): a Mamba2 mixer and attention side by side in every layer
    **{model_type: PagedFalconH1Runner for model_type in FALCON_H1_TYPES},
    # AFMoE (Arcee Trinity Nano / Mini / Large), Laguna (poolside Laguna XS.2): a gate on the attention's output,
    # q/k norms, sigmoid-routed experts with shared ones
    **{model_type: PagedGatedAttentionRunner for model_type in GATED_ATTENTION_TYPES},
    # pure Mamba language models (Mamba-Codestral-7B's Mamba2, Mamba, Falcon-Mamba): every layer a Mamba mixer (states
    # rolled back), no attention
    **{model_type: PagedMambaRunner for model_type in MAMBA_LM_TYPES},
    # Jamba (1.5 / 1.6 / 1.7 Mini and Large, Reasoning 3B): Mamba1 layers, attention layers without positions, experts
    **{model_type: PagedJambaRunner for model_type in JAMBA_TYPES},
    # MiniMax-Text-01 / MiniMax-M1: lightning attention layers (linear, a decay per head; states rolled back) with
    # softmax attention layers, experts in every layer, DeepNorm's residual factors
    **{model_type: PagedMiniMaxRunner for model_type in MINIMAX_TYPES},
    # Kimi Linear (Kimi-Linear-48B-A3B): Kimi Delta Attention layers (a decay per key channel; states rolled back) with
    # latent attention layers without positions (expanded on the paged cache), DeepSeek-V3's experts
    **{model_type: PagedKimiLinearRunner for model_type in KIMI_LINEAR_TYPES},
    # LFM2 (350M-2.6B): gated short-convolution layers (their windows rolled back) with attention layers
    **{model_type: PagedLfm2Runner for model_type in LFM2_TYPES},
    # OLMo Hybrid (Olmo-Hybrid-7B): Qwen3.5's Gated DeltaNet layers with OLMo 3 attention layers
    **{model_type: PagedOlmoHybridRunner for model_type in OLMO_HYBRID_TYPES},
    # MiMo-V2-Flash: value heads narrower than the key heads (padded in the cache), sliding layers with twice the KV
    # heads and attention sinks, DeepSeek-V3's experts
    **{model_type: PagedMimoRunner for model_type in MIMO_TYPES},
}

# The model types whose paged runner depends on the config: model_type -> (predicate(config), the runner where it
# holds; PAGED_RUNNERS' where not). Granite 4.0 (granitemoehybrid): its hybrids (Mamba2 layers, experts) on their
# own runner, its dense transformers on the Llama runner's fused layers.
BY_CONFIG = {"granitemoehybrid": (granite_is_hybrid, PagedGraniteHybridRunner)}

# Tensor parallelism (docs/architecture.md §10): the runner of one rank's ShardedCausalLM.
TP_RUNNERS: dict[str, type[PagedRunnerBase]] = {**{model_type: TPPagedLlamaRunner for model_type in TP_LLAMA_TYPES},
                                                 **{model_type: TPPagedCohereRunner for model_type in TP_COHERE_TYPES},
                                                 **{model_type: TPPagedMlaRunner for model_type in TP_MLA_TYPES},
                                                 **{model_type: TPPagedQwen3NextRunner for model_type in TP_HYBRID_TYPES},
                                                 **{model_type: TPPagedGemmaRunner for model_type in TP_GEMMA_TYPES},
                                                 **{model_type: TPPagedOlmo2Runner for model_type in TP_OLMO_TYPES},
                                                 **{model_type: TPPagedLlama4Runner for model_type in TP_LLAMA4_TYPES},
                                                 **{model_type: TPPagedStarcoder2Runner for model_type in TP_STARCODER2_TYPES},
                                                 **{model_type: TPPagedGemma4Runner for model_type in TP_GEMMA4_TYPES},
                                                 **{model_type: TPPagedGatedAttentionRunner for model_type in TP_GATED_TYPES},
                                                 **{model_type: TPPagedMimoRunner for model_type in TP_MIMO_TYPES},
                                                 **{model_type: TPPagedMiniMaxRunner for model_type in TP_MINIMAX_TYPES},
                                                 **{model_type: TPPagedJambaRunner for model_type in TP_JAMBA_TYPES},
                                                 **{model_type: TPPagedKimiLinearRunner
                                                    for model_type in TP_KIMI_LINEAR_TYPES},
                                                 **{model_type: TPPagedOlmoHybridRunner for model_type in TP_OLMO_HYBRID_TYPES},
                                                 **{model_type: TPPagedNemotronHRunner for model_type in TP_NEMOTRON_H_TYPES},
                                                 "bamba": TPPagedGraniteHybridRunner, "falcon_h1": TPPagedFalconH1Runner}
# Granite 4.0's hybrids (Mamba2 layers) on their own tensor-parallel runner, its dense transformers on the Llama one's
TP_BY_CONFIG = {"granitemoehybrid": (granite_is_hybrid, TPPagedGraniteHybridRunner)}


def _model_type(model) -> str | None:
    return getattr(getattr(model, "config", None), "model_type", None)


def paged_runner_class(model) -> type[PagedRunnerBase] | None:
    """The paged runner class of ``model``'s family (by config.model_type, and BY_CONFIG; a ShardedCausalLM's
    tensor-parallel runner), or None."""
    if isinstance(model, ShardedCausalLM):
        return _tp_runner_for_config(model.config)
    return _runner_for_config(getattr(model, "config", None))


def _tp_runner_for_config(config) -> type[PagedRunnerBase] | None:
    """TP_RUNNERS' class for the config's model_type, or TP_BY_CONFIG's where its predicate holds."""
    model_type = getattr(config, "model_type", None)
    predicate, cls = TP_BY_CONFIG.get(model_type, (None, None))
    return cls if predicate is not None and predicate(config) else TP_RUNNERS.get(model_type)


def _runner_for_config(config) -> type[PagedRunnerBase] | None:
    """PAGED_RUNNERS' class for the config's model_type, or BY_CONFIG's where its predicate holds."""
    model_type = getattr(config, "model_type", None)
    predicate, cls = BY_CONFIG.get(model_type, (None, None))
    return cls if predicate is not None and predicate(config) else PAGED_RUNNERS.get(model_type)


def paged_unsupported_reason(model, max_tokens_per_row: int | None = None, backend=None) -> str | None:
    """Why no paged runner can run ``model`` with rows of up to max_tokens_per_row tokens (None:
    unknown) and kernel ``backend``, or None when paged_runner_class(model) can."""
    cls = paged_runner_class(model)
    if cls is None:
        table = TP_RUNNERS if isinstance(model, ShardedCausalLM) else PAGED_RUNNERS
        return f"model_type {_model_type(model)!r} is not one of {tuple(table)}"
    return cls.unsupported_reason(model, max_tokens_per_row, backend)


def paged_runner(model, *, process_group=None, **kwargs) -> PagedRunnerBase:
    """The paged runner of ``model``'s family (kwargs: PagedRunnerBase's); ValueError naming why
    when no paged runner can run it. process_group (a ProcessGroup or TensorParallelGroup): this
    rank's tensor-parallel runner over its shard of ``model`` (loaded whole on every rank; the
    runner keeps the ShardedCausalLM as ``owned_model``); a ShardedCausalLM needs none."""
    if process_group is not None and not isinstance(model, ShardedCausalLM):
        model = shard_model(model, process_group)
        runner = paged_runner(model, **kwargs)
        runner.owned_model = model
        return runner
    reason = paged_unsupported_reason(model, backend=kwargs.get("backend"))
    if reason is not None:
        raise ValueError(f"no paged runner can run this model: {reason}" +
                         ("" if isinstance(model, ShardedCausalLM) else "; use runner='hf'"))
    return paged_runner_class(model)(model, **kwargs)


def shard_model(model, process_group, *, timeout=None) -> ShardedCausalLM:
    """This rank's ShardedCausalLM of ``model`` (loaded whole here) over ``process_group``;
    ValueError naming why when its family has no tensor-parallel runner or no paged runner can run it."""
    config = text_config(model.config)  # a multimodal model: its text decoder's
    model_type = getattr(config, "model_type", None)
    if model_type not in TP_RUNNERS:
        raise ValueError(f"tensor parallelism supports model_type {tuple(TP_RUNNERS)}, got {_model_type(model)!r}")
    reason = paged_unsupported_reason(model)
    if reason is not None:
        raise ValueError(f"tensor parallelism needs the paged runner, which cannot run this model: {reason}")
    return ShardedCausalLM.from_model(model, process_group, timeout=timeout)


def paged_runner_from_pretrained(path, *, process_group=None, **kwargs) -> PagedRunnerBase:
    """A paged runner for the checkpoint directory ``path`` (config.json + safetensors), of the
    checkpoint's family; kwargs: PagedRunnerBase.from_pretrained's. process_group (a ProcessGroup
    or TensorParallelGroup; kwargs may add timeout=): this rank's tensor-parallel runner, which
    reads only its slices of the checkpoint (safetensors slicing, runners/sharding.py)."""
    from transformers import AutoConfig

    # a multimodal checkpoint (Gemma 3 4B-27B, Llama 4) by its text decoder's type (what AutoModelForCausalLM loads:
    # Llama4ForCausalLM, or Gemma 3's whole model, whose runner takes its text decoder)
    config = text_config(AutoConfig.from_pretrained(path))
    model_type = config.model_type
    table = PAGED_RUNNERS if process_group is None else TP_RUNNERS
    cls = _runner_for_config(config) if process_group is None else _tp_runner_for_config(config)
    if cls is None:
        raise ValueError(f"no {'tensor-parallel ' if process_group is not None else ''}paged runner for {path}: "
                         f"model_type {model_type!r} is not one of {tuple(table)}")
    if process_group is not None:
        return cls.from_pretrained(path, process_group=process_group, **kwargs)
    return cls.from_pretrained(path, **kwargs)


RUNNERS = ("paged", "hf")


def choose_runner(model, runner, max_tokens_per_row: int | None, backend=None) -> str:
    """"paged" or "hf" for ``model``: runner=None picks "paged" when its family's runner
    (PAGED_RUNNERS) supports it -- no sliding window reached within max_tokens_per_row, static
    RoPE, rows within GPT-2's / OPT's / GPT-BigCode's position table, a head_dim the
    kernel ``backend`` takes -- else "hf", or UnsupportedModelError naming both runners' reasons where the hf
    runner cannot run it either; runner="paged" on an unsupported model raises."""
    if runner is not None and runner not in RUNNERS:
        raise ValueError(f"runner must be None, 'paged' or 'hf', got {runner!r}")
    if runner == "hf":
        if isinstance(model, ShardedCausalLM):
            raise ValueError("runner='hf' cannot run a ShardedCausalLM: tensor parallelism runs on the paged runner")
        return "hf"
    reason = paged_unsupported_reason(model, max_tokens_per_row, backend)
    if reason is None:
        return "paged"
    if runner == "paged":
        raise ValueError(f"runner='paged' cannot run {type(model).__name__}: {reason}; use runner='hf' or None")
    hf_reason = hf_refusal(model)
    if hf_reason is not None:  # neither runner: both reasons (Llama 4 past its RoPE's first frequencies, ...)
        raise UnsupportedModelError(f"{hf_reason}; and the paged runner cannot run it: {reason}")
    return "hf"


def make_runner(model, name: str, *, backend=None, **sizes):
    """The runner ``name`` ("paged": the family's paged runner, sizes: PagedRunnerBase's; "hf":
    HFRunner) for ``model``."""
    if name == "paged":
        return paged_runner_class(model)(model, backend=backend, **sizes)
    return HFRunner(model)
