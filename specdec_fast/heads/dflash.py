"""DFlashHead: a block-parallel drafter as published (z-lab DFlash: DFlashDraftModel), a torch module.

All K drafts of an iteration come from ONE forward over a block: the last accepted token
followed by mask_token_id up to block_size, embedded with the target's embedding, run through
the drafter's layers. Each layer attends, non-causally inside the block, over
    the context   ctx = hidden_norm(fc(cat(target hidden states of target_layer_ids))) at every
                  accepted position, projected by the layer's own k_proj (+ k_norm) / v_proj,
                  RoPE at the position (not the token embeddings: the target's states only)
    the block     its own q / k / v of the layer's input (q_norm / k_norm: Qwen3's per-head norms)
and the output norm(h) goes through the target's lm_head (then output_multiplier and
final_logit_softcapping where the config gives them: scale_logits): block position i (1 .. block_size - 1)
proposes the token AT position start + i (the block's first token sits at start). K <= block_size
- 1 drafts are the first K of the full block (the block is always whole: it is non-causal).

Layer: h += o_proj(attention(q_norm(q_proj(x)), [k_ctx ; k_norm(k_proj(x))], [v_ctx ; v_proj(x)]))
with x = input_layernorm(h); h += mlp(post_attention_layernorm(h)); SwiGLU MLP.

Hidden states read from the target: target_layer_ids i are layer i's outputs, transformers'
hidden_states[i + 1] (runners/hidden_capture.py); without them in the config, DFlash's own rule
(build_target_layer_ids: evenly from layer 1 to L - 3, or L // 2 for a one-layer drafter).

Checkpoint layout (heads/layout.py): config.json with architectures ["DFlashDraftModel"] (a
Qwen3Config), block_size at top level or in dflash_config, dflash_config {mask_token_id,
target_layer_ids}; weights layers.{i}.input_layernorm / post_attention_layernorm /
self_attn.{q,k,v,o}_proj / self_attn.{q,k}_norm / mlp.{gate,up,down}_proj, fc, hidden_norm, norm
(no embedding, no lm_head: the target's).

Which layers are causal inside the block, and which slide (layer_causality, z-lab's reference
dflash/model.py Qwen3DFlashAttention, read 2026-11-30): the config's is_causal when it has one
(NeMo AutoModel's DFlash recipe writes is_causal false, as it says the published DFlash2 drafters
do), else this package's earlier field `causal`
(dflash_config or the config), else per layer: sliding_attention layers causal, full_attention
ones not. sliding_attention layers slide by sliding_window W: a query at position p sees no key
with |p - k| >= W (the reference's mask: p - k < W, and k - p < W where the layer is not causal).

forward() is the plain-torch reference (training, tests); decoding runs the same math on the
paged kernels with the block mask (runners/paged_dflash.py).
"""
import torch
import torch.nn.functional as F
from torch import nn

from .eagle3 import RMSNorm, _rotate_half

DFLASH_ARCHITECTURES = ("DFlashDraftModel",)


def layer_causality(config, layer_types: list) -> tuple:
    """Whether each layer is causal inside the block (module docstring): is_causal, else this
    package's `causal` field, else sliding_attention layers causal and full_attention ones not."""
    explicit = _dflash_field(config, "is_causal")
    if explicit is None:
        explicit = _dflash_field(config, "causal")
    if explicit is not None:
        return (bool(explicit),) * len(layer_types)
    return tuple(kind == "sliding_attention" for kind in layer_types)


def build_target_layer_ids(num_target_layers: int, num_draft_layers: int) -> list:
    """DFlash's default choice of target layers (z-lab dflash.py)."""
    if num_draft_layers == 1:
        return [num_target_layers // 2]
    start, end = 1, num_target_layers - 3
    return [int(round(start + (i * (end - start)) / (num_draft_layers - 1))) for i in range(num_draft_layers)]


class _Attention(nn.Module):
    def __init__(self, config):
        super().__init__()
        heads, kv_heads, dim = config.num_attention_heads, config.num_key_value_heads, config.head_dim
        bias = bool(getattr(config, "attention_bias", False))
        self.q_proj = nn.Linear(config.hidden_size, heads * dim, bias=bias)
        self.k_proj = nn.Linear(config.hidden_size, kv_heads * dim, bias=bias)
        self.v_proj = nn.Linear(config.hidden_size, kv_heads * dim, bias=bias)
        self.o_proj = nn.Linear(heads * dim, config.hidden_size, bias=bias)
        self.q_norm = RMSNorm(dim, config.rms_norm_eps)
        self.k_norm = RMSNorm(dim, config.rms_norm_eps)


class _MLP(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.gate_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.up_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DFlashLayer(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = _Attention(config)
        self.mlp = _MLP(config)


def scale_logits(logits: torch.Tensor, multiplier: float = 1.0, softcap: float | None = None) -> torch.Tensor:
    """The published output transform of the drafter's logits [..., V]: softcap * tanh(multiplier *
    logits / softcap) (final_logit_softcapping), or multiplier * logits without a cap; float32
    arithmetic, the input's dtype back. The identity (no op at all) at multiplier 1 without a cap."""
    if multiplier == 1.0 and not softcap:
        return logits
    values = logits.float() * multiplier
    if softcap:
        values = torch.tanh(values / softcap) * softcap
    return values.to(logits.dtype)


def _dflash_field(config, name, default=None):
    dflash = getattr(config, "dflash_config", None) or {}
    value = dflash.get(name)
    return getattr(config, name, default) if value is None else value


class DFlashHead(nn.Module):
    """DFlash drafter (module docstring). config: a transformers Qwen3Config with the DFlash fields."""

    kind = "dflash"  # the engine's block-drafter path (variants too: variant says which)
    variant = "dflash"
    label = "DFlash"
    architecture = DFLASH_ARCHITECTURES[0]

    def __init__(self, config):
        super().__init__()
        layer_types = list(getattr(config, "layer_types", None) or [])
        if any(t not in ("full_attention", "sliding_attention") for t in layer_types):
            raise ValueError(f"DFlash drafters take full_attention / sliding_attention layers, got layer_types "
                             f"{layer_types}")
        # Sliding-window layers (the published DFlash2 drafters: every layer, 2048), and which layers
        # are causal inside the block (module docstring)
        self.sliding_window = None
        if "sliding_attention" in layer_types:
            window = getattr(config, "sliding_window", None)
            if not window or int(window) < 1:
                raise ValueError(f"sliding_attention layers need a sliding_window, got {window!r}")
            self.sliding_window = int(window)
        kinds = layer_types or ["full_attention"] * config.num_hidden_layers
        if len(kinds) < config.num_hidden_layers:
            raise ValueError(f"layer_types lists {len(kinds)} layers, the drafter has {config.num_hidden_layers}")
        kinds = kinds[:config.num_hidden_layers]
        self.layer_windows = tuple(self.sliding_window if kind == "sliding_attention" else None for kind in kinds)
        self.layer_causal = layer_causality(config, kinds)
        if getattr(config, "hidden_act", "silu") != "silu":
            raise ValueError(f"DFlash drafters here take hidden_act 'silu', got {config.hidden_act!r}")
        self.config = config
        self.block_size = int(_dflash_field(config, "block_size"))
        self.mask_token_id = int(_dflash_field(config, "mask_token_id"))
        ids = _dflash_field(config, "target_layer_ids")
        if ids is None:
            ids = build_target_layer_ids(int(config.num_target_layers), int(config.num_hidden_layers))
        self.target_layer_ids = [int(i) for i in ids]
        # the logits' output transform where the config gives one (scale_logits)
        self.output_multiplier = float(_dflash_field(config, "output_multiplier", 1.0) or 1.0)
        softcap = float(_dflash_field(config, "final_logit_softcapping", 0.0) or 0.0)
        self.final_logit_softcapping = softcap if softcap > 0 else None
        if self.block_size < 2:
            raise ValueError(f"block_size must be >= 2 (the last token and one draft), got {self.block_size}")
        self.vocab_size = int(config.vocab_size)
        hidden = config.hidden_size
        target_hidden = int(getattr(config, "target_hidden_size", None) or hidden)
        self.layers = nn.ModuleList([DFlashLayer(config) for _ in range(config.num_hidden_layers)])
        self.fc = nn.Linear(len(self.target_layer_ids) * target_hidden, hidden, bias=False)
        self.hidden_norm = RMSNorm(hidden, config.rms_norm_eps)
        self.norm = RMSNorm(hidden, config.rms_norm_eps)
        from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

        self.rotary = LlamaRotaryEmbedding(config)

    @property
    def feature_width(self) -> int:
        """Columns of the target features an entry reads (fc's input: the captured states side by side)."""
        return int(self.fc.weight.shape[1])

    def hidden_indices(self, target_layers: int | None = None) -> tuple:
        """output_hidden_states numbering of the target states it reads: layer i -> i + 1."""
        return tuple(i + 1 for i in self.target_layer_ids)

    def context(self, target_hidden: torch.Tensor) -> torch.Tensor:
        """[..., len(ids) H_t] -> ctx [..., H]."""
        return self.hidden_norm(self.fc(target_hidden))

    def forward(self, block_embeds: torch.Tensor, ctx: torch.Tensor, block_positions: torch.Tensor,
                ctx_positions: torch.Tensor, ctx_visible: torch.Tensor | None = None) -> torch.Tensor:
        """block_embeds [B, M, H] (M = blocks x block_size, each block whole), ctx [B, C, H]
        (projected), positions [B, M] / [B, C]; ctx_visible bool [B, M, C] (None: every query sees
        the whole context). Queries see the visible context and, inside their own block of
        block_size, every block token (a causal layer: the earlier ones); a sliding layer hides the
        keys whose position is W or more away (module docstring). -> norm(h) [B, M, H]."""
        config = self.config
        batch, m = block_embeds.shape[:2]
        dim, scale = config.head_dim, config.head_dim ** -0.5
        cos_b, sin_b = self.rotary(block_embeds, block_positions)
        cos_c, sin_c = self.rotary(ctx, ctx_positions)
        blk = torch.arange(m, device=block_embeds.device) // self.block_size
        inner = blk[:, None] == blk[None, :]
        earlier = torch.arange(m, device=inner.device)[None, :] <= torch.arange(m, device=inner.device)[:, None]
        ctx_mask = torch.ones(batch, m, ctx.shape[1], dtype=torch.bool, device=ctx.device) if ctx_visible is None \
            else ctx_visible
        # |q - k| per query and key, for the sliding layers: [B, M, C + M] (only where some layer slides)
        gap = None if self.sliding_window is None else \
            (block_positions[:, :, None] - torch.cat([ctx_positions, block_positions], 1)[:, None, :]).abs()
        masks = {}
        for causal, window in set(zip(self.layer_causal, self.layer_windows)):
            block = inner & earlier if causal else inner
            mask = torch.cat([ctx_mask, block[None].expand(batch, -1, -1)], -1)  # [B, M, C + M]
            masks[causal, window] = (mask if window is None else mask & (gap < window))[:, None]
        h = self.scale_embeddings(block_embeds)
        for layer, causal, window in zip(self.layers, self.layer_causal, self.layer_windows):
            mask = masks[causal, window]
            attn = layer.self_attn
            x, mixing = self.mix_in(layer, "attention", layer.input_layernorm(h))
            q = attn.q_norm(attn.q_proj(x).view(batch, m, -1, dim)).transpose(1, 2)
            k = torch.cat([attn.k_norm(attn.k_proj(ctx).view(batch, ctx.shape[1], -1, dim)),
                           attn.k_norm(attn.k_proj(x).view(batch, m, -1, dim))], 1).transpose(1, 2)
            v = torch.cat([attn.v_proj(ctx).view(batch, ctx.shape[1], -1, dim),
                           attn.v_proj(x).view(batch, m, -1, dim)], 1).transpose(1, 2)
            cos = torch.cat([cos_c, cos_b], 1)[:, None]
            sin = torch.cat([sin_c, sin_b], 1)[:, None]
            q = q * cos_b[:, None] + _rotate_half(q) * sin_b[:, None]
            k = k * cos + _rotate_half(k) * sin
            group = q.shape[1] // k.shape[1]
            o = F.scaled_dot_product_attention(q, k.repeat_interleave(group, 1), v.repeat_interleave(group, 1),
                                               attn_mask=mask, scale=scale)
            h = h + self.mix_out(layer, "attention", attn.o_proj(o.transpose(1, 2).reshape(batch, m, -1)), mixing)
            x, mixing = self.mix_in(layer, "mlp", layer.post_attention_layernorm(h))
            h = h + self.mix_out(layer, "mlp", layer.mlp(x), mixing)
        return self.norm(h)

    # Hooks of the variants (heads/dflash2.py: DFlash2's in-block convolution, its embedding scale):
    # the identity here. x [B, M, H]: whole blocks of block_size along M.
    def scale_embeddings(self, block_embeds: torch.Tensor) -> torch.Tensor:
        return block_embeds

    def mix_in(self, layer, sublayer: str, x: torch.Tensor):
        """A sublayer's input -> (what it reads, what mix_out needs)."""
        return x, None

    def mix_out(self, layer, sublayer: str, y: torch.Tensor, mixing) -> torch.Tensor:
        """A sublayer's output -> what its residual adds."""
        return y


def dflash_from_layout(raw: dict, weights: dict, head_class=None) -> DFlashHead:
    """A DFlashHead (or head_class: a variant, heads/dflash2.py) from a checkpoint's config.json
    dict and weights (names as published; a leading "model." is dropped)."""
    from transformers import Qwen3Config

    head_class = head_class or DFlashHead
    name = head_class.label
    config = Qwen3Config(**{k: v for k, v in raw.items() if k != "architectures"})
    config.architectures = list(raw.get("architectures") or [head_class.architecture])
    head = head_class(config)
    weights = {(n[len("model."):] if n.startswith("model.") else n): t for n, t in weights.items()}
    weights = {n: t for n, t in weights.items() if not n.startswith(("embed_tokens.", "lm_head."))}
    state = head.state_dict()
    missing, unexpected = sorted(set(state) - set(weights)), sorted(set(weights) - set(state))
    if missing or unexpected:
        raise ValueError(f"{name} weights do not fit the layout: missing {missing}, unexpected {unexpected}")
    for weight, tensor in weights.items():
        if tuple(tensor.shape) != tuple(state[weight].shape):
            raise ValueError(f"{name} weight {weight}: shape {tuple(tensor.shape)}, the config says "
                             f"{tuple(state[weight].shape)}")
    head.load_state_dict({n: t.to(state[n].dtype) for n, t in weights.items()})
    return head
