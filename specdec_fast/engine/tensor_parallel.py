"""What SpeculativeEngine does differently when its target is sharded over a process group
(docs/architecture.md §10): which group, which runners, and the agreement around each call.

Every rank builds the same engine and makes the same calls with the same arguments. The
target's runner is the tensor-parallel one (runners/paged_llama_tp.py); the draft is
replicated (the default: a small model, each rank runs all of it, no collective) or sharded
like the target (shard_draft=True: one all-reduce per layer half and one logits all-gather per
draft token, for drafts too big to replicate; bench/bench_tp.py prices both). A replicated
draft must compute the same on every rank -- it does: same kernels, same inputs, deterministic
kernels (docs/architecture.md §6) -- and the call's closing agreement checks it (the emitted
tokens' checksum). A draft head (EAGLE-3, DFlash) is replicated the same way, reading the hidden
states the tensor-parallel runner captures (whole on every rank after each all-reduce);
whole_vocab_weight gives it the target's embedding / LM head over the whole vocabulary.

A call: ``guard()`` around everything; the checks run on every rank; ``agree()`` exchanges the
request's fingerprint (shape and checksum of input_ids / attention_mask, the resolved options,
K, tree, seed) or the error; a call without a seed takes rank 0's draw; then the decoding loop;
then one more agreement on the output. The adaptive K schedule chooses from this process's own
step times, and ranks must run the same iterations: every rank runs rank 0's choices
(distributed/k_leader.py). The KV pools: every rank sizes its own (local KV heads
only) and they agree on the smallest, so that every rank refuses the same requests.
"""
import re
import zlib

import torch

from ..distributed import TensorParallelError, as_tp_group
from ..distributed.failures import AGREED, mark
from ..processing.guidance import guidance_on
from ..runners.registry import make_runner, paged_unsupported_reason, shard_model
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
        reason = paged_unsupported_reason(model, row_tokens, backend)
        if reason is not None:
            raise ValueError(f"runner='paged' cannot run {type(model).__name__}: {reason}: tensor parallelism runs on "
                             "the paged runner only")
        sharded = shard_model(model, group)
    elif model.tp is not group and model.tp.size != group.size:
        raise ValueError(f"mismatched world sizes: a model sharded over {model.tp.size} ranks, the group has {group.size}")
    made = make_runner(sharded, "paged", backend=backend, block_size=block_size)
    if sharded is not model:
        made.owned_model = sharded
    return made


def whole_vocab_weight(target, which: str) -> torch.Tensor:
    """The target's token embedding ("embed") or LM head ("lm_head"), [V, H] over the whole
    vocabulary, for a draft head that looks tokens up in it (EAGLE-3 without an embedding of its
    own; DFlash reads both). A ShardedCausalLM holds its rank's rows [V / N, H] of each: they are
    gathered here once, at the engine's construction (a collective: every rank builds the same
    head runner, so every rank calls it), and the copy costs V x H elements per rank."""
    if isinstance(target, ShardedCausalLM):
        shard = target.shards["model.embed_tokens.weight" if which == "embed" else "lm_head.weight"]
        return target.tp.all_gather(shard).reshape(-1, shard.shape[-1])
    module = target.get_input_embeddings() if which == "embed" else target.get_output_embeddings()
    return module.weight


def _digest(tensor: torch.Tensor) -> tuple:
    """(sum, position-weighted sum of a strided sample of at most 2^16 values), both float64 and
    exact (float.hex: the ranks of one group hold the same tensors on the same kind of device).
    The weighted part tells permutations apart (a draft vocabulary in another order)."""
    flat = tensor.detach().reshape(-1)
    sample = flat[:: max(1, flat.numel() // 65536)].double()
    weights = torch.arange(sample.numel(), device=sample.device, dtype=torch.float64) % 251 + 1
    return float(flat.sum(dtype=torch.float64)).hex(), float((sample * weights).sum()).hex()


def head_facts(head) -> dict | None:
    """What the ranks compare of their draft heads before building (None without one): the kind,
    the config (which hidden states it reads, the mask token, ... -- less paths and versions) and
    a digest of every weight and buffer (EAGLE-3's draft vocabulary is a buffer; _digest: two
    device reductions per tensor, read once); both as short hashes, so a mismatch is one readable
    line. Ranks drafting with different heads would issue different collectives and stall (found by the tensor-parallel heads' fuzzing round: the
    same weights with other aux layer ids, or another draft vocabulary, stalled until the timeout)."""
    if head is None:
        return None
    config = getattr(head, "config", None)
    config = config.to_dict() if hasattr(config, "to_dict") else {}
    config = {key: value for key, value in sorted(config.items())
              if not key.startswith("_") and key not in ("transformers_version", "name_or_path")}
    tensors = [(name, _digest(t)) for name, t in [*head.named_parameters(), *head.named_buffers()]]
    return {"kind": getattr(head, "kind", type(head).__name__), "config": f"{zlib.crc32(repr(config).encode()):08x}",
            "weights": f"{zlib.crc32(repr(tensors).encode()):08x}"}


def checksum(tensor: torch.Tensor) -> int:
    """A checksum of a tensor's values (a host read: call boundaries only)."""
    return zlib.crc32(tensor.detach().cpu().contiguous().numpy().tobytes())


def request_facts(input_ids, mask, opts, k: int, token_tree, seed, ks=None) -> dict:
    """What every rank must agree on before a call's loop (equal inputs -> equal tokens). ks: the
    adaptive schedule's Ks (None: a constant K), among which rank 0 chooses for every rank."""
    return {"input_ids": (tuple(input_ids.shape), checksum(input_ids.long())),
            "attention_mask": checksum(mask.long()), "options": options_text(opts), "K": k, "Ks": ks,
            "tree": None if token_tree is None else token_tree.describe(), "seed": seed}


def options_text(opts) -> str:
    """repr(opts) without the memory addresses of default reprs ("<function <lambda> at 0x7f...>",
    "<StopOn object at 0x...>"): each rank builds its own stopping criteria, logits processors and
    prefix_allowed_tokens_fn, so the ranks compare their types and texts, not where they live
    (found by the tensor-parallel fuzzing round: every call with one was refused as a disagreement)."""
    return _ADDRESS.sub("", repr(opts))


_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")


def check_tp_call(target, opts, limits, user_cache=None) -> None:
    """What a tensor-parallel call cannot do (ValueError on every rank, before the loop). Every rank
    must run the same iterations, so nothing a rank decides from its own clock may steer the loop:
    the adaptive schedule's K is rank 0's on every rank (distributed/k_leader.py), and max_time /
    MaxTimeCriteria would end rows at different tokens on different ranks. A
    ShardedCausalLM has no forward of its own for output_scores / output_logits / output_hidden_states /
    output_attentions, a user's cache (user_cache.py) or guidance_scale."""
    from transformers.generation.stopping_criteria import MaxTimeCriteria

    if opts.extra.get("max_time") is not None or any(isinstance(c, MaxTimeCriteria) for c in limits.host or ()):
        raise ValueError("max_time (MaxTimeCriteria) with tensor parallelism: each rank's clock would stop rows at "
                         "different tokens; use max_new_tokens / stop_strings")
    forward_outputs = ("output_scores", "output_logits", "output_hidden_states", "output_attentions")
    asked = [name for name in forward_outputs if opts.extra.get(name)]
    if isinstance(target, ShardedCausalLM) and asked and opts.extra.get("return_dict_in_generate"):
        raise ValueError(f"{' / '.join(asked)} need the target's own forward, which a ShardedCausalLM does "
                         "not have: load the target whole on each rank (process_group=), or drop them")
    if isinstance(target, ShardedCausalLM) and guidance_on(opts.extra.get("guidance_scale")):
        raise ValueError("guidance_scale needs the target's own forward (its unconditional stream), which a "
                         "ShardedCausalLM does not have: load the target whole on each rank (process_group=), or drop it")
    if isinstance(target, ShardedCausalLM) and user_cache is not None:
        raise ValueError("cache= / past_key_values= needs the target's own forward to extend the cache, which a "
                         "ShardedCausalLM does not have: load the target whole on each rank (process_group=), or drop it")


def check_output(group, tokens: torch.Tensor) -> None:
    """After a call: every rank emitted the same tokens (else TensorParallelError on every rank)."""
    try:
        group.agree("generate (the emitted tokens)", {"tokens": (tuple(tokens.shape), checksum(tokens))})
    except TensorParallelError as exc:  # every rank raises it together: the group stays in step
        raise mark(TensorParallelError(f"{exc}: a replicated computation (the draft?) differed between ranks"),
                   AGREED) from None
