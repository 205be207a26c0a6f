"""Eagle3Head: an EAGLE-3 draft head as published (SafeAILab/EAGLE, SGLang, vLLM), as a torch module.

The head drafts from the target's own hidden states. Its context entry t pairs the target's
hidden states at position t with the token at t + 1:
    f_t   = fc(cat(h_low_t, h_mid_t, h_high_t))                       [H]   (3 H_t -> H, no bias)
    r     = f_t (hidden_norm(f_t) with config.norm_before_residual)
    a     = cat(input_layernorm(embed(x_{t+1})), hidden_norm(f_t))   [2H]  (the midlayer's input)
    x     = r + o_proj(attention(q/k/v_proj(a)))                            (RoPE at position t)
    g_t   = x + mlp(post_attention_layernorm(x))                      [H]   (pre-norm: fed back)
    logits over the draft vocabulary = lm_head(norm(g_t))             [Vd]  (predict x_{t+2})
Draft step i >= 1 feeds (g of the previous step, the token just drafted) at the next position:
the head's own g replaces f (no fc: it is already H wide). Attention is causal over the head's
own KV cache (one layer: the midlayer).

Vocabulary: lm_head covers draft_vocab_size tokens; draft token d is target token d + d2t[d]
(d2t int64 [Vd], the published "difference" form); t2d bool [V] marks the target tokens that have
a draft id. Without draft_vocab_size (or equal to vocab_size) the identity.

Hidden states read from the target (transformers' output_hidden_states numbering, runners/
hidden_capture.py): config eagle_aux_hidden_state_layer_ids (top level or in eagle_config, vLLM's
key), else vLLM's default (2, L // 2, L - 3) for a target of L layers.

Checkpoint layout (heads/layout.py reads and writes it): config.json (a LlamaConfig with
architectures ["LlamaForCausalLMEagle3"], num_hidden_layers 1, draft_vocab_size, optional
target_hidden_size / norm_before_residual / eagle_config) and weights fc.weight,
midlayer.{input_layernorm,hidden_norm,post_attention_layernorm}.weight,
midlayer.self_attn.{q,k,v,o}_proj.weight, midlayer.mlp.{gate,up,down}_proj.weight, norm.weight,
lm_head.weight, d2t, t2d (embed_tokens.weight optional: the target's embedding otherwise).

forward() is the plain-torch reference over whole sequences (training, tests); decoding runs the
same math on the paged kernels (runners/paged_eagle3.py).
"""
import torch
import torch.nn.functional as F
from torch import nn

EAGLE3_ARCHITECTURES = ("LlamaForCausalLMEagle3", "Eagle3LlamaForCausalLM")  # config.json architectures


class RMSNorm(nn.Module):
    """transformers' LlamaRMSNorm (weight, variance_epsilon; float32 statistics)."""

    def __init__(self, size: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.variance_epsilon = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)
        return self.weight * x.to(dtype)


class _Attention(nn.Module):
    def __init__(self, config, in_features: int):
        super().__init__()
        heads, kv_heads, dim = config.num_attention_heads, config.num_key_value_heads, config.head_dim
        bias = bool(getattr(config, "attention_bias", False))
        self.q_proj = nn.Linear(in_features, heads * dim, bias=bias)
        self.k_proj = nn.Linear(in_features, kv_heads * dim, bias=bias)
        self.v_proj = nn.Linear(in_features, kv_heads * dim, bias=bias)
        self.o_proj = nn.Linear(heads * dim, config.hidden_size, bias=bias)


class _MLP(nn.Module):
    def __init__(self, config):
        super().__init__()
        bias = bool(getattr(config, "mlp_bias", False))
        self.gate_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=bias)
        self.up_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=bias)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=bias)
        if config.hidden_act != "silu":
            raise ValueError(f"EAGLE-3 heads here take hidden_act 'silu', got {config.hidden_act!r}")

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Eagle3Layer(nn.Module):
    """The midlayer: a Llama decoder layer whose attention projections read 2H (embedding ; feature)."""

    def __init__(self, config):
        super().__init__()
        eps = config.rms_norm_eps
        self.input_layernorm = RMSNorm(config.hidden_size, eps)
        self.hidden_norm = RMSNorm(config.hidden_size, eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, eps)
        self.self_attn = _Attention(config, 2 * config.hidden_size)
        self.mlp = _MLP(config)


def aux_layer_ids(config, target_layers: int | None) -> tuple:
    """The target hidden states the head reads (output_hidden_states numbering)."""
    ids = getattr(config, "eagle_aux_hidden_state_layer_ids", None)
    eagle = getattr(config, "eagle_config", None) or {}
    ids = ids or eagle.get("eagle_aux_hidden_state_layer_ids")
    if ids:
        return tuple(int(j) for j in ids)
    if target_layers is None:
        raise ValueError("the head's config names no eagle_aux_hidden_state_layer_ids; give the target's layer count")
    return (2, target_layers // 2, target_layers - 3)  # vLLM's default (llama.py get_eagle3_aux_hidden_state_layers)


class Eagle3Head(nn.Module):
    """EAGLE-3 head (module docstring). config: a transformers LlamaConfig carrying the head's
    fields. embed_tokens: None (the target's embedding is used) or an nn.Embedding of its own."""

    kind = "eagle3"
    architecture = EAGLE3_ARCHITECTURES[0]  # what save_draft_head writes

    def __init__(self, config, *, embed_tokens: nn.Embedding | None = None):
        super().__init__()
        if int(getattr(config, "num_hidden_layers", 1)) != 1:
            raise ValueError(f"EAGLE-3 heads with one midlayer only, got num_hidden_layers={config.num_hidden_layers}")
        self.config = config
        hidden = config.hidden_size
        self.target_hidden_size = int(getattr(config, "target_hidden_size", None) or hidden)
        self.vocab_size = int(config.vocab_size)
        self.draft_vocab_size = int(getattr(config, "draft_vocab_size", None) or self.vocab_size)
        self.norm_before_residual = bool(getattr(config, "norm_before_residual", False))
        self.fc = nn.Linear(3 * self.target_hidden_size, hidden, bias=bool(getattr(config, "bias", False)))
        self.midlayer = Eagle3Layer(config)
        self.norm = RMSNorm(hidden, config.rms_norm_eps)
        self.lm_head = nn.Linear(hidden, self.draft_vocab_size, bias=False)
        self.embed_tokens = embed_tokens
        self.register_buffer("d2t", torch.zeros(self.draft_vocab_size, dtype=torch.long))
        self.register_buffer("t2d", torch.ones(self.vocab_size, dtype=torch.bool) if self.draft_vocab_size ==
                             self.vocab_size else torch.zeros(self.vocab_size, dtype=torch.bool))
        from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

        self.rotary = LlamaRotaryEmbedding(config)

    # -- what the engine needs to know ---------------------------------------------------------
    @property
    def feature_width(self) -> int:
        """Columns of the target features an entry reads (fc's input: the captured states side by side)."""
        return int(self.fc.weight.shape[1])

    def hidden_indices(self, target_layers: int | None = None) -> tuple:
        return aux_layer_ids(self.config, target_layers)

    @property
    def draft_to_target(self) -> torch.Tensor:
        """int64 [Vd]: the target id of each draft id (d + d2t[d])."""
        return torch.arange(self.draft_vocab_size, device=self.d2t.device) + self.d2t

    def set_vocabulary(self, target_ids) -> None:
        """The draft vocabulary: target ids (sorted, distinct), d2t / t2d as published."""
        ids = torch.as_tensor(target_ids, dtype=torch.long).sort().values
        if ids.numel() != self.draft_vocab_size or len(set(ids.tolist())) != ids.numel():
            raise ValueError(f"need {self.draft_vocab_size} distinct target ids, got {ids.numel()}")
        self.d2t.copy_(ids - torch.arange(ids.numel()))
        self.t2d.zero_()
        self.t2d[ids] = True

    # -- the reference forward (training, tests) -----------------------------------------------
    def project(self, target_hidden: torch.Tensor) -> torch.Tensor:
        """[..., 3 H_t] -> f [..., H]."""
        return self.fc(target_hidden)

    def layer(self, embeds: torch.Tensor, feature: torch.Tensor, positions: torch.Tensor, attend) -> torch.Tensor:
        """embeds, feature [B, T, H], positions [B, T] -> g [B, T, H] (pre-norm). attend(q, k, v)
        with q [B, Hq, T, D], k / v [B, Hkv, T, D] (rotated) -> [B, Hq, T, D]: the mask is the caller's."""
        layer, config = self.midlayer, self.config
        residual = layer.hidden_norm(feature) if self.norm_before_residual else feature
        a = torch.cat([layer.input_layernorm(embeds), layer.hidden_norm(feature)], -1)
        batch, length = a.shape[:2]
        dim = config.head_dim
        q = layer.self_attn.q_proj(a).view(batch, length, -1, dim).transpose(1, 2)
        k = layer.self_attn.k_proj(a).view(batch, length, -1, dim).transpose(1, 2)
        v = layer.self_attn.v_proj(a).view(batch, length, -1, dim).transpose(1, 2)
        cos, sin = self.rotary(a, positions)  # [B, T, D]
        cos, sin = cos[:, None], sin[:, None]
        q, k = q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin
        o = attend(q, k, v).transpose(1, 2).reshape(batch, length, -1)
        x = residual + layer.self_attn.o_proj(o)
        return x + layer.mlp(layer.post_attention_layernorm(x))

    def logits(self, g: torch.Tensor) -> torch.Tensor:
        """g [..., H] -> draft-vocabulary logits [..., Vd]."""
        return self.lm_head(self.norm(g))

    def forward(self, embeds: torch.Tensor, feature: torch.Tensor, positions: torch.Tensor | None = None):
        """Causal pass over whole sequences: embeds, feature [B, T, H] -> (logits [B, T, Vd], g [B, T, H])."""
        batch, length = embeds.shape[:2]
        if positions is None:
            positions = torch.arange(length, device=embeds.device)[None].expand(batch, -1)
        g = self.layer(embeds, feature, positions, causal_attention(self.config))
        return self.logits(g), g


def causal_attention(config):
    """attend(q, k, v) for Eagle3Head.layer: causal softmax attention with GQA, transformers' scaling."""
    scale = config.head_dim ** -0.5

    def attend(q, k, v):
        group = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale)

    return attend


def _rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)

