"""The engines behind specdec_fast.generate(model, ...): one SpeculativeEngine per (target, draft,
drafting mode, backend, runner, cuda_graphs, the tokenizers of a draft with another vocabulary),
reused by every call that fits it.

Held weakly: the table is keyed by the target model (a WeakKeyDictionary) and an entry that
drafts with a model holds it through a weak reference whose callback drops the entry, and
neither engine nor runner holds a model strongly (runners keep its tensors and a weak
reference), so deleting the target or the draft frees its engine, KV pools and graphs.

Growth: an engine holds max_batch_size rows of max_seq_len tokens. A call that needs more
replaces it with one sized for both (batch rounded up to a bucket, tokens per row to a power of
two, at least 256): a few rebuilds over a data set, then none. An engine is also rebuilt when
the model's parameters moved (model.to(...), new tensors): the fingerprint is (device, dtype,
every parameter's data pointer).
"""
import threading
import weakref

import torch

from .draft_heads import head_source
from .engine import BUCKETS, DEFAULT_NUM_ASSISTANT_TOKENS, SpeculativeEngine, bucket_for
from .inputs import check_pair, paged_positions, tokenizer_key

MIN_SEQ_LEN = 256
_ENGINES: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()  # target -> {key: _Entry}
_LOCK = threading.Lock()


class _Entry:
    def __init__(self, engine, draft_ref, fingerprint):
        self.engine, self.draft_ref, self.fingerprint = engine, draft_ref, fingerprint


def _fingerprint(*models) -> tuple:
    return tuple((p.device, p.dtype, p.data_ptr()) for model in models if model is not None for p in model.parameters())


def _grow(current: int, need: int) -> int:
    size = max(MIN_SEQ_LEN, current)
    while size < need:
        size *= 2
    return size


def engine_for(target, assistant_model=None, *, prompt_lookup: bool, max_matching_ngram_size=None, backend=None,
               runner=None, cuda_graphs=None, batch: int, row_tokens: int, drafted: int,
               tokenizer=None, assistant_tokenizer=None, draft_head=None, process_group=None,
               shard_draft: bool = False) -> SpeculativeEngine:
    """The cached engine for this target and drafting that fits ``batch`` rows of ``row_tokens``
    tokens (prompt + max_new_tokens) and ``drafted`` tokens scored per iteration beyond the last
    one (K, or a tree's N - 1), built or grown as needed. draft_head: a head directory (the engine
    loads it once: keyed by its resolved path) or a head object (held weakly, as a draft model).
    process_group / shard_draft: tensor parallelism (every rank makes the same calls, so every rank
    builds and grows the same engines)."""
    head_object = draft_head if isinstance(draft_head, torch.nn.Module) else None
    mode = "draft" if assistant_model is not None else "head" if draft_head is not None else \
        "lookup" if prompt_lookup else "plain"
    # The engine serves any K up to its max_draft_tokens; a draft model's (a head's) calls default to K = 4.
    drafted = max(drafted, DEFAULT_NUM_ASSISTANT_TOKENS if mode in ("draft", "head") else 1 if mode == "lookup" else 0)
    drafter_id = id(assistant_model) if assistant_model is not None else id(head_object) if head_object is not None \
        else None if draft_head is None else head_source(draft_head)
    # A draft with another vocabulary drafts through the two tokenizers: its engine is keyed by them
    # (their tokenizer.json, so a reloaded tokenizer finds the engine); the same draft with one
    # shared vocabulary keeps today's key (tokenizers given or not).
    cross = assistant_model is not None and check_pair(target, assistant_model, tokenizer, assistant_tokenizer)
    key = (mode, drafter_id, max_matching_ngram_size, backend, runner, repr(cuda_graphs),
           None if process_group is None else id(process_group), bool(shard_draft),
           (tokenizer_key(tokenizer), tokenizer_key(assistant_tokenizer)) if cross else None)
    weak = assistant_model if assistant_model is not None else head_object  # dropped with the entry when deleted
    fingerprint = _fingerprint(target, weak)
    with _LOCK:
        entries = _ENGINES.setdefault(target, {})
        entry = entries.get(key)
        if entry is not None and (entry.fingerprint != fingerprint or
                                  (entry.draft_ref is not None and entry.draft_ref() is not weak)):
            entry = None
        rows = bucket_for(batch, BUCKETS[-1]) if batch <= BUCKETS[-1] else batch
        if entry is not None:
            engine = entry.engine
            if batch <= engine.max_batch_size and row_tokens <= engine.max_seq_len and drafted <= engine.max_draft_tokens:
                return engine
            rows, drafted = max(rows, engine.max_batch_size), max(drafted, engine.max_draft_tokens)
            seq_len = _grow(MIN_SEQ_LEN, max(row_tokens, engine.max_seq_len))
        else:
            seq_len = _grow(MIN_SEQ_LEN, row_tokens)
        entries.pop(key, None)  # the old engine's pools go before the new one's are allocated
        limit = paged_positions(target)  # a sliding window is none: the kernels apply it
        if limit is not None:
            # A model with a position limit: rows of prompt + max_new_tokens + K + 1 within it where
            # the call's own rows fit; else rows of exactly the call's size (a paged runner cannot
            # hold them, the hf runner serves, and a runner='paged' error names the call's need).
            room = limit - drafted - 1
            seq_len = min(seq_len, room) if row_tokens <= room else row_tokens
        engine = SpeculativeEngine(
            target, assistant_model, draft_head=draft_head, prompt_lookup_num_tokens=1 if prompt_lookup else None,
            max_matching_ngram_size=max_matching_ngram_size, max_draft_tokens=drafted or None,
            backend=backend, runner=runner, cuda_graphs=cuda_graphs, tokenizer=tokenizer,
            assistant_tokenizer=assistant_tokenizer, max_batch_size=rows, max_seq_len=seq_len,
            process_group=process_group, shard_draft=shard_draft)
        draft_ref = None
        if weak is not None:
            target_ref = weakref.ref(target)

            def forget(_, target_ref=target_ref, key=key):
                owner = target_ref()
                if owner is not None:
                    _ENGINES.get(owner, {}).pop(key, None)

            draft_ref = weakref.ref(weak, forget)
        entries[key] = _Entry(engine, draft_ref, fingerprint)
        return engine


def cached_engines(target) -> list:
    """The engines cached for ``target`` (for inspection and tests)."""
    with _LOCK:
        return [entry.engine for entry in _ENGINES.get(target, {}).values()]


def release_engines(target=None) -> None:
    """Drops the cached engines of ``target`` (every target when None): their KV pools and graphs
    are freed once nothing else holds them."""
    with _LOCK:
        if target is None:
            _ENGINES.clear()
        else:
            _ENGINES.pop(target, None)
