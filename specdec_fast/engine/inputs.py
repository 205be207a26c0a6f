"""Checks of a generate() request before anything runs: input_ids / attention_mask, the
target / draft pair, the model's position limit. One clear ValueError per bad input."""
import weakref

import torch

from ..heads.gemma4_assistant import ASSISTANT_CLASSES, is_gemma4_assistant


def device_of(model) -> torch.device:
    return next(model.parameters()).device


def vocab_size(model) -> int:
    """Rows of the output embedding (what the logits hold), else config.vocab_size."""
    head = model.get_output_embeddings()
    return int(head.weight.shape[0]) if head is not None else int(model.config.vocab_size)


def max_positions(model) -> int | None:
    """The model's position limit (max_position_embeddings / n_positions), or None."""
    config = model.config
    for name in ("max_position_embeddings", "n_positions"):
        value = getattr(config, name, None)
        if isinstance(value, int):
            return value
    return None


def paged_positions(model) -> int | None:
    """The most positions a row may take on the model's paged runner: its position limit, or fewer
    where its RoPE changes frequencies past a length (longrope, dynamic:
    runners/_rotary.static_rope_limit; the hf runner serves longer rows). None: no limit."""
    from ..runners._rotary import static_rope_limit

    rotary = getattr(getattr(model, "model", None), "rotary_emb", None)
    rope_limit = static_rope_limit(model.config, getattr(rotary, "rope_type", None)) if rotary is not None else None
    limits = [limit for limit in (max_positions(model), rope_limit) if limit is not None]
    return min(limits) if limits else None


class UnsupportedInputError(ValueError):
    """Inputs transformers' generate takes (with a warning) and specdec_fast does not: a right-padded
    attention_mask. A bound patch_generate hands such a call to transformers' generate, as it does an
    unsupported option."""


def infer_attention_mask(input_ids: torch.Tensor, pad_token_id, eos_token_ids) -> torch.Tensor:
    """generate() without an attention_mask, as transformers infers it
    (_prepare_attention_mask_for_generation): input_ids != pad_token_id where the pad token occurs in
    input_ids and is not an EOS id, else all ones. pad_token_id: transformers' (the given one, else
    the first EOS id, else None: all ones). -> int64 [B, P]."""
    ones = torch.ones_like(input_ids, dtype=torch.long)
    if pad_token_id is None or pad_token_id in (eos_token_ids or ()):
        return ones
    padded = input_ids == pad_token_id
    if not bool(padded.any()):
        return ones
    if input_ids.shape[1] > 1 and bool((padded[:, 1:] & ~padded[:, :-1]).any()):
        raise UnsupportedInputError(f"no attention_mask, and input_ids hold pad_token_id={pad_token_id} after a real "
                                    "token: transformers would mask it there too (a hole in the prompt); pass the "
                                    "tokenizer's attention_mask")
    return (~padded).long()


def check_inputs(input_ids, attention_mask) -> torch.Tensor:
    """input_ids [B, P] int, attention_mask [B, P] of 0/1 with left padding (or None: all 1)
    -> the mask as int64 (reads the mask's values: before the loop)."""
    if not isinstance(input_ids, torch.Tensor):
        raise ValueError(f"input_ids must be an int tensor [batch, prompt_len], got {type(input_ids).__name__}")
    if input_ids.dim() != 2 or input_ids.dtype not in (torch.int32, torch.int64):
        raise ValueError("input_ids must be an int tensor [batch, prompt_len] (torch.long or torch.int32), got "
                         f"{str(input_ids.dtype).removeprefix('torch.')} of shape {tuple(input_ids.shape)}")
    if input_ids.shape[1] == 0 or input_ids.shape[0] == 0:
        raise ValueError(f"input_ids must hold at least one token per row, got shape {tuple(input_ids.shape)}")
    if attention_mask is None:
        return torch.ones_like(input_ids, dtype=torch.long)
    if not isinstance(attention_mask, torch.Tensor):
        raise ValueError(f"attention_mask must be a tensor [batch, prompt_len] of 0 and 1 (or None), got {type(attention_mask).__name__}")
    if tuple(attention_mask.shape) != tuple(input_ids.shape):
        raise ValueError(f"attention_mask shape {tuple(attention_mask.shape)} differs from input_ids {tuple(input_ids.shape)}")
    mask = attention_mask.long()
    if bool(((mask != 0) & (mask != 1)).any()):
        raise ValueError("attention_mask must hold only 0 and 1")
    if mask.shape[1] > 1 and bool(((mask[:, 1:] == 0) & (mask[:, :-1] == 1)).any()):
        raise UnsupportedInputError("attention_mask is right-padded (a 0 after a 1): decoder-only generation needs left "
                                    "padding (tokenizer.padding_side = 'left')")
    if bool((mask.sum(1) == 0).any()):
        raise ValueError("attention_mask has a row with no real token")
    return mask


def _config_vocab(model) -> int | None:
    """The vocab_size of a model's config, or of its text config (a multimodal model's, Gemma 3 4B-27B's, whose
    own config has none: transformers' get_text_config), or None."""
    config = model.config
    text = config.get_text_config() if callable(getattr(config, "get_text_config", None)) else config
    return getattr(text, "vocab_size", None)


# Assistants that are no models of their own: transformers drafts with them from the target's KV states and last
# hidden state (its Gemma4AssistantCandidateGenerator). Gemma 4's drafts here as a head (heads/gemma4_assistant.py:
# generate(assistant_model=...) passes it as one); the unified model's is not run
TARGET_STATE_ASSISTANTS = ASSISTANT_CLASSES + ("Gemma4UnifiedAssistantForCausalLM",)


def check_pair(model, assistant_model, tokenizer=None, assistant_tokenizer=None) -> bool:
    """One device for the target and the draft, and one shared vocabulary (-> False) or, with both
    tokenizers given, a draft of another vocabulary (-> True: it drafts through its own tokenizer,
    drafters/cross_tokenizer.py). Vocabularies differ when the models' sizes or the tokenizers' do.
    A Gemma 4 assistant (TARGET_STATE_ASSISTANTS) as a draft model: runners/hf.py's UnsupportedModelError, naming it."""
    name = type(assistant_model).__name__
    if name in TARGET_STATE_ASSISTANTS:
        from ..runners.hf import UnsupportedModelError

        how = ("an engine takes it as draft_head= (generate(assistant_model=...) passes it so)"
               if is_gemma4_assistant(assistant_model) else "this package does not run it (transformers' generate does)")
        raise UnsupportedModelError(f"assistant_model is a Gemma 4 assistant ({name}): it drafts from the target's own "
                                    f"KV states and last hidden state, not as a model of its own; {how}")
    target_vocab, draft_vocab = vocab_size(model), vocab_size(assistant_model)
    cfg_t, cfg_d = _config_vocab(model), _config_vocab(assistant_model)
    both = tokenizer is not None and assistant_tokenizer is not None
    if both:  # (one alone is only read for stop_strings)
        check_tokenizer("tokenizer", tokenizer)
        check_tokenizer("assistant_tokenizer", assistant_tokenizer)
    cross = both and tokenizer_key(tokenizer)[0] != tokenizer_key(assistant_tokenizer)[0]
    if not cross and (target_vocab != draft_vocab or cfg_t != cfg_d):
        if not both:
            raise ValueError(
                f"vocab mismatch: the target has vocab_size {cfg_t} ({target_vocab} output rows), the draft (assistant_model) "
                f"has {cfg_d} ({draft_vocab}); speculative decoding needs one shared vocabulary, or pass both tokenizer= "
                "(the target's) and assistant_tokenizer= (the draft's) to draft across tokenizers"
            )
        cross = True  # one tokenizer, models of other sizes (padded embeddings): through the text, exact
    if cross:  # each tokenizer's ids must be rows of its model's logits (the drafts are the target's ids)
        for name, tok, owner, rows, cfg in (("tokenizer", tokenizer, "the target (model)", target_vocab, cfg_t),
                                            ("assistant_tokenizer", assistant_tokenizer, "the draft (assistant_model)",
                                             draft_vocab, cfg_d)):
            ids = _tokenizer_info(tok)[2]
            if ids > rows:
                raise ValueError(f"{name} has token ids up to {ids - 1} but {owner} has {rows} output rows (vocab_size "
                                 f"{cfg}): tokenizer= is the target's tokenizer and assistant_tokenizer= the draft's "
                                 "(swapped?)")
    if device_of(model) != device_of(assistant_model):
        raise ValueError(f"model is on {device_of(model)} but assistant_model is on {device_of(assistant_model)}; "
                         "put both on one device")
    return cross


def check_tokenizer(name: str, tokenizer) -> None:
    """A transformers tokenizer (what AutoTokenizer.from_pretrained returns): the vocabulary, the
    special ids and encoding the cross-tokenizer drafter reads (drafters/token_bytes.py)."""
    missing = [a for a in ("get_vocab", "all_special_ids", "convert_tokens_to_string", "__call__", "__len__")
               if not hasattr(tokenizer, a)]
    if missing:
        raise ValueError(f"{name} must be a transformers tokenizer (AutoTokenizer.from_pretrained(...)), got "
                         f"{type(tokenizer).__module__}.{type(tokenizer).__qualname__} (no {', '.join(missing)})")


_TOKENIZER_KEYS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def tokenizer_key(tokenizer) -> tuple:
    """(vocabulary, whole tokenizer) hashes of ``tokenizer``, once per tokenizer object (get_vocab of
    a 128k vocabulary costs tens of ms): equal vocabularies mean equal token ids; the second part
    (its tokenizer.json: pre-tokenizer, normaliser, decoder too) keys a cross-tokenizer engine."""
    return _tokenizer_info(tokenizer)[:2]


def _tokenizer_info(tokenizer) -> tuple:
    """tokenizer_key's two hashes and the tokenizer's id count (its largest id + 1), cached per object."""
    try:
        info = _TOKENIZER_KEYS.get(tokenizer)
    except TypeError:  # not weakly referenceable: computed each call
        info = None
    if info is None:
        vocab = tokenizer.get_vocab()
        backend = getattr(tokenizer, "backend_tokenizer", None)
        info = (hash(frozenset(vocab.items())),
                hash(backend.to_str()) if backend is not None else (type(tokenizer).__name__, id(tokenizer)),
                max(vocab.values(), default=-1) + 1)
        try:
            _TOKENIZER_KEYS[tokenizer] = info
        except TypeError:
            pass
    return info


def check_in_vocabulary(input_ids: torch.Tensor, vocab_size: int) -> None:
    """Every id of ``input_ids`` (left padding included: the model embeds it too) in [0, vocab_size),
    else ValueError naming input_ids, the offending id and the vocabulary size (instead of an
    IndexError, or a device-side assert on CUDA, from inside torch's embedding). One host read
    (min and max together), before the loop."""
    low, high = torch.stack(torch.aminmax(input_ids)).tolist()
    bad = low if low < 0 else high if high >= vocab_size else None
    if bad is not None:
        raise ValueError(f"input_ids holds token id {bad}, outside the target's vocabulary of size {vocab_size} "
                         f"(ids must be in [0, {vocab_size}))")
