"""tree_verify: speculative-sampling verify of a token tree per row (validation + dispatch).

Backends: "triton" (triton.py; CUDA, or CPU under TRITON_INTERPRET=1), "cpp" (csrc/tree_verify.cpp,
the CPU default when it builds), "torch" (reference.py: the spec; read it for the semantics).
"""
import functools
from typing import NamedTuple

import torch

from .._backend import resolve_backend
from ..sampling_params import make_sampling_tensors
from ..verify import TOKEN_DTYPES, _check_draft_logits, _check_finite, _check_logits
from .reference import present_nodes, tree_verify_reference

MAX_TREE_NODES = 64  # the attention kernel's tree mask: one int64 bitmask per query

__all__ = ["tree_verify", "tree_verify_reference", "TreeVerifyResult", "prepared_tree_verify", "check_tree",
           "most_children", "MAX_TREE_NODES"]


class TreeVerifyResult(NamedTuple):
    """tokens int32 [B, N]: accepted nodes' tokens in path order, then the final token, then -1;
    path int32 [B, N]: [0, a_1, ..., a_j] (node indices, root first) then -1;
    num_accepted int32 [B]: j; final_token int32 [B]: tokens[b, j]."""

    tokens: torch.Tensor
    path: torch.Tensor
    num_accepted: torch.Tensor
    final_token: torch.Tensor


def _check_index_tensor(name: str, t, batch: int, n: int, device) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in TOKEN_DTYPES:
        raise TypeError(f"{name} must be int32 or int64, got {t.dtype}")
    if tuple(t.shape) != (batch, n):
        raise ValueError(f"{name} must have shape [B, N] = [{batch}, {n}] to match target_logits, got {list(t.shape)}")
    if t.device != device:
        raise ValueError(f"{name} is on {t.device} but target_logits is on {device}")


def check_tree(parents: torch.Tensor, tokens: torch.Tensor | None = None, vocab: int | None = None) -> None:
    """ValueError naming the argument unless every row of parents [B, N] is a tree in topological
    order (parents[b, 0] = -1; for i >= 1 a parent in [0, i) that is present, or -1 = absent) and
    present nodes' tokens lie in [0, vocab). Reads values (a host sync)."""
    batch, n = parents.shape
    if n > MAX_TREE_NODES:
        raise ValueError(f"parents: a tree has at most {MAX_TREE_NODES} nodes (one int64 attention mask per node), got N = {n}")
    if batch == 0 or n == 0:
        return
    par = parents.long().cpu()
    if bool((par[:, 0] != -1).any()):
        b = int((par[:, 0] != -1).nonzero()[0, 0])
        raise ValueError(f"parents[{b}, 0] must be -1 (node 0 is the root), got {int(par[b, 0])}")
    bad = (par < -1) | (par >= n)
    if bool(bad.any()):
        b, i = (int(v) for v in bad.nonzero()[0])
        raise ValueError(f"parents[{b}, {i}] = {int(par[b, i])} is out of range: a parent is a node index in [0, {n}) or -1")
    # Follow parent pointers N times: a node still inside the tree then lies on a cycle.
    walk = par.clone()
    for _ in range(n):
        walk = torch.where(walk >= 0, par.gather(1, walk.clamp(min=0)), walk)
    if bool((walk >= 0).any()):
        b, i = (int(v) for v in (walk >= 0).nonzero()[0])
        raise ValueError(f"parents: row {b} has a cycle through node {i}")
    index = torch.arange(n)[None, :]
    late = par >= index
    if bool(late.any()):
        b, i = (int(v) for v in late.nonzero()[0])
        raise ValueError(f"parents[{b}, {i}] = {int(par[b, i])}: a parent must come before its child (BFS order)")
    present = present_nodes(par)
    orphan = (par >= 0) & ~present
    if bool(orphan.any()):
        b, i = (int(v) for v in orphan.nonzero()[0])
        raise ValueError(f"parents[{b}, {i}] = {int(par[b, i])} is an absent node (parent -1): node {i} has no path to the root")
    if tokens is not None:
        tok = tokens.long().cpu()
        bad = present & (index > 0) & ((tok < 0) | (tok >= vocab))
        if bool(bad.any()):
            b, i = (int(v) for v in bad.nonzero()[0])
            raise ValueError(f"tokens[{b}, {i}] = {int(tok[b, i])}: a present node's token must lie in [0, V) = [0, {vocab})")


def tree_verify(
    target_logits: torch.Tensor,
    draft_logits: torch.Tensor | None,
    tokens: torch.Tensor,
    parents: torch.Tensor,
    *,
    temperature=1.0,
    top_k=0,
    top_p=1.0,
    min_p=0.0,
    seed=0,
    offset=0,
    backend: str | None = None,
    check: bool = True,
    max_children: int | None = None,
) -> TreeVerifyResult:
    """Speculative-sampling verify of a token tree per row, from logits (semantics: reference.py).

    target_logits [B, N, V] float32/bfloat16/float16, N <= 64 (node 0 = the root, the last
    emitted token); draft_logits [B, N, V] same dtype (children sampled i.i.d. from the draft)
    or None (deterministic children, e.g. the draft's top-b: p = one-hot per child); tokens
    [B, N] and parents [B, N] int32/int64 (BFS order, -1 = root / absent node). Sampling params
    as chain_verify: scalars or per-row tensors [B]; seed int or int64 [B]; offset int or [B].
    check=False skips the checks that read tensor values (no host sync): the trees must then be
    valid already (check_tree); a malformed row gives unspecified tokens (memory-safe).
    max_children: an int >= 1 bounding the children of any node in any row (the Triton backend
    runs one residual-mass launch per sibling after the first, up to it); None: read from
    parents with the checks (check=True), else N - 1. A bound below a row's count is an error
    (check=True) or unspecified tokens (check=False).
    Returns TreeVerifyResult(tokens, path, num_accepted, final_token).
    No repetition / frequency / presence penalties (chain_verify's penalties=): a node's penalty
    would depend on its own path of ancestors, which no tree backend applies; the engine refuses
    trees with penalties.
    """
    _check_logits("target_logits", target_logits, 3)
    batch, n, vocab = target_logits.shape
    if n < 1:
        raise ValueError(f"target_logits must hold N >= 1 nodes, got shape {tuple(target_logits.shape)}")
    if n > MAX_TREE_NODES:
        raise ValueError(f"target_logits has N = {n} nodes: a tree has at most {MAX_TREE_NODES}")
    device = target_logits.device
    _check_index_tensor("tokens", tokens, batch, n, device)
    _check_index_tensor("parents", parents, batch, n, device)
    if draft_logits is not None:
        _check_draft_logits(draft_logits, target_logits, n, "N")
    params = make_sampling_tensors(
        batch, device, temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p, seed=seed, offset=offset, check=check
    )
    if max_children is not None and (isinstance(max_children, bool) or not isinstance(max_children, int)
                                     or max_children < 1):
        raise ValueError(f"max_children must be an int >= 1 or None, got {max_children!r}")
    if check:
        host_parents = parents.cpu()  # read once for both checks
        check_tree(host_parents, tokens, vocab)
        _check_finite("target_logits", target_logits)
        if draft_logits is not None:
            _check_finite("draft_logits", draft_logits)
        most = most_children(host_parents)
        if max_children is not None and most > max_children:
            raise ValueError(f"max_children = {max_children} but a node of parents has {most} children")
        max_children = max_children or max(most, 1)
    impl = prepared_tree_verify(backend, device, max_children)
    out_tokens, path, num_accepted = impl(target_logits, draft_logits, tokens, parents, params)
    final = out_tokens.gather(1, num_accepted.long()[:, None])[:, 0]
    return TreeVerifyResult(out_tokens, path, num_accepted, final)


def most_children(parents: torch.Tensor) -> int:
    """The most children of one node in any row of parents [B, N] (reads values: a host sync)."""
    par = parents.long().cpu()
    if par.numel() == 0:
        return 0
    n = par.shape[1]
    counts = torch.zeros(par.shape[0], n + 1, dtype=torch.long).scatter_add_(1, par.clamp(min=-1) + 1, torch.ones_like(par))
    return int(counts[:, 1:].max())


def prepared_tree_verify(backend, device, max_children: int | None = None):
    """tree_verify_impl(target_logits, draft_logits, tokens, parents, params) -> (tokens, path,
    num_accepted) of the backend resolve_backend picks for ``device``; no checks (for the engine).
    max_children: as tree_verify's (a bound the caller guarantees; None: N - 1). Triton: the impl
    holds a KernelWorkspace (one sequence of calls on one stream: one prepared impl per decoder)."""
    chosen = resolve_backend(backend, torch.device(device), "tree_verify")
    if chosen == "triton":  # with its own workspace: no zero fills per call (kernels/_workspace.py)
        from ..verify.triton import KernelWorkspace
        from .triton import tree_verify_triton

        return functools.partial(tree_verify_triton, max_children=max_children, workspace=KernelWorkspace())
    if chosen == "cpp":
        from .cpp import tree_verify_cpp

        return tree_verify_cpp
    return tree_verify_reference
