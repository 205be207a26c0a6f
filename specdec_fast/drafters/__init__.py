"""Drafters: what proposes the draft tokens of an iteration. model.py (a draft model's runner;
early_exit.py builds one from the target's own first layers),
lookup.py (prompt lookup, no model), eagle3.py / eagle3_tree.py (an EAGLE-3 head reading the
target's hidden states: chains / trees), block.py (a DFlash block drafter: K drafts from one
forward), block_selector.py (DFlash2's: the block, then its candidate selector's walk), tree.py (a draft model expanding a token tree; token_tree.py
gives the shapes, tree_dynamic.py the per-row dynamic choice). The protocol is in model.py."""
from .block import BlockDrafter
from .block_selector import SelectorBlockDrafter
from .eagle3 import Eagle3Drafter
from .eagle3_tree import Eagle3TreeDrafter
from .lookup import PromptLookupDrafter
from .model import ModelDrafter
from .token_tree import TokenTree, as_token_tree
from .tree import TreeDrafter

__all__ = ["BlockDrafter", "Eagle3Drafter", "Eagle3TreeDrafter", "ModelDrafter", "PromptLookupDrafter", "SelectorBlockDrafter", "TreeDrafter", "TokenTree", "as_token_tree"]
