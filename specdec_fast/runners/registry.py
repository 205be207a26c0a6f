"""The paged runner of each model family, in one table (model_type -> runner class).

Adding a family = one file (a PagedRunnerBase subclass with ``_bind``, ``_decode`` and an
``unsupported_reason`` static method) + one row per model_type here. Nothing below this module
imports it: paged_base.py knows no family, and the api, the tree decoder and the tests ask here.
"""
from .paged_base import PagedRunnerBase
from .paged_gpt2 import PagedGPT2Runner
from .paged_llama import PagedLlamaRunner

PAGED_RUNNERS: dict[str, type[PagedRunnerBase]] = {
    "llama": PagedLlamaRunner,
    "mistral": PagedLlamaRunner,
    "qwen2": PagedLlamaRunner,
    "qwen3": PagedLlamaRunner,
    "gpt2": PagedGPT2Runner,
}


def _model_type(model) -> str | None:
    return getattr(getattr(model, "config", None), "model_type", None)


def paged_runner_class(model) -> type[PagedRunnerBase] | None:
    """The paged runner class of ``model``'s family (by config.model_type), or None."""
    return PAGED_RUNNERS.get(_model_type(model))


def paged_unsupported_reason(model, max_tokens_per_row: int | None = None, backend=None) -> str | None:
    """Why no paged runner can run ``model`` with rows of up to max_tokens_per_row tokens (None:
    unknown) and kernel ``backend``, or None when paged_runner_class(model) can."""
    cls = paged_runner_class(model)
    if cls is None:
        return f"model_type {_model_type(model)!r} is not one of {tuple(PAGED_RUNNERS)}"
    return cls.unsupported_reason(model, max_tokens_per_row, backend)


def paged_runner(model, **kwargs) -> PagedRunnerBase:
    """The paged runner of ``model``'s family (kwargs: PagedRunnerBase's); ValueError naming why
    when no paged runner can run it."""
    reason = paged_unsupported_reason(model, backend=kwargs.get("backend"))
    if reason is not None:
        raise ValueError(f"no paged runner can run this model: {reason}; use runner='hf'")
    return paged_runner_class(model)(model, **kwargs)


def paged_runner_from_pretrained(path, **kwargs) -> PagedRunnerBase:
    """A paged runner for the checkpoint directory ``path`` (config.json + safetensors), of the
    checkpoint's family; kwargs: PagedRunnerBase.from_pretrained's."""
    from transformers import AutoConfig

    model_type = AutoConfig.from_pretrained(path).model_type
    cls = PAGED_RUNNERS.get(model_type)
    if cls is None:
        raise ValueError(f"no paged runner for {path}: model_type {model_type!r} is not one of {tuple(PAGED_RUNNERS)}")
    return cls.from_pretrained(path, **kwargs)
