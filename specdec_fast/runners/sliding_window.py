"""Whether a model's attention slides, and how: the one rule for the paged runners (which pass
each layer's window to the paged attention kernels: layer_windows), the hf runner (which builds
the window into its mask) and the cross-check tests.

transformers applies a window in three ways (5.24):
  - ``layer_types`` lists "sliding_attention" layers (Qwen2 / Qwen3 with use_sliding_window,
    Gemma 2 / 3): those layers slide by ``sliding_window``, the full_attention ones do not;
  - no ``layer_types``, and the model's code reads ``sliding_window`` (Mistral, Mixtral, Phi-3,
    Starcoder2, Qwen3-MoE, ...): every layer slides when it is set;
  - the model's code never reads it (Llama): a ``sliding_window`` in its config is inert.
A Qwen2 config of transformers 4.x with ``use_sliding_window`` False and no layer_types has none.

Before this module two rules answered differently on the third case: the paged runner's said
"no window" for any model type but mistral without layer_types, the hf runner's said "a window"
for any config with one, so a Llama checkpoint carrying a stray ``sliding_window`` had its keys
masked by the hf runner (other tokens than model.generate: tests/engine/test_sliding_window_rule.py)
while a Phi-3-style model's window would have been ignored by a paged rule had it taken the type.
"""
import functools
import importlib
import inspect
import sys


def _source_mentions_window(module_name: str) -> bool | None:
    """Whether the source of module ``module_name`` mentions sliding_window; None when it cannot
    be read (no module, no source file: a model compiled or built in memory)."""
    module = sys.modules.get(module_name)
    if module is None:
        try:
            module = importlib.import_module(module_name)
        except Exception:  # noqa: BLE001 - an unknown or broken module: no answer, not an error
            return None
    try:
        return "sliding_window" in inspect.getsource(module)
    except (OSError, TypeError):
        return None


def family_module(model_class) -> str | None:
    """The module of a model class's family code: the first class of its MRO defined in
    transformers.models (a user's subclass of MistralForCausalLM reads Mistral's code), else the
    class's own module (remote code), else None."""
    if model_class is None:
        return None
    for klass in getattr(model_class, "__mro__", ()):
        if klass.__module__.startswith("transformers.models."):
            return klass.__module__
    return model_class.__module__


@functools.lru_cache(maxsize=None)
def _code_reads_window(module_name: str | None, model_type: str | None) -> bool:
    """Whether the modeling code of a model reads config.sliding_window: its class's module when
    known (remote code included), else transformers' modeling module for model_type. True when
    neither can be read (the window is assumed, as transformers' Mistral-style models apply it)."""
    for name in (module_name, f"transformers.models.{model_type}.modeling_{model_type}" if model_type else None):
        if name is None:
            continue
        mentions = _source_mentions_window(name)
        if mentions is not None:
            return mentions
    return True


def sliding_layout(config, model_class=None):
    """(window, per_layer_type) of a config whose attention slides (module docstring), else
    (None, False): per_layer_type True when config.layer_types mixes full and sliding layers
    (a mask goes as a dict), False when every layer slides (Mistral: sliding_window set, no
    layer_types). ``model_class``: the model's class, whose code says whether a sliding_window
    without layer_types is read (default: transformers' class for config.model_type).
    UnsupportedModelError for layer types other than full / sliding attention."""
    window = getattr(config, "sliding_window", None)
    layer_types = getattr(config, "layer_types", None)
    if layer_types is not None:
        kinds = set(layer_types)
        if not kinds <= {"full_attention", "sliding_attention"}:
            from .hf import UnsupportedModelError  # hf imports this module

            raise UnsupportedModelError(f"runner='hf' takes full_attention / sliding_attention layers, got layer_types {sorted(kinds)}: "
                                        "its rejected drafts stay as masked slots, which only attention layers can skip (a "
                                        "recurrent or chunked layer would keep them)")
        if "sliding_attention" not in kinds:
            return None, False
        if isinstance(window, bool) or not isinstance(window, int) or window < 1:
            raise ValueError(f"sliding_attention layers need an int sliding_window, got {window!r}")
        return window, True
    if getattr(config, "use_sliding_window", None) is False:  # a Qwen2 config of transformers 4.x: window unused
        return None, False
    if not isinstance(window, int) or isinstance(window, bool) or window < 1:
        return None, False
    if not _code_reads_window(family_module(model_class), getattr(config, "model_type", None)):
        return None, False  # Llama: its code never reads a sliding_window its config carries
    return window, False


def windows_per_layer(config, num_layers: int, model_class=None) -> tuple:
    """Each layer's sliding window ([num_layers] ints, None for a full-attention layer) under
    sliding_layout's rule: layer_types' sliding_attention layers, or every layer (Mistral)."""
    window, per_layer_type = sliding_layout(config, model_class)
    if window is None:
        return (None,) * num_layers
    if per_layer_type:
        kinds = list(config.layer_types)
        if len(kinds) < num_layers:
            raise ValueError(f"config.layer_types lists {len(kinds)} layers, the model has {num_layers}")
        return tuple(window if kind == "sliding_attention" else None for kind in kinds[:num_layers])
    return (window,) * num_layers


class AsFullAttention:
    """A config read through, but for layer_types (all "full_attention") and sliding_window (None): the
    Llama family's config checks (paged_llama.llama_config_reason) and this module's rule for a layer
    kind they do not know, which slides no window and whose own restriction of the keys a runner applies
    itself -- Llama 4's chunked layers (its runner's chunks), DeepSeek Sparse Attention's indexed layers
    (the MLA runner's choice of keys: paged_mla.py, sparse_mla.py)."""

    def __init__(self, config):
        self._config = config
        self.layer_types = ["full_attention"] * len(config.layer_types)
        self.sliding_window = None

    def __getattr__(self, name):
        return getattr(self._config, name)
