"""PagedGemmaRunner: Gemma (model_type gemma: GemmaForCausalLM, Gemma 1 2B / 7B, CodeGemma), Gemma 2
(gemma2: Gemma2ForCausalLM, 2B / 9B / 27B) and Gemma 3's text decoder (gemma3_text:
Gemma3ForCausalLM, the 270M and 1B checkpoints; and gemma3: Gemma3ForConditionalGeneration, the
4B / 12B / 27B, whose text decoder runs a prompt of text tokens: text_decoder) run layer by layer over a PagedKVCache with the
project's append_kv / paged_attention kernels (the machinery is shared: runners/paged_base.py).

Weights are the model's own parameters (no copy): embed_tokens, per layer input_layernorm,
self_attn.{q,k,v,o}_proj, self_attn.q_norm / k_norm (Gemma 3), post_attention_layernorm,
pre_feedforward_layernorm, post_feedforward_layernorm, mlp.{gate,up,down}_proj, then model.norm
and lm_head (tied). The math is transformers 5.24's Gemma2DecoderLayer / Gemma3DecoderLayer
(modeling_gemma2.py, modeling_gemma3.py), eval mode:
    x = embed(ids) * sqrt(H)                      the scale rounded to the model dtype first
    h = input_layernorm(x); q, k, v = projections of h
    Gemma 3: q, k = q_norm(q), k_norm(k) per head
    RoPE with the layer type's table (cos / sin in the model dtype): Gemma 3's sliding_attention
    layers a local base, full_attention ones the global (and its scaling); Gemma 2 one table
    x = x + post_attention_layernorm(o_proj(attention(q, k, v)))   scale query_pre_attn_scalar^-0.5;
        Gemma 2's scores soft-capped by attn_logit_softcapping (50) in the kernels (Gemma 3's
        config carries the field too, unread by its attention)
    x = x + post_feedforward_layernorm(down(act(gate(h2)) * up(h2))), h2 = pre_feedforward_layernorm(x)
    logits = lm_head(norm(x)), soft-capped by final_logit_softcapping when it is set
and Gemma's RMSNorm is x_normed * (1 + weight) in float32, then the dtype (gemma_rms_norm).
Sliding layers (layer_types; Gemma 2 4096 tokens, Gemma 3 512) pass their window to the kernels
(runners/sliding_window.py). Refused: bidirectional attention (EmbeddingGemma). One path on every
backend, as the OLMo and GPT-2 runners: the attention and KV append through the kernels, the
rest torch ops. Tensor parallelism for Gemma 1 / 2: paged_gemma_tp.py. Gemma 1 (modeling_gemma.py) is Llama's layer with
these norms, the scaled embedding and head_dim^-0.5: its post_attention_layernorm is the MLP's
input norm, and no branch output is normed (the runner's post_attention / post_feedforward None).
"""
import torch
import torch.nn.functional as F

from ..kernels.llama_ops.reference import rotate_half_apply
from ._layer_math import linear_params, norm_params
from ._linear import linear
from ._rotary import device_rope_tables, rope_tables_reason, rotations
from .paged_base import PagedRunnerBase, decoder_reason
from .paged_llama import projection_modules
from .sliding_window import windows_per_layer


def gemma_rms_norm(x: torch.Tensor, norm) -> torch.Tensor:
    """Gemma3RMSNorm over the last dim of x: x_normed * (1 + weight) in float32, then x's dtype.
    norm: (weight, eps)."""
    weight, eps = norm
    x32 = x.float()
    return (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps) * (1.0 + weight.float())).to(x.dtype)


def _normed(x: torch.Tensor, norm) -> torch.Tensor:
    """A branch's output as added to the stream: through its norm (Gemma 2 / 3), or as it is (None: Gemma 1)."""
    return x if norm is None else gemma_rms_norm(x, norm)


# vaultgemma: VaultGemma 1B, Gemma 2's layer without the norms of each branch's output
GEMMA_MODEL_TYPES = ("gemma", "gemma2", "gemma3_text", "gemma3", "vaultgemma")
ATTN_SOFTCAP_TYPES = ("gemma2", "vaultgemma")  # the families whose attention reads attn_logit_softcapping


class _TextDecoder:
    """Gemma 3's multimodal model (model_type gemma3: Gemma3ForConditionalGeneration, what AutoModelForCausalLM
    loads for the 4B / 12B / 27B checkpoints) seen as its text decoder: .model its language_model, .config its
    text_config, its LM head; a prompt of text tokens runs through exactly these (the vision tower only
    embeds image tokens, which generate's ids here never hold)."""

    def __init__(self, model):
        self._whole = model
        self.model, self.config = model.model.language_model, model.config.text_config

    def get_output_embeddings(self):
        return self._whole.get_output_embeddings()

    def parameters(self):
        return self._whole.parameters()


def text_decoder(model):
    """``model`` itself, or Gemma 3's / Gemma 4's multimodal model as its text decoder (_TextDecoder)."""
    config = getattr(model, "config", None)
    if getattr(config, "model_type", None) in ("gemma3", "gemma4", "gemma4_unified") and hasattr(getattr(model, "model", None),
                                                                               "language_model"):
        return _TextDecoder(model)
    return model


def gemma_unsupported_reason(model, max_tokens_per_row: int | None = None, backend=None) -> str | None:
    """Why PagedGemmaRunner cannot run ``model`` with rows of up to max_tokens_per_row tokens and
    kernel ``backend``, or None when it can."""
    if getattr(getattr(model, "config", None), "model_type", None) == "gemma3":
        if not hasattr(getattr(model, "model", None), "language_model"):
            return "a gemma3 model without its language_model (expected Gemma3ForConditionalGeneration)"
        model = text_decoder(model)
        if model.config.model_type != "gemma3_text":
            return f"gemma3's text_config is {model.config.model_type!r}, not 'gemma3_text'"
    reason = decoder_reason(model, GEMMA_MODEL_TYPES, "model.layers", "a GemmaForCausalLM (1, 2 or 3)",
                            projection_modules)
    if reason is not None:
        return reason
    if getattr(model.config, "use_bidirectional_attention", False):
        return "use_bidirectional_attention (EmbeddingGemma) is not a causal decoder"
    return rope_tables_reason(model, max_tokens_per_row, backend)


class _GemmaLayer:
    """One Gemma2DecoderLayer's or Gemma3DecoderLayer's parameters (references to the model's
    tensors, not copies; q_norm / k_norm None for Gemma 2)."""

    def __init__(self, layer):
        attn, mlp = layer.self_attn, layer.mlp
        self.q, self.k, self.v, self.o = linear_params(attn.q_proj, attn.k_proj, attn.v_proj, attn.o_proj)
        self.q_norm, self.k_norm = ((norm_params(attn.q_norm), norm_params(attn.k_norm)) if hasattr(attn, "q_norm")
                                    else (None, None))
        self.input = norm_params(layer.input_layernorm)
        if hasattr(layer, "pre_feedforward_layernorm"):  # Gemma 2 / 3: four norms, each branch's output normed
            # (VaultGemma: the branches' outputs not normed, None)
            self.post_attention = norm_params(getattr(layer, "post_attention_layernorm", None))
            self.pre_feedforward = norm_params(layer.pre_feedforward_layernorm)
            self.post_feedforward = norm_params(getattr(layer, "post_feedforward_layernorm", None))
        else:  # Gemma 1: Llama's two (post_attention_layernorm is the MLP's input norm)
            self.post_attention, self.post_feedforward = None, None
            self.pre_feedforward = norm_params(layer.post_attention_layernorm)
        self.gate, self.up, self.down = linear_params(mlp.gate_proj, mlp.up_proj, mlp.down_proj)
        self.act = mlp.act_fn


class PagedGemmaRunner(PagedRunnerBase):
    """Runner (see runners/base.py) for a Gemma2ForCausalLM or Gemma3ForCausalLM instance (weights
    shared); the arguments are PagedRunnerBase's."""

    unsupported_reason = staticmethod(gemma_unsupported_reason)

    def _bind(self, model) -> None:
        model, inner = self._bind_text_decoder(model)
        config = self.config
        self.layers = [_GemmaLayer(layer) for layer in inner.layers]
        self.final_norm = norm_params(inner.norm)
        self.lm_head = model.get_output_embeddings().weight
        self.softcap = getattr(config, "final_logit_softcapping", None)  # Gemma 1 has none
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = config.head_dim
        # Gemma2Attention's / Gemma3Attention's scaling; GemmaAttention's head_dim^-0.5
        self.scale = (getattr(config, "query_pre_attn_scalar", None) or self.head_dim)**-0.5
        # Gemma 2's attention soft-cap (50; VaultGemma's too). Gemma 3's config keeps the field, which its attention
        # never reads (transformers 5.24 passes no softcap there): not applied.
        self.attn_softcap = config.attn_logit_softcapping if config.model_type in ATTN_SOFTCAP_TYPES else None
        self.rope_tables, self.rope_keys = device_rope_tables(model, self.device)

    def _bind_text_decoder(self, model) -> tuple:
        """The text decoder's config and scaled embedding (Gemma 3's / Gemma 4's multimodal model: its text decoder)
        -> (the text decoder, its base model)."""
        model = text_decoder(model)
        self.config, inner = model.config, model.model
        self.embed = inner.embed_tokens.weight
        self.embed_scale = inner.embed_tokens.embed_scale  # a 0-d float32 buffer: sqrt(H)
        return model, inner

    def _decode(self, flat, positions, cu, attn_lens, n) -> torch.Tensor:
        """Packed tokens [T] at positions [T] -> final-norm hidden states [T, H]."""
        total, heads, kv_heads, dim = flat.shape[0], self.num_heads, self.num_kv_heads, self.head_dim
        # [T, D] cos / sin of each layer type's RoPE in the model dtype, once per call
        tables = rotations(self.rope_tables, positions, self.dtype)
        sum_ = self._sum_partials
        x = self._embed(flat)
        self._keep(0, x)
        for i, layer in enumerate(self.layers):
            cos, sin = tables[self.rope_keys[i]]
            h = gemma_rms_norm(x, layer.input)
            q, k = linear(h, *layer.q).view(total, heads, dim), linear(h, *layer.k).view(total, kv_heads, dim)
            if layer.q_norm is not None:
                q, k = gemma_rms_norm(q, layer.q_norm), gemma_rms_norm(k, layer.k_norm)
            v = linear(h, *layer.v).view(total, kv_heads, dim)
            q, k = rotate_half_apply(q, cos, sin), rotate_half_apply(k, cos, sin)
            o = self._attend(i, q, k, v, attn_lens, cu, n, self.scale)
            x = x + _normed(sum_(linear(o.reshape(total, heads * dim), *layer.o)), layer.post_attention)
            h = gemma_rms_norm(x, layer.pre_feedforward)
            act = layer.act(linear(h, *layer.gate)) * linear(h, *layer.up)
            x = x + _normed(sum_(linear(act, *layer.down)), layer.post_feedforward)
            if i + 1 < len(self.layers):
                self._keep(i + 1, x)
        out = gemma_rms_norm(x, self.final_norm)
        self._keep(len(self.layers), out)
        return out

    def _layer_windows(self, model) -> tuple:
        """The windows of the text decoder's config (Gemma 3's multimodal model: its text_config's layer_types
        and sliding_window, which the rule reads without the model's class)."""
        if text_decoder(model) is model:
            return super()._layer_windows(model)
        return windows_per_layer(self.config, len(self.layers))

    def _embed(self, flat: torch.Tensor) -> torch.Tensor:
        """ids [T] (-1 pads) -> embeddings [T, H] times sqrt(H) (the embedding's embed_scale, in its dtype)."""
        return F.embedding(flat.clamp(min=0), self.embed) * self.embed_scale.to(self.embed.dtype)

    def _logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """The lm_head product, soft-capped as Gemma2ForCausalLM / Gemma3ForCausalLM do when
        final_logit_softcapping is set."""
        logits = super()._logits(hidden)
        if self.softcap is None:
            return logits
        return torch.tanh(logits / self.softcap) * self.softcap
