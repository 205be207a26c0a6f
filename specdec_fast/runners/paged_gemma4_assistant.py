"""PagedGemma4AssistantRunner: Gemma 4's assistant (heads/gemma4_assistant.py) drafting over the TARGET's paged
caches: it keeps no KV of its own. Each layer's queries attend over the cache of the target runner's last layer of
the same type that writes K/V (runners/paged_gemma4.py, transformers' "store" layer) with the target's block table
and committed lengths, so a row's drafts read exactly the K/V the target has committed: positions 0 .. p - 1 for a
query at p, the position of the token being fed (the drafts' token after the last accepted one).

It speaks the pairs interface of the draft heads (runners/paired.py: prefill_pairs / score_pairs / commit), which
Eagle3Drafter feeds: the pending entries (the target's final-norm states with the tokens after them) and then
K - 1 draft steps fed back the assistant's post_projection output. The assistant reads only the LAST entry of a
feed (it has no context to keep), at the position the target's committed length gives, every draft step at that
same position (transformers' Gemma4AssistantCandidateGenerator: position_ids len(input_ids) - 1 throughout).
Per row and entry, as transformers' Gemma4AssistantForCausalLM over shared_kv_states (module docstring of the head):
    e = pre_projection(cat(target_embed(x), h)); each layer (Gemma 4's, KV-shared: q_proj, q_norm, RoPE at p,
    attention scale 1.0 over the target's K/V, o_proj and its norms, the MLP, layer_scalar); o = norm(e)
    logits = lm_head(o), or the ordered embedding's (use_ordered_embeddings: each row's top centroids' tokens,
    the others at that row's least logit - 1; transformers takes the least over the whole batch); g = post_projection(o)
A sliding layer reads the last sliding_window keys before p: the real keys transformers' generation reads (its
bidirectional sliding mask keeps the last W + 1 entries it is given: the W before p and the rejected draft's at p).
No host read, static shapes: graph safe. Chains only (a tree's nodes would each need their own position).
"""
import torch
import torch.nn.functional as F

from ..kernels.attention import paged_attention
from ._layer_math import linear_params, rope_cos_sin
from ._linear import linear
from ..kernels.llama_ops.reference import rotate_half_apply
from .paged_gemma4 import PagedGemma4Runner, _norm, gemma4_norm


def assistant_reason(head, target_runner) -> str | None:
    """Why ``head`` cannot draft over ``target_runner``'s caches, or None."""
    if not isinstance(target_runner, PagedGemma4Runner):
        return (f"a Gemma 4 assistant drafts over the target's paged Gemma 4 caches; the target runs on "
                f"{type(target_runner).__name__}")
    if head.feature_width != target_runner.config.hidden_size:
        return (f"the assistant was trained for a target {head.feature_width} wide; this one is "
                f"{target_runner.config.hidden_size}")
    stores = target_runner.store_layers
    for layer in head.assistant.model.layers:
        attn = layer.self_attn
        store = stores.get(attn.layer_type)
        if store is None:
            return f"the target has no {attn.layer_type} layer that writes K/V for the assistant's to read"
        heads, dim = target_runner.kv_shape(store)
        if dim != attn.head_dim or head.config.num_attention_heads % heads:
            return (f"the assistant's {attn.layer_type} heads ({head.config.num_attention_heads} of {attn.head_dim}) "
                    f"do not read the target's K/V there ({heads} heads of {dim})")
    return None


class _Layer:
    """One assistant layer's parameters (references): q / o, q_norm, its four norms, the MLP, layer_scalar."""

    def __init__(self, layer):
        attn, mlp = layer.self_attn, layer.mlp
        self.kind, self.head_dim = attn.layer_type, attn.head_dim
        self.q, self.o = linear_params(attn.q_proj, attn.o_proj)
        self.q_norm = _norm(attn.q_norm)
        self.input, self.post_attention = _norm(layer.input_layernorm), _norm(layer.post_attention_layernorm)
        self.pre_feedforward, self.post_feedforward = (_norm(layer.pre_feedforward_layernorm),
                                                       _norm(layer.post_feedforward_layernorm))
        self.gate, self.up, self.down = linear_params(mlp.gate_proj, mlp.up_proj, mlp.down_proj)
        self.act, self.scalar = mlp.act_fn, layer.layer_scalar


class PagedGemma4AssistantRunner:
    """A Gemma 4 assistant over ``target_runner``'s caches (module docstring). The head is held weakly by the
    engine as every head; this runner holds its tensors."""

    graph_safe = True
    # why tree=... is refused (engine._tree_drafter): a tree's nodes would each need their own position
    tree_reason = "tree=... with a Gemma 4 assistant: it drafts chains (trees: EAGLE-3 heads or a draft model)"

    def __init__(self, head, target_runner, *, backend=None):
        reason = assistant_reason(head, target_runner)
        if reason is not None:
            raise ValueError(reason)
        assistant = head.assistant
        self.target, self.config, self.backend = target_runner, head.config, backend
        first = assistant.pre_projection.weight
        self.device, self.dtype = first.device, first.dtype
        self.feature_width, self.vocab_size = head.feature_width, head.vocab_size
        inner = assistant.model
        self.layers = [_Layer(layer) for layer in inner.layers]
        self.kv_of = [target_runner.store_layers[layer.kind] for layer in self.layers]
        self.final_norm = _norm(inner.norm)
        self.pre_projection, self.post_projection = linear_params(assistant.pre_projection, assistant.post_projection)
        self.lm_head = assistant.lm_head.weight
        masked = assistant.masked_embedding
        self.ordered = None if masked is None else (masked.centroids.weight, masked.token_ordering,
                                                    masked.centroid_intermediate_top_k, masked.num_centroids)
        self.num_heads = self.config.num_attention_heads
        rotary = inner.rotary_emb
        self.rope = {kind: (getattr(rotary, f"{kind}_inv_freq").to(device=self.device, dtype=torch.float32),
                            float(getattr(rotary, f"{kind}_attention_scaling"))) for kind in rotary.layer_types}
        window = getattr(self.config, "sliding_window", None)
        self.windows = [window if layer.kind == "sliding_attention" else None for layer in self.layers]
        self._cu = {}

    # -- the pairs interface ---------------------------------------------------------------
    @torch.no_grad()
    def prefill_pairs(self, tokens, features, attention_mask, *, budgets, num_draft_tokens=None) -> None:
        """Nothing to keep: the assistant reads the target's caches (the context entries are the target's)."""

    @torch.no_grad()
    def score_pairs(self, tokens: torch.Tensor, features: torch.Tensor, num_valid=None, *, project: bool,
                    tree=None, last_only: bool = False, rows=None):
        """tokens [B, N], features [B, N, F] -> (logits [B, 1, V] of the last entry, g [B, N, H_t]: the last column
        the assistant's post_projection output, the others zero). Only the last entry is read (left padding: each
        row's last real one)."""
        if tree is not None or rows is not None:
            raise ValueError("a Gemma 4 assistant drafts chains (tree=None)")
        batch, n = tokens.shape
        logits, g = self._step(tokens[:, -1], features[:, -1])
        out = torch.zeros(batch, n, g.shape[-1], dtype=g.dtype, device=g.device)
        out[:, -1] = g
        return logits[:, None], out

    def commit(self, keep) -> None:
        """Nothing to commit: no cache of its own."""

    def release(self) -> None:
        """No blocks to return."""

    # -- the forward -----------------------------------------------------------------------
    def _step(self, token: torch.Tensor, feature: torch.Tensor):
        """token [B] int64, feature [B, H_t] -> (logits [B, V], post_projection output [B, H_t]) at each row's
        position p = the target's committed length, over the target's K/V of positions 0 .. p - 1."""
        target, batch = self.target, token.shape[0]
        lengths = target.seq_lens  # [B] int32: the call's rows' committed lengths
        cu = self._cu.get(batch)
        if cu is None:
            cu = self._cu[batch] = torch.arange(batch + 1, dtype=torch.int32, device=self.device)
        embed = target._embed(token)
        x = linear(torch.cat([embed, feature.to(embed.dtype)], -1), *self.pre_projection)
        positions = lengths.long()
        tables = {kind: rope_cos_sin(positions, inv_freq, scaling, self.dtype) for kind, (inv_freq, scaling)
                  in self.rope.items()}
        for layer, kv, window in zip(self.layers, self.kv_of, self.windows):
            cos, sin = tables[layer.kind]
            h = gemma4_norm(x, *layer.input)
            q = linear(h, *layer.q).view(batch, self.num_heads, layer.head_dim)
            q = rotate_half_apply(gemma4_norm(q, *layer.q_norm), cos, sin)
            # one query a row, after every key it reads: the kernels' causal mask is no mask here
            o = paged_attention(q, target.k_caches[kv], target.v_caches[kv], target._tables[kv], lengths, cu,
                                max_query_len=1, scale=1.0, window=window, backend=self.backend, check=False)
            x = x + gemma4_norm(linear(o.reshape(batch, -1), *layer.o), *layer.post_attention)
            h = gemma4_norm(x, *layer.pre_feedforward)
            x = x + gemma4_norm(linear(layer.act(linear(h, *layer.gate)) * linear(h, *layer.up), *layer.down),
                                *layer.post_feedforward)
            x.mul_(layer.scalar)  # in place in x's dtype, as transformers' `*=`
        normed = gemma4_norm(x, *self.final_norm)
        return self._logits(normed), linear(normed, *self.post_projection)

    def _logits(self, normed: torch.Tensor) -> torch.Tensor:
        """lm_head(normed) [B, V], or the ordered embedding's: the tokens of each row's top centroids scored, the
        others at that row's least score - 1 (Gemma4AssistantMaskedEmbedder, per row)."""
        if self.ordered is None:
            return F.linear(normed, self.lm_head)
        centroids, ordering, top_k, count = self.ordered
        chosen = torch.topk(F.linear(normed, centroids), k=top_k, dim=-1).indices  # [B, top_k]
        members = ordering.long().view(count, -1)[chosen].reshape(normed.shape[0], -1)  # [B, top_k * V / count]
        scores = (self.lm_head[members] @ normed[:, :, None])[..., 0]
        out = (scores.min(-1, keepdim=True).values - 1.0).expand(-1, self.vocab_size).clone()
        return out.scatter_(1, members, scores)
