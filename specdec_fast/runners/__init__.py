"""Runners: one model's forward + KV cache behind the small interface of runners/base.py.
The paged runner of a model's family: registry.py (one table from model_type to class)."""
from .base import Runner
from .hf import HFRunner
from .paged_gpt2 import PagedGPT2Runner
from .paged_llama import PagedLlamaRunner
from .paged_llama_tp import TPPagedLlamaRunner
from .registry import PAGED_RUNNERS, TP_RUNNERS, paged_runner, paged_runner_from_pretrained, shard_model
from .sharded_model import ShardedCausalLM

__all__ = ["Runner", "HFRunner", "PagedLlamaRunner", "PagedGPT2Runner", "PAGED_RUNNERS", "paged_runner",
           "paged_runner_from_pretrained", "TPPagedLlamaRunner", "ShardedCausalLM", "TP_RUNNERS", "shard_model"]
