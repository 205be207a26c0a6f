"""Tensor parallelism over torch.distributed (docs/architecture.md §10): the group the sharded
runners talk through (group.py: its collectives, their counters, the per-call agreement) and
what happens when a rank fails (failures.py: one clear line on every rank, never a hang)."""
from .failures import TensorParallelError
from .group import TensorParallelGroup, as_tp_group

__all__ = ["TensorParallelGroup", "TensorParallelError", "as_tp_group"]
