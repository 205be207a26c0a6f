"""Training draft heads for a target from its own hidden states and outputs: eagle3.py (EAGLE-3
with the training-time test), dflash.py (DFlash block drafters: random anchors, the block mask).
Not imported by specdec_fast itself (it needs only torch)."""
from .dflash import train_dflash
from .eagle3 import choose_draft_vocabulary, shrink_eagle3_head, train_eagle3

__all__ = ["choose_draft_vocabulary", "shrink_eagle3_head", "train_dflash", "train_eagle3"]
