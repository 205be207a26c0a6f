"""generate(assistant_early_exit=N): the target's own first N layers as the draft model (transformers'
EarlyExitCandidateGenerator; LayerSkip checkpoints such as facebook/layerskip-llama3.2-1B are
trained so that the final norm and the LM head read layer N's output).

transformers drafts by setting config.num_hidden_layers = N on the target for the draft's
forwards (its decoder runs ``layers[:num_hidden_layers]``, then the final norm and the LM head).
Here the draft is a model of its own that holds the target's modules, not copies: the embedding,
layers 0..N-1, the final norm, the rotary embedding and the LM head, under a config with
num_hidden_layers = N (and layer_types cut to N). So it runs through the same draft path as any
assistant_model (drafters/model.py over a paged or hf runner, with its own KV cache of N layers)
and costs no weight memory: a paged runner's fused q/k/v and gate/up are views of the same
storage for both (runners/_fused_weights.py). Exactness does not depend on the draft (Chen et
al., Theorem 1); how many drafts it gets accepted does.

One draft per (target, N), built at the first call that asks for it and kept while the target
lives (a weak key), so the engine cached for (target, draft) serves every later call.

A decoder whose layers are not a ModuleList at ``<base>.layers`` (GPT-2's ``h``, ...) is an
UnsupportedModelError, which patch_generate hands to transformers' own generate (there such a
model's forward ignores num_hidden_layers: its "early exit" drafts with every layer).
"""
import copy
import weakref

import torch

from ..runners.hf import UnsupportedModelError

_DRAFTS = weakref.WeakKeyDictionary()  # target -> {N: draft model}


def check_early_exit(model, layers) -> int:
    """assistant_early_exit as an int in [1, the target's layers); ValueError naming it otherwise."""
    total = getattr(getattr(model, "config", None), "num_hidden_layers", None)
    if isinstance(layers, bool) or not isinstance(layers, int) or layers < 1:
        raise ValueError(f"assistant_early_exit must be an int >= 1 (the layers the draft keeps), got {layers!r}")
    if total is not None and layers >= total:
        raise ValueError(f"assistant_early_exit={layers} keeps every layer of this {total}-layer model (the draft would "
                         f"be the target): use fewer than {total}")
    return layers


def _layers_of(base):
    layers = getattr(base, "layers", None)
    if not isinstance(layers, torch.nn.ModuleList):
        raise UnsupportedModelError(f"assistant_early_exit needs a decoder whose layers are a ModuleList at "
                                    f"{type(base).__name__}.layers (transformers' Llama-style models)")
    return layers


def early_exit_model(model, layers: int):
    """The draft model of assistant_early_exit=layers (module docstring): the target's modules,
    shared; the same object for every call with the same (model, layers)."""
    layers = check_early_exit(model, layers)
    per_model = _DRAFTS.setdefault(model, {})
    if layers not in per_model:
        per_model[layers] = _build(model, layers)
    return per_model[layers]


def _base_name(model) -> str | None:
    """The attribute that holds a *ForCausalLM's decoder: its base_model_prefix, else ``model`` (Llama 4's
    Llama4ForCausalLM names its prefix "language_model" and holds the decoder at .model), else None."""
    prefix = getattr(model, "base_model_prefix", None)
    for name in (prefix, "model"):
        if name and isinstance(getattr(model, name, None), torch.nn.Module):
            return name
    return None


def _build(model, layers: int):
    prefix = _base_name(model)
    base = getattr(model, prefix) if prefix else None
    if base is None:
        raise ValueError(f"assistant_early_exit needs a transformers PreTrainedModel (its base model holds the layers), "
                         f"got {type(model).__name__}")
    kept = list(_layers_of(base))[:layers]
    for field, what in (("hidden_size_per_layer_input", "per-layer inputs (one embedding of every layer's, split by the "
                                                        "layer count)"),
                        ("num_kv_shared_layers", "KV-sharing layers (its last layers read earlier ones' K/V)")):
        if getattr(model.config, field, None):  # Gemma 4's E2B / E4B: its first N layers are no model of their own
            raise UnsupportedModelError(f"assistant_early_exit on a {model.config.model_type} with {what} ({field} "
                                        f"{getattr(model.config, field)})")
    config = copy.deepcopy(model.config)
    config.num_hidden_layers = layers
    for per_layer in ("layer_types", "no_rope_layers"):  # lists of one entry a layer (no_rope_layers: Llama 4's)
        stored = getattr(config, "attribute_map", {}).get(per_layer, per_layer)  # Falcon-H1's: layers_block_type
        if isinstance(getattr(type(config), stored, None), property):  # derived from num_hidden_layers (Mamba's,
            continue  # Jamba's, Falcon-H1's config): it follows the cut; it has no setter (found by the families fuzzer)
        if isinstance(getattr(config, per_layer, None), list):
            setattr(config, per_layer, getattr(config, per_layer)[:layers])
    with torch.device("meta"):  # a skeleton: every module is replaced by the target's below
        draft = type(model)(config)
    draft_base = getattr(draft, prefix)
    for name, child in base.named_children():
        setattr(draft_base, name, torch.nn.ModuleList(kept) if name == "layers" else child)
    for name, child in model.named_children():
        if name != prefix:
            setattr(draft, name, child)
    left = [name for name, t in (*draft.named_parameters(), *draft.named_buffers()) if t.is_meta]
    if left:
        raise ValueError(f"assistant_early_exit: {type(model).__name__} holds tensors outside its decoder's children "
                         f"({', '.join(left[:3])}) that the draft cannot share")
    draft.generation_config = copy.deepcopy(model.generation_config)
    draft.generation_config.assistant_early_exit = None
    return draft.eval()
