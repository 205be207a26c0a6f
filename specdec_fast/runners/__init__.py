"""Runners: one model's forward + KV cache behind the small interface of runners/base.py."""
from .base import Runner
from .hf import HFRunner
from .paged import PagedRunner
from .paged_gpt2 import PagedGPT2Runner

__all__ = ["Runner", "HFRunner", "PagedRunner", "PagedGPT2Runner"]
