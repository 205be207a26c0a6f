"""Training draft heads for a target from its own hidden states and outputs: eagle3.py (EAGLE-3
with the training-time test). Not imported by specdec_fast itself (it needs only torch)."""
from .eagle3 import choose_draft_vocabulary, train_eagle3

__all__ = ["choose_draft_vocabulary", "train_eagle3"]
