"""specdec_fast: speculative decoding with fused verify and paged attention kernels."""
from ._version import __version__
from .api import generate
from .distributed import TensorParallelError, TensorParallelGroup
from .drafters import ModelDrafter, PromptLookupDrafter
from .engine import GenerationStats, SpeculativeDecoder, SpeculativeEngine, release_engines
from .kernels import chain_verify, sample
from .pair import demo_pair
from .patch import patch_generate
from .runners import (HFRunner, PagedGPT2Runner, PagedLlamaRunner, ShardedCausalLM, TPPagedLlamaRunner, paged_runner,
                      paged_runner_from_pretrained)
from .runners.paged_cache import OutOfBlocksError, PagedKVCache

__all__ = [
    "__version__", "generate", "patch_generate", "SpeculativeEngine", "release_engines", "SpeculativeDecoder", "HFRunner", "PagedLlamaRunner", "PagedGPT2Runner",
    "paged_runner", "paged_runner_from_pretrained",
    "ModelDrafter", "PromptLookupDrafter", "GenerationStats",
    "chain_verify", "sample", "demo_pair", "PagedKVCache", "OutOfBlocksError",
    "ShardedCausalLM", "TPPagedLlamaRunner", "TensorParallelGroup", "TensorParallelError",
]
