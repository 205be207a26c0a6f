"""Which transformers causal LMs runner='hf' speculates on exactly, and how it must mask them.

The hf runner (runners/hf.py) extends a transformers Cache by every draft it scores and hides the
rejected ones as masked slots, giving every real token an explicit position_id. That is exact for
a model whose attention honours the mask and whose positions come from position_ids. A sweep of
transformers 5.24's 196 causal-LM types (tiny configs; prompt lookup and a noisy draft, batch 1
and left-padded batch 3, against model.generate) found three kinds that are not, and one that
is when masked its own way -- 15 families had decoded other tokens than model.generate, silently,
and 8 had failed with errors that named nothing:

- a recurrent state (transformers' own flag, ``_is_stateful``: RWKV, xLSTM, Zamba, Bamba, ...):
  a rejected draft stays in the state. (Layer types that keep state without the flag -- linear,
  conv, chunked attention -- are refused by runners/sliding_window.sliding_layout.)
- no KV cache in the forward (OpenAI GPT, XLNet): every call would see only its own tokens;
  or masks of its own (XLM's get_masks: OWN_MASKS), which no mask the runner passes can reach.
- no ``position_ids`` in the forward (the causal heads of BART, Pegasus, Marian, mBART,
  Blenderbot, Whisper, TrOCR, RoFormer, MPT, CPM-Ant, ProphetNet, ...): their positions follow
  the cache's length or slot index, which the masked slots shift (transformers' generate passes
  none either, so its own left-padded batches differ from decoding each row alone).
- except ALiBi built from the 2-D attention mask (Bloom, Falcon with alibi=True:
  build_alibi_tensor(attention_mask, ...) counts the mask's ones, the true positions past any
  hole): exact when the runner passes the 2-D mask (``alibi_from_mask``), which it then does.

Refused models raise UnsupportedModelError (runners/hf.py), which patch_generate hands to
transformers' generate with a warning. Left: GIT without pixel_values widens its 2-D mask by its
image tokens on decode steps, so transformers' own left-padded batch is misaligned there; ours
equals decoding each row alone (README).
"""
import inspect
import sys

from .sliding_window import family_module
from .wrapped import forward_parameters, forwards_everything, unwrapped


# Model types whose attention masks come from a padding mask of their own, not transformers'
# mask builders, so no mask the runner passes can hide a slot (XLM: get_masks asserts on it).
# Not read from the forward's cache annotation: nine families (RoBERTa, ERNIE, CamemBERT, ...)
# annotate a tuple or a list and pass a transformers Cache on (the refusal there was wrong).
OWN_MASKS = ("xlm",)


def alibi_from_mask(model) -> bool:
    """Whether the model's family code builds ALiBi from the 2-D attention mask
    (build_alibi_tensor(attention_mask, ...): Bloom, Falcon): it must get the 2-D mask."""
    module = sys.modules.get(family_module(type(unwrapped(model))) or "")
    build = getattr(module, "build_alibi_tensor", None)
    if build is None:
        return False
    try:
        first = next(iter(inspect.signature(build).parameters), None)
    except (TypeError, ValueError):
        return False
    return first == "attention_mask"


def hf_unsupported_reason(model) -> str | None:
    """Why runner='hf' cannot speculate on ``model`` exactly (module docstring), or None. A wrapper
    (torch.compile, PEFT) is judged by the model it wraps; a forward(**kwargs) that wraps nothing
    known cannot be judged: None, as before these checks."""
    model = unwrapped(model)
    name = type(model).__name__
    if getattr(model, "_is_stateful", False):
        return (f"{name} keeps a recurrent state (transformers marks it stateful): a rejected draft would stay in it, "
                "and runner='hf' can only mask rejected drafts out of a KV cache")
    params = forward_parameters(model)
    if params is None or forwards_everything(params):
        return None
    cache = params.get("cache", params.get("past_key_values"))
    if cache is None:
        return f"{name}.forward takes no KV cache, which runner='hf' extends by the drafts and masks the rejected in"
    if getattr(getattr(model, "config", None), "model_type", None) in OWN_MASKS:
        return (f"{name} builds its attention mask from a padding mask of its own (XLM's get_masks), which cannot "
                "hide the masked slots of rejected drafts")
    if "position_ids" not in params and not alibi_from_mask(model):
        return (f"{name}.forward takes no position_ids: its positions follow the cache's length, which the masked "
                "slots of rejected drafts would shift")
    return None
