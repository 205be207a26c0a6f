"""TreeDecoder: speculative decoding with a token tree per iteration (SpeculativeDecoder's loop).

One iteration, no host sync:
    drafter.propose()            -> tokens [B, N] (node 0 = the last emitted token), draft logits or None
    target.score(N, tree mask)   -> target logits [B, N, V] in one pass (node i at position
                                    context + depth(i), seeing its ancestors and itself; the
                                    drafter's node_mask: [N], or [B, N] for a dynamic tree)
    stage.tree                   -> the call's logits processors, node i with its ancestor path
                                    (only for calls that have them)
    tree_verify                  -> emitted tokens [B, N], path [B, N], num_accepted [B] (parents:
                                    the drafter's node_parents [B, N], per row when dynamic)
    target.commit_path(path, j + 1)   the root and the accepted nodes move into place (compact_kv)
    append, drafter.commit(path, j)   the draft cache likewise (TreeDrafter.commit)
Everything else (the loop, polling, EOS, CUDA graphs / the "static" twin, stats) is
SpeculativeDecoder's: the draft step is drafter.propose(), the verify step the rest. The depth
D of the tree plays K's part there (at most D + 1 tokens per iteration): the stats'
accepted_hist and acceptance_per_position are per depth; stats.extra["tree"] adds which sibling
rank was accepted at each depth.
"""
import torch

from ..drafters.tree import TreeDrafter
from ..drafters.tree_dynamic import rank_widths
from ..kernels.tree_verify import prepared_tree_verify
from .loop import SpeculativeDecoder


class TreeStats:
    """Device counters: accepted[d - 1, r] = row-iterations whose accepted node at depth d had rank r."""

    def __init__(self, tree, device):
        self.tree = tree
        self.width = max(rank_widths(tree))
        self.accepted = torch.zeros(tree.depth * self.width, dtype=torch.long, device=device)
        self.base = torch.arange(tree.depth, device=device)[None, :] * self.width

    def record(self, path: torch.Tensor, active: torch.Tensor, ranks: torch.Tensor) -> None:
        """path [B, N], active [B] bool, ranks: each node's rank, [N] (static tree) or [B, N] (dynamic)."""
        nodes = path[:, 1 : self.tree.depth + 1].long()  # the node at each depth, -1 past the path
        on = (nodes >= 0) & active[:, None]
        index = self.base + ranks.expand(nodes.shape[0], -1).gather(1, nodes.clamp(min=0))
        self.accepted.scatter_add_(0, index.reshape(-1), on.long().reshape(-1))

    def summary(self, accepted_hist: list) -> dict:
        counts = self.accepted.view(self.tree.depth, self.width).cpu().tolist()
        reached = [sum(accepted_hist[d:]) for d in range(self.tree.depth)]  # row-iterations reaching depth d
        return dict(tree=self.tree.describe(), parents=list(self.tree.parents), children=self.tree.children,
                    dynamic=self.tree.dynamic, accepted_rank_by_depth=counts, reached_by_depth=reached)


class TreeDecoder(SpeculativeDecoder):
    """Speculative decoding of one batch with a TreeDrafter; the target must be a paged runner
    (tree-masked one-pass scoring and commit_path). Other arguments as SpeculativeDecoder (k is the
    tree's depth). A call's logits processors process the target's logits at every node with the
    node's own prefix (its ancestor path: LogitsStage.tree); tree_verify has no penalised
    kernels, so the penalties run there too. The drafter processes its logits the same way before
    it draws each level's children (TreeDrafter.propose: the processed rows are tree_verify's q)."""

    fused_penalties = False

    def __init__(self, target, drafter: TreeDrafter, **kwargs):
        if not isinstance(drafter, TreeDrafter):
            raise TypeError(f"drafter must be a TreeDrafter, got {type(drafter).__name__}")
        if not hasattr(target, "commit_path"):
            raise ValueError(f"tree decoding needs a paged target runner (tree-masked scoring), got {type(target).__name__}")
        if kwargs.get("skip_finished"):
            raise ValueError("skip_finished: tree scoring feeds every row its whole tree (no num_valid)")
        self.tree = drafter.tree
        super().__init__(target, drafter, k=self.tree.depth, **{**kwargs, "skip_finished": False})
        self.drafted_per_step = self.tree.size - 1  # the target scores every node: N tentative tokens
        self._depths = self.tree.tensors(self.device)["depths"]
        self._tree_verify_impl = prepared_tree_verify(self.backend, self.device, self.tree.max_children)
        self.tree_stats = TreeStats(self.tree, self.device)

    def draft_step(self):
        """drafter.propose() -> (tokens [B, N] int64, node 0 the last emitted token; draft logits [B, N, V] or None)."""
        return self.drafter.propose()

    def verify_step(self, tokens: torch.Tensor, draft_logits) -> None:
        """tokens [B, N], draft_logits [B, N, V] or None: target.score(N nodes, tree mask) ->
        tree_verify -> commit the accepted path in both caches -> append (in place, graph safe)."""
        st = self.state
        drafter = self.drafter  # the tree's shape this step: per row for a dynamic tree (tree_dynamic.py)
        target_logits = self.target.score(tokens, tree=(drafter.node_mask, self._depths))  # [B, N, V], the runner's dtype
        if self.stage is not None:  # logits processors per node, each with its ancestor path
            target_logits = self.stage.tree(target_logits, st, tokens, (drafter.node_parents, self._depths, self.tree.depth))
        if draft_logits is not None and draft_logits.dtype != target_logits.dtype:
            target_logits, draft_logits = target_logits.float(), draft_logits.float()
        emitted, path, accepted = self._tree_verify_impl(target_logits, draft_logits, tokens, drafter.node_parents,
                                                         self._verify_params)
        self.target.commit_path(path, accepted.long() + 1)
        active = ~st.finished  # rows still generating in this iteration (before the append)
        self.stats.record(accepted, self._append(emitted[:, : self.k + 1], accepted))
        self.tree_stats.record(path, active, drafter.node_ranks)
        self.drafter.commit(path, accepted)
        self._update_live()

    def _begin_call(self, input_ids, attention_mask, call):
        prompt = super()._begin_call(input_ids, attention_mask, call)
        self.tree_stats.accepted.zero_()  # in place: the verify graph writes it
        return prompt

    def generate(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, **call) -> torch.Tensor:
        out = super().generate(input_ids, attention_mask, **call)
        self.stats.result.extra["tree"] = self.tree_stats.summary(self.stats.result.accepted_hist)
        return out
