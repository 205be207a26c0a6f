"""DeepSeek Sparse Attention (DSA) on the paged MLA runner: DeepSeek-V3.2 (deepseek_v32) and GLM-5
(glm_moe_dsa) past their index_topk (runners/paged_mla.py runs rows within it as V3's dense MLA).

transformers 5.24's DeepseekV32Indexer / GlmMoeDsaIndexer, eval mode, per query token t of a layer
with an indexer (h its attention input, q_resid = q_a_norm(q_a(h)); Hi heads of Di, the first dr dims
of each rotated: in halves on V3.2, in interleaved pairs on GLM-5):
    q_i = wq_b(q_resid)  [Hi, Di]          k_i = LayerNorm(wk(h))  [Di]   (k cached per token, in the model dtype)
    w   = weights_proj(h) * Hi^-0.5  [Hi]  (float32)
    score[t, s] = sum_h w_h relu(q_i[h] . k_s * Di^-0.5)   (float32, over the visible keys s <= t)
    chosen(t)   = the top min(index_topk, keys) of score[t]
and the layer's MLA attends to the chosen keys only (transformers masks the others out of its dense
attention). A GLM-5 layer whose indexer_types entry is "shared" has no indexer: it reuses the chosen
keys of the last layer before it that has one.

Here (torch ops on every backend; no kernel of its own yet, untimed on a GPU): each layer's indexer
keys live in a paged cache of their own ([Di] a token, the latents' block table's rows: the runner's
KV layers past the decoder's, PagedMlaRunner.kv_shape), appended like the latents, so a rejected
draft costs no copy here either. A call gathers each row's keys over its whole block table (a static
shape: S = blocks a row x block size, graph safe), masks the keys past each query's position, takes
the top k (k = min(index_topk, S); chosen positions past the query, which only rows shorter than k
have, are masked out of the attention), gathers the chosen latent entries and runs the absorbed
attention over them (softmax in float32). A prefill runs its queries in chunks that keep the score
and gathered-entry tensors under CHUNK_BYTES. Ties between index scores are broken by torch.topk over
another tensor shape than transformers' own: where two keys tie at the k-th score the choice may
differ (measure zero for real weights; the tests check their scores have none). Token trees are not
taken past index_topk (a node's visible keys are its ancestors': not masked here).
"""
import torch
import torch.nn.functional as F

from ..kernels.llama_ops.reference import rotate_half_apply
from ._linear import linear

# At most this many bytes for a chunk of queries' index scores [B, c, Hi, S] (float32) or chosen entries
# [B, c, k, W]: a prefill of 4096 tokens at DeepSeek-V3.2's widths (Hi 64, S 4096) runs 32 chunks of 128
CHUNK_BYTES = 1 << 28


class Indexer:
    """One layer's indexer parameters (references to the model's tensors: no copies): wq_b [Hi Di,
    q_lora_rank], wk [Di, H], k_norm (LayerNorm weight [Di], bias [Di], eps), weights_proj [Hi, H]."""

    def __init__(self, wq_b: torch.Tensor, wk: torch.Tensor, k_norm: tuple, weights_proj: torch.Tensor, heads: int):
        self.wq_b, self.wk, self.k_norm, self.weights_proj = wq_b, wk, k_norm, weights_proj
        self.heads, self.head_dim = heads, wk.shape[0]

    @classmethod
    def of(cls, attention) -> "Indexer | None":
        """A transformers DSA attention module's indexer, or None (no indexer: V3 / a GLM-5 "shared" layer)."""
        module = getattr(attention, "indexer", None)
        if module is None:
            return None
        norm = module.k_norm
        return cls(module.wq_b.weight, module.wk.weight, (norm.weight, norm.bias, norm.eps), module.weights_proj.weight,
                   module.n_heads)

    @classmethod
    def from_shards(cls, get, prefix: str, config) -> "Indexer | None":
        """The indexer of a tensor-parallel rank's layer (get(name) -> its tensor or None), whole on every rank."""
        wq_b = get(prefix + "wq_b.weight")
        if wq_b is None:
            return None
        return cls(wq_b, get(prefix + "wk.weight"), (get(prefix + "k_norm.weight"), get(prefix + "k_norm.bias"), 1e-6),
                   get(prefix + "weights_proj.weight"), int(config.index_n_heads))


def indexer_rope(model_type: str):
    """How the indexer rotates the first dr dims of q_i / k_i: fn(x [T, H, Di], cos, sin) -> x, the rest passed
    through (V3.2: halves; GLM-5: interleaved pairs, as its MLA)."""
    if model_type == "glm_moe_dsa":
        from .paged_mla import rotate_interleaved

        def interleaved(x, cos, sin):
            dr = cos.shape[-1]
            return torch.cat((rotate_interleaved(x[..., :dr], cos, sin), x[..., dr:]), dim=-1)

        return interleaved
    return rotate_half_apply


def indexer_key(ix: Indexer, h: torch.Tensor, rotation: tuple, rope) -> torch.Tensor:
    """h [T, H] -> the tokens' indexer keys [T, 1, Di] (rotated: what the cache keeps)."""
    weight, bias, eps = ix.k_norm
    k = F.layer_norm(linear(h, ix.wk, None), (ix.head_dim,), weight, bias, eps)
    return rope(k[:, None], *rotation)


def row_slots(table: torch.Tensor, block_size: int) -> torch.Tensor:
    """A block table [B, blocks] -> each row's positions 0..S-1 as slots of its cache planes [B, S]
    (S = blocks x block_size; an unreserved block reads block 0: masked by position)."""
    steps = torch.arange(block_size, device=table.device)
    return (table.clamp(min=0).long()[:, :, None] * block_size + steps).flatten(1)


def choose(ix: Indexer, h, q_resid, rotation, rope, plane: torch.Tensor, slots, rows, positions, topk: int) -> tuple:
    """The chosen keys of every query (module docstring). h [T, H], q_resid [T, q_lora_rank], rotation: the
    (cos, sin) [T, dr] of the tokens; plane [blocks, bs, 1, Di]: this layer's indexer keys (the call's
    appended); slots [B, S] (row_slots); rows: (packed index [B, n], real [B, n]) of the call's tokens
    (PagedRunnerBase._row_index); positions [T]. -> (chosen positions [B, n, k] int64, seen [B, n, k] bool: a
    chosen position at or before its query's)."""
    index, real = rows
    total = h.shape[0]
    q = rope(linear(q_resid, ix.wq_b, None).view(total, ix.heads, ix.head_dim), *rotation)
    w = linear(h.to(ix.weights_proj.dtype), ix.weights_proj, None).float() * (ix.heads ** -0.5)
    q = torch.cat((q, q.new_zeros(1, *q.shape[1:])))[index]  # [B, n, Hi, Di] (padding: zeros)
    w = torch.cat((w, w.new_zeros(1, w.shape[1])))[index]  # [B, n, Hi]
    pos = torch.where(real, torch.cat((positions, positions.new_zeros(1)))[index], -1)  # [B, n]
    keys = plane.reshape(-1, ix.head_dim)[slots].float().transpose(1, 2)[:, None]  # [B, 1, Di, S]
    batch, n, span = index.shape[0], index.shape[1], slots.shape[1]
    k = min(topk, span)
    step = max(1, min(n, CHUNK_BYTES // max(1, batch * ix.heads * span * 4)))
    where = torch.arange(span, device=slots.device)
    chosen = []
    for start in range(0, n, step):
        stop = min(n, start + step)
        scores = F.relu(torch.matmul(q[:, start:stop].float(), keys) * ix.head_dim ** -0.5)  # [B, c, Hi, S]
        score = torch.matmul(w[:, start:stop, None], scores).squeeze(-2)  # [B, c, S]
        score = score.masked_fill(where > pos[:, start:stop, None], float("-inf"))
        chosen.append(score.topk(k, dim=-1).indices)
    chosen = torch.cat(chosen, dim=1)
    return chosen, chosen <= pos[..., None]


def chosen_attention(q: torch.Tensor, plane: torch.Tensor, slots, rows, chosen: tuple, scale: float,
                     rank: int) -> torch.Tensor:
    """The absorbed MLA attention of the packed queries q [T, Hq, W] (W = r + dr) over the chosen latent
    entries of plane [blocks, bs, 1, W] (slots [B, S]: row_slots of this layer's table) -> [T, Hq, r]
    (the value is the entry's first r dims)."""
    index, _ = rows
    positions, seen = chosen
    total, heads, width = q.shape
    batch, n, k = positions.shape
    qr = torch.cat((q, q.new_zeros(1, heads, width)))[index]  # [B, n, Hq, W]
    # a position past its query (a row shorter than k) reads position 0 instead, which its row has written: the
    # slot it names may never have been (the pool is uninitialised) and 0 x NaN is NaN in the weighted sum
    positions = torch.where(seen, positions, 0)
    flat, where = plane.reshape(-1, width), slots.gather(1, positions.flatten(1)).view(batch, n, k)
    out = []
    step = max(1, min(n, CHUNK_BYTES // max(1, batch * k * max(width * plane.element_size(), heads * 4))))
    for start in range(0, n, step):
        stop = min(n, start + step)
        e = flat[where[:, start:stop]]  # [B, c, k, W]
        logits = torch.matmul(qr[:, start:stop], e.transpose(-1, -2)).float() * scale  # [B, c, Hq, k]
        logits = logits.masked_fill(~seen[:, start:stop, None, :], torch.finfo(torch.float32).min)
        p = torch.softmax(logits, dim=-1).to(e.dtype)
        out.append(torch.matmul(p, e[..., :rank]))  # [B, c, Hq, r]
    out = torch.cat(out, dim=1)
    packed = out.new_zeros(total + 1, heads, rank)
    packed.index_copy_(0, index.reshape(-1), out.reshape(batch * n, heads, rank))
    return packed[:total]
