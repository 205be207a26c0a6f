"""Runners: one model's forward + KV cache behind the small interface of runners/base.py."""
from .base import Runner
from .hf import HFRunner
from .paged import PagedRunner

__all__ = ["Runner", "HFRunner", "PagedRunner"]
