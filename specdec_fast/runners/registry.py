"""The paged runner of each model family, in one table (model_type -> runner class).

Adding a family = one file (a PagedRunnerBase subclass with ``_bind``, ``_decode`` and an
``unsupported_reason`` static method) + one row per model_type here. Nothing below this module
imports it: paged_base.py knows no family, and the api, the tree decoder and the tests ask here.
"""
from .hf import HFRunner
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


RUNNERS = ("paged", "hf")


def choose_runner(model, runner, max_tokens_per_row: int | None, backend=None) -> str:
    """"paged" or "hf" for ``model``: runner=None picks "paged" when the model supports it
    (Llama/Mistral/Qwen2/Qwen3 with no sliding window reached within max_tokens_per_row and
    static RoPE, or GPT-2 with max_tokens_per_row <= n_positions; a head_dim the kernel
    ``backend`` takes), else "hf"; runner="paged" on an unsupported model raises."""
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


def make_runner(model, name: str, *, backend=None, **sizes):
    """The runner ``name`` ("paged": the family's paged runner, sizes: PagedRunnerBase's; "hf":
    HFRunner) for ``model``."""
    if name == "paged":
        return paged_runner_class(model)(model, backend=backend, **sizes)
    return HFRunner(model)
