"""Draft heads that read the target's hidden states: eagle3.py (EAGLE-3: one layer over
(embedding ; projected hidden states), a reduced draft vocabulary), dflash.py (DFlash: a block of
drafts from one non-causal forward over the projected hidden states), dflash2.py (DFlash2: DFlash
with an in-block convolution and a candidate selector), layout.py (their published
checkpoint layouts: load_draft_head / save_draft_head), mtp.py (a target's own multi-token-prediction
layer: generate(use_mtp=True)), gemma4_assistant.py (Gemma 4's published assistant, which drafts over the
target's K/V: generate(assistant_model=<it>)). The runners that decode them are under
runners/, the drafters under drafters/."""
from .dflash import DFlashHead
from .dflash2 import DFlash2Head
from .eagle3 import Eagle3Head
from .gemma4_assistant import Gemma4AssistantHead
from .mtp import MtpHead
from .layout import is_draft_head, load_draft_head, save_draft_head

__all__ = ["DFlash2Head", "DFlashHead", "Eagle3Head", "Gemma4AssistantHead", "MtpHead", "is_draft_head", "load_draft_head",
           "save_draft_head"]
