"""specdec_fast: speculative decoding with fused verify and paged attention kernels."""
from ._version import __version__
from .cache import OutOfBlocksError, PagedKVCache
from .kernels import chain_verify, sample

__all__ = ["__version__", "chain_verify", "sample", "PagedKVCache", "OutOfBlocksError"]
