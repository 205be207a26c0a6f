"""SpeculativeEngine: the runners, the KV pools and the CUDA graphs built once and reused by
every generate() call (docs/architecture.md §1, §4).

What one call used to build and a later call now reuses (H100, 8B-shaped pair, B=1, K=4, 128
new tokens, bench/results/h100_2026-11-23/: graph capture 44-103 ms and prefill 14-31 ms per
call, 15-25% of the call):
  - the two runners, each with ONE KV block pool sized at construction (runners/paged_base.py
    allocate): a call admits its rows into the pool and returns the blocks when it ends;
  - the decoders (loop.py), one per (batch bucket, K, sampling modes, token tree): a decoder
    owns the state buffers and the StepGraphs captured at its first call; every later call
    re-fills the buffers in place and replays.
Batch buckets as vLLM's capture sizes (1, 2, 4, 8, 16, 32, 64, then max_batch_size): a batch of
5 runs in the bucket of 8, its 3 extra rows unused (no prompt, no KV blocks, fed no tokens, as
finished rows are). Buckets apply where graphs do (cuda_graphs / the "static" twin); eager
decoding runs each batch size as it is (padding would only cost).

Memory: each runner's pool holds kv_cache_tokens tokens (default: max_batch_size rows of
max_seq_len + K + 1 tokens, each rounded up to whole KV blocks; on CUDA at most
kv_memory_fraction of the free memory, and the one line at construction says which); a request
that does not fit raises OutOfBlocksError naming the sizes; blocks freed by a finished call are
reused by the next.

Threads: one call at a time per engine (a lock); a call from another thread waits its turn,
so calls never share a KV block, a graph's buffers or a random stream mid-call.
"""
import collections
import contextlib
import dataclasses
import logging
import math
import threading
import time
import weakref

import torch

from ..drafters import BlockDrafter, SelectorBlockDrafter, Eagle3Drafter, Eagle3TreeDrafter, ModelDrafter, PromptLookupDrafter, TreeDrafter, as_token_tree
from ..distributed.k_leader import LeaderK
from ..drafters.cross_tokenizer import CrossTokenizerDrafter
from ..heads.mtp import MTP_DEFAULT_K
from ..options import resolve_options
from ..options.rules import UnsupportedOptionError
from ..processing.guidance import check_guidance, guidance_on
from ..kernels.sampling_params import make_sampling_tensors
from ..runners.paged_cache import OutOfBlocksError
from ..runners.hf import UnsupportedModelError
from ..runners.registry import choose_runner, make_runner
from ..runners.sharded_model import ShardedCausalLM
from .draft_heads import head_runner, head_source, load_head
from .graph_policy import resolve_graph_mode
from .inputs import (check_in_vocabulary, check_inputs, check_pair, check_tokenizer, device_of, infer_attention_mask,
                     max_positions, paged_positions, tokenizer_key)
from .logits_stage import StageRequest, kernel_params, stage_options_of
from .loop import EOS_SLOTS, SpeculativeDecoder
from .outputs import expand_rows, forwards_asked, output_dict, return_sequences
from .stopping import call_limits
from .tensor_parallel import check_output, check_tp_call, group_for, head_facts, request_facts, tp_runner
from .tree_loop import TreeDecoder
from .user_cache import cached_length, extend_user_cache, take_user_cache

log = logging.getLogger("specdec_fast")

BUCKETS = (1, 2, 4, 8, 16, 32, 64)
DEFAULT_NUM_ASSISTANT_TOKENS = 4
DEFAULT_MAX_SEQ_LEN = 4096  # with no max_seq_len: min(this, the model's position limit)
DEFAULT_KV_MEMORY_FRACTION = 0.9  # CUDA: the pools take at most this share of the free memory
MAX_DRAFTED = 64  # the most tokens a call may score beyond the last one (a token tree's 64 nodes)
CROSS_TREE_ERROR = ("tree=... with a draft of another tokenizer: a token tree's nodes are draft tokens the target "
                    "scores, which needs one shared vocabulary; drop tree=")
CROSS_TP_ERROR = ("a draft with another tokenizer under tensor parallelism (process_group= or a ShardedCausalLM) is "
                  "not implemented; run it unsharded, or draft with a model of the target's vocabulary")
# The Ks the adaptive schedule (schedule.py) chooses among with a draft model, and its first K.
# The best fixed K measured on the H100 was 4 at batch 1 and 3 at batch 8 / 32
# (bench/results/h100_2026-11-23/); each K's graphs are captured the first time it is chosen.
ADAPTIVE_KS = (1, 2, 3, 4, 5, 6, 8)
# A block drafter's (DFlash / DFlash2): the first K of one block (its cost does not grow with K, so
# the choice is mostly the verify's rows against the acceptance further out), and the whole block.
ADAPTIVE_BLOCK_KS = (1, 2, 3, 4, 6, 8, 12)
SCHEDULES = ("adaptive", "constant", "heuristic", "heuristic_transient")
# Decoders an engine keeps (LRU). A call's logits stage is part of a decoder's key, option values
# included (a repetition_penalty of 1.1 and one of 1.2 are two decoders): calls whose options
# change without end (per-request penalties in a server) would otherwise add decoders without end
# (seen by the sampling fuzzing round: ~13 MB a call at 4000 rows on CPU). 64 holds every bucket
# of a warm-up in several modes; past it a returning key is rebuilt (and its graphs recaptured).
MAX_DECODERS = 64
USER_PROCESSORS_NOTE = ("a user logits_processor, prefix_allowed_tokens_fn, watermarking_config or guidance_scale runs "
                        "eagerly on the host per row and position (exact input_ids; guidance: the model's unconditional "
                        "forward per row), which a CUDA graph cannot replay")


def bucket_for(batch: int, max_batch_size: int) -> int:
    """The smallest capture size >= batch (BUCKETS, then max_batch_size itself)."""
    for size in BUCKETS:
        if batch <= size <= max_batch_size:
            return size
    return max_batch_size


@dataclasses.dataclass
class _Call:
    """A checked generate() call: input_ids [B, P], mask [B, P] int64 (rows expanded for
    num_return_sequences), the resolved options, the token tree (or None), K (a tree's depth), the
    adaptive schedule's Ks (None: constant K), the stopping limits (stopping.py), the logits stage
    request without its sampling parameters (or None), the streamer, and the user's transformers
    Cache with the prompt tokens it holds (user_cache.py; None and 0 without one)."""

    input_ids: torch.Tensor
    mask: torch.Tensor
    opts: object
    token_tree: object
    k: int
    ks: tuple | None
    limits: object
    stage: object
    streamer: object
    user_cache: object = None
    cached: int = 0


def _positive(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be an int >= 1, got {value!r}")
    return value


class SpeculativeEngine:
    """Speculative decoding of ``target`` with ``assistant_model`` (a draft model), a draft head
    that reads the target's hidden states (``draft_head``: an EAGLE-3 head directory in its
    published layout or a loaded head, specdec_fast.load_draft_head; drafters/eagle3.py), or
    prompt lookup (prompt_lookup_num_tokens = K), or plain decoding (none), for many calls.

    max_batch_size: the most rows of one call. max_seq_len: the most tokens of one row (prompt
    + max_new_tokens; default min(4096, the model's limit)). kv_cache_tokens: the tokens each
    runner's KV pool holds (default max_batch_size rows of max_seq_len + K + 1; on CUDA capped at
    kv_memory_fraction of free memory). num_assistant_tokens: K (default 4; a call may ask for
    another up to max_draft_tokens, default K). tree: a token tree for every call (as generate's
    tree=; a call may give another of at most max_draft_tokens + 1 nodes). backend, runner,
    cuda_graphs, block_size: as generate's. run_ahead: the loop's run-ahead bound R.
    tokenizer, assistant_tokenizer: the target's and the draft's; when their vocabularies differ
    (or the models' do), the draft drafts in its own tokens and its text is re-encoded into the
    target's (drafters/cross_tokenizer.py: eager, no trees).

    Tensor parallelism (docs/architecture.md §10; engine/tensor_parallel.py): process_group (a
    torch.distributed ProcessGroup, or a TensorParallelGroup) shards the target over its ranks
    (each rank builds the same engine and makes the same calls; a target loaded whole is sharded
    here, a ShardedCausalLM needs no process_group); the KV pool is sized per rank (its local KV
    heads) and agreed. shard_draft: shard the draft too (default: replicated on every rank).
    tp_timeout: the group's collective timeout (datetime.timedelta). Every rank returns the tokens.

    generate(input_ids, attention_mask=None, **options) takes what specdec_fast.generate takes
    (transformers' argument names) and returns what it returns; warmup() captures every bucket's
    graphs up front."""

    def __init__(self, target, assistant_model=None, *, draft_head=None, prompt_lookup_num_tokens=None,
                 max_matching_ngram_size=None,
                 max_batch_size: int = 8, max_seq_len: int | None = None, kv_cache_tokens: int | None = None,
                 kv_memory_fraction: float = DEFAULT_KV_MEMORY_FRACTION, num_assistant_tokens: int | None = None,
                 max_draft_tokens: int | None = None, tree=None, backend=None, runner=None, cuda_graphs=None,
                 block_size: int = 16, run_ahead: int = 2, tokenizer=None, assistant_tokenizer=None,
                 process_group=None, shard_draft: bool = False, tp_timeout=None):
        if sum(x is not None for x in (assistant_model, prompt_lookup_num_tokens, draft_head)) > 1:
            raise ValueError("give one of assistant_model, draft_head and prompt_lookup_num_tokens")
        if tree is not None and assistant_model is None and draft_head is None:
            raise ValueError("tree=... needs an assistant_model or a draft_head (the drafter that expands the tree)")
        self.max_batch_size = _positive("max_batch_size", max_batch_size)
        limit = paged_positions(target)  # the default rows fit the paged runner (a longrope model's first frequencies)
        self.max_seq_len = _positive("max_seq_len", max_seq_len) if max_seq_len is not None else \
            min(DEFAULT_MAX_SEQ_LEN, limit) if limit else DEFAULT_MAX_SEQ_LEN
        if not 0 < kv_memory_fraction <= 1:
            raise ValueError(f"kv_memory_fraction must be in (0, 1], got {kv_memory_fraction!r}")
        self.device = device_of(target)
        # (tokenizer, assistant_tokenizer) of a draft with another vocabulary, else None
        self.cross_tokenizers = None
        if assistant_model is not None and check_pair(target, assistant_model, tokenizer, assistant_tokenizer):
            if tree is not None:
                raise ValueError(CROSS_TREE_ERROR)
            self.cross_tokenizers = (tokenizer, assistant_tokenizer)
        # The models are held weakly (runners hold their tensors): a cache keyed by the model
        # (engine/cached.py) must not keep it alive. Keep the models while you use the engine.
        self._target_ref = weakref.ref(target)
        self._draft_ref = None if assistant_model is None else weakref.ref(assistant_model)
        # A head object is held weakly, as the models are; a head this engine loaded from a
        # directory is its own (the runner holds the head's tensors either way).
        self.head_source = self._own_head = self._head_ref = None
        if draft_head is not None:
            head = load_head(draft_head, target, self.device)
            if isinstance(draft_head, torch.nn.Module):
                self._head_ref = weakref.ref(head)
            else:
                self.head_source, self._own_head = head_source(draft_head), head
        self.backend, self.run_ahead, self.block_size, self.cuda_graphs = backend, run_ahead, block_size, cuda_graphs
        self.tree = tree
        if prompt_lookup_num_tokens is not None:
            self.default_k = _positive("prompt_lookup_num_tokens", prompt_lookup_num_tokens)
            self.mode = "lookup"
        elif assistant_model is not None or draft_head is not None:
            # A block drafter's default K: the whole block (its K drafts cost one forward whatever K).
            # An MTP layer's: one (heads/mtp.py MTP_DEFAULT_K). A Gemma 4 assistant's: its generation_config's, as
            # transformers reads it (heads/gemma4_assistant.py default_k).
            kind = getattr(self.draft_head, "kind", None)
            default = self.draft_head.block_size - 1 if kind == "dflash" else MTP_DEFAULT_K if kind == "mtp" \
                else getattr(self.draft_head, "default_k", None) or DEFAULT_NUM_ASSISTANT_TOKENS
            self.default_k = default if num_assistant_tokens is None else \
                _positive("num_assistant_tokens", num_assistant_tokens)
            self.mode = "draft" if draft_head is None else "head"
        else:
            self.default_k, self.mode = 0, "plain"
        self.prompt_lookup_num_tokens, self.max_matching_ngram_size = prompt_lookup_num_tokens, max_matching_ngram_size
        # drafting config -> drafter; (bucket, K, modes, tree, stage) -> decoder, least recently used first
        self._drafters, self._decoders = {}, collections.OrderedDict()
        drafted = (as_token_tree(tree).size - 1) if tree is not None else self.default_k
        if max_draft_tokens is not None and _positive("max_draft_tokens", max_draft_tokens) > MAX_DRAFTED:
            raise ValueError(f"max_draft_tokens must be <= {MAX_DRAFTED}, got {max_draft_tokens}")
        # The most tokens one iteration scores beyond the last one (K, a tree's N - 1, the adaptive
        # schedule's largest K) for any call.
        self.fixed_k = num_assistant_tokens is not None  # an engine built with a K: its calls default to it
        if self.cross_tokenizers is not None and process_group is not None:
            raise ValueError(CROSS_TP_ERROR)
        self.tp = group_for(target, assistant_model, process_group, shard_draft, tp_timeout)
        if self.cross_tokenizers is not None and self.tp is not None:
            raise ValueError(CROSS_TP_ERROR)
        self.shard_draft = bool(shard_draft)
        if self.shard_draft and self.mode != "draft":
            raise ValueError(f"shard_draft=True shards a draft model; this engine drafts with "
                             f"{'a draft head (it runs whole on every rank)' if self.mode == 'head' else self.mode}")
        if max_draft_tokens is not None:  # the adaptive schedule then chooses among the Ks up to it
            self.max_draft_tokens = max(drafted, max_draft_tokens)
        else:  # room for the adaptive Ks (tensor parallel: rank 0's, where its group shares them: _ks_for)
            adaptive = self._chain_schedulable() and not self.fixed_k and (self.tp is None or LeaderK.available(self.tp))
            self.max_draft_tokens = max(drafted, max(ADAPTIVE_KS) if adaptive else 0)
        row_tokens = self.max_seq_len + self.max_draft_tokens + 1  # a row's most tokens: the block table's width
        if self.tp is None:
            self._build_runners(target, assistant_model, runner, row_tokens, tree)
            self.memory_note = self._allocate_pools(row_tokens, row_tokens, kv_cache_tokens, kv_memory_fraction)
        else:  # all agree on the engine, every rank builds, all agree it built (one clear error on every rank)
            with self.tp.guard():
                # First the configuration: building runs collectives that depend on it (a sharded
                # draft's), so ranks that differ must stop here, not in different collectives (found
                # by the tensor-parallel fuzzing round: shard_draft on one rank only hung the other).
                facts = dict(sizes=dict(max_batch_size=self.max_batch_size, max_seq_len=self.max_seq_len,
                                        max_draft_tokens=self.max_draft_tokens, block_size=block_size,
                                        kv_cache_tokens=kv_cache_tokens),
                             drafting=dict(mode=self.mode, k=self.default_k, tree=repr(tree), shard_draft=self.shard_draft,
                                           head=head_facts(self.draft_head)),
                             kernels=dict(backend=backend, runner=runner, cuda_graphs=repr(cuda_graphs), run_ahead=run_ahead))
                self.tp.agree("building the engine", facts)
                error = None
                try:
                    self._build_runners(target, assistant_model, runner, row_tokens, tree)
                except Exception as exc:  # noqa: BLE001 - raised on every rank by agree()
                    error = exc
                self.tp.agree("building the engine's runners", {}, error)
                self.memory_note = self._allocate_pools(row_tokens, row_tokens, kv_cache_tokens, kv_memory_fraction)
        log.info("specdec_fast engine: %s", self.memory_note)
        self._lock = threading.Lock()
        self.graph_mode, self.graph_note = resolve_graph_mode(cuda_graphs, self.target_runner, self._chain_drafter(),
                                                              backend, self.device)
        self.calls = 0

    @property
    def target(self):
        model = self._target_ref()
        if model is None:
            raise RuntimeError("this engine's target model was deleted; keep the model while you use its engine")
        return model

    @property
    def draft_head(self):
        """The draft head (None without one, or once a head object given by the caller is gone)."""
        return self._own_head if self._own_head is not None else None if self._head_ref is None else self._head_ref()

    @property
    def assistant_model(self):
        return None if self._draft_ref is None else self._draft_ref()

    # -- construction ------------------------------------------------------------------------
    def _build_runners(self, target, assistant_model, runner, row_tokens: int, tree) -> None:
        self.target_runner = self._runner(target, runner, row_tokens, sharded=self.tp is not None)
        self.draft_runner = None if assistant_model is None else \
            self._runner(assistant_model, runner, row_tokens, sharded=self.shard_draft)
        if self.mode == "head":
            self.draft_runner = head_runner(self.draft_head, target, self.target_runner, tree=self.tree,
                                            max_draft_tokens=self.max_draft_tokens, block_size=self.block_size,
                                            backend=self.backend)
        if tree is not None:
            self._tree_drafter(as_token_tree(tree))  # checks the runners now

    def _runner(self, model, runner, row_tokens: int, sharded: bool = False):
        if sharded:
            return tp_runner(model, self.tp, runner, row_tokens, self.backend, self.block_size)
        name = choose_runner(model, runner, row_tokens, self.backend)
        return make_runner(model, name, backend=self.backend, **({"block_size": self.block_size} if name == "paged" else {}))

    def _allocate_pools(self, row_tokens: int, default_row: int, kv_cache_tokens, fraction: float) -> str:
        """Each paged runner's KV pool (once); the line that says how big and why."""
        # A draft with another tokenizer counts other tokens: its drafter sizes its KV per call.
        draft = None if self.cross_tokenizers is not None else self.draft_runner
        runners = [(name, r) for name, r in (("target", self.target_runner), ("draft" if self.mode != "head" else "head",
                                                                             draft))
                   if r is not None and hasattr(r, "allocate")]
        if not runners:
            return "no KV pool (the runners keep their own caches per call)"
        # per pooled token (the layers on the full cache) and fixed (the windowed layers' ring caches)
        sizes = [r.kv_sizes(self.max_batch_size, row_tokens + getattr(r, "extra_row_tokens", 0)) for _, r in runners]
        per_token, fixed = sum(size[0] for size in sizes), sum(size[1] for size in sizes)
        if kv_cache_tokens is not None:
            tokens, why = _positive("kv_cache_tokens", kv_cache_tokens), "kv_cache_tokens"
        else:
            # whole blocks per row: a row of max_seq_len + K + 1 tokens takes ceil(that / block) blocks
            # (rows x tokens alone fell short: 16 rows of 257 tokens need 272 blocks of 16, not 257)
            tokens = self.max_batch_size * math.ceil(default_row / self.block_size) * self.block_size
            why = f"max_batch_size {self.max_batch_size} x (max_seq_len + K + 1) in whole blocks"
            if self.device.type == "cuda" and per_token:
                free = torch.cuda.mem_get_info(self.device)[0]
                cap = max(int(free * fraction) - fixed, 0) // per_token
                if cap < tokens:
                    tokens, why = cap, f"{fraction:.0%} of the {free / 2**30:.1f} GiB free"
        if self.tp is not None:  # every rank's pool the same size: every rank refuses the same requests
            agreed = self.tp.all_min("sizing the KV pools", tokens)
            why = why if agreed == tokens else f"{why}; the smallest of the {self.tp.size} ranks'"
            tokens = agreed
        blocks = max(1, math.ceil(tokens / self.block_size))
        for _, r in runners:
            extra = getattr(r, "extra_row_tokens", 0)  # a block drafter's block sits after its context
            r.allocate(self.max_batch_size, row_tokens + extra, blocks + self.max_batch_size * math.ceil(extra / self.block_size))
        total = sum(r.kv_bytes for _, r in runners)
        per_rank = "" if self.tp is None else f" on each of {self.tp.size} ranks (local KV heads)"
        rings = "".join(f"; the {name}'s {len(r._ring_layers)} windowed layers keep {r.caches[-1].ring_blocks} blocks a row"
                        for name, r in runners if r._ring_layers)
        return (f"KV pool {blocks * self.block_size} tokens per model ({why}), {total / 2**20:.1f} MiB for "
                f"{' + '.join(name for name, _ in runners)}{per_rank}; up to {self.max_batch_size} rows of "
                f"{self.max_seq_len} tokens{rings}")

    def _chain_drafter(self):
        """The chain drafter (one per engine: it keeps per-batch-size buffers), None for plain decoding."""
        if self.mode == "plain":
            return None
        drafter = self._drafters.get("chain")
        if drafter is None:
            if self.mode == "lookup":
                drafter = PromptLookupDrafter(self.max_matching_ngram_size or 2)
            elif self.cross_tokenizers is not None:
                drafter = CrossTokenizerDrafter(self.draft_runner, *self.cross_tokenizers)
            elif self.mode == "head" and self.draft_head.kind == "dflash":  # DFlash2: its candidate selector
                block = SelectorBlockDrafter if getattr(self.draft_head, "variant", "dflash") == "dflash2" else BlockDrafter
                drafter = block(self.draft_runner, self.target_runner)
            elif self.mode == "head":
                drafter = Eagle3Drafter(self.draft_runner, self.target_runner, self._draft_to_target())
            else:
                drafter = ModelDrafter(self.draft_runner)
            self._drafters["chain"] = drafter
        return drafter

    def _tree_drafter(self, token_tree):
        kinds = [type(r).__name__ for r in (self.target_runner, self.draft_runner)]
        if getattr(self.draft_runner, "tree_reason", None):  # a head that drafts chains only (its own words)
            raise UnsupportedModelError(self.draft_runner.tree_reason)
        if not all(hasattr(r, "commit_path") for r in (self.target_runner, self.draft_runner)):
            # an UnsupportedModelError (a ValueError): a bound patch_generate hands such calls to transformers
            raise UnsupportedModelError(f"tree=... needs paged runners for the target and the draft (tree-masked "
                                        f"scoring), got {kinds}")
        drafter = self._drafters.get(token_tree)
        if drafter is None:
            if self.mode == "head" and self.draft_head.kind == "dflash":
                raise ValueError("tree=... with a DFlash drafter: its block drafts a chain (trees: EAGLE-3 heads or a "
                                 "draft model)")
            if self.mode == "head":
                drafter = Eagle3TreeDrafter(self.draft_runner, self.target_runner, self._draft_to_target(), token_tree)
            else:
                drafter = TreeDrafter(self.draft_runner, token_tree)
            self._drafters[token_tree] = drafter
        return drafter

    def _draft_to_target(self):
        """The head's draft-to-target id map (None when its vocabulary is the target's)."""
        head = self.draft_head
        return head.draft_to_target if head.draft_vocab_size != head.vocab_size else None

    # -- calls ---------------------------------------------------------------------------------
    def generate(self, input_ids=None, attention_mask=None, **options):
        """Like specdec_fast.generate(target, input_ids, attention_mask, ...) with this engine's
        drafting: returns tokens [B, prompt_len + new] (or (tokens, stats) with return_stats=True).
        Calls from several threads take turns (one call at a time per engine)."""
        return self.generate_resolved(None, input_ids, attention_mask, **options)

    def generate_resolved(self, opts, input_ids=None, attention_mask=None, **options):
        """generate() with the options already resolved (``opts``: options.Options from the same
        arguments, e.g. by specdec_fast.generate, which sized the engine by them; None: resolve
        here): transformers' length warnings are given once per call."""
        with self._lock:
            return self._generate(input_ids, attention_mask, resolved=opts, **options)

    def _generate(self, input_ids, attention_mask, *, assistant_model=None, prompt_lookup_num_tokens=None,
                  max_new_tokens=None, do_sample=None, temperature=None, top_k=None, top_p=None, min_p=None,
                  eos_token_id=None, pad_token_id=None, num_assistant_tokens=None, streamer=None, seed=None,
                  return_stats=False, generation_config=None, tree=None, resolved=None, draft_head=None, **kwargs):
        args = dict(draft_head=draft_head, assistant_model=assistant_model, prompt_lookup_num_tokens=prompt_lookup_num_tokens,
                    max_new_tokens=max_new_tokens, do_sample=do_sample, temperature=temperature, top_k=top_k,
                    top_p=top_p, min_p=min_p, eos_token_id=eos_token_id, pad_token_id=pad_token_id,
                    num_assistant_tokens=num_assistant_tokens, streamer=streamer, generation_config=generation_config,
                    tree=tree, resolved=resolved, **kwargs)
        if self.tp is None:
            return self._run(self._prepare(input_ids, attention_mask, **args), seed, return_stats)
        with self.tp.guard():  # engine/tensor_parallel.py: agree on the request, decode, agree on the output
            call, error = None, None
            try:
                call = self._prepare(input_ids, attention_mask, **args)
            except Exception as exc:  # noqa: BLE001 - raised on every rank by agree()
                error = exc
            drawn = int(torch.randint(0, 2**62, (1,)).item()) if seed is None and error is None else None
            facts = {} if error else dict(request_facts(call.input_ids, call.mask, call.opts, call.k, call.token_tree, seed,
                                                        call.ks), drawn=drawn, cached=call.cached)
            agreed = self.tp.agree("generate", facts, error, uncompared=("drawn",))
            leader = LeaderK(self.tp, self.calls) if call.ks else None  # every rank runs rank 0's Ks
            try:
                out = self._run(call, seed if seed is not None else agreed[0]["drawn"], return_stats, leader)
                tokens = out[0] if return_stats else out
                check_output(self.tp, getattr(tokens, "sequences", tokens))  # return_dict_in_generate: its sequences
            except BaseException:
                if leader is not None:  # the call failed on every rank: its Ks are read no more
                    leader.abandon()
                raise
            if leader is not None:  # every rank is past its loop: the call's Ks are read
                leader.clear()
            return out

    def _prepare(self, input_ids, attention_mask, *, assistant_model=None, prompt_lookup_num_tokens=None,
                 max_new_tokens=None, do_sample=None, temperature=None, top_k=None, top_p=None, min_p=None,
                 eos_token_id=None, pad_token_id=None, num_assistant_tokens=None, streamer=None,
                 generation_config=None, tree=None, resolved=None, draft_head=None, **kwargs) -> "_Call":
        """Every check of a call, before anything runs (ValueError naming the problem)."""
        if input_ids is None:
            input_ids = kwargs.pop("inputs", None)
        tokenizer, assistant_tokenizer = kwargs.pop("tokenizer", None), kwargs.pop("assistant_tokenizer", None)
        if tokenizer is not None and assistant_tokenizer is not None:
            check_tokenizer("tokenizer", tokenizer)
            check_tokenizer("assistant_tokenizer", assistant_tokenizer)
        if self.cross_tokenizers is not None:
            self._check_cross_tokenizers(tokenizer, assistant_tokenizer)
            tokenizer = self.cross_tokenizers[0] if tokenizer is None else tokenizer  # stop_strings read it
        elif tokenizer is not None and assistant_tokenizer is not None:
            self._check_tokenizers(tokenizer, assistant_tokenizer)
        self._check_drafting(assistant_model, prompt_lookup_num_tokens, tree, draft_head)
        check_inputs(input_ids, None)  # type and shape, before the options read the width
        target = self.target
        if streamer is not None and input_ids.shape[0] != 1:
            raise ValueError(f"streamer supports batch size 1 only (like transformers' streamers), got batch {input_ids.shape[0]}")
        if input_ids.device != self.device:
            raise ValueError(f"input_ids is on {input_ids.device} but model is on {self.device}")
        # Every other option of transformers' generate: accepted where it changes nothing, else one
        # ValueError naming it (options/rules.py).
        explicit = dict(max_new_tokens=max_new_tokens, do_sample=do_sample, temperature=temperature, top_k=top_k,
                        top_p=top_p, min_p=min_p, eos_token_id=eos_token_id, pad_token_id=pad_token_id,
                        num_assistant_tokens=num_assistant_tokens, prompt_lookup_num_tokens=prompt_lookup_num_tokens, **kwargs)
        opts = resolved or resolve_options(target, generation_config, explicit, input_ids.shape[1])
        extra, user_cache = take_user_cache(opts.extra)  # out of the options: they are compared across ranks
        cached = 0
        if user_cache is not None:
            opts = dataclasses.replace(opts, extra=extra)
            cached = cached_length(user_cache, input_ids, attention_mask, return_sequences(opts))
        if guidance_on(opts.extra.get("guidance_scale")):
            check_guidance(opts.extra["guidance_scale"], opts.extra.get("negative_prompt_ids"),
                           opts.extra.get("negative_prompt_attention_mask"), input_ids.shape[0], return_sequences(opts))
        if attention_mask is None:  # transformers infers it from the pad token
            attention_mask = infer_attention_mask(input_ids, opts.mask_pad_token_id, opts.eos_token_ids)
        input_ids, attention_mask = expand_rows(input_ids, attention_mask, return_sequences(opts))
        mask = check_inputs(input_ids, attention_mask)
        check_in_vocabulary(input_ids, self.target_runner.vocab_size)
        tree = self.tree if tree is None else tree
        token_tree = None if tree is None else as_token_tree(tree, greedy=not opts.do_sample)
        k = self._k_for(opts, token_tree, num_assistant_tokens)
        ks = self._ks_for(opts, token_tree, num_assistant_tokens)
        limits = call_limits(opts, input_ids.shape[1], tokenizer)  # stopping criteria (stopping.py)
        self._check_sizes(input_ids, limits.max_new_tokens, max(ks or (k,)) if token_tree is None else token_tree.size - 1)
        if len(limits.eos_token_ids or ()) > EOS_SLOTS:  # transformers takes any number: a bound patch hands it over
            raise UnsupportedOptionError(f"at most {EOS_SLOTS} eos_token_id values are supported, got "
                                         f"{len(limits.eos_token_ids)}")
        stage = self._stage_request(opts, None, token_tree, target)  # its checks now; the call's params in _run
        if self.tp is not None:
            check_tp_call(target, opts, limits, user_cache)
        return _Call(input_ids, mask, opts, token_tree, k, ks, limits, stage, streamer, user_cache, cached)

    def _run(self, call: "_Call", seed, return_stats: bool, leader=None):
        """The checked call's decoding (seed None: drawn from torch's global RNG; leader: tensor parallel with
        an adaptive schedule, the call's distributed.k_leader.LeaderK)."""
        input_ids, mask, opts, limits = call.input_ids, call.mask, call.opts, call.limits
        if seed is None:
            seed = int(torch.randint(0, 2**62, (1,)).item())
        params = make_sampling_tensors(input_ids.shape[0], self.device, seed=seed, **opts.kernel_params())
        stage = None if call.stage is None else dataclasses.replace(call.stage, params=params)
        kernel = kernel_params(stage, params, seed)  # the warpers in the stage: the kernels sample plainly
        decoder = self._decoder(input_ids.shape[0], call.k, kernel.modes, call.token_tree, len(limits.eos_token_ids or ()),
                                None if stage is None else stage.spec, call.ks)
        decoder.k_leader = leader
        try:
            tokens = decoder.generate(input_ids.long(), mask.to(self.device), params=kernel,
                                      max_new_tokens=limits.max_new_tokens, eos_token_ids=limits.eos_token_ids,
                                      pad_token_id=opts.pad_token_id, streamer=call.streamer, stage=stage,
                                      stopping_criteria=limits if limits.host else None)
        finally:
            decoder.k_leader = None
            decoder.release()
            self.calls += 1
        stats = decoder.stats.result
        stats.extra["engine"] = dict(bucket=decoder.rows, decoders=len(self._decoders),
                                     graphs_captured_total=self.graphs_captured)
        if self.tp is not None:
            stats.extra["tensor_parallel"] = dict(ranks=self.tp.size, rank=self.tp.rank, backend=self.tp.backend,
                                                  shard_draft=self.shard_draft,
                                                  k_schedule="rank 0's adaptive" if leader is not None else "constant")
        forwards = None
        if call.user_cache is not None:  # left as transformers' generate leaves it; the output's forwards with it
            forwards = extend_user_cache(self.target, call.user_cache, tokens, mask, call.cached, **forwards_asked(opts))
        if opts.extra.get("return_dict_in_generate"):
            # no cache passed: the one transformers' generate would have built and returned (none from a
            # ShardedCausalLM, which has no forward of its own)
            new_cache = call.user_cache is None and opts.builds_cache and not isinstance(self.target, ShardedCausalLM)
            tokens = output_dict(self.target, tokens, mask, opts, params, call.user_cache, new_cache, forwards)
        return (tokens, stats) if return_stats else tokens

    def _check_tokenizers(self, tokenizer, assistant_tokenizer) -> None:
        """One shared vocabulary (tokenizer_key: each tokenizer hashed once)."""
        if tokenizer_key(tokenizer)[0] != tokenizer_key(assistant_tokenizer)[0]:
            raise ValueError("vocab mismatch: tokenizer and assistant_tokenizer have different vocabularies, and this "
                             "engine drafts in one shared vocabulary; build SpeculativeEngine(target, draft, tokenizer=..., "
                             "assistant_tokenizer=...) or call specdec_fast.generate to draft across tokenizers")

    def _check_cross_tokenizers(self, tokenizer, assistant_tokenizer) -> None:
        """A call to an engine that drafts across tokenizers may name its tokenizers (or ones of the
        same tokenizer.json), not others."""
        for name, given, own in (("tokenizer", tokenizer, self.cross_tokenizers[0]),
                                 ("assistant_tokenizer", assistant_tokenizer, self.cross_tokenizers[1])):
            if given is not None and given is not own and tokenizer_key(given) != tokenizer_key(own):
                raise ValueError(f"this engine drafts across tokenizers with another {name}; build a SpeculativeEngine "
                                 "for this pair, or call specdec_fast.generate")

    @staticmethod
    def _stage_request(opts, params, token_tree, model=None):
        """The call's logits stage (logits processors, penalties), or None when it needs none
        (model: the target, for guidance_scale)."""
        options = stage_options_of(opts)
        request = (StageRequest(options, opts.eos_token_ids, opts.do_sample, params, opts.max_new_tokens, model)
                   if options else None)
        if request is None or request.spec is None:
            return None
        if token_tree is not None and guidance_on(options.get("guidance_scale")):
            # an UnsupportedOptionError (a ValueError): a bound patch_generate hands such calls to transformers
            raise UnsupportedOptionError("guidance_scale with tree=...: classifier-free guidance runs on chains only "
                                         "(each row's unconditional stream is one cache, extended by its drafts); "
                                         "drop tree=")
        return request

    def _is_own_head(self, draft_head) -> bool:
        if isinstance(draft_head, torch.nn.Module):
            return draft_head is self.draft_head
        return self.head_source is not None and head_source(draft_head) == self.head_source

    def _check_drafting(self, assistant_model, prompt_lookup_num_tokens, tree, draft_head=None) -> None:
        """A call may name the engine's own drafting (as model.generate calls do), not another."""
        if prompt_lookup_num_tokens is not None and assistant_model is not None:  # first: the checks below blame the engine
            raise ValueError("give either assistant_model or prompt_lookup_num_tokens, not both")
        if assistant_model is not None and assistant_model is not self.assistant_model:
            raise ValueError("this engine drafts with another assistant_model (or none); build a SpeculativeEngine "
                             "for this one, or call specdec_fast.generate")
        if prompt_lookup_num_tokens is not None and self.mode != "lookup":
            raise ValueError("this engine does not draft by prompt lookup; build a SpeculativeEngine with "
                             "prompt_lookup_num_tokens")
        if tree is not None and self.mode not in ("draft", "head"):
            raise ValueError("tree=... needs an assistant_model or a draft_head (the drafter that expands the tree)")
        if draft_head is not None and not self._is_own_head(draft_head):
            raise ValueError("this engine drafts with another draft_head (or none); build a SpeculativeEngine for this one, "
                             "or call specdec_fast.generate")
        if tree is not None and self.cross_tokenizers is not None:
            raise ValueError(CROSS_TREE_ERROR)

    def _k_for(self, opts, token_tree, num_assistant_tokens) -> int:
        if token_tree is not None:
            if num_assistant_tokens is not None:
                raise ValueError("tree=... needs an assistant_model (the draft that expands the tree) and no "
                                 "num_assistant_tokens (the tree's shape sets the drafts)")
            return token_tree.depth
        if self.mode == "lookup":
            k = opts.prompt_lookup_num_tokens if opts.prompt_lookup_num_tokens is not None else self.default_k
            return _positive("prompt_lookup_num_tokens", k)
        if self.mode in ("draft", "head"):
            k = opts.num_assistant_tokens if opts.num_assistant_tokens is not None else self.default_k
            if isinstance(k, bool) or not isinstance(k, int) or k < 1:
                raise ValueError(f"num_assistant_tokens (K) must be an int >= 1, got {k!r}")
            block = getattr(self.draft_head, "block_size", None)
            if self.mode == "head" and block is not None and k > block - 1:
                raise ValueError(f"a DFlash block of {block} drafts at most {block - 1} tokens per iteration, got "
                                 f"num_assistant_tokens={k}")
            return k
        return 0

    def _ks_for(self, opts, token_tree, num_assistant_tokens):
        """The Ks an adaptive schedule chooses among (draft model or block drafter, chains), or None
        for a constant K: adaptive when the call names that schedule (or transformers' heuristic
        ones, which it serves); a K given with it is the first iteration's.

        Not the default: on the H100 (bench/results/h100_2026-11-24/adaptive_k_*.json) it reached
        0.75-0.98 of the best fixed K's tokens/s without warmup() and 0.83-0.91 after it, and ran up
        to 10% slower than a constant K at the same K in some configurations (not explained yet);
        a sampled call under it is exact in distribution but not reproducible under a seed (its
        choices follow measured times)."""
        schedule = opts.extra.get("num_assistant_tokens_schedule")
        if schedule is not None and schedule not in SCHEDULES:
            raise ValueError(f"num_assistant_tokens_schedule must be one of {SCHEDULES}, got {schedule!r}")
        # A draft model and an EAGLE-3 head draft one token a step (the head sizes its pending
        # entries for the call's largest K at start() and uses the first K of them). A block drafter
        # chooses among the first K of its block (ADAPTIVE_BLOCK_KS and block_size - 1): one forward
        # whatever K, so the schedule prices its draft per iteration (drafters/block.py draft_cost)
        # and the choice weighs the verify's K + 1 rows against the acceptance further out.
        block = getattr(self.draft_head, "block_size", None) if self.mode == "head" else None
        if (not self._chain_schedulable() and block is None) or token_tree is not None or schedule in (None, "constant"):
            return None
        if self.tp is not None and not LeaderK.available(self.tp):
            # Tensor parallel without a store to share rank 0's Ks (distributed/k_leader.py): a constant K. The
            # adaptive choice reads this process's own step times, which differ between ranks: ranks choosing
            # different Ks would issue different collectives (a hang, or gloo's size-mismatch abort).
            return None
        if block is not None:
            top = min(self.max_draft_tokens, block - 1)
            return tuple(sorted({q for q in ADAPTIVE_BLOCK_KS if q <= top} | {top}))
        # Named with a draft of another tokenizer it runs (exact), but its choice is poor there: that
        # draft phase is mostly a fixed cost per iteration (the feed call, the host re-tokenisation),
        # which the schedule's per-step draft cost (draft phase / K) spreads over K, so it settles on
        # K = 1 (CPU, shipped cross draft: K = 1 in 274 of 276 iterations, 1.80 tokens per target
        # pass against 3.41 at K = 4; bench/results/cross_tokenizer_cpu_avx512.json).
        return tuple(q for q in ADAPTIVE_KS if q <= self.max_draft_tokens)

    def _chain_schedulable(self) -> bool:
        """Whether this engine drafts a chain one token a step (a draft model, an early exit, an
        EAGLE-3 head, an MTP layer): the adaptive schedule chooses among ADAPTIVE_KS for it."""
        return self.mode == "draft" or (self.mode == "head" and getattr(self.draft_head, "kind", None) in ("eagle3", "mtp"))

    def _check_sizes(self, input_ids, max_new_tokens: int, drafted: int) -> None:
        batch, width = input_ids.shape
        if drafted > self.max_draft_tokens:
            raise ValueError(f"this call drafts {drafted} tokens per iteration, more than this engine's max_draft_tokens="
                             f"{self.max_draft_tokens}; build the engine with max_draft_tokens={drafted}")
        if batch > self.max_batch_size:
            raise ValueError(f"a batch of {batch} rows exceeds this engine's max_batch_size={self.max_batch_size}")
        limit = max_positions(self.target)
        if limit is not None and width + max_new_tokens > limit:
            raise ValueError(f"prompt ({width} tokens) + max_new_tokens ({max_new_tokens}) exceeds the "
                             f"model's max_position_embeddings ({limit})")
        if width + max_new_tokens > self.max_seq_len:
            raise ValueError(f"prompt ({width} tokens) + max_new_tokens ({max_new_tokens}) exceeds this engine's "
                             f"max_seq_len={self.max_seq_len}")
        pool = getattr(self.target_runner, "cache", None)
        # a ring cache (every layer windowed: runners/paged_cache.py) holds a ring per slot whatever the row's length
        if pool is not None and getattr(self.target_runner, "pooled", False) and pool.ring_blocks is None:
            need = batch * math.ceil((width + max_new_tokens + drafted + 1) / self.block_size)
            if need > pool.num_blocks:
                raise OutOfBlocksError(
                    f"{batch} rows of {width} + {max_new_tokens} + {drafted + 1} tokens need up to {need} KV blocks of "
                    f"{self.block_size} tokens; the pool holds {pool.num_blocks} (kv_cache_tokens = "
                    f"{pool.num_blocks * self.block_size}): raise kv_cache_tokens, or lower max_batch_size / max_seq_len "
                    f"of the requests")

    def _decoder(self, batch: int, k: int, modes, token_tree, num_eos: int, stage_spec=None, ks=None) -> SpeculativeDecoder:
        """The decoder of this call's bucket, K, sampling modes, tree and logits stage (built at its
        first call). A user's logits_processor, prefix_allowed_tokens_fn, watermarking_config or
        guidance_scale runs eagerly: its decoders take no graphs."""
        if num_eos > EOS_SLOTS:
            raise ValueError(f"at most {EOS_SLOTS} eos_token_id values are supported, got {num_eos}")
        eager = stage_spec == "user"
        bucketed = self.graph_mode != "eager" and not eager
        rows = bucket_for(batch, self.max_batch_size) if bucketed else batch
        key = (rows, ks or k, None if modes is None else frozenset(modes), token_tree, stage_spec)
        decoder = self._decoders.get(key)
        if decoder is not None:
            self._decoders.move_to_end(key)
        else:
            k_max = max(ks or (k,))
            common = dict(backend=self.backend, run_ahead=self.run_ahead, rows=rows,
                          seq_capacity=self.max_seq_len + k_max + 1, cuda_graphs=False if eager else self.cuda_graphs)
            if token_tree is not None:  # k = the tree's depth (TreeDecoder sets it)
                decoder = TreeDecoder(self.target_runner, self._tree_drafter(token_tree), **common)
            else:
                drafter = self._chain_drafter() if k else None
                decoder = SpeculativeDecoder(self.target_runner, drafter, k=k, ks=ks, **common)
            if eager and self.graph_mode != "eager":
                decoder.graph_note = USER_PROCESSORS_NOTE
            self._decoders[key] = decoder
            while len(self._decoders) > MAX_DECODERS:  # the least recently used goes, with its buffers and graphs
                self._decoders.popitem(last=False)
        return decoder

    @property
    def graphs_captured(self) -> int:
        """CUDA graphs (or static twins) captured so far, over every decoder."""
        return sum(len(d.steps.captured()) for d in self._decoders.values() if d.steps is not None)

    def warmup(self, batch_sizes=None, *, max_new_tokens: int | None = None, **options) -> dict:
        """Captures every bucket's graphs now (as a server does at start-up) by running a short
        generate() per batch size (default: every bucket up to max_batch_size) with ``options``
        (sampling options choose the kernels: warm up each mode you will serve). Returns
        {batch size: ms}. Without graphs (eager) it builds the decoders and runs them once."""
        sizes = sorted({bucket_for(b, self.max_batch_size) for b in (batch_sizes or BUCKETS) if b <= self.max_batch_size})
        steps = max_new_tokens or (3 + 2 * self.run_ahead)  # warm-up + capture iterations, with room
        pad = 0 if self.target.config.pad_token_id is None else int(self.target.config.pad_token_id)
        out = {}
        for size in sizes:
            ids = torch.full((size, 1), pad, dtype=torch.long, device=self.device)
            t0 = time.perf_counter()
            self._warm(ids, steps, dict(options))
            out[size] = 1000 * (time.perf_counter() - t0)
        return out

    def _warm(self, ids, steps: int, options: dict) -> None:
        with self._lock, (self.tp.guard() if self.tp is not None else contextlib.nullcontext()):
            opts = resolve_options(self.target, options.pop("generation_config", None),
                                   {**{k: options.get(k) for k in ("do_sample", "temperature", "top_k", "top_p", "min_p")},
                                    "max_new_tokens": steps}, ids.shape[1])
            tree = options.get("tree", self.tree)
            token_tree = None if tree is None else as_token_tree(tree, greedy=not opts.do_sample)
            if options.get("num_assistant_tokens_schedule") is not None:  # warm the adaptive schedule's Ks
                opts.extra["num_assistant_tokens_schedule"] = options["num_assistant_tokens_schedule"]
            k = self._k_for(opts, token_tree, options.get("num_assistant_tokens"))
            ks = self._ks_for(opts, token_tree, options.get("num_assistant_tokens"))
            params = make_sampling_tensors(ids.shape[0], self.device, seed=0, **opts.kernel_params())
            decoder = self._decoder(ids.shape[0], k, params.modes, token_tree, 0, ks=ks)
            # An adaptive schedule: one short run pinned at each K captures every K's graphs (and
            # gives the schedule each K's first step times).
            for pinned in ks or (None,):
                if decoder.schedule is not None:
                    decoder.schedule.pinned = pinned
                try:  # no EOS: every step runs, so the capture happens
                    decoder.generate(ids, torch.ones_like(ids), params=params, max_new_tokens=steps, eos_token_ids=None,
                                     pad_token_id=opts.pad_token_id, streamer=None)
                finally:
                    decoder.release()
                    if decoder.schedule is not None:
                        decoder.schedule.pinned = None

    def describe(self) -> str:
        """One line: the drafting, the sizes, the pool, the graph mode."""
        drafting = {"draft": f"draft model, K={self.default_k}", "head": f"draft head, K={self.default_k}",
                    "lookup": f"prompt lookup, K={self.default_k}",
                    "plain": "plain decoding"}[self.mode]
        if self.tree is not None:
            drafting = f"{'draft head' if self.mode == 'head' else 'draft model'}, tree {as_token_tree(self.tree).describe()}"
        elif self.cross_tokenizers is not None:
            drafting = f"draft model with its own tokenizer, K={self.default_k}"
        parallel = "" if self.tp is None else \
            (f"; tensor parallel over {self.tp.size} ranks ({self.tp.backend}, {'head' if self.mode == 'head' else 'draft'} "
             f"{'sharded' if self.shard_draft else 'replicated'}; {self.target_runner.plan.describe()})")
        return f"SpeculativeEngine({drafting}; {self.memory_note}; graphs: {self.graph_mode}{parallel})"

    __repr__ = describe
