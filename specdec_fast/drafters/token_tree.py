"""TokenTree: the static shape of a draft token tree, and the tensors the tree iteration needs.

A tree of N nodes (2 <= N <= 64) in BFS order: node 0 is the root (the last emitted token),
parents[i] < i is node i's parent, siblings are ordered by rank (rank 0 = the draft's most
probable child, or its first sample). ``children`` says how the drafter picks them: "sample"
(the default: b i.i.d. samples from the draft's standardised distribution) or "top" (the draft's
top-b tokens, deterministic: p = one-hot per child in the verify). Greedy rows always take the
top-b. Sampling rows accept a sample far more often than the draft's top token (demo pair at
T 0.8: 0.81 vs 0.48 for the first child, bench/results/tree_cpu_052efcb.json).

Shapes:
    TokenTree.chain(k)                     a chain of k drafts (k + 1 nodes)
    TokenTree.from_branching([4, 2, 1])    every node at depth d has branching[d] children
    TokenTree.best_first(n, acceptance)    the n-node tree with the largest expected accepted
        length when the child of rank r is the accepted one with probability acceptance[r]
        (independently of depth): a node's value is the product of acceptance[rank] along its
        path, the expected tokens per step is the sum of the values (root included), and the n
        largest values form a tree (a parent or elder sibling is never worth less), so picking
        them best first is optimal (the argument of Sequoia / EAGLE-2's expansion).
    TokenTree.default(n, greedy=...)       best_first (depth <= 8) with the rank acceptance
        measured on the demo pair (bench/bench_tree.py, bench/results/tree_cpu.json)
    TokenTree.dynamic_tree(n, greedy=...)  the same nodes per depth, but each row picks at run
        time which node of depth d - 1 each depth-d node hangs on, and its rank (EAGLE-2 style,
        static shapes: tree_dynamic.py)

dynamic=True: ``parents`` then fixes only the number of nodes at each depth (n_d, hence N, the
depths and every call shape); the drafter chooses per row, level by level on the device, the
n_d best (parent, rank) pairs of depth d - 1's nodes (tree_dynamic.py says how they are scored).
``acceptance`` (per depth rows of P(the accepted child has rank r), as in best_first) scores the
ranks of sampled children there; None = the demo pair's sampling profile.
"""
import heapq
from dataclasses import dataclass
from functools import cached_property

import torch

MAX_NODES = 64  # the attention kernel's tree mask: one int64 bitmask per query
CHILDREN = ("top", "sample")

# P(the accepted child has rank r) at depth 1 and at depth 2 (deeper depths: depth 2's), measured
# on the demo pair's calibration prompts by bench/bench_tree.py (bench/results/tree_cpu.json,
# "rank_acceptance", shipped draft; counts of row-iterations / those that reached the depth):
# greedy (top-b children) and sampling at T 0.8 / top-p 0.95 (i.i.d. children).
def _ratios(counts, total):
    return tuple(c / total for c in counts)


DEMO_RANK_ACCEPTANCE = {
    "greedy": (_ratios((116, 19, 9, 2, 0, 2, 0, 0), 149), _ratios((115, 15, 10, 4, 0, 2, 0, 0), 148)),
    "sampling": (_ratios((258, 22, 7, 4, 4, 2, 2, 2), 315), _ratios((477, 40, 14, 9, 7, 7, 0, 0), 602)),
}
# Dynamic trees: the draft's probabilities are divided by this temperature before they score a
# node (tree_dynamic.py: fitted on the demo pair's calibration prompts for greedy rows; sampling
# rows score ranks, and the draft's confidence as it is).
DEMO_SCORE_TEMPERATURE = {"greedy": 0.3, "sampling": 1.0}
DEFAULT_NODES = 32  # see default()
DYNAMIC_BY_DEFAULT = {"greedy": True, "sampling": False}  # see recommended()
DEFAULT_MAX_DEPTH = 8


@dataclass(frozen=True)
class TokenTree:
    parents: tuple
    children: str = "sample"
    dynamic: bool = False
    acceptance: tuple | None = None
    score_temperature: float = 1.0

    def __post_init__(self):
        parents = tuple(int(p) for p in self.parents)
        object.__setattr__(self, "parents", parents)
        if self.acceptance is not None:
            object.__setattr__(self, "acceptance", tuple(tuple(row) for row in _acceptance_rows(self.acceptance)))
        n = len(parents)
        if not 2 <= n <= MAX_NODES:
            raise ValueError(f"a token tree has 2 to {MAX_NODES} nodes (root included), got {n}")
        if parents[0] != -1:
            raise ValueError(f"parents[0] must be -1 (node 0 is the root), got {parents[0]}")
        for i, p in enumerate(parents[1:], 1):
            if not 0 <= p < i:
                raise ValueError(f"parents[{i}] = {p}: a parent must be a node before its child (BFS order)")
        depths = self.depths
        for i in range(2, n):
            if depths[i] < depths[i - 1]:
                raise ValueError(f"parents: node {i} (depth {depths[i]}) comes after a deeper node: not BFS order")
        if self.children not in CHILDREN:
            raise ValueError(f"children must be one of {CHILDREN}, got {self.children!r}")
        if not isinstance(self.dynamic, bool):
            raise ValueError(f"dynamic must be a bool, got {self.dynamic!r}")
        if not (isinstance(self.score_temperature, (int, float)) and 0 < self.score_temperature < float("inf")):
            raise ValueError(f"score_temperature must be a positive float, got {self.score_temperature!r}")

    # -- shapes -----------------------------------------------------------------------------
    @classmethod
    def chain(cls, k: int, children: str = "sample") -> "TokenTree":
        return cls(tuple(range(-1, k)), children)

    @classmethod
    def from_branching(cls, branching, children: str = "sample") -> "TokenTree":
        parents, level = [-1], [0]
        for b in branching:
            nxt = []
            for node in level:
                for _ in range(int(b)):
                    parents.append(node)
                    nxt.append(len(parents) - 1)
            level = nxt
        return cls(tuple(parents), children)

    @classmethod
    def best_first(cls, n: int, acceptance, children: str = "sample", max_depth: int | None = None) -> "TokenTree":
        """The n-node tree maximising the sum over nodes of the product of acceptance along the path.
        acceptance: P(the accepted child has rank r), a sequence over r (every depth), or a
        sequence of such rows, row d - 1 for depth d (the last row for deeper depths)."""
        rows = _acceptance_rows(acceptance)

        def acc(depth: int, rank: int) -> float:
            row = rows[min(depth, len(rows)) - 1]
            return row[rank] if rank < len(row) else 0.0

        # Candidates: (-value, tiebreak, rank path); a node's younger sibling and first child
        # become candidates once it is chosen, so every chosen set is a tree.
        chosen = [()]
        heap = [(-acc(1, 0), 0, (0,))]
        counter = 1
        while len(chosen) < n and heap:
            neg, _, path = heapq.heappop(heap)
            chosen.append(path)
            depth, rank = len(path), path[-1]
            if acc(depth, rank + 1) > 0:  # its next younger sibling
                heapq.heappush(heap, (neg / acc(depth, rank) * acc(depth, rank + 1), counter, path[:-1] + (rank + 1,)))
                counter += 1
            if (max_depth is None or depth < max_depth) and acc(depth + 1, 0) > 0:  # its first child
                heapq.heappush(heap, (neg * acc(depth + 1, 0), counter, path + (0,)))
                counter += 1
        order = sorted(chosen, key=lambda p: (len(p), p))  # BFS: by depth, then parent, then rank
        index = {p: i for i, p in enumerate(order)}
        return cls(tuple(-1 if not p else index[p[:-1]] for p in order), children)

    @classmethod
    def default(cls, n: int = DEFAULT_NODES, *, greedy: bool = False, max_depth: int | None = DEFAULT_MAX_DEPTH,
                children: str = "sample") -> "TokenTree":
        """The best-first n-node tree (depth <= max_depth) for the demo pair's measured rank
        acceptance, greedy or sampling profile. Why 32 nodes, depth <= 8 (bench/results/tree_cpu.json,
        demo pair on CPU): at equal target tokens the trees' gain over chains grows with N (64
        nodes: 1.09x greedy, 1.15x sampling; draft + 0.3 noise: 1.46x / 1.21x), but a CPU target
        step costs ~60% more at 64 rows than at 32; and the draft runs one forward per level, so
        capping the depth at 8 keeps its cost near a K = 8 chain's (on a GPU, where 32 rows cost
        about what 9 do, the fair chain is K = 8: tree 5.84 vs chain 4.51 tokens per step, greedy)."""
        profile = DEMO_RANK_ACCEPTANCE["greedy" if greedy else "sampling"]
        return cls.best_first(n, profile, children, max_depth=max_depth if max_depth is not None and n > max_depth + 1 else None)

    @classmethod
    def dynamic_tree(cls, n: int = DEFAULT_NODES, *, greedy: bool = False, max_depth: int | None = DEFAULT_MAX_DEPTH,
                     children: str = "sample", acceptance=None, score_temperature: float | None = None) -> "TokenTree":
        """A dynamic tree (tree_dynamic.py) with the nodes per depth of TokenTree.default(n, ...)
        and the demo pair's score temperature. Depth <= 8 as default(): uncapped, the greedy demo
        pair's 32-node dynamic tree gives 6.87 tokens per step against 6.21, but its draft runs 13
        levels: 151 against 202 tokens/s on CPU (bench/results/tree_defaults_cpu.json)."""
        static = cls.default(n, greedy=greedy, max_depth=max_depth, children=children)
        if score_temperature is None:
            score_temperature = DEMO_SCORE_TEMPERATURE["greedy" if greedy else "sampling"]
        return cls(static.parents, children, dynamic=True, acceptance=acceptance, score_temperature=score_temperature)

    @classmethod
    def recommended(cls, n: int = DEFAULT_NODES, *, greedy: bool = False) -> "TokenTree":
        """generate(tree=True / N): the better of default() and dynamic_tree() as measured on the
        demo pair: DYNAMIC_BY_DEFAULT per mode. Greedy (bench/bench_tree_defaults.py, CPU, 32
        nodes, depth <= 8): dynamic 6.21 / static 5.84 tokens per step, 202 / 202 tokens/s
        (draft + 0.3 noise: 3.73 / 3.39, 130 / 135 tokens/s; 16 nodes: 5.31 / 5.26, 228 / 239 and
        3.10 / 3.07, 141 / 129). Sampling (bench/bench_tree.py, shipped / noisy draft, 32 nodes):
        dynamic 5.54 / 3.69 against static 5.50 / 3.78 tokens per step, at a dearer draft step:
        static stays. (Since an all-greedy batch skips the sampler in tree_dynamic.py, 32 nodes:
        dynamic 217 / static 220 tokens/s, noisy draft 143 / 135; draft step 16.2 / 14.4 ms.)"""
        if DYNAMIC_BY_DEFAULT["greedy" if greedy else "sampling"]:
            return cls.dynamic_tree(n, greedy=greedy)
        return cls.default(n, greedy=greedy)

    def as_dynamic(self, acceptance=None, score_temperature: float = 1.0) -> "TokenTree":
        """This tree's nodes per depth, chosen per row at run time."""
        return TokenTree(self.parents, self.children, dynamic=True, acceptance=acceptance,
                         score_temperature=score_temperature)

    # -- derived structure (host) -------------------------------------------------------------
    @property
    def size(self) -> int:
        return len(self.parents)

    @cached_property
    def depths(self) -> tuple:
        d = [0]
        for p in self.parents[1:]:
            d.append(d[p] + 1)
        return tuple(d)

    @property
    def depth(self) -> int:
        return max(self.depths)

    @cached_property
    def ranks(self) -> tuple:
        """Each node's rank among its siblings (root: 0)."""
        seen, out = {}, [0]
        for p in self.parents[1:]:
            out.append(seen.get(p, 0))
            seen[p] = out[-1] + 1
        return tuple(out)

    @cached_property
    def num_children(self) -> tuple:
        out = [0] * self.size
        for p in self.parents[1:]:
            out[p] += 1
        return tuple(out)

    @cached_property
    def max_children(self) -> int:
        """A bound on any node's children in any row: a static tree's own count; a dynamic tree
        (each row picks its nodes' parents among the previous depth's: tree_dynamic.py) the most
        nodes at one depth."""
        if self.dynamic:
            return max(self.depths.count(d) for d in range(1, self.depth + 1))
        return max(self.num_children)

    def level(self, d: int) -> list:
        """Node indices at depth d (contiguous in BFS order)."""
        return [i for i, di in enumerate(self.depths) if di == d]

    def ancestor_masks(self, nodes) -> list:
        """For each node of ``nodes`` (a BFS-ordered list containing every ancestor of each of its
        nodes, except possibly the root), the bitmask over positions in ``nodes`` of its
        ancestors in ``nodes`` and itself: the attention mask of a call feeding ``nodes``."""
        where = {node: i for i, node in enumerate(nodes)}
        masks = []
        for node in nodes:
            bits, a = 0, node
            while a >= 0:
                if a in where:
                    bits |= 1 << where[a]
                a = self.parents[a]
            masks.append(bits - (1 << 64) if bits >= 1 << 63 else bits)  # int64 two's complement
        return masks

    def expected_length(self, acceptance) -> float:
        """Expected tokens per step (accepted nodes + 1) under ``acceptance`` (as in best_first)."""
        rows = _acceptance_rows(acceptance)
        value = [1.0]
        for i in range(1, self.size):
            row, r = rows[min(self.depths[i], len(rows)) - 1], self.ranks[i]
            value.append(value[self.parents[i]] * (row[r] if r < len(row) else 0.0))
        return sum(value)

    def describe(self) -> str:
        widths = [len(self.level(d)) for d in range(self.depth + 1)]
        kind = "dynamic, " if self.dynamic else ""
        return f"{self.size} nodes, {kind}depth {self.depth}, nodes per depth {widths[1:]}, children {self.children}"

    # -- device tensors -----------------------------------------------------------------------
    def tensors(self, device) -> dict:
        """parents int64 [N], depths int32 [N], mask int64 [N] (each node's ancestors and itself:
        the target's one-pass scoring), ranks int64 [N], on ``device``."""
        dev = torch.device(device)
        return dict(
            parents=torch.tensor(self.parents, dtype=torch.int64, device=dev),
            depths=torch.tensor(self.depths, dtype=torch.int32, device=dev),
            mask=torch.tensor(self.ancestor_masks(list(range(self.size))), dtype=torch.int64, device=dev),
            ranks=torch.tensor(self.ranks, dtype=torch.int64, device=dev),
        )


def _acceptance_rows(acceptance) -> list:
    """acceptance as a list of per-depth rows of probabilities (validated)."""
    rows = [list(acceptance)] if not hasattr(acceptance[0], "__len__") else [list(r) for r in acceptance]
    if not rows or any(not row or any(not 0 <= float(a) <= 1 for a in row) or not 0 < row[0] for row in rows):
        raise ValueError(f"acceptance must hold probabilities in [0, 1] (rank 0 > 0), per rank or per depth and rank, "
                         f"got {acceptance!r}")
    return [[float(a) for a in row] for row in rows]


def as_token_tree(tree, greedy: bool = False) -> TokenTree:
    """generate(tree=...): a TokenTree, True (the default tree), an int N (the default N-node
    tree), "static" or "dynamic" (the default static / dynamic tree); the defaults for a greedy or
    a sampling request (TokenTree.recommended)."""
    if isinstance(tree, TokenTree):
        return tree
    if tree is True:
        return TokenTree.recommended(greedy=greedy)
    if tree == "static":
        return TokenTree.default(greedy=greedy)
    if tree == "dynamic":
        return TokenTree.dynamic_tree(greedy=greedy)
    if isinstance(tree, int) and not isinstance(tree, bool):
        if not 2 <= tree <= MAX_NODES:
            raise ValueError(f"a token tree has 2 to {MAX_NODES} nodes (root included), got {tree}")
        return TokenTree.recommended(tree, greedy=greedy)
    raise ValueError(f"tree must be a TokenTree, True, 'static', 'dynamic' or an int number of nodes in [2, {MAX_NODES}], "
                     f"got {tree!r}")
