"""Training an EAGLE-3 head for a target (CPU-feasible for small targets; bench/train_eagle3.py
trains the demo pair's).

Data: token sequences [N, T] (a corpus). For each batch the frozen target runs once with
output_hidden_states: the head's features are its hidden states at the head's indices
(heads/eagle3.py aux_layer_ids), its labels the target's next-token distributions restricted to
the draft vocabulary (EAGLE-3: softmax over the mapped target logits).

Training-time test (EAGLE-3 §3.2): S unrolled steps. Step 0 feeds every entry t (target
features at t, token t + 1) and predicts the target's distribution at t + 1 (for token t + 2).
Step j >= 1 feeds, at every entry t, the head's own output g of step j - 1 with token t + 1 + j
at position t + j, and predicts the target's distribution at t + 1 + j: what the head sees at
draft step j of decoding. Its attention: the step-0 entries s <= t (the context, causal) and the
earlier steps' entries at the same t (the drafts before it), as EAGLE's training code builds it.
Loss: sum_j 0.8^j * CE(target distribution, head), over positions whose target argmax is in the
draft vocabulary (EAGLE's position mask).
"""
from collections import Counter

import torch
import torch.nn.functional as F

from ._loop import train_head

STEP_WEIGHT = 0.8  # EAGLE-3's weight of unrolled step j: 0.8 ** j


def choose_draft_vocabulary(sequences, size: int, vocab_size: int) -> torch.Tensor:
    """The ``size`` most frequent target tokens of ``sequences`` (ties: lower id), sorted: the
    draft vocabulary (EAGLE-3 scans its training data the same way)."""
    counts = Counter(torch.as_tensor(sequences).reshape(-1).tolist())
    ranked = sorted(range(vocab_size), key=lambda t: (-counts.get(t, 0), t))
    return torch.tensor(sorted(ranked[:size]), dtype=torch.long)


def shrink_eagle3_head(head, vocabulary, intermediate_size: int, fallback_rows: torch.Tensor):
    """A smaller copy of a trained ``head`` to continue training from: draft vocabulary
    ``vocabulary`` (sorted target ids; lm_head rows copied where the old head had the token, else
    ``fallback_rows[id]``, e.g. the target's embedding) and the ``intermediate_size`` MLP units of
    largest |gate| |up| |down| norm product (rows of gate / up, columns of down, in their order);
    fc, attention and norms unchanged. The shrunk head is not the old one: it needs training."""
    import copy

    from ..heads import Eagle3Head

    mlp = head.midlayer.mlp
    if not 0 < intermediate_size <= mlp.gate_proj.out_features:
        raise ValueError(f"intermediate_size must be in 1 .. {mlp.gate_proj.out_features}, got {intermediate_size}")
    vocabulary = torch.as_tensor(vocabulary, dtype=torch.long).sort().values
    config = copy.deepcopy(head.config)
    config.intermediate_size, config.draft_vocab_size = int(intermediate_size), int(vocabulary.numel())
    small = Eagle3Head(config, embed_tokens=copy.deepcopy(head.embed_tokens)).to(head.fc.weight.dtype)
    small.set_vocabulary(vocabulary)
    state = {k: v for k, v in head.state_dict().items()
             if not k.startswith(("midlayer.mlp.", "lm_head.", "d2t", "t2d"))}
    small.load_state_dict(state, strict=False)  # fc, attention, norms
    with torch.no_grad():
        score = (mlp.gate_proj.weight.norm(dim=1) * mlp.up_proj.weight.norm(dim=1) * mlp.down_proj.weight.norm(dim=0))
        keep = score.topk(intermediate_size).indices.sort().values
        small.midlayer.mlp.gate_proj.weight.copy_(mlp.gate_proj.weight[keep])
        small.midlayer.mlp.up_proj.weight.copy_(mlp.up_proj.weight[keep])
        small.midlayer.mlp.down_proj.weight.copy_(mlp.down_proj.weight[:, keep])
        for name in ("gate_proj", "up_proj"):
            if getattr(mlp, name).bias is not None:
                getattr(small.midlayer.mlp, name).bias.copy_(getattr(mlp, name).bias[keep])
        if mlp.down_proj.bias is not None:
            small.midlayer.mlp.down_proj.bias.copy_(mlp.down_proj.bias)
        old = torch.full((head.vocab_size,), -1, dtype=torch.long)
        old[head.draft_to_target.cpu()] = torch.arange(head.draft_vocab_size)
        rows = old[vocabulary]
        weight = fallback_rows[vocabulary].to(small.lm_head.weight.dtype).clone()
        have = rows >= 0
        weight[have] = head.lm_head.weight[rows[have]]
        small.lm_head.weight.copy_(weight)
    return small.eval()


def target_features(target, ids: torch.Tensor, indices) -> tuple:
    """ids [B, T] -> (features [B, T, len(indices) * H] from hidden_states[j], logits [B, T, V])."""
    with torch.no_grad():
        out = target(input_ids=ids, output_hidden_states=True)
    return torch.cat([out.hidden_states[j] for j in indices], -1), out.logits


def ttt_attention_mask(length: int, step: int, device) -> torch.Tensor:
    """bool [T, (step + 1) T]: step ``step``'s query t sees step-0 keys s <= t and steps 1..step at t."""
    t = torch.arange(length, device=device)
    causal = t[None, :] <= t[:, None]
    diag = t[None, :] == t[:, None]
    return torch.cat([causal] + [diag] * step, 1)


def ttt_loss(head, embed: torch.Tensor, features: torch.Tensor, ids: torch.Tensor, target_logits: torch.Tensor,
             steps: int, t2d: torch.Tensor, d2t_ids: torch.Tensor):
    """The training-time-test loss of one batch -> (loss, per-step top-1 agreement with the target)."""
    batch, length = ids.shape
    span = length - 1 - steps  # entries t with labels for every step (t + 1 + step < length)
    if span < 1:
        raise ValueError(f"sequences of {length} tokens are too short for {steps} unrolled steps")
    config = head.config
    scale = config.head_dim ** -0.5
    feature = head.project(features[:, :span].to(head.fc.weight.dtype))
    keys, values = [], []
    loss, agree = 0.0, []
    positions0 = torch.arange(span, device=ids.device)[None].expand(batch, -1)
    for j in range(steps):
        tokens = ids[:, 1 + j: 1 + j + span]
        with torch.no_grad():
            labels = target_logits[:, 1 + j: 1 + j + span].float()  # the target's distribution for token t + 2 + j
            in_vocab = t2d[labels.argmax(-1)]
            probs = torch.softmax(labels.index_select(-1, d2t_ids), -1)
        mask = ttt_attention_mask(span, j, ids.device)

        def attend(q, k, v, mask=mask):
            keys.append(k)
            values.append(v)
            group = q.shape[1] // k.shape[1]
            k_all = torch.cat(keys, 2).repeat_interleave(group, 1)
            v_all = torch.cat(values, 2).repeat_interleave(group, 1)
            return F.scaled_dot_product_attention(q, k_all, v_all, attn_mask=mask, scale=scale)

        g = head.layer(F.embedding(tokens, embed), feature, positions0 + j, attend)
        logp = torch.log_softmax(head.logits(g).float(), -1)
        weight = in_vocab.float()
        step_loss = -((probs * logp).sum(-1) * weight).sum() / weight.sum().clamp(min=1)
        loss = loss + STEP_WEIGHT ** j * step_loss
        with torch.no_grad():
            agree.append(float(((logp.argmax(-1) == probs.argmax(-1)) & in_vocab).float().mean()))
        feature = g
    return loss, agree


def train_eagle3(head, target, sequences: torch.Tensor, *, steps: int = 1000, minutes: float | None = None,
                 batch_size: int = 16, unroll: int = 4, lr: float = 3e-3, seed: int = 0, log=None) -> dict:
    """Trains ``head`` (in place; its vocabulary already chosen) on ``target``'s hidden states and
    outputs over ``sequences`` [N, T] (random batches, fixed seed): AdamW, linear warm-up over 5%
    then cosine decay, whichever of ``steps`` / ``minutes`` ends first. -> a summary dict."""
    indices = head.hidden_indices(target.config.num_hidden_layers)
    embed = target.get_input_embeddings().weight.detach()
    params = [p for name, p in head.named_parameters() if not name.startswith("embed_tokens")]
    d2t_ids, t2d = head.draft_to_target, head.t2d

    def batch_loss(ids, gen):
        features, logits = target_features(target, ids, indices)
        return ttt_loss(head, embed, features, ids, logits, unroll, t2d, d2t_ids)

    return train_head(head, params, sequences, batch_loss, steps=steps, minutes=minutes, batch_size=batch_size, lr=lr,
                      seed=seed, log=log, agreement="top-1 agreement")
