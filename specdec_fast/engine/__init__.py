"""The engine: SpeculativeEngine (engine.py: runners, KV pools and CUDA graphs built once and
reused call after call; cached.py: the engines behind specdec_fast.generate), the decoding
loop (loop.py; token trees: tree_loop.py), its run-ahead polls
(run_ahead.py), CUDA graphs (graph_policy.py decides, graphs.py runs them, triton_launches.py
checks Triton's specialisation keys) and run statistics (stats.py, phase_costs.py).
docs/architecture.md §1-4."""
from .cached import cached_engines, release_engines
from .engine import SpeculativeEngine
from .loop import DecodeState, SpeculativeDecoder
from .stats import GenerationStats
from .tree_loop import TreeDecoder

__all__ = ["SpeculativeEngine", "cached_engines", "release_engines", "DecodeState", "SpeculativeDecoder", "TreeDecoder",
           "GenerationStats"]
