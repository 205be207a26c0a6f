"""generate(): a drop-in for model.generate with speculative decoding, and patch_generate().

Defaults: K = num_assistant_tokens = 4 with a draft model (transformers' default of 20 is
tuned for its heuristic schedule, which shrinks K after rejections; we use a constant K, and
Leviathan's Theorem 3.8 puts the optimum at 3-6 for alpha 0.6-0.8 and c <= 0.1). With
prompt_lookup_num_tokens the drafts come from the context (K = that number), with
max_matching_ngram_size (default 2) as in transformers.

Runners (runner=): "paged" (runners/paged_llama.py and paged_gpt2.py: the model's own weights run layer
by layer over a paged KV cache with this package's kernels; Llama/Mistral/Qwen2/Qwen3 and GPT-2)
is the default where the model supports it, "hf" (runners/hf.py: the model's own forward and
DynamicCache) elsewhere.

One difference from transformers: an argument left at None means "not given" (the value comes
from generation_config / model.generation_config), whereas transformers treats an explicit
eos_token_id=None as "no EOS". To decode without EOS here, clear generation_config.eos_token_id.
"""
import torch

from .drafters import ModelDrafter, PromptLookupDrafter, TreeDrafter, as_token_tree
from .engine import SpeculativeDecoder, TreeDecoder
from .generation_options import resolve_options
from .input_ids_check import check_in_vocabulary
from .kernels.sampling_params import make_sampling_tensors
from .runners import HFRunner
from .runners.registry import paged_runner_class, paged_unsupported_reason

DEFAULT_NUM_ASSISTANT_TOKENS = 4


def _device_of(model) -> torch.device:
    return next(model.parameters()).device


def _vocab_size(model) -> int:
    head = model.get_output_embeddings()
    return int(head.weight.shape[0]) if head is not None else int(model.config.vocab_size)


def _check_inputs(input_ids, attention_mask):
    if not isinstance(input_ids, torch.Tensor) or input_ids.dim() != 2 or input_ids.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"input_ids must be an int tensor [batch, prompt_len], got {getattr(input_ids, 'shape', type(input_ids))}")
    if input_ids.shape[1] == 0 or input_ids.shape[0] == 0:
        raise ValueError(f"input_ids must hold at least one token per row, got shape {tuple(input_ids.shape)}")
    if attention_mask is None:
        return torch.ones_like(input_ids)
    if tuple(attention_mask.shape) != tuple(input_ids.shape):
        raise ValueError(f"attention_mask shape {tuple(attention_mask.shape)} differs from input_ids {tuple(input_ids.shape)}")
    mask = attention_mask.long()
    if bool(((mask != 0) & (mask != 1)).any()):
        raise ValueError("attention_mask must hold only 0 and 1")
    if mask.shape[1] > 1 and bool(((mask[:, 1:] == 0) & (mask[:, :-1] == 1)).any()):
        raise ValueError("attention_mask is right-padded (a 0 after a 1): decoder-only generation needs left padding "
                         "(tokenizer.padding_side = 'left')")
    if bool((mask.sum(1) == 0).any()):
        raise ValueError("attention_mask has a row with no real token")
    return mask


def _check_pair(model, assistant_model, tokenizer, assistant_tokenizer):
    target_vocab, draft_vocab = _vocab_size(model), _vocab_size(assistant_model)
    cfg_t = getattr(model.config, "vocab_size", None)
    cfg_d = getattr(assistant_model.config, "vocab_size", None)
    if target_vocab != draft_vocab or cfg_t != cfg_d:
        raise ValueError(
            f"vocab mismatch: the target has vocab_size {cfg_t} ({target_vocab} output rows), the draft (assistant_model) "
            f"has {cfg_d} ({draft_vocab}); speculative decoding needs one shared vocabulary"
        )
    if tokenizer is not None and assistant_tokenizer is not None and tokenizer.get_vocab() != assistant_tokenizer.get_vocab():
        raise ValueError("vocab mismatch: tokenizer and assistant_tokenizer have different vocabularies")
    if _device_of(model) != _device_of(assistant_model):
        raise ValueError(f"model is on {_device_of(model)} but assistant_model is on {_device_of(assistant_model)}; "
                         "put both on one device")


def _max_positions(model):
    config = model.config
    for name in ("max_position_embeddings", "n_positions"):
        value = getattr(config, name, None)
        if isinstance(value, int):
            return value
    return None


RUNNERS = ("paged", "hf")


def choose_runner(model, runner, max_tokens_per_row: int, backend=None) -> str:
    """"paged" or "hf" for ``model``: runner=None picks "paged" when the model supports it
    (runners/registry.py: Llama/Mistral/Qwen2/Qwen3 with no sliding window reached within
    max_tokens_per_row and static RoPE, or GPT-2 with max_tokens_per_row <= n_positions; a head_dim
    the kernel ``backend`` takes), else "hf"; runner="paged" on an unsupported model raises."""
    if runner is not None and runner not in RUNNERS:
        raise ValueError(f"runner must be None, 'paged' or 'hf', got {runner!r}")
    if runner == "hf":
        return "hf"
    reason = paged_unsupported_reason(model, max_tokens_per_row, backend)
    if reason is None:
        return "paged"
    if runner == "paged":
        raise ValueError(f"runner='paged' cannot run {type(model).__name__}: {reason}; use runner='hf' or None")
    return "hf"


def _make_runner(model, name: str, *, max_new_tokens: int, k: int, backend):
    if name == "paged":
        return paged_runner_class(model)(model, max_new_tokens=max_new_tokens, num_draft_tokens=k, backend=backend)
    return HFRunner(model)


def generate(model, input_ids=None, attention_mask=None, *, assistant_model=None, prompt_lookup_num_tokens=None,
             max_new_tokens=None, do_sample=None, temperature=None, top_k=None, top_p=None, min_p=None,
             eos_token_id=None, pad_token_id=None, num_assistant_tokens=None, streamer=None, seed=None,
             return_stats=False, generation_config=None, backend=None, runner=None, cuda_graphs=None, tree=None,
             **kwargs):
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
    report which ran (graph_mode, graph_note, graph_replays).
    tree: draft a token tree per step instead of a chain (specdec_fast.drafters.token_tree): a TokenTree, True
    (TokenTree.recommended(): the static or dynamic default, whichever measured better for the
    request's mode), an int N (the same with N nodes), "static" or "dynamic" (the default static /
    dynamic tree: a dynamic tree chooses its shape per row and step, tree_dynamic.py); needs
    assistant_model and paged runners; num_assistant_tokens does not apply.
    Any other option of transformers' generate (**kwargs, generation_config, model.generation_config):
    accepted where it changes nothing (neutral or no effect), else one ValueError naming it
    (specdec_fast/option_rules.py)."""
    if input_ids is None:
        input_ids = kwargs.pop("inputs", None)
    tokenizer, assistant_tokenizer = kwargs.pop("tokenizer", None), kwargs.pop("assistant_tokenizer", None)
    attention_mask = _check_inputs(input_ids, attention_mask)
    check_in_vocabulary(input_ids, _vocab_size(model))
    if streamer is not None and input_ids.shape[0] != 1:
        raise ValueError(f"streamer supports batch size 1 only (like transformers' streamers), got batch {input_ids.shape[0]}")
    device = _device_of(model)
    if input_ids.device != device:
        raise ValueError(f"input_ids is on {input_ids.device} but model is on {device}")
    attention_mask = attention_mask.to(device)
    if assistant_model is not None and prompt_lookup_num_tokens is not None:
        raise ValueError("give either assistant_model or prompt_lookup_num_tokens, not both")
    if assistant_model is not None:
        _check_pair(model, assistant_model, tokenizer, assistant_tokenizer)
    explicit = dict(max_new_tokens=max_new_tokens, do_sample=do_sample, temperature=temperature, top_k=top_k, top_p=top_p,
                    min_p=min_p, eos_token_id=eos_token_id, pad_token_id=pad_token_id,
                    num_assistant_tokens=num_assistant_tokens, prompt_lookup_num_tokens=prompt_lookup_num_tokens, **kwargs)
    opts = resolve_options(model, generation_config, explicit, input_ids.shape[1])
    limit = _max_positions(model)
    if limit is not None and input_ids.shape[1] + opts.max_new_tokens > limit:
        raise ValueError(f"prompt ({input_ids.shape[1]} tokens) + max_new_tokens ({opts.max_new_tokens}) exceeds the "
                         f"model's max_position_embeddings ({limit})")

    if assistant_model is not None:
        k = opts.num_assistant_tokens if opts.num_assistant_tokens is not None else DEFAULT_NUM_ASSISTANT_TOKENS
        drafter = None  # built below, once K is validated
        name = "num_assistant_tokens"
    elif opts.prompt_lookup_num_tokens is not None:
        k = opts.prompt_lookup_num_tokens
        drafter = PromptLookupDrafter(opts.max_matching_ngram_size)
        name = "prompt_lookup_num_tokens"
    else:
        k, drafter, name = 0, None, None
    if name is not None and (isinstance(k, bool) or not isinstance(k, int) or k < 1):
        raise ValueError(f"{name} (K) must be an int >= 1, got {k!r}")
    if tree is not None:  # token trees (engine/tree_loop.py)
        return _generate_tree(model, assistant_model, input_ids, attention_mask, opts, tree, runner=runner, backend=backend,
                             seed=seed, streamer=streamer, cuda_graphs=cuda_graphs, return_stats=return_stats)
    # Each row's reservation in a paged runner: prompt + max_new_tokens + K + 1 tokens.
    row_tokens = input_ids.shape[1] + opts.max_new_tokens + k + 1
    sizes = dict(max_new_tokens=opts.max_new_tokens, k=k, backend=backend)
    target_runner = _make_runner(model, choose_runner(model, runner, row_tokens, backend), **sizes)
    if assistant_model is not None:
        drafter = ModelDrafter(_make_runner(assistant_model, choose_runner(assistant_model, runner, row_tokens, backend), **sizes))

    if seed is None:
        seed = int(torch.randint(0, 2**62, (1,)).item())
    params = make_sampling_tensors(input_ids.shape[0], device, seed=seed, **opts.kernel_params())
    decoder = SpeculativeDecoder(
        target_runner, drafter, k=k, params=params, max_new_tokens=opts.max_new_tokens,
        eos_token_ids=opts.eos_token_ids, pad_token_id=opts.pad_token_id, backend=backend, streamer=streamer,
        cuda_graphs=cuda_graphs,
    )
    tokens = decoder.generate(input_ids.long(), attention_mask)
    return (tokens, decoder.stats.result) if return_stats else tokens


def _generate_tree(model, assistant_model, input_ids, attention_mask, opts, tree, *, runner, backend, seed, streamer,
                  cuda_graphs, return_stats):
    """api.generate(..., tree=...) after its argument checks: opts are the resolved generation
    options; both runners paged, sized for N - 1 drafted nodes per step."""
    if assistant_model is None or opts.num_assistant_tokens is not None:
        raise ValueError("tree=... needs an assistant_model (the draft that expands the tree) and no num_assistant_tokens")
    token_tree = as_token_tree(tree, greedy=not opts.do_sample)
    sizes = dict(max_new_tokens=opts.max_new_tokens, k=token_tree.size - 1, backend=backend)
    row_tokens = input_ids.shape[1] + opts.max_new_tokens + token_tree.size
    runners = [choose_runner(m, runner, row_tokens, backend) for m in (model, assistant_model)]
    if runners != ["paged", "paged"]:
        raise ValueError(f"tree=... needs paged runners for the target and the draft (tree-masked scoring), got {runners}")
    drafter = TreeDrafter(_make_runner(assistant_model, "paged", **sizes), token_tree)
    if seed is None:
        seed = int(torch.randint(0, 2**62, (1,)).item())
    params = make_sampling_tensors(input_ids.shape[0], _device_of(model), seed=seed, **opts.kernel_params())
    decoder = TreeDecoder(_make_runner(model, "paged", **sizes), drafter, params=params, max_new_tokens=opts.max_new_tokens,
                          eos_token_ids=opts.eos_token_ids, pad_token_id=opts.pad_token_id, backend=backend,
                          streamer=streamer, cuda_graphs=cuda_graphs)
    tokens = decoder.generate(input_ids.long(), attention_mask)
    return (tokens, decoder.stats.result) if return_stats else tokens
