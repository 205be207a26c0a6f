"""Training a DFlash block drafter for a target (CPU-feasible for small targets;
bench/train_dflash.py trains the demo pair's).

Per batch of sequences [B, T] the frozen target runs once with output_hidden_states: the context
is its hidden states at the drafter's target_layer_ids (every position), the labels its
next-token distributions. M anchors a per sequence (random, distinct, in [1, T - block_size + 1])
each open a block [x_a, mask x (block_size - 1)] at positions a .. a + block_size - 1 that sees
the context at positions < a (what decoding sees: the accepted positions before the block) and
its own block both ways (DFlash's block mask); all M blocks of a sequence run as one forward.
Block position i = 1 .. block_size - 1 learns the target's distribution at a + i - 1 (for the
token at a + i): CE against it through the target's (frozen) lm_head, weighted exp(-(i - 1) / gamma)
(later positions count only if the earlier ones are accepted; DFlash's decay: gamma 7 for blocks of
16, 5 for 10, 4 for 8, position_weights).

A DFlash2 head (heads/dflash2.py) trains its backbone (convolutions included) by the same loss,
plus its candidate selector's (NeMo AutoModel's dflash2_core recipe, as documented): at each block
position i >= 1, CE over the position's top selector_top_k candidates of S(x_{a+i-1}, .) (the
sequence's own predecessor token) against the index of the sequence's token x_{a+i} among them,
with the same position weights; positions whose token is not a candidate add nothing. The
selector's loss reads the backbone's outputs detached (it trains the selector's weights only).
"""
import torch
import torch.nn.functional as F

from ..heads.dflash import scale_logits
from ._loop import train_head
from .eagle3 import target_features

# DFlash's loss decay gamma per block size (its training recipe: 7 for 16, 5 for 10, 4 for 8);
# other sizes scale 16's.
DECAY_GAMMA = {8: 4.0, 10: 5.0, 16: 7.0}


def position_weights(block_size: int, gamma: float | None = None) -> torch.Tensor:
    """[block_size] float: 0 at block position 0 (the given token), exp(-(i - 1) / gamma) at i >= 1."""
    gamma = gamma if gamma is not None else DECAY_GAMMA.get(block_size, 7.0 * block_size / 16)
    i = torch.arange(block_size, dtype=torch.float32)
    return torch.where(i > 0, torch.exp(-(i - 1).clamp(min=0) / gamma), torch.zeros(()))


def block_batch(head, ids: torch.Tensor, anchors: torch.Tensor):
    """ids [B, T], anchors [B, M] -> (block tokens [B, M*bs], block positions [B, M*bs], the
    label position of each block token [B, M*bs] (a + i - 1; -1 for i = 0), ctx_visible [B, M*bs, T])."""
    bs = head.block_size
    batch, length = ids.shape
    offsets = torch.arange(bs, device=ids.device)
    positions = (anchors[:, :, None] + offsets).reshape(batch, -1)  # [B, M*bs]
    tokens = torch.full_like(positions, head.mask_token_id)
    tokens[:, ::bs] = ids.gather(1, anchors)
    labels = torch.where(offsets.repeat(anchors.shape[1])[None] > 0, positions - 1, -1)
    starts = anchors.repeat_interleave(bs, 1)  # [B, M*bs]: each query's block start
    visible = torch.arange(length, device=ids.device)[None, None, :] < starts[:, :, None]
    return tokens, positions, labels, visible


def dflash_loss(head, target, ids: torch.Tensor, anchors_per_row: int, generator: torch.Generator):
    """-> (loss, per-position top-1 agreement with the target, position 1 .. bs - 1)."""
    bs = head.block_size
    batch, length = ids.shape
    features, target_logits = target_features(target, ids, head.hidden_indices())
    ctx = head.context(features.to(head.fc.weight.dtype))
    anchors = torch.stack([torch.randperm(length - bs, generator=generator)[:anchors_per_row] + 1 for _ in range(batch)])
    anchors = anchors.sort(1).values.to(ids.device)
    tokens, positions, labels, visible = block_batch(head, ids, anchors)
    embed = target.get_input_embeddings().weight
    hidden = head(F.embedding(tokens, embed), ctx, positions, torch.arange(length, device=ids.device)[None].expand(batch, -1),
                  visible)
    logits = F.linear(hidden, target.get_output_embeddings().weight).float()  # [B, M*bs, V]
    with torch.no_grad():
        probs = torch.softmax(target_logits.float().gather(1, labels.clamp(min=0)[:, :, None].expand(-1, -1, logits.shape[-1])),
                              -1)
    logp = torch.log_softmax(scale_logits(logits, head.output_multiplier, head.final_logit_softcapping), -1)
    weight = position_weights(bs).to(ids.device).repeat(anchors.shape[1])  # [M*bs]: per block position
    per_token = -(probs * logp).sum(-1)  # [B, M*bs]
    loss = (per_token * weight).sum() / (weight.sum() * batch)
    if getattr(head, "candidate_selector", None) is not None:
        loss = loss + selector_loss(head, ids, positions, hidden, logits, weight)
    with torch.no_grad():
        hit = (logits.argmax(-1) == probs.argmax(-1)).view(batch, -1, bs)[:, :, 1:].float()  # [B, M, bs-1]
        chain = hit.cumprod(-1)  # accepted iff every earlier position was
        reached = torch.cat([torch.ones_like(chain[..., :1]), chain[..., :-1]], -1)
        agree = (chain.sum((0, 1)) / reached.sum((0, 1)).clamp(min=1)).tolist()
    return loss, agree


def selector_loss(head, ids, positions, hidden, logits, weight) -> torch.Tensor:
    """DFlash2's candidate-selector CE (module docstring) over block tokens at positions [B, M*bs]."""
    from ..heads.dflash2 import candidates, edge_scores, successor_gates

    sel = head.candidate_selector
    hidden, logits = hidden.detach(), logits.detach()
    ids_c, unary = candidates(logits, sel.top_k, head.output_multiplier, head.final_logit_softcapping)
    gates = successor_gates(hidden, ids_c, sel.successor_codebook, sel.hidden_projection.weight)
    previous = ids.gather(1, (positions - 1).clamp(min=0))  # x_{a+i-1}
    scores = edge_scores(unary, gates, sel.predecessor_codebook[previous])  # [B, M*bs, k]
    hit = ids_c == ids.gather(1, positions.clamp(max=ids.shape[1] - 1))[..., None]
    w = weight * hit.any(-1)
    ce = F.cross_entropy(scores.flatten(0, 1), hit.float().argmax(-1).flatten(), reduction="none").view_as(w)
    return (ce * w).sum() / w.sum().clamp(min=1e-6)


def train_dflash(head, target, sequences: torch.Tensor, *, steps: int = 1000, minutes: float | None = None,
                 batch_size: int = 8, anchors_per_row: int = 8, lr: float = 2e-3, seed: int = 0, log=None) -> dict:
    """Trains ``head`` (in place) on ``target``'s hidden states and outputs over ``sequences``
    [N, T]: AdamW, warm-up over 5% then cosine decay, whichever of steps / minutes ends first."""
    return train_head(head, list(head.parameters()), sequences,
                      lambda rows, gen: dflash_loss(head, target, rows, anchors_per_row, gen), steps=steps,
                      minutes=minutes, batch_size=batch_size, lr=lr, seed=seed, log=log,
                      agreement="chained top-1 agreement")
