"""The engine: the decoding loop (loop.py; token trees: tree_loop.py), its run-ahead polls
(run_ahead.py), CUDA graphs (graph_policy.py decides, graphs.py runs them, triton_launches.py
checks Triton's specialisation keys) and run statistics (stats.py, phase_costs.py).
docs/architecture.md §1-4."""
from .loop import DecodeState, SpeculativeDecoder
from .stats import GenerationStats
from .tree_loop import TreeDecoder

__all__ = ["DecodeState", "SpeculativeDecoder", "TreeDecoder", "GenerationStats"]
