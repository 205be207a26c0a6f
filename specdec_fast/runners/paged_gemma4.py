"""PagedGemma4Runner: Gemma 4's text decoder (model_type gemma4_text: Gemma4ForCausalLM; gemma4:
Gemma4ForConditionalGeneration, what AutoModelForCausalLM loads from a Gemma 4 checkpoint, whose text
decoder runs a prompt of text tokens; and the unified models' -- gemma4_unified_text / gemma4_unified: the
same layers without per-layer inputs or the MoE block) layer by layer over paged KV caches with the project's append_kv /
paged_attention kernels (the machinery: runners/paged_base.py), the rest torch ops.

The math is transformers 5.24's Gemma4TextModel / Gemma4TextDecoderLayer (modeling_gemma4.py), eval mode:
    norms          Gemma4RMSNorm: x * (mean x^2 + eps)^-0.5 * w in float32, then the dtype (no w: v_norm,
                   the router's norm)
    x              embed(ids) * sqrt(H) (the scale rounded to the dtype first)
    per-layer      (hidden_size_per_layer_input P, the E2B / E4B checkpoints) each layer i gets
    inputs         u_i = (norm(x W_ple / sqrt(H))[i] + embed_ple(ids)[i] * sqrt(P)) / sqrt(2)
    attention      q = rope(q_norm(q_proj h)); k = rope(k_norm(k_proj h)); v = v_norm(v_proj h) -- or of
                   k_proj h where the layer's v is its k (attention_k_eq_v: the full layers); scale 1.0;
                   the layer type's RoPE (proportional on the full layers: the unrotated dims' frequencies 0);
                   sliding layers' window. Heads differ in width by layer type (head_dim on the sliding
                   layers, global_head_dim on the full ones) and their KV heads may too: one paged cache
                   per (KV heads, head dim) (PagedRunnerBase.kv_shape)
    KV sharing     the last num_kv_shared_layers layers write no K/V: each attends over the cache of the
                   last earlier layer of its type (kv_sharing_modes' "store" layer), this call's tokens
                   already written there
    x              x + post_attention_layernorm(o_proj(attn))
    MLP            m = down(act(gate(h)) * up(h)), h = pre_feedforward_layernorm(x) (twice as wide on the
                   KV-shared layers with use_double_wide_mlp: the weights say so); with enable_moe_block
                   m = post_ff_1(m) + post_ff_2(experts(pre_ff_2(x))), the router on x: softmax over
                   proj(norm(x) * scale / sqrt(H)), top-k renormalised, times per_expert_scale (the experts'
                   products: runners/_moe.MoE.mix, which waits on the device only in a prefill)
    x              x + post_feedforward_layernorm(m); then, with per-layer inputs,
                   x + post_per_layer_input_norm(per_layer_projection(act(per_layer_input_gate(x)) * u_i))
    x              x * layer_scalar
    logits         lm_head(norm(x)), soft-capped by final_logit_softcapping when it is set
Refused: bidirectional attention over the whole prompt ("all"; "vision" is causal over text tokens); a RoPE whose frequencies change with the length. Tensor parallelism:
runners/paged_gemma4_tp.py. The published full layers' 512-wide heads take the Triton attention's 16-row tiles (kernels/attention/triton.py
choose_tiling; untimed on a GPU). Its assistant (Gemma4AssistantForCausalLM) drafts over these caches:
runners/paged_gemma4_assistant.py.
"""
import torch
import torch.nn.functional as F

from ..kernels.llama_ops.reference import rotate_half_apply
from ._layer_math import linear_params
from ._linear import linear
from ._moe import MoE
from ._rotary import device_rope_tables, rope_tables, rotations, static_rope_reason
from .paged_base import decoder_reason, head_dim_reason
from .paged_gemma import PagedGemmaRunner, text_decoder
from .sliding_window import windows_per_layer

# Gemma 4 and its unified successor (gemma4_unified: Gemma 4's text decoder without per-layer inputs or the MoE
# block); each multimodal type -> its text decoder's type
GEMMA4_MODEL_TYPES = ("gemma4_text", "gemma4", "gemma4_unified_text", "gemma4_unified")
GEMMA4_TEXT_OF = {"gemma4": "gemma4_text", "gemma4_unified": "gemma4_unified_text"}


def gemma4_norm(x: torch.Tensor, weight, eps: float) -> torch.Tensor:
    """Gemma4RMSNorm over the last dim of x: x * (mean x^2 + eps)^-0.5 (times weight unless None) in float32,
    then x's dtype."""
    x32 = x.float()
    out = x32 * torch.pow(x32.pow(2).mean(-1, keepdim=True) + eps, -0.5)
    return (out if weight is None else out * weight.float()).type_as(x)


def _norm(module) -> tuple:
    """A Gemma4RMSNorm's (weight or None, eps)."""
    return (module.weight if module.with_scale else None), module.eps


def _has_ple(layer) -> bool:
    """Whether a decoder layer takes per-layer inputs (Gemma 4's E2B / E4B; the unified decoder's layers have none)."""
    return bool(getattr(layer, "hidden_size_per_layer_input", 0))


def _has_moe(layer) -> bool:
    """Whether a decoder layer has the MoE block beside its MLP (Gemma 4's 26B-A4B; none in the unified decoder)."""
    return bool(getattr(layer, "enable_moe_block", False))


def _projections(layer) -> tuple:
    """A Gemma 4 decoder layer's projection modules (for plain_projections_reason)."""
    attn, mlp = layer.self_attn, layer.mlp
    mixing = tuple(m for m in (attn.q_proj, getattr(attn, "k_proj", None), getattr(attn, "v_proj", None), attn.o_proj)
                   if m is not None)
    ple = (layer.per_layer_input_gate, layer.per_layer_projection) if _has_ple(layer) else ()
    router = (layer.router.proj,) if _has_moe(layer) else ()
    return mixing + (mlp.gate_proj, mlp.up_proj, mlp.down_proj) + ple + router


def bidirectional_reason(config) -> str | None:
    """Why a Gemma 4 config is not a causal decoder: use_bidirectional_attention "all" (every token sees the whole
    prompt); "vision" (the larger checkpoints, the unified decoder's default) is bidirectional over image tokens
    only, given by mm_token_type_ids, which a text prompt has none of: causal, as transformers' masks then are."""
    mode = getattr(config, "use_bidirectional_attention", None)
    if mode not in (None, "vision"):
        return f"use_bidirectional_attention {mode!r} is not a causal decoder"
    return None


def gemma4_unsupported_reason(model, max_tokens_per_row: int | None = None, backend=None) -> str | None:
    """Why PagedGemma4Runner cannot run ``model`` with kernel ``backend``, or None when it can."""
    config = getattr(model, "config", None)
    multimodal = getattr(config, "model_type", None)
    if multimodal in GEMMA4_TEXT_OF:
        if not hasattr(getattr(model, "model", None), "language_model"):
            return f"a {multimodal} model without its language_model (expected its *ForConditionalGeneration)"
        model = text_decoder(model)
        if model.config.model_type != GEMMA4_TEXT_OF[multimodal]:
            return f"{multimodal}'s text_config is {model.config.model_type!r}, not {GEMMA4_TEXT_OF[multimodal]!r}"
    reason = decoder_reason(model, GEMMA4_MODEL_TYPES, "model.layers", "a Gemma4ForCausalLM", _projections)
    if reason is not None:
        return reason
    config = model.config
    reason = bidirectional_reason(config)
    if reason is not None:
        return reason
    kinds = set(config.layer_types)
    if kinds - {"full_attention", "sliding_attention"}:
        return f"layer_types {sorted(kinds)}: this runner takes full and sliding attention layers"
    tables = rope_tables(model)
    if tables is None:
        return "the model has no rotary_emb with {layer type}_inv_freq"
    for _, _, rope_type in tables[0].values():
        reason = static_rope_reason(rope_type)
        if reason is not None:
            return reason
    for layer in model.model.layers:
        reason = head_dim_reason(layer.self_attn.head_dim, backend)
        if reason is not None:
            return reason
    return None


class _Layer:
    """One Gemma4TextDecoderLayer's parameters (references to the model's tensors, not copies)."""

    def __init__(self, layer, config, kernels: str):
        attn, mlp = layer.self_attn, layer.mlp
        self.kind, self.shared, self.head_dim = attn.layer_type, attn.is_kv_shared_layer, attn.head_dim
        self.q, self.o = linear_params(attn.q_proj, attn.o_proj)
        self.q_norm = _norm(attn.q_norm)
        if not self.shared:
            (self.k,) = linear_params(attn.k_proj)
            self.v = linear_params(attn.v_proj)[0] if attn.v_proj is not None else None  # None: v is k (k_eq_v)
            self.k_norm, self.v_norm = _norm(attn.k_norm), _norm(attn.v_norm)
            self.kv_heads = self.k[0].shape[0] // self.head_dim
        self.input = _norm(layer.input_layernorm)
        self.post_attention = _norm(layer.post_attention_layernorm)
        self.pre_feedforward = _norm(layer.pre_feedforward_layernorm)
        self.post_feedforward = _norm(layer.post_feedforward_layernorm)
        self.gate, self.up, self.down = linear_params(mlp.gate_proj, mlp.up_proj, mlp.down_proj)
        self.act = mlp.act_fn
        self.moe = None
        if _has_moe(layer):
            router, experts = layer.router, layer.experts
            self.moe = dict(router_eps=router.norm.eps, router_scale=router.scale, root=router.scalar_root_size,
                            router=router.proj.weight, expert_scale=router.per_expert_scale,
                            top_k=int(config.top_k_experts), post_1=_norm(layer.post_feedforward_layernorm_1),
                            pre_2=_norm(layer.pre_feedforward_layernorm_2),
                            post_2=_norm(layer.post_feedforward_layernorm_2),
                            experts=MoE.experts_only(experts.gate_up_proj, experts.down_proj, config.top_k_experts,
                                                     experts.act_fn, config.hidden_activation, kernels))
        self.ple = None
        if _has_ple(layer):
            (gate,), (proj,) = linear_params(layer.per_layer_input_gate), linear_params(layer.per_layer_projection)
            self.ple = (gate, proj, _norm(layer.post_per_layer_input_norm), layer.act_fn)
        self.scalar = layer.layer_scalar


def _routing(moe: dict, x: torch.Tensor) -> tuple:
    """Gemma4TextRouter on x [T, H]: softmax over proj(norm(x) * scale / sqrt(H)) in float32, the top k renormalised
    and times their per_expert_scale -> (weights [T, k] float32, experts [T, k] int64)."""
    normed = gemma4_norm(x, None, moe["router_eps"]) * moe["router_scale"] * moe["root"]
    probs = torch.softmax(F.linear(normed, moe["router"]), dim=-1, dtype=torch.float32)
    weights, chosen = torch.topk(probs, k=moe["top_k"], dim=-1)
    return weights / weights.sum(dim=-1, keepdim=True) * moe["expert_scale"][chosen], chosen


class PagedGemma4Runner(PagedGemmaRunner):
    """Runner (see runners/base.py) for a Gemma4ForCausalLM, or Gemma4ForConditionalGeneration's text decoder
    (weights shared); the arguments are PagedRunnerBase's. Gemma's runner gives it the scaled embedding and the
    soft-capped logits; the layers are its own."""

    unsupported_reason = staticmethod(gemma4_unsupported_reason)

    def _bind(self, model) -> None:
        model, inner = self._bind_text_decoder(model)  # Gemma 4's multimodal model: its text decoder
        config = self.config
        self.layers = [_Layer(layer, config, self.kernels) for layer in inner.layers]
        self.final_norm = _norm(inner.norm)
        self.lm_head = model.get_output_embeddings().weight
        self.num_heads = config.num_attention_heads
        self._bind_kv_layers(config)
        self.ple = None
        if getattr(inner, "hidden_size_per_layer_input", 0):
            (projection,) = linear_params(inner.per_layer_model_projection)
            self.ple = dict(embed=inner.embed_tokens_per_layer.weight, embed_scale=inner.embed_tokens_per_layer.embed_scale,
                            projection=projection, projection_scale=inner.per_layer_model_projection_scale,
                            norm=_norm(inner.per_layer_projection_norm), input_scale=inner.per_layer_input_scale,
                            width=config.hidden_size_per_layer_input)
        self.rope_tables, self.rope_keys = device_rope_tables(model, self.device)

    def _bind_kv_layers(self, config) -> None:
        """Each layer's KV layer (kv_of): its own (the layers that write K/V, numbered among themselves), or for a
        KV-shared layer the last earlier writer of its type (transformers' "store" layer of kv_sharing_modes); the
        KV layers' shapes; the scale (1.0: the q / k norms set the scores' scale) and soft-cap."""
        writers, self.kv_of, last = [], [], {}
        for i, layer in enumerate(self.layers):
            if not layer.shared:
                last[layer.kind] = len(writers)
                writers.append(i)
            self.kv_of.append(last[layer.kind])
        self._writers = writers
        self.store_layers = last  # {layer type: its last KV layer} (transformers' "store" layers: its assistant reads them)
        self._shapes = [(self.layers[i].kv_heads, self.layers[i].head_dim) for i in writers]
        self.num_kv_heads, self.head_dim = self._shapes[0]
        self.scale = 1.0  # Gemma4TextAttention's scaling
        self.softcap = getattr(config, "final_logit_softcapping", None)

    @property
    def kv_layer_count(self) -> int:
        """The layers that write K/V (the KV-shared ones read theirs)."""
        return len(self._writers)

    def kv_shape(self, i: int) -> tuple:
        """(KV heads, head dim) of KV layer i: its layer type's (head_dim, or global_head_dim on the full layers)."""
        return self._shapes[i]

    def _layer_windows(self, model) -> tuple:
        """Each KV layer's window: its type's (sliding_window on the sliding layers, else None)."""
        windows = windows_per_layer(self.config, len(self.layers))
        return tuple(windows[i] for i in self._writers)

    def _per_layer_inputs(self, flat: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """Gemma4TextModel's get_per_layer_inputs + project_per_layer_inputs: ids [T], embeddings x [T, H] ->
        [T, L, P]."""
        ple, total = self.ple, flat.shape[0]
        token = F.embedding(flat.clamp(min=0), ple["embed"]) * ple["embed_scale"].to(ple["embed"].dtype)
        context = linear(x, *ple["projection"]) * ple["projection_scale"]
        context = gemma4_norm(context.view(total, len(self.layers), ple["width"]), *ple["norm"])
        return (context + token.view(total, len(self.layers), ple["width"])) * ple["input_scale"]

    def _decode(self, flat, positions, cu, attn_lens, n) -> torch.Tensor:
        """Packed tokens [T] at positions [T] -> final-norm hidden states [T, H]."""
        total, heads = flat.shape[0], self.num_heads
        tables = rotations(self.rope_tables, positions, self.dtype)  # [T, D] cos / sin a layer type, once per call
        sum_ = self._sum_partials  # a branch's partials summed (the tensor-parallel runner's all-reduce)
        x = self._embed(flat)
        per_layer = self._per_layer_inputs(flat, x) if self.ple is not None else None
        self._keep(0, x)
        for i, layer in enumerate(self.layers):
            cos, sin = tables[self.rope_keys[i]]
            dim = layer.head_dim
            h = gemma4_norm(x, *layer.input)
            q = rotate_half_apply(gemma4_norm(linear(h, *layer.q).view(total, heads, dim), *layer.q_norm), cos, sin)
            if layer.shared:  # this call's K/V already written by the layer it reads
                o = self._attention(self.kv_of[i], q, attn_lens, cu, n, self.scale)
            else:
                k_raw = linear(h, *layer.k).view(total, layer.kv_heads, dim)
                v_raw = k_raw if layer.v is None else linear(h, *layer.v).view(total, layer.kv_heads, dim)
                k = rotate_half_apply(gemma4_norm(k_raw, *layer.k_norm), cos, sin)
                o = self._attend(self.kv_of[i], q, k, gemma4_norm(v_raw, *layer.v_norm), attn_lens, cu, n, self.scale)
            x = x + gemma4_norm(sum_(linear(o.reshape(total, heads * dim), *layer.o)), *layer.post_attention)
            h = gemma4_norm(x, *layer.pre_feedforward)
            m = sum_(linear(layer.act(linear(h, *layer.gate)) * linear(h, *layer.up), *layer.down))
            if layer.moe is not None:
                moe = layer.moe
                weights, chosen = _routing(moe, x)  # on the layer's input; the experts on another norm of it
                routed = moe["experts"].mix(gemma4_norm(x, *moe["pre_2"]), weights, chosen, self._prefilling)
                m = gemma4_norm(m, *moe["post_1"]) + gemma4_norm(routed, *moe["post_2"])
            x = x + gemma4_norm(m, *layer.post_feedforward)
            if layer.ple is not None:
                gate, proj, norm, act = layer.ple
                x = x + gemma4_norm(linear(act(linear(x, *gate)) * per_layer[:, i], *proj), *norm)
            x.mul_(layer.scalar)  # in place in x's dtype, as transformers' `*=` (x is this layer's own sum)
            if i + 1 < len(self.layers):
                self._keep(i + 1, x)
        out = gemma4_norm(x, *self.final_norm)
        self._keep(len(self.layers), out)
        return out
