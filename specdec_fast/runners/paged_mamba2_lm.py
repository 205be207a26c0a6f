"""PagedMamba2Runner: a pure Mamba2 language model (model_type mamba2: Mistral's Mamba-Codestral-7B, the
state-spaces Mamba2 checkpoints as transformers converts them) -- every layer a Mamba2 mixer, no attention -- with
speculative decoding's rollback of the mixers' states (runners/paged_recurrent.py; the mixer: runners/mamba2.py).

The math is transformers 5.24's Mamba2Block / Mamba2Model (modeling_mamba2.py), eval mode:
    x = embeddings(ids)
    per layer   x = residual + mixer(norm(x in the norm's dtype)), the residual in float32 where residual_in_fp32
                (transformers' default: in a bf16 model the stream stays float32 between layers)
    logits = lm_head(norm_f(x) in the LM head's dtype)
with Mamba2RMSNorm Llama's and the mixer Nemotron-H's Mamba2 (its gated norm over groups of intermediate / n_groups
channels; dt clamped to time_step_limit's lower end: a finite upper end is refused). No layer attends: the pool keeps
one unused KV layer for its admission bookkeeping (PagedRecurrentRunner.kv_layer_count). Token trees are refused.
No tensor-parallel runner. Not timed on a GPU.
"""
import math

import torch
import torch.nn.functional as F

from ._layer_math import norm_params
from .mamba2 import Mamba2, mamba2_forward
from .paged_base import decoder_reason
from .paged_olmo2 import llama_rms_norm
from .paged_recurrent import PagedRecurrentRunner

MAMBA2_TYPES = ("mamba2",)


def mamba2_lm_unsupported_reason(model, max_tokens_per_row: int | None = None, backend=None) -> str | None:
    """Why PagedMamba2Runner cannot run ``model``, or None when it can."""
    reason = decoder_reason(model, MAMBA2_TYPES, "backbone.layers", "a Mamba2ForCausalLM",
                            lambda layer: (layer.mixer.in_proj, layer.mixer.out_proj))
    if reason is not None:
        return reason
    config = model.config
    if config.hidden_act != "silu":
        return f"a Mamba2 convolution with activation {config.hidden_act!r}"
    if not math.isinf(float(config.time_step_limit[1])):
        return f"time_step_limit {tuple(config.time_step_limit)}: dt clamped above (this runner clamps the lower end)"
    return None


class _Block:
    """One Mamba2Block: its kind (the recurrent one, for _index_layers), norm (weight, eps) and mixer's tensors."""

    kind = "linear_attention"

    def __init__(self, layer):
        self.norm = norm_params(layer.norm)
        self.mixer = Mamba2(layer.mixer)


class PagedMamba2Runner(PagedRecurrentRunner):
    """Runner (see runners/base.py) for a Mamba2ForCausalLM instance (weights shared); the arguments are
    PagedRunnerBase's. Token trees are refused (score(tree=...))."""

    unsupported_reason = staticmethod(mamba2_lm_unsupported_reason)
    family = "Mamba2"

    def _bind(self, model) -> None:
        config, inner = model.config, model.backbone
        self.embed = inner.embeddings.weight
        self.layers = [_Block(layer) for layer in inner.layers]
        self._index_layers()
        self.final_norm = norm_params(inner.norm_f)
        self.lm_head = model.get_output_embeddings().weight
        self.residual_in_fp32 = bool(config.residual_in_fp32)
        # no attention layer: the base's head sizes for its one unused KV layer
        self.num_heads, self.num_kv_heads, self.head_dim, self.scale = 1, 1, 1, 1.0

    def _decode(self, flat, positions, cu, attn_lens, n) -> torch.Tensor:
        """Packed tokens [T] at positions [T] -> final-norm hidden states [T, H]."""
        rows = self._row_layout(cu, flat.shape[0], n)
        x = F.embedding(flat.clamp(min=0), self.embed)
        self._keep(0, x)
        for i, block in enumerate(self.layers):
            h = llama_rms_norm(x.to(block.norm[0].dtype), block.norm)
            out = mamba2_forward(block.mixer, self.states[self._recurrent_index[i]], h, rows, self._prefilling)
            x = (x.float() if self.residual_in_fp32 else x) + out
            if i + 1 < len(self.layers):
                self._keep(i + 1, x.to(self.dtype))
        out = llama_rms_norm(x, self.final_norm).to(self.dtype)  # (float32 in, the weight's product: then cast)
        self._keep(len(self.layers), out)
        return out
