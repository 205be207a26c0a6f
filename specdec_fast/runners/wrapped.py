"""The transformers model inside a wrapper whose forward passes everything on (torch.compile's
OptimizedModule, PEFT's PeftModel): what the runners' checks judge (runners/hf_support.py, the
sliding-window rule) -- a wrapper's own class and forward(*args, **kwargs) say nothing of the
model's code."""
import inspect

_NAMES = ("cache", "past_key_values", "position_ids")


def forwards_everything(params) -> bool:
    """A forward(*args, **kwargs) that names none of the parameters asked about: a wrapper's."""
    return (any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
            and not any(name in params for name in _NAMES))


def unwrapped(model):
    """The transformers model inside a wrapper whose forward passes everything on: torch.compile's
    OptimizedModule (``_orig_mod``), PEFT's PeftModel (``get_base_model()``); else ``model``."""
    for _ in range(4):  # a compiled PEFT model: two layers; never a cycle
        params = forward_parameters(model)
        if params is None or not forwards_everything(params):
            return model
        inner = getattr(model, "_orig_mod", None)
        if inner is None and callable(getattr(model, "get_base_model", None)):
            inner = model.get_base_model()
        if inner is None or inner is model:
            return model
        model = inner
    return model


def forward_parameters(model):
    """The parameters of model.forward's signature, or None when it has none to read."""
    try:
        return inspect.signature(model.forward).parameters
    except (TypeError, ValueError):  # no signature to read: nothing to say
        return None
