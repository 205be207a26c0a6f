"""Runners: one model's forward + KV cache behind the small interface of runners/base.py.
The paged runner of a model's family: registry.py (one table from model_type to class)."""
from .base import Runner
from .hf import HFRunner
from .paged_gpt2 import PagedGPT2Runner
from .paged_llama import PagedLlamaRunner
from .registry import PAGED_RUNNERS, paged_runner, paged_runner_from_pretrained

__all__ = ["Runner", "HFRunner", "PagedLlamaRunner", "PagedGPT2Runner", "PAGED_RUNNERS", "paged_runner",
           "paged_runner_from_pretrained"]
