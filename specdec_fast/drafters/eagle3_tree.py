"""Eagle3TreeDrafter: an EAGLE-3 head expands a token tree level by level (EAGLE-2's dynamic trees
or static ones): TreeDrafter's expansion (drafters/tree.py: children "top" / "sample", the
per-row dynamic choice of tree_dynamic.py) with the head's pairs in place of a draft model's tokens.

    root      the pending context entries (drafters/eagle3.py) are fed and committed; the last
              one's logits are the root's, its g the root's g
    level d   nodes 1 .. end_d - 1 are re-fed as one tree-masked call of pairs (node token, g of
              the node's parent) at head positions context + depth - 1 (each sees the context,
              its ancestors and itself), after the previous level's entries are rolled back;
              their logits give depth d + 1's children, their g is kept per node ([B, N, H],
              in place: a dynamic tree's parents change per row and step)
    commit    every draft entry is dropped (commit 0: draft entries never become context); the
              accepted path's nodes become the pending entries: (target hidden states at path
              node i, token of path node i + 1), then (hidden states at the last accepted node,
              the final token) -- the target's tree scoring captured them per node

Logits: the head's are over its draft vocabulary; each call's are spread into the target's
vocabulary with -inf outside the mapped tokens (a fresh [B, n, V] per level, as TreeDrafter's
[B, N, V] draft logits are), so top-b children, Gumbel-sampled children and the tree verify all
see the law the drafts were drawn from (drafters/eagle3.py states why that is exact).
"""
import torch

from .tree import TreeDrafter


class Eagle3TreeDrafter(TreeDrafter):
    """runner: the head's PagedEagle3Runner; target: the target's paged runner (capturing the
    head's hidden states); draft_to_target: int64 [Vd] or None; tree: a TokenTree."""

    _BUILT = TreeDrafter._BUILT + ("pend_tokens", "pend_features", "_pend_slots", "g_nodes")

    def __init__(self, runner, target, draft_to_target, tree):
        super().__init__(runner, tree)
        if getattr(target, "hidden_capture", None) is None:
            raise ValueError("the target runner must capture the head's hidden states (capture_hidden_states)")
        self.target = target
        self.vocab_size = target.vocab_size
        self.d2t_ids = None if draft_to_target is None else draft_to_target.to(device=runner.device, dtype=torch.long)

    @property
    def graph_safe(self) -> bool:
        return bool(getattr(self.runner, "graph_safe", False) and getattr(self.target, "graph_safe", False))

    def start(self, state, prompt) -> None:
        self.state = state
        hidden = self.target.take_prefill_hidden()  # [B, P, W]
        batch, width = prompt.ids.shape
        self.runner.prefill_pairs(prompt.ids[:, 1:], hidden[:, :-1], prompt.mask[:, :-1], budgets=prompt.budgets,
                                  num_draft_tokens=prompt.k)
        built = self.__dict__.setdefault("_built", {})
        key = (batch, None if state.params.modes is None else frozenset(state.params.modes))
        if key not in built:
            self._build(state)
            dev, depth = state.seq.device, self.tree.depth
            long = dict(dtype=torch.long, device=dev)
            self.pend_tokens = torch.zeros(batch, depth + 1, **long)
            self.pend_features = torch.zeros(batch, depth + 1, hidden.shape[-1], dtype=self.target.dtype, device=dev)
            self._pend_slots = torch.arange(depth + 1, **long)[None, :]
            self.g_nodes = torch.zeros(batch, self.tree.size, self.runner.config.hidden_size, dtype=self.runner.dtype,
                                       device=dev)
            built[key] = {name: getattr(self, name, None) for name in self._BUILT}
        else:
            self._refill(state, built[key])
        depth = self.tree.depth
        self.pend_tokens.zero_()
        self.pend_tokens[:, depth] = state.last_token()
        self.pend_features.zero_()
        self.pend_features[:, depth] = hidden[:, width - 1]
        self.num_pending.fill_(1)

    def _target_vocab(self, logits: torch.Tensor) -> torch.Tensor:
        """[B, n, Vd] -> float32 [B, n, V], -inf outside the mapped tokens."""
        logits = logits.float()
        if self.d2t_ids is None:
            return logits
        full = torch.full((*logits.shape[:2], self.vocab_size), float("-inf"), device=logits.device)
        return full.index_copy_(2, self.d2t_ids, logits)

    def _root_logits(self) -> torch.Tensor:
        """The pending (token, feature) entries fed and committed -> float32 [B, 1, V] (target
        vocabulary) at the root; the last entry's g becomes the root's."""
        live = self.state.live if self.state.skip_finished else None
        fed = self.num_pending if live is None else self.num_pending * live
        logits, g = self.runner.score_pairs(self.pend_tokens, self.pend_features, fed, project=True, last_only=True)
        self.runner.commit(fed)
        self.g_nodes[:, 0] = g[:, -1]
        return self._target_vocab(logits[:, -1:])

    def _level_logits(self, tokens: torch.Tensor, level, feed, rows: torch.Tensor) -> torch.Tensor:
        """Nodes 1 .. level.end - 1 re-fed as pairs (node token, g of its parent) in one
        tree-masked call -> float32 [B, E, V] at the fed positions rows [E] (the next level's
        parents); each node's g kept (g_nodes)."""
        parents = self.node_parents[:, 1:level.end]  # [B, n]: each fed node's parent
        features = self.g_nodes.gather(1, parents[:, :, None].expand(-1, -1, self.g_nodes.shape[-1]))
        step_logits, step_g = self.runner.score_pairs(tokens[:, 1:level.end], features, None, project=False, tree=feed,
                                                      rows=rows)
        self.g_nodes[:, 1:level.end] = step_g
        return self._target_vocab(step_logits)

    def commit(self, path: torch.Tensor, num_accepted: torch.Tensor) -> None:
        """path [B, N] int32 ([0, a_1, .., a_j, -1, ...]), num_accepted [B]: the draft entries go;
        the path's nodes become the pending entries (target hidden states at each path node, the
        token after it: state.seq holds the emitted tokens)."""
        st, depth = self.state, self.tree.depth
        self.runner.commit(self._no_keep)
        j = num_accepted.long()
        hidden = self.target.hidden_states(path.shape[0], self.tree.size)  # [B, N, W] per node
        entry = (self._pend_slots - depth + j[:, None]).clamp(min=0)  # [B, D+1]: left padded, entry i of 0..j
        nodes = path.long().gather(1, entry).clamp(min=0)
        self.pend_features.copy_(hidden.gather(1, nodes[:, :, None].expand(-1, -1, hidden.shape[-1])))
        emitted = (st.end - 1 - j)[:, None] + entry  # entry i's token: the (i+1)-th emitted this iteration
        self.pend_tokens.copy_(st.seq.gather(1, emitted.clamp(min=0)))
        self.num_pending.copy_(j + 1)
