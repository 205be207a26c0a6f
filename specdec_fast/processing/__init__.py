"""transformers' logits processors, exact per speculative position, on the device
(docs/architecture.md §9). LogitsProcessing (pipeline.py) is what the engine builds once per
generate call; the pieces are importable for tests and other callers."""
from .ngram import NoRepeatNGram
from .penalties import apply_penalties_, token_counts
from .pipeline import OPTIONS, LogitsProcessing
from .prefix import Prefixes
from .scores import copy_emitted_scores_
from .sequence_bias import SequenceBias
from .user import UserProcessors
from .warpers import standardise_all

__all__ = ["LogitsProcessing", "OPTIONS", "Prefixes", "SequenceBias", "NoRepeatNGram", "UserProcessors",
           "apply_penalties_", "token_counts", "standardise_all", "copy_emitted_scores_"]
