"""What SpeculativeEngine does differently when its target is sharded over a process group
(docs/architecture.md §10): which group, which runners, and the agreement around each call.

Every rank builds the same engine and makes the same calls with the same arguments. The
target's runner is the tensor-parallel one (runners/paged_llama_tp.py); the draft is
replicated (the default: a small model, each rank runs all of it, no collective) or sharded
like the target (shard_draft=True: one all-reduce per layer half and one logits all-gather per
draft token, for drafts too big to replicate; bench/bench_tp.py prices both). A replicated
draft must compute the same on every rank -- it does: same kernels, same inputs, deterministic
kernels (docs/architecture.md §6) -- and the call's closing agreement checks it (the emitted
tokens' checksum).

A call: ``guard()`` around everything; the checks run on every rank; ``agree()`` exchanges the
request's fingerprint (shape and checksum of input_ids / attention_mask, the resolved options,
K, tree, seed) or the error; a call without a seed takes rank 0's draw; then the decoding loop;
then one more agreement on the output. The KV pools: every rank sizes its own (local KV heads
only) and they agree on the smallest, so that every rank refuses the same requests.
"""
import zlib

import torch

from ..distributed import TensorParallelError, as_tp_group
from ..distributed.failures import AGREED, mark
from ..runners.registry import choose_runner, make_runner, shard_model
from ..runners.sharded_model import ShardedCausalLM


def _size(process_group) -> int:
    return process_group.size if hasattr(process_group, "failures") else process_group.size()


def group_for(target, assistant_model, process_group, shard_draft: bool, timeout):
    """The engine's TensorParallelGroup, or None (a single process). ValueError for a sharded
    target whose world size differs from process_group's, or shard_draft without a group."""
    if isinstance(target, ShardedCausalLM):
        if process_group is not None and _size(process_group) != target.tp.size:
            raise ValueError(f"mismatched world sizes: the target was sharded over {target.tp.size} ranks, process_group "
                             f"has {_size(process_group)}")
        return target.tp
    if isinstance(assistant_model, ShardedCausalLM):
        raise ValueError("the draft is a ShardedCausalLM but the target is not sharded: pass process_group= (or a "
                         "ShardedCausalLM target)")
    if process_group is None:
        if shard_draft:
            raise ValueError("shard_draft=True needs process_group= (tensor parallelism)")
        return None
    return as_tp_group(process_group, timeout=timeout)


def tp_runner(model, group, runner, row_tokens: int, backend, block_size: int):
    """The tensor-parallel paged runner of ``model`` (a ShardedCausalLM, or a model loaded whole
    on this rank: sharded here, the runner keeping the shard as ``owned_model``)."""
    if runner == "hf":
        raise ValueError("tensor parallelism runs on the paged runner; runner='hf' cannot be sharded")
    sharded = model
    if not isinstance(model, ShardedCausalLM):
        choose_runner(model, "paged", row_tokens, backend)  # ValueError naming why the paged runner cannot
        sharded = shard_model(model, group)
    elif model.tp is not group and model.tp.size != group.size:
        raise ValueError(f"mismatched world sizes: a model sharded over {model.tp.size} ranks, the group has {group.size}")
    made = make_runner(sharded, "paged", backend=backend, block_size=block_size)
    if sharded is not model:
        made.owned_model = sharded
    return made


def checksum(tensor: torch.Tensor) -> int:
    """A checksum of a tensor's values (a host read: call boundaries only)."""
    return zlib.crc32(tensor.detach().cpu().contiguous().numpy().tobytes())


def request_facts(input_ids, mask, opts, k: int, token_tree, seed) -> dict:
    """What every rank must agree on before a call's loop (equal inputs -> equal tokens)."""
    return {"input_ids": (tuple(input_ids.shape), checksum(input_ids.long())),
            "attention_mask": checksum(mask.long()), "options": repr(opts), "K": k,
            "tree": None if token_tree is None else token_tree.describe(), "seed": seed}


def check_output(group, tokens: torch.Tensor) -> None:
    """After a call: every rank emitted the same tokens (else TensorParallelError on every rank)."""
    try:
        group.agree("generate (the emitted tokens)", {"tokens": (tuple(tokens.shape), checksum(tokens))})
    except TensorParallelError as exc:  # every rank raises it together: the group stays in step
        raise mark(TensorParallelError(f"{exc}: a replicated computation (the draft?) differed between ranks"),
                   AGREED) from None
