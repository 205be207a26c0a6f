"""generate(): a drop-in for model.generate with speculative decoding.

A thin face: the work is done by a SpeculativeEngine (engine/engine.py) cached per target and
drafting (engine/cached.py), so a second call reuses the first call's runners, KV pools and
CUDA graphs. Build a SpeculativeEngine yourself to size it (max_batch_size, max_seq_len,
kv_cache_tokens) and to capture its graphs up front (warmup()).

Defaults: K = num_assistant_tokens = 4 with a draft model (transformers' default of 20 is
tuned for its heuristic schedule, which shrinks K after rejections; we use a constant K, and
Leviathan's Theorem 3.8 puts the optimum at 3-6 for alpha 0.6-0.8 and c <= 0.1). With
prompt_lookup_num_tokens the drafts come from the context (K = that number), with
max_matching_ngram_size (default 2) as in transformers.

Runners (runner=): "paged" (the family's paged runner, runners/registry.PAGED_RUNNERS: the model's own
weights run layer by layer over a paged KV cache with this package's kernels) is the default where
the model supports it, "hf" (runners/hf.py: the model's own forward and DynamicCache) elsewhere.

One difference from transformers: an argument left at None means "not given" (the value comes
from generation_config / model.generation_config), whereas transformers treats an explicit
eos_token_id=None as "no EOS". To decode without EOS here, clear generation_config.eos_token_id.
"""
import torch

from .drafters import as_token_tree
from .drafters.early_exit import early_exit_model
from .engine.cached import engine_for
from .engine.engine import ADAPTIVE_KS, DEFAULT_NUM_ASSISTANT_TOKENS  # noqa: F401 (the documented default K)
from .engine.inputs import check_inputs
from .engine.outputs import return_sequences
from .engine.stopping import call_limits
from .heads.gemma4_assistant import is_gemma4_assistant
from .heads.layout import load_draft_head
from .heads.mtp import mtp_head
from .options import resolve_options
from .runners.registry import RUNNERS, choose_runner  # noqa: F401 (generate's runner= values; runner choice)
from .runners.sharded_model import ShardedCausalLM

# The ways to draft that generate() takes, one per call (patch_generate binds one of them too).
DRAFTERS = ("assistant_model", "draft_head", "prompt_lookup_num_tokens", "assistant_early_exit", "use_mtp")


def drafter_given(value) -> bool:
    """Whether a DRAFTERS argument names a drafter: not None, and not use_mtp=False."""
    return value is not None and value is not False


def generate(model, input_ids=None, attention_mask=None, *, assistant_model=None, prompt_lookup_num_tokens=None,
             max_new_tokens=None, do_sample=None, temperature=None, top_k=None, top_p=None, min_p=None,
             eos_token_id=None, pad_token_id=None, num_assistant_tokens=None, streamer=None, seed=None,
             return_stats=False, generation_config=None, backend=None, runner=None, cuda_graphs=None, tree=None,
             draft_head=None, process_group=None, shard_draft=False, **options):
    """Like model.generate(input_ids, attention_mask, assistant_model=..., ...): returns the LongTensor
    [B, prompt_len + new] that model.generate returns (left padding kept, pad after EOS). With
    return_stats=True returns (tokens, GenerationStats). Without a drafter: plain decoding (K=0).
    seed: int (per-row streams) or None (drawn from torch's global RNG). backend: kernel backend.
    runner: None (paged where supported, else hf; chosen for target and draft separately),
    "paged" (error if unsupported) or "hf" (the model's own forward and DynamicCache).
    cuda_graphs: None (graph_policy.GRAPHS_BY_DEFAULT: CUDA graphs wherever they can run, else
    eager with the reason in the stats' graph_note), True (the draft and verify steps as CUDA graphs: CUDA, paged runners, Triton kernels;
    error if unsupported), False (eager), "static"
    (the graph code path run eagerly with its safety checks, any device: for tests). The stats
    report which ran (graph_mode, graph_note, graph_replays, graphs_captured: 0 when this call
    replayed graphs an earlier call captured).
    tree: draft a token tree per step instead of a chain (specdec_fast.drafters.token_tree): a TokenTree, True
    (TokenTree.recommended(): the static or dynamic default, whichever measured better for the
    request's mode), an int N (the same with N nodes), "static" or "dynamic" (the default static /
    dynamic tree: a dynamic tree chooses its shape per row and step, drafters/tree_dynamic.py); needs
    assistant_model and paged runners; num_assistant_tokens does not apply.

    assistant_early_exit (a keyword, as transformers'): N, the draft is the target's own first N
    layers with its final norm and LM head (drafters/early_exit.py: the modules shared, no copy;
    for LayerSkip-trained checkpoints), then exactly as an assistant_model.

    speculation_type="dflash" with assistant_model a DFlash drafter loaded as a module (transformers'
    DFlash assisted generation): that checkpoint drafts as draft_head (heads/layout.load_draft_head
    reads the module's config and weights, once per module).

    use_mtp=True (as transformers'): draft with the target's own multi-token-prediction layer
    (GLM-4.5 / 4.6 / 4.7, DeepSeek-V3, Qwen3-Next, Qwen3.5: heads/mtp.py), read from the target's
    checkpoint directory once per model (by transformers' MtpModel; Qwen's mtp.* by heads/mtp_checkpoint.py); K = num_assistant_tokens, else 1 (transformers drafts
    one token per MTP layer); a larger K runs the layer again per draft. With process_group (or a
    ShardedCausalLM) each rank reads only its slices of the layer from the checkpoint directory.

    A Gemma 4 assistant (Gemma4AssistantForCausalLM) as assistant_model drafts as a head (heads/gemma4_assistant.py):
    over the paged Gemma 4 target's own K/V, the checkpoint's num_assistant_tokens its default K.

    draft_head: draft with a head that reads the target's hidden states instead of a draft model:
    a directory in the published EAGLE-3 / DFlash layout or a loaded head (specdec_fast.load_draft_head);
    K = num_assistant_tokens; without it 4 for an EAGLE-3 head and block_size - 1 for a DFlash
    drafter (its K drafts cost one forward whatever K); constant unless the call names
    num_assistant_tokens_schedule="adaptive": an EAGLE-3 head then chooses K per iteration among the
    draft model's Ks (ADAPTIVE_KS), a DFlash / DFlash2 drafter among the first drafts of its block;
    needs the paged target runner.

    tokenizer, assistant_tokenizer (keywords, as transformers'): with both given and vocabularies
    that differ, the draft drafts in its own tokens and its text is re-encoded into the target's
    (drafters/cross_tokenizer.py: exact, eager, no tree=, no process_group); a different vocabulary
    without both raises.

    cache / past_key_values (keywords, as transformers'): a transformers Cache holding the KV of
    input_ids' first L tokens (a chat loop's DynamicCache, a prompt cache): the tokens are those of
    model.generate with it, and the cache is left as generate leaves it (engine/user_cache.py: the
    prompt is recomputed here, then the model's own forward over the tokens past the cache
    extends it, as generate fills it).

    process_group: tensor parallelism (docs/architecture.md §10): the target (a model loaded whole
    on every rank, or a ShardedCausalLM) runs sharded over this torch.distributed group; call
    generate on every rank with the same arguments (a call without seed takes rank 0's draw);
    every rank returns the tokens. shard_draft: shard the draft too (default: replicated).

    The call runs on the engine cached for (model, assistant_model / draft_head or prompt lookup, backend,
    runner, cuda_graphs, process_group, the tokenizers of a draft with another vocabulary): built
    at the first call, grown when a call needs more rows or tokens,
    freed with the models (engine/cached.py; specdec_fast.release_engines() frees it sooner).
    Any other option of transformers' generate (**options, generation_config, model.generation_config):
    accepted where it changes nothing (neutral or no effect), else one ValueError naming it
    (specdec_fast/options/rules.py)."""
    if input_ids is None:
        input_ids = options.pop("inputs", None)
    check_inputs(input_ids, None)  # type and shape (the mask's values: the engine checks them)
    explicit = dict(max_new_tokens=max_new_tokens, do_sample=do_sample, temperature=temperature, top_k=top_k, top_p=top_p,
                    min_p=min_p, eos_token_id=eos_token_id, pad_token_id=pad_token_id,
                    num_assistant_tokens=num_assistant_tokens, prompt_lookup_num_tokens=prompt_lookup_num_tokens,
                    **{name: value for name, value in options.items() if name not in ("tokenizer", "assistant_tokenizer")})
    opts = resolve_options(model, generation_config, explicit, input_ids.shape[1])
    if opts.extra.get("speculation_type") == "dflash":  # transformers' DFlash: assistant_model is the drafter
        if assistant_model is None or draft_head is not None:
            raise ValueError("speculation_type='dflash' drafts with assistant_model, a DFlash draft model (or pass "
                             "draft_head= alone)")
        draft_head, assistant_model = load_draft_head(assistant_model), None
    if draft_head is None and is_gemma4_assistant(assistant_model):  # transformers' Gemma 4 assistant: a head that
        # drafts over the target's K/V (heads/gemma4_assistant.py), not a draft model
        draft_head, assistant_model = load_draft_head(assistant_model), None
    early_exit, use_mtp = opts.extra.get("assistant_early_exit"), opts.extra.get("use_mtp")
    # here, before an engine is chosen: its own checks would speak of engines
    check_one_drafter(dict(assistant_model=assistant_model, draft_head=draft_head,
                           prompt_lookup_num_tokens=prompt_lookup_num_tokens, assistant_early_exit=early_exit,
                           use_mtp=use_mtp))
    if use_mtp:  # transformers' use_mtp: the target's own MTP layer, loaded once per model, drafts as a head
        draft_head = mtp_head(model, tensor_parallel=process_group is not None or isinstance(model, ShardedCausalLM))
    elif isinstance(draft_head, torch.nn.Module):  # a head as it is; a loaded checkpoint module -> its head (once)
        draft_head = load_draft_head(draft_head)
    if early_exit is not None:  # the target's first N layers: a draft model like any other
        assistant_model = early_exit_model(model, early_exit)
    lookup = assistant_model is None and opts.prompt_lookup_num_tokens is not None
    lookup = lookup and draft_head is None
    engine = engine_for(model, assistant_model, draft_head=draft_head, prompt_lookup=lookup,
                        max_matching_ngram_size=opts.max_matching_ngram_size if lookup else None, backend=backend,
                        runner=runner, cuda_graphs=cuda_graphs, batch=input_ids.shape[0] * return_sequences(opts),
                        row_tokens=input_ids.shape[1] + call_limits(opts, input_ids.shape[1], options.get("tokenizer")).max_new_tokens,
                        drafted=_drafted(opts, tree, lookup, assistant_model is not None, draft_head is not None),
                        tokenizer=options.get("tokenizer"), assistant_tokenizer=options.get("assistant_tokenizer"),
                        process_group=process_group, shard_draft=shard_draft)
    return engine.generate_resolved(opts, input_ids, attention_mask, assistant_model=assistant_model,
                           prompt_lookup_num_tokens=prompt_lookup_num_tokens, max_new_tokens=max_new_tokens,
                           do_sample=do_sample, temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p,
                           eos_token_id=eos_token_id, pad_token_id=pad_token_id, num_assistant_tokens=num_assistant_tokens,
                           streamer=streamer, seed=seed, return_stats=return_stats, generation_config=generation_config,
                           tree=tree, draft_head=draft_head, **options)


def check_one_drafter(given: dict) -> None:
    """At most one of DRAFTERS not None in ``given`` (name -> value); ValueError naming them."""
    names = [name for name in DRAFTERS if drafter_given(given.get(name))]
    if len(names) > 1:
        raise ValueError(f"give one drafter ({', '.join(DRAFTERS)}), got {' and '.join(names)}")


def _drafted(opts, tree, lookup: bool, draft: bool, head: bool = False) -> int:
    """Tokens one iteration of this call scores beyond the last one: K, or a tree's N - 1 (K checked here,
    before an engine is sized by it). A draft head without K: 0 (its engine's own default K: 4 for an
    EAGLE-3 head, the whole block for a DFlash drafter, whose adaptive Ks lie inside it), or, when the
    call names an adaptive schedule, the largest of ADAPTIVE_KS (an EAGLE-3 head chooses among them)."""
    if tree is not None:
        return as_token_tree(tree, greedy=not opts.do_sample).size - 1
    if not lookup and not draft and not head:
        return 0
    name, k = ("prompt_lookup_num_tokens", opts.prompt_lookup_num_tokens) if lookup else \
        ("num_assistant_tokens", opts.num_assistant_tokens)
    if k is None and not lookup:  # a draft model: the adaptive schedule's Ks (engine/schedule.py); a head: its default
        adaptive = opts.extra.get("num_assistant_tokens_schedule") not in (None, "constant")  # checked by the engine
        return max(ADAPTIVE_KS) if draft or adaptive else 0
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"{name} (K) must be an int >= 1, got {k!r}")
    return k
