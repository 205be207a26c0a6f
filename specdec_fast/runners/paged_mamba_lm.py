"""PagedMambaRunner: pure Mamba language models -- every layer a Mamba mixer, no attention -- with speculative
decoding's rollback of the mixers' states (runners/paged_recurrent.py): Mamba2 (model_type mamba2: Mistral's
Mamba-Codestral-7B; the mixer: runners/mamba2.py), Mamba (mamba: the state-spaces Mamba checkpoints) and
Falcon-Mamba (falcon_mamba: Falcon-Mamba-7B; the Mamba1 mixer: runners/mamba1.py).

The math is transformers 5.24's Mamba2Block / MambaBlock / FalconMambaBlock and their models (modeling_mamba2.py,
modeling_mamba.py, modeling_falcon_mamba.py), eval mode:
    x = embeddings(ids)
    per layer   x = residual + mixer(norm(x in the norm's dtype)), the residual in float32 where residual_in_fp32
                (transformers' default: in a bf16 model the stream stays float32 between layers)
    logits = lm_head(norm_f(x) in the LM head's dtype)
with every RMSNorm Llama's. Mamba2's mixer is Nemotron-H's (its gated norm over groups of intermediate / n_groups
channels; dt clamped to time_step_limit's lower end: a finite upper end is refused); Mamba's and Falcon-Mamba's
run token by token (runners/mamba1.py; a score call's scan one Triton launch on the Triton path). No layer attends: the pool keeps one unused KV layer for its admission
bookkeeping (PagedRecurrentRunner.kv_layer_count). Token trees: each node from its parent's states (runners/paged_recurrent.py). A projection bias (use_bias) is refused:
transformers zeroes a padded position's input, whose biased projection would then reach the convolution. No
tensor-parallel runner. Not timed on a GPU.
"""
import math

import torch

from ._layer_math import norm_params
from .mamba1 import Mamba1, mamba1_forward
from .mamba2 import Mamba2, mamba2_forward
from .paged_base import decoder_reason
from .paged_olmo2 import llama_rms_norm
from .paged_recurrent import PagedRecurrentRunner, padded_bias_reason

MAMBA_LM_TYPES = ("mamba2", "mamba", "falcon_mamba")


def _projections(layer) -> tuple:
    mixer = layer.mixer
    return (mixer.in_proj, mixer.out_proj) + ((mixer.x_proj, mixer.dt_proj) if hasattr(mixer, "x_proj") else ())


def mamba_lm_unsupported_reason(model, max_tokens_per_row: int | None = None, backend=None) -> str | None:
    """Why PagedMambaRunner cannot run ``model``, or None when it can."""
    reason = decoder_reason(model, MAMBA_LM_TYPES, "backbone.layers",
                            "a Mamba2ForCausalLM, MambaForCausalLM or FalconMambaForCausalLM", _projections)
    if reason is not None:
        return reason
    config = model.config
    if config.hidden_act != "silu":
        return f"a Mamba convolution with activation {config.hidden_act!r}"
    reason = padded_bias_reason(config, "use_bias")
    if reason is not None:
        return reason
    if config.model_type == "mamba2" and not math.isinf(float(config.time_step_limit[1])):
        return f"time_step_limit {tuple(config.time_step_limit)}: dt clamped above (this runner clamps the lower end)"
    return None


class _Block:
    """One block: its kind (the recurrent one, for _index_layers), norm (weight, eps), mixer's tensors (Mamba2's, or
    Mamba1's) and the forward over a call that runs it."""

    kind = "linear_attention"

    def __init__(self, layer, mamba2: bool):
        self.norm = norm_params(layer.norm)
        self.mixer = Mamba2(layer.mixer) if mamba2 else Mamba1(layer.mixer)
        self.forward = mamba2_forward if mamba2 else mamba1_forward


class PagedMambaRunner(PagedRecurrentRunner):
    """Runner (see runners/base.py) for a Mamba2ForCausalLM, MambaForCausalLM or FalconMambaForCausalLM instance
    (weights shared); the arguments are PagedRunnerBase's. Token trees: each node from its parent's states."""

    unsupported_reason = staticmethod(mamba_lm_unsupported_reason)

    def _bind(self, model) -> None:
        config, inner = model.config, model.backbone
        self.embed = inner.embeddings.weight
        self.layers = [_Block(layer, config.model_type == "mamba2") for layer in inner.layers]
        self._index_layers()
        self.final_norm = norm_params(inner.norm_f)
        self.lm_head = model.get_output_embeddings().weight
        self.residual_in_fp32 = bool(config.residual_in_fp32)
        # no attention layer: the base's head sizes for its one unused KV layer
        self.num_heads, self.num_kv_heads, self.head_dim, self.scale = 1, 1, 1, 1.0

    def _decode(self, flat, positions, cu, attn_lens, n) -> torch.Tensor:
        """Packed tokens [T] at positions [T] -> final-norm hidden states [T, H]."""
        rows = self._row_layout(cu, flat.shape[0], n)
        x = self._embed(flat)
        self._keep(0, x)
        for i, block in enumerate(self.layers):
            h = llama_rms_norm(x.to(block.norm[0].dtype), block.norm)
            out = block.forward(block.mixer, self.states[self._recurrent_index[i]], h, rows, self._prefilling)
            x = (x.float() if self.residual_in_fp32 else x) + out
            if i + 1 < len(self.layers):
                self._keep(i + 1, x.to(self.dtype))
        out = llama_rms_norm(x, self.final_norm).to(self.dtype)  # (float32 in, the weight's product: then cast)
        self._keep(len(self.layers), out)
        return out
