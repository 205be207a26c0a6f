"""PagedMtpRunner: a target's MTP layer (heads/mtp.py) run over its own PagedKVCache.

The MTP block is a decoder layer of the target's family, so this is the family's runner over one
layer -- the Llama runner (runners/paged_llama.py: its layer math on every backend, GLM-4.5's
partial RoPE, q/k/v biases and MoE included), the MLA runner for DeepSeek-V3's layer
(runners/paged_mla.py: PagedMlaMtpRunner), or the Qwen3-Next runner for Qwen3-Next's / Qwen3.5's gated
full-attention layer (runners/paged_qwen3_next.py: PagedQwen3NextMtpRunner, enorm / hnorm the family's
x (1 + w) norms) -- with two changes: the
layer's input is eh_proj(cat(enorm(embed(token)), hnorm(feature))) instead of the embedding
(_embed), and its final norm is the MTP layer's post_norm. It is fed (token, feature) pairs
(PairedRunner: runners/paired.py); its logits are the target's lm_head over post_norm's output,
which is also what a draft step feeds back (heads/mtp.py).

TPPagedMtpRunner is the same over the tensor-parallel Llama runner (runners/paged_llama_tp.py;
TPPagedMlaMtpRunner over the tensor-parallel MLA runner, runners/paged_mla_tp.py; TPPagedQwen3NextMtpRunner
over runners/paged_qwen3_next_tp.py):
each rank reads its slices of the layer from the target's checkpoint (sharding.mtp_layer_shards,
by the target's plan: heads and every expert's width split, enorm / hnorm / eh_proj whole) and
looks tokens up in the target runner's vocabulary slice; the logits are gathered over the
vocabulary, equal on every rank.
"""
import weakref

import torch

from ._layer_math import fused_layer_math, linear_params, norm_params, rms_norm
from ._linear import linear
from .paged_base import head_dim_reason
from .paged_llama import PagedLlamaRunner
from .paged_llama_tp import TPPagedLlamaRunner
from .paged_mla_tp import TPPagedMlaRunner
from .paged_mla import MLA_MODEL_TYPES, PagedMlaRunner, latent_reason
from .paged_qwen3_next import QWEN3_NEXT_TYPES, PagedQwen3NextRunner, qwen_norm
from .paged_qwen3_next_tp import TPPagedQwen3NextRunner
from .paired import PairedRunner
from .sharded_model import ShardedCausalLM, rotary_of
from .sharding import mtp_layer_shards
from ..heads.mtp import mtp_block_config

# The MTP layer's own tensors beside its decoder block (the block's names are a layer's)
MTP_OWN = ("enorm.", "hnorm.", "eh_proj.", "shared_head.")


def mtp_unsupported_reason(head, max_tokens_per_row: int | None = None, backend=None) -> str | None:
    """Why PagedMtpRunner (PagedMlaMtpRunner for an MLA family's layer) cannot run ``head`` with kernel
    ``backend``, or None."""
    if getattr(head, "kind", None) != "mtp":
        return f"{type(head).__name__} is not an MTP head"
    config = head.config
    if config.model_type in MLA_MODEL_TYPES:
        return latent_reason(config, backend)
    return head_dim_reason(getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads,
                           backend)


def mtp_runner(head, embed: torch.Tensor, lm_head: torch.Tensor, **kwargs):
    """The single-process runner of ``head``'s layer: PagedMlaMtpRunner for an MLA family's
    (DeepSeek-V3), PagedQwen3NextMtpRunner for Qwen3-Next's / Qwen3.5's, else PagedMtpRunner; kwargs:
    their num_draft_tokens / block_size / backend."""
    cls = _family_runner(head.config.model_type, (PagedMlaMtpRunner, PagedQwen3NextMtpRunner, PagedMtpRunner))
    return cls(head, embed, lm_head, **kwargs)


class _MtpLayer:
    """The MTP layer's half of both runners: its input, its outputs and its logits. Mixed in before
    PairedRunner and the Llama runner (single-process or tensor-parallel), whose _embed gives the
    token embedding; _bind_mtp sets enorm / hnorm / eh_proj."""

    position_offset = 1  # entry t (the token at t + 1) at position t + 1, as transformers' MtpModel
    _features = None  # [T, H] during a forward: the entries' features (target states or the layer's outputs)

    def _bind_mtp(self, enorm, hnorm, eh_proj, hidden_first: bool, feature_width: int) -> None:
        """(weight, eps) of enorm / hnorm, (weight, bias) of eh_proj."""
        self.enorm, self.hnorm, self.eh_proj = enorm, hnorm, eh_proj
        self.hidden_first, self.feature_width = hidden_first, feature_width

    def _mtp_norm(self, x: torch.Tensor, norm) -> torch.Tensor:
        """enorm / hnorm ((weight, eps)) over x [T, H]: the family's RMSNorm (Qwen3-Next's: _QwenNorms)."""
        return rms_norm(x, *norm, fused_layer_math(self.dtype, self.device.type))

    def _embed(self, flat: torch.Tensor) -> torch.Tensor:
        """ids [T] (-1 pads) with the forward's features [T, H] -> the MTP block's input [T, H]."""
        e = self._mtp_norm(super()._embed(flat), self.enorm)
        h = self._mtp_norm(self._features, self.hnorm)
        return linear(torch.cat([h, e] if self.hidden_first else [e, h], -1), *self.eh_proj)

    def _head_decode(self, flat, feats, positions, cu, attn_lens, n: int, project: bool):
        """Packed entries -> (post_norm output [T, H], the same: what a draft step feeds back).
        project: ignored (target features and the layer's own outputs take the same path)."""
        self._features = feats
        try:
            out = self._decode(flat, positions, cu, attn_lens, n)
        finally:
            self._features = None
        return out, out

    def _head_logits(self, normed: torch.Tensor) -> torch.Tensor:
        return self._logits(normed)


class _WholeMtpLayer(_MtpLayer):
    """The single-process runners' construction: the head's whole layer over the target's embedding
    and LM head, on the family runner mixed in after PairedRunner (whose _bind_parts binds it)."""

    unsupported_reason = staticmethod(mtp_unsupported_reason)

    def __init__(self, head, embed: torch.Tensor, lm_head: torch.Tensor, *, num_draft_tokens: int = 0,
                 block_size: int = 16, backend=None):
        reason = mtp_unsupported_reason(head, backend=backend)
        if reason is not None:
            raise ValueError(f"{type(self).__name__} cannot run this head: {reason}")
        if head.sharded:
            raise ValueError("this MTP head is read in slices by tensor-parallel ranks (TPPagedMtpRunner)")
        layer = head.layer
        if embed.shape[1] != head.feature_width or lm_head.shape[1] != head.feature_width:
            raise ValueError(f"the MTP layer is {head.feature_width} wide but the target's embedding / lm_head are "
                             f"{embed.shape[1]} / {lm_head.shape[1]} (an MTP layer of another model?)")
        self._init_head(head, layer.eh_proj.weight, num_draft_tokens=num_draft_tokens, block_size=block_size,
                        backend=backend)
        if embed.device != self.device:
            raise ValueError(f"the MTP layer is on {self.device} but the target's embedding is on {embed.device}")
        self.fuse_projections = self.kernels == "triton"
        # the Llama runner's parts: the block the one layer, post_norm the final norm, the target's
        # embedding / LM head / rotary module
        self._bind_parts(head.config, embed, [layer.mtp_block], layer.post_norm, lm_head, head.rotary)
        (eh_proj,) = linear_params(layer.eh_proj)
        self._bind_mtp(norm_params(layer.enorm), norm_params(layer.hnorm), eh_proj, head.hidden_first,
                       head.feature_width)
        self.vocab_size = int(self.lm_head.shape[0])


class PagedMtpRunner(_WholeMtpLayer, PairedRunner, PagedLlamaRunner):
    """Runner of a target's MTP layer (heads/mtp.MtpHead) of a Llama-runner family (GLM-4.5):
    prefill_pairs / score_pairs / commit. embed [V, H] and lm_head [V, H]: the target's.
    num_draft_tokens: K (sizes the tentative entries: K + 1)."""


class PagedMlaMtpRunner(_WholeMtpLayer, PairedRunner, PagedMlaRunner):
    """PagedMtpRunner for an MLA family's MTP layer (DeepSeek-V3's): the layer's block on the MLA
    runner (runners/paged_mla.py), its cache one latent plane."""


class _QwenNorms:
    """Qwen3-Next's and Qwen3.5's enorm / hnorm (pre_fc_norm_embedding / pre_fc_norm_hidden): the family's
    x (1 + w) in float32 (paged_qwen3_next.qwen_norm), as its every other norm."""

    def _mtp_norm(self, x: torch.Tensor, norm) -> torch.Tensor:
        return qwen_norm(x, norm)


class PagedQwen3NextMtpRunner(_QwenNorms, _WholeMtpLayer, PairedRunner, PagedQwen3NextRunner):
    """PagedMtpRunner for Qwen3-Next's / Qwen3.5's MTP layer (heads/mtp_checkpoint.py): its gated
    full-attention block on the Qwen3-Next runner (runners/paged_qwen3_next.py; no recurrent layer, so
    no state to roll back)."""


class _ShardedMtpLayer(_MtpLayer):
    """The tensor-parallel runners' construction (heads/mtp.MtpLayerSlices): this rank's slices of the
    layer read from the checkpoint by ``target_runner``'s plan, as a one-layer ShardedCausalLM over
    the target runner's vocabulary slice (embedding and LM head) and group, run by the family's
    tensor-parallel runner mixed in after PairedRunner. Building it is a collective (every rank
    agrees it built: TensorParallelRunner)."""

    def __init__(self, head, target_runner, *, num_draft_tokens: int = 0, block_size: int = 16, backend=None):
        if not head.sharded:
            raise ValueError("under tensor parallelism each rank reads its slices of the MTP layer: use_mtp=True "
                             "(heads/mtp.MtpLayerSlices), not a loaded MtpModel")
        target = target_runner.model
        plan, prefix = target.plan, f"model.layers.{head.layer_index}."
        error = model = None
        try:  # a rank that cannot read its slices tells the others (the agreement in TPPagedLlamaRunner's init)
            shards = mtp_layer_shards(head.path, plan, head.layer_index, dtype=target_runner.dtype,
                                      device=target_runner.device)
            config = mtp_block_config(target.config)
            block = {"model.layers.0." + name[len(prefix):]: t for name, t in shards.items()
                     if not name.startswith(tuple(prefix + n for n in MTP_OWN))}
            block.update({"model.embed_tokens.weight": target_runner.embed, "lm_head.weight": target_runner.lm_head,
                          "model.norm.weight": shards[prefix + "shared_head.norm.weight"]})
            model = ShardedCausalLM(config, block, plan, target.tp, rotary_of(config), None)
            eps = config.rms_norm_eps
            self._mtp = ((shards[prefix + "enorm.weight"], eps), (shards[prefix + "hnorm.weight"], eps),
                         (shards[prefix + "eh_proj.weight"], None), head.hidden_first, head.feature_width)
        except Exception as exc:  # noqa: BLE001 - every rank learns of it in the agreement
            error = exc
        if error is not None:
            target.tp.agree("building the tensor-parallel runner", {}, error)
        super().__init__(model, max_new_tokens=None, num_draft_tokens=num_draft_tokens, block_size=block_size,
                         backend=backend)
        self._model_ref = weakref.ref(head)
        self.layer_windows = ()

    def _bind(self, model) -> None:
        super()._bind(model)
        self._bind_mtp(*self._mtp)

    def _head_logits(self, normed: torch.Tensor) -> torch.Tensor:
        """Logits over the whole vocabulary [.., V], gathered from every rank's slice."""
        return self.tp.gather_vocab(self._logits(normed))


class TPPagedMtpRunner(_ShardedMtpLayer, PairedRunner, TPPagedLlamaRunner):
    """Runner of a target's MTP layer on one tensor-parallel rank, a Llama-runner family's (GLM-4.5)."""


class TPPagedMlaMtpRunner(_ShardedMtpLayer, PairedRunner, TPPagedMlaRunner):
    """Runner of a target's MTP layer on one tensor-parallel rank, an MLA family's (DeepSeek-V3): this
    rank's heads of the layer's latent attention, the latent whole (runners/paged_mla_tp.py)."""


class TPPagedQwen3NextMtpRunner(_QwenNorms, _ShardedMtpLayer, PairedRunner, TPPagedQwen3NextRunner):
    """Runner of Qwen3-Next's / Qwen3.5's MTP layer on one tensor-parallel rank: this rank's heads of its
    gated attention and its columns of every expert (runners/paged_qwen3_next_tp.py)."""


def _family_runner(model_type: str, classes: tuple):
    """Of (MLA, Qwen3-Next, Llama) runner classes, the one for ``model_type``'s MTP layer."""
    mla, qwen, llama = classes
    return mla if model_type in MLA_MODEL_TYPES else qwen if model_type in QWEN3_NEXT_TYPES else llama


def tp_mtp_runner(head, target_runner, **kwargs):
    """The tensor-parallel runner of ``head``'s layer on this rank: TPPagedMlaMtpRunner for an MLA
    family's, TPPagedQwen3NextMtpRunner for Qwen3-Next's / Qwen3.5's, else TPPagedMtpRunner; kwargs: their
    num_draft_tokens / block_size / backend."""
    cls = _family_runner(head.config.model_type, (TPPagedMlaMtpRunner, TPPagedQwen3NextMtpRunner, TPPagedMtpRunner))
    return cls(head, target_runner, **kwargs)
