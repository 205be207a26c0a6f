"""MtpHead: a target's own multi-token-prediction layer (GLM-4.5 / 4.6 / 4.7's and DeepSeek-V3 / R1's
``model.layers.{L}``, Qwen3-Next's and Qwen3.5's ``mtp.*``, shipped inside the target checkpoint) as a
draft head; what ``generate(use_mtp=True)`` drafts with.

The layer is transformers' MtpModel layer (transformers.modeling_layers.MtpLayer, loaded by
transformers' own MtpModel.from_pretrained: its checkpoint names and conversions), run here on the
paged kernels (runners/paged_mtp.py). Its context entry t pairs the target's final-norm hidden
state at position t (transformers' hidden_states[-1]; capture index L) with the token at t + 1:
    x0  = eh_proj(cat(enorm(embed(x_{t+1})), hnorm(h_t)))      [H]  (cat(hnorm, enorm) with the
                                                                     config's mtp_hidden_states_first)
    x   = the target family's decoder layer (mtp_block) over x0, RoPE at position t + 1
    m_t = post_norm(x)                                          [H]  (the checkpoint's shared_head.norm)
    logits = the target's lm_head(m_t)                          [V]  (predict x_{t+2})
as transformers' MtpModel.forward_layer computes it (positions are those of the tokens, t + 1,
as transformers feeds them; vLLM's glm4_moe_mtp uses t: RoPE is relative, so the attention is the
same). A draft step feeds (m of the previous step, the token just drafted) at the next position:
transformers chains an MTP layer's normed output into the next layer, SGLang feeds it back (vLLM
feeds the pre-norm output back). With one MTP layer transformers drafts one token per iteration;
here K = 1 by default too (MTP_DEFAULT_K), and a larger K (num_assistant_tokens, or the adaptive
schedule) runs the same layer again per draft.

Qwen3-Next's and Qwen3.5's layer (QWEN_MTP_TYPES; vLLM's qwen3_next_mtp / qwen3_5_mtp) is the same
thing under other names -- fc (eh_proj), pre_fc_norm_embedding (enorm), pre_fc_norm_hidden (hnorm), a
gated full-attention decoder layer (mtp.layers.0: mtp_block), norm (post_norm), its norms the family's
x (1 + w) -- and transformers drops it on loading (^mtp.*) and has no MtpModel for it: this package reads
it from the checkpoint itself (heads/mtp_checkpoint.py) into transformers' MtpLayer around the target's
own decoder layer class.

Which targets: MTP_MODEL_TYPES, whose decoder layer the Llama runner (runners/paged_llama.py: GLM-4.5),
the MLA runner (runners/paged_mla.py: DeepSeek-V3) or the Qwen3-Next runner (runners/paged_qwen3_next.py)
runs; one MTP layer (every GLM-4.x, DeepSeek-V3, Qwen3-Next and Qwen3.5 checkpoint has one; several
would each need their own cache). Under tensor parallelism the head is MtpLayerSlices: each rank reads
its slices of the layer itself.
"""
import copy
import os
import weakref

from torch import nn

# Qwen3-Next and Qwen3.5's text decoders: their MTP layer under their own names (config.mtp_num_hidden_layers)
QWEN_MTP_TYPES = ("qwen3_next", "qwen3_5_text", "qwen3_5_moe_text")
MTP_MODEL_TYPES = ("glm4_moe", "deepseek_v3") + QWEN_MTP_TYPES
# K without num_assistant_tokens: transformers' use_mtp drafts one token per MTP layer, and vLLM's
# GLM-4.5 recipe (recipes.vllm.ai/zai-org/GLM-4.5) reports 1 best for throughput ("higher values
# increase mean acceptance length but drop acceptance rate significantly"). Not measured here.
MTP_DEFAULT_K = 1
_FOR_TARGET = weakref.WeakKeyDictionary()  # target model -> {head class: its head} (loaded once per model)


def mtp_reason(target) -> str | None:
    """Why ``target`` has no MTP head this package drafts with, or None."""
    config = getattr(target, "config", None)
    model_type = getattr(config, "model_type", None)
    if model_type not in MTP_MODEL_TYPES:
        return (f"use_mtp drafts with a target's own MTP layer; model_type {model_type!r} has none this package runs "
                f"(it runs {', '.join(MTP_MODEL_TYPES)})")
    if model_type in QWEN_MTP_TYPES:
        layers = getattr(config, "mtp_num_hidden_layers", None)
        if not layers:
            return "the target's config has no MTP layer (mtp_num_hidden_layers is 0 or missing)"
        if getattr(config, "mtp_use_dedicated_embeddings", False):
            return "the target's MTP layer has embeddings of its own (mtp_use_dedicated_embeddings): not supported"
    else:
        layers = getattr(config, "num_mtp_layers", None)
        if not layers:
            return "the target's config has no MTP layer (num_mtp_layers / num_nextn_predict_layers is 0 or missing)"
    if layers != 1:
        return f"the target has {layers} MTP layers; this package drafts with one (each would need its own cache)"
    return None


def mtp_block_config(config):
    """The config of the MTP layer's decoder block as a one-layer decoder of the target's family
    (``config``: the target's): GLM-4.5's and DeepSeek-V3's as it is, Qwen3-Next's / Qwen3.5's a gated
    full-attention layer (vLLM's and SGLang's MTP layers: layer_types ["full_attention"]), its MLP as
    transformers and vLLM make layer 0's (mlp_only_layers, decoder_sparse_step)."""
    block = copy.copy(config)
    block.num_hidden_layers = 1
    if config.model_type in QWEN_MTP_TYPES:
        block.layer_types = ["full_attention"]
    return block


def _refusal(message: str) -> Exception:
    """The error of a use_mtp call this package does not run: runners/hf.py's UnsupportedModelError
    (imported here: heads/ sits below runners/)."""
    from ..runners.hf import UnsupportedModelError

    return UnsupportedModelError(message)


class _MtpBase(nn.Module):
    """What the engine reads of an MTP head: kind, config, vocabulary, the features it reads."""

    kind = "mtp"
    sharded = False  # True: each tensor-parallel rank reads its slices of the layer (MtpLayerSlices)

    def _bind_config(self, config) -> None:
        self.config = config
        self.vocab_size = self.draft_vocab_size = int(config.vocab_size)
        self.hidden_first = bool(getattr(config, "mtp_hidden_states_first", False))

    @property
    def feature_width(self) -> int:
        """Columns of the target features an entry reads: the final-norm hidden state [H]."""
        return int(self.config.hidden_size)

    def hidden_indices(self, target_layers: int | None = None) -> tuple:
        """The target hidden states the head reads: the final norm's (output_hidden_states[L])."""
        if target_layers is None:
            raise ValueError("an MTP head reads the target's final-norm states: give the target's layer count")
        return (target_layers,)

    @classmethod
    def for_target(cls, target):
        """This kind of head for ``target``, made once per target (the same head every call, so the
        engine cached for it serves every call); UnsupportedModelError where the target has no MTP
        layer this package runs (a patched generate hands such a call to transformers': patch.py)."""
        head = _FOR_TARGET.get(target, {}).get(cls)
        if head is None:
            reason = mtp_reason(target)
            if reason is not None:
                raise _refusal(reason)
            head = _FOR_TARGET.setdefault(target, {})[cls] = cls._load(target)
        return head


class MtpHead(_MtpBase):
    """A target's MTP layer as a draft head (module docstring). ``mtp_model``: transformers'
    MtpModel of the target (MtpModel.from_pretrained(target)); its one layer (enorm, hnorm, eh_proj,
    mtp_block, post_norm) is this head's weights, shared, not copied. The embedding and LM head
    are the target's (the runner takes them from the target)."""

    def __init__(self, mtp_model):
        super().__init__()
        layers = getattr(mtp_model, "layers", None)
        if layers is None or len(layers) != 1:
            raise ValueError(f"an MTP head takes transformers' MtpModel with one layer, got "
                             f"{type(mtp_model).__name__} with {None if layers is None else len(layers)}")
        if getattr(mtp_model, "use_shared_post_norm", False) or layers[0].post_norm is None:
            raise ValueError("an MTP model without a per-layer post norm (chain_hidden_post_norm) is not supported")
        self._bind_config(mtp_model.config)
        self.layer = layers[0]
        # the target's rotary module (its inv_freq / attention_scaling), held outside the module tree
        self.__dict__["rotary"] = mtp_model.rotary_emb

    @classmethod
    def _load(cls, target) -> "MtpHead":
        """The head of ``target``'s own MTP layer, read from its checkpoint directory
        (config.name_or_path) by transformers' MtpModel.from_pretrained on the device of the
        target's last layer, in its dtype."""
        try:
            from transformers.modeling_layers import MtpModel
        except ImportError as exc:  # transformers before MTP support (5.14 has the use_mtp field)
            raise _refusal("use_mtp needs a transformers with MtpModel (transformers.modeling_layers); "
                                        "upgrade transformers") from exc

        source = getattr(target.config, "name_or_path", "")
        if not source:
            raise _refusal("use_mtp reads the MTP layer from the target's checkpoint (config.name_or_path); "
                                        "this model was not loaded from one")
        device = next(target.get_decoder().layers[-1].parameters()).device
        try:
            if target.config.model_type in QWEN_MTP_TYPES:  # no MtpModel in transformers: read here
                from .mtp_checkpoint import CheckpointMtpModel

                mtp_model = CheckpointMtpModel.from_checkpoint(target, source, device)
            else:
                mtp_model = MtpModel.from_pretrained(target, device_map={"": device})
        except (OSError, RuntimeError, ValueError) as exc:  # no MTP weights in the checkpoint, unreadable files
            raise _refusal(f"use_mtp: no MTP layer could be read from {source}: {exc}") from exc
        return cls(mtp_model.eval().requires_grad_(False))


class MtpLayerSlices(_MtpBase):
    """A target's MTP layer under tensor parallelism: where it is (the checkpoint directory and the
    layer index, config.num_hidden_layers); each rank reads its slices of it by the target's plan
    when the engine builds the head runner (runners/paged_mtp.py TPPagedMtpRunner), so no rank
    holds the whole layer. No weights here (what the ranks compare of it: the config)."""

    sharded = True

    def __init__(self, config, path: str):
        super().__init__()
        self._bind_config(config)
        self.path, self.layer_index = str(path), int(config.num_hidden_layers)

    @classmethod
    def _load(cls, target) -> "MtpLayerSlices":
        """The slices' source for ``target`` (a ShardedCausalLM, or a model loaded whole that a
        tensor-parallel engine shards): its checkpoint directory."""
        path = getattr(target.config, "name_or_path", "")
        if not path or not os.path.isdir(path):
            raise _refusal(f"use_mtp under tensor parallelism reads each rank's slices of the MTP layer from "
                                        f"the target's checkpoint directory (config.name_or_path); got {path!r}")
        return cls(target.config, path)


def mtp_head(target, tensor_parallel: bool):
    """The head generate(use_mtp=True) drafts with: the whole layer (MtpHead) in one process, its
    slices' source (MtpLayerSlices) under tensor parallelism."""
    return (MtpLayerSlices if tensor_parallel else MtpHead).for_target(target)
