"""DFlash2Head: DFlash2 (architectures ["DFlash2DraftModel"]), the DFlash block drafter
(heads/dflash.py) with its two published additions, as a subclass: everything else (the context,
the block, the block mask, the paged runner, the drafter's bookkeeping) is DFlash's.

Sources followed (read 2026-11; the model's own reference code was not available here): vLLM's
model_executor/models/qwen3_dflash2.py and v1/worker/gpu/spec_decode/dflash2/speculator.py (PR
vllm-project/vllm#52816), SGLang PR sgl-project/sglang#35371 (its description), the NeMo
AutoModel docs of draft_qwen3_dflash2 / dflash2_core, and the DFlash2 blog widget's source
(inco.ai/blog/dflash2). Not read: llama.cpp PR ggml-org/llama.cpp#27342's code (only part of its
discussion: its drafts are greedy) and any published checkpoint's config.json (no hub here); the
field names below are the ones vLLM reads, and other ports' test fixtures of the published
Qwen3.8-27B drafter spell them the same way (5 layers, selector_rank 256, selector_top_k 16,
conv_kernel_size 2, conv_group_size 16, and every layer "sliding_attention" with a window of 2048;
DFlash's layer rules, heads/dflash.layer_causality, follow z-lab's reference, which has DFlash2
since). Where the sources differ it is
said below.

1. In-block convolution (dflash_config.conv_kernel_size = taps, conv_group_size; absent or 0: none,
   SGLang's rule; vLLM requires it). Each layer's attention and MLP sublayer is wrapped by a
   grouped dynamic depthwise convolution along the block positions:
       x = norm(h);  c = kernel_projection(x) -> [2, taps, H / group]  (one projection for in and out)
       h += conv_1(sublayer(conv_0(x)))
       conv_s(y)[i, ch] = sum_t (base_kernel[s, t, ch] + c[i, s, t, ch // group]) * y[i - t, ch]
   taps never cross a block boundary (y[i - t] is 0 when i - t < the block's start: block position
   0, the anchor, reads nothing before it). Weights layers.{i}.attention_conv / mlp_conv.
   {base_kernel [2, taps, H], kernel_projection.weight [2 taps H / group, H]}. The block always
   spans block_size positions here (DFlash's rule in this package), so block position i reads
   i - 1 .. i - taps + 1 as trained; vLLM runs only the K + 1 positions it drafts from.
   Context entries are not convolved (they are the target's states, not block positions).

2. Candidate selector (dflash_config.selector_rank = r, selector_top_k = k_s; required here:
   without it a DFlash2DraftModel is refused rather than run as DFlash). With h_i = norm(h) at
   block position i (1 .. K) and the target's lm_head:
       candidates_i = top-k_s token ids of lm_head(h_i)           (ties: torch.topk's order)
       U_i(c)       = softcap(output_multiplier * logit_i(c))      (dflash_config.output_multiplier,
                                                                    final_logit_softcapping)
       S_i(a, c)    = U_i(c) + < A[a] * P h_i , B[c] >              A = predecessor_codebook [V, r],
                                                                    B = successor_codebook [V, r],
                                                                    P = hidden_projection [r, H]
   and a walk from the anchor x_0 (the last accepted token), one step per position: draft x_i is
   drawn from the selector's distribution at i, softmax over candidates_i of S_i(x_{i-1}, .)
   (zero elsewhere), under the call's temperature / top-k / top-p (greedy: its argmax); x_i then
   is the next step's predecessor. That distribution is what the verify gets as q_i: the drafter
   hands the row S_i(x_{i-1}, .) at the candidates, -inf elsewhere, which the sampler and the
   verify standardise alike. q_i depends on x_{i-1} (a chain, not independent positions): Chen
   et al.'s rule needs only x_i ~ q_i given x_<i, so the verify is exact as is.
   vLLM's walk (speculator.py) is this one: per step the argmax (greedy) or a Gumbel draw at
   temperature T (sampled) over the k_s scores of the row of the previous pick, and the realized
   scores are cached as the draft logits for its rejection sampler. The blog's widget shows a
   Viterbi path instead (the best whole path); vLLM, SGLang and the issue ("one cheap step per
   position") walk greedily, and so does this. vLLM's sampled walk applies no top-k / top-p to
   the selector's scores; here the call's processing applies to q as to every draft's q.
   Here S_i(a, .) is computed for the actual predecessor a (A[a] is read for any token), so a
   draft outside the previous candidates (the logits stage's fallback, drafters/block_selector.py)
   still has a row.

Also from dflash_config: input_embedding_scale (the block's embeddings are multiplied by it).
Weights: DFlash's (heads/dflash.py) plus the conv's and candidate_selector.{predecessor_codebook,
successor_codebook, hidden_projection.weight}. A fresh head's convolutions are the identity
(base_kernel [s, 0] = 1, the rest and kernel_projection 0): it then runs as the DFlash backbone.
"""
import torch
import torch.nn.functional as F
from torch import nn

from .dflash import DFlashHead, _dflash_field, dflash_from_layout, scale_logits

DFLASH2_ARCHITECTURES = ("DFlash2DraftModel",)


def block_conv(y: torch.Tensor, delta: torch.Tensor, base: torch.Tensor, block_size: int) -> torch.Tensor:
    """y [..., N, H] (N: whole blocks of block_size along dim -2), delta [..., N, taps, G], base
    [taps, H] -> sum_t (base[t] + delta[:, t] per group) * y shifted by t inside its block."""
    taps, hidden = base.shape
    coeff = base.to(y.dtype) + delta.to(y.dtype).repeat_interleave(hidden // delta.shape[-1], -1)  # [..., N, taps, H]
    n = y.shape[-2]
    out = coeff[..., 0, :] * y
    if taps > 1:
        position = torch.arange(n, device=y.device) % block_size
        for t in range(1, taps):
            shifted = F.pad(y[..., :n - t, :], (0, 0, t, 0)) * (position >= t).to(y.dtype)[:, None]
            out = out + coeff[..., t, :] * shifted
    return out


def conv_coefficients(x: torch.Tensor, projection: torch.Tensor, taps: int) -> torch.Tensor:
    """x [..., N, H], kernel_projection.weight [2 taps G, H] -> [..., N, 2, taps, G]."""
    c = F.linear(x, projection.to(x.dtype))
    return c.view(*c.shape[:-1], 2, taps, -1)


class BlockConv(nn.Module):
    """DFlash2's convolution around one sublayer (module docstring, 1)."""

    def __init__(self, hidden: int, taps: int, group_size: int, block_size: int):
        super().__init__()
        if taps < 1 or group_size < 1 or hidden % group_size:
            raise ValueError(f"DFlash2 convolution: conv_kernel_size {taps} must be >= 1 and conv_group_size "
                             f"{group_size} must divide hidden_size {hidden}")
        self.taps, self.block_size = taps, block_size
        base = torch.zeros(2, taps, hidden)
        base[:, 0] = 1.0
        self.base_kernel = nn.Parameter(base)
        self.kernel_projection = nn.Linear(hidden, 2 * taps * (hidden // group_size), bias=False)
        nn.init.zeros_(self.kernel_projection.weight)

    def prepare(self, x: torch.Tensor):
        c = conv_coefficients(x, self.kernel_projection.weight, self.taps)
        return block_conv(x, c[..., 0, :, :], self.base_kernel[0], self.block_size), c[..., 1, :, :]

    def finish(self, y: torch.Tensor, delta: torch.Tensor) -> torch.Tensor:
        return block_conv(y, delta, self.base_kernel[1], self.block_size)


class CandidateSelector(nn.Module):
    """DFlash2's selector weights (module docstring, 2)."""

    def __init__(self, hidden: int, vocab: int, rank: int, top_k: int):
        super().__init__()
        self.rank, self.top_k = rank, top_k
        self.predecessor_codebook = nn.Parameter(torch.randn(vocab, rank) * rank ** -0.5)
        self.successor_codebook = nn.Parameter(torch.randn(vocab, rank) * rank ** -0.5)
        self.hidden_projection = nn.Linear(hidden, rank, bias=False)
        nn.init.zeros_(self.hidden_projection.weight)  # a fresh selector ranks by U alone


def candidates(logits: torch.Tensor, top_k: int, multiplier: float = 1.0, softcap: float | None = None):
    """logits [..., V] -> (candidate ids [..., k] int64, U float32 [..., k]) (module docstring, 2)."""
    values, ids = torch.topk(logits, top_k, dim=-1)
    return ids, scale_logits(values.float(), multiplier, softcap)


def successor_gates(h: torch.Tensor, ids: torch.Tensor, successor: torch.Tensor, projection: torch.Tensor) -> torch.Tensor:
    """h [..., H] at the candidates' position, ids [..., k] -> B[c] * P h  float32 [..., k, r]:
    S(a, c) = U(c) + sum_r A[a, r] * gates[c, r]."""
    gate = F.linear(h, projection.to(h.dtype)).float()
    return successor[ids].float() * gate[..., None, :]


def edge_scores(unary: torch.Tensor, gates: torch.Tensor, predecessor_rows: torch.Tensor) -> torch.Tensor:
    """U [..., k], gates [..., k, r], A[a] [..., r] -> S(a, .) float32 [..., k]."""
    return unary + (gates * predecessor_rows.float()[..., None, :]).sum(-1)


class DFlash2Head(DFlashHead):
    """DFlash2 drafter (module docstring). config: a transformers Qwen3Config with DFlash's fields
    and DFlash2's (dflash_config: selector_rank, selector_top_k; conv_kernel_size,
    conv_group_size; optional input_embedding_scale, output_multiplier, final_logit_softcapping)."""

    variant = "dflash2"
    label = "DFlash2"
    architecture = DFLASH2_ARCHITECTURES[0]

    def __init__(self, config):
        super().__init__(config)
        rank, top_k = _dflash_field(config, "selector_rank"), _dflash_field(config, "selector_top_k")
        if not rank or not top_k:
            raise ValueError(f"a DFlash2 drafter needs dflash_config.selector_rank and selector_top_k (its candidate "
                             f"selector), got {rank!r} and {top_k!r}")
        rank, top_k = int(rank), int(top_k)
        if not 1 <= top_k <= self.vocab_size:
            raise ValueError(f"DFlash2 selector_top_k must be in 1 .. vocab_size {self.vocab_size}, got {top_k}")
        hidden = config.hidden_size
        self.conv_taps = int(_dflash_field(config, "conv_kernel_size", 0) or 0)
        group = int(_dflash_field(config, "conv_group_size", 16) or 16)
        if self.conv_taps:
            for layer in self.layers:
                layer.attention_conv = BlockConv(hidden, self.conv_taps, group, self.block_size)
                layer.mlp_conv = BlockConv(hidden, self.conv_taps, group, self.block_size)
        self.candidate_selector = CandidateSelector(hidden, self.vocab_size, rank, top_k)
        self.input_embedding_scale = float(_dflash_field(config, "input_embedding_scale", 1.0) or 1.0)

    @property
    def selector_top_k(self) -> int:
        return self.candidate_selector.top_k

    # -- the backbone hooks (heads/dflash.py) -------------------------------------------------
    def scale_embeddings(self, block_embeds):
        return block_embeds if self.input_embedding_scale == 1.0 else block_embeds * self.input_embedding_scale

    def mix_in(self, layer, sublayer, x):
        conv = getattr(layer, f"{sublayer}_conv", None)
        return (x, None) if conv is None else conv.prepare(x)

    def mix_out(self, layer, sublayer, y, mixing):
        return y if mixing is None else getattr(layer, f"{sublayer}_conv").finish(y, mixing)

    # -- the selector (reference: tests, training) ---------------------------------------------
    def candidates(self, h: torch.Tensor, lm_head: torch.Tensor):
        """norm(h) [..., H] at block positions 1 .. K -> (ids [..., k_s], U [..., k_s], gates [..., k_s, r])."""
        sel = self.candidate_selector
        ids, unary = candidates(F.linear(h, lm_head.to(h.dtype)), sel.top_k, self.output_multiplier,
                                self.final_logit_softcapping)
        return ids, unary, successor_gates(h, ids, sel.successor_codebook, sel.hidden_projection.weight)

    def walk(self, h: torch.Tensor, lm_head: torch.Tensor, anchor: torch.Tensor) -> torch.Tensor:
        """The greedy walk: h [B, K, H] (block positions 1 .. K), anchor [B] -> drafts [B, K]."""
        ids, unary, gates = self.candidates(h, lm_head)
        previous, drafts = anchor, []
        for i in range(h.shape[1]):
            scores = edge_scores(unary[:, i], gates[:, i], self.candidate_selector.predecessor_codebook[previous])
            previous = ids[:, i].gather(1, scores.argmax(-1, keepdim=True))[:, 0]
            drafts.append(previous)
        return torch.stack(drafts, 1)


def dflash2_from_layout(raw: dict, weights: dict) -> DFlash2Head:
    """A DFlash2Head from a checkpoint's config.json dict and weights (heads/layout.py)."""
    return dflash_from_layout(raw, weights, DFlash2Head)
