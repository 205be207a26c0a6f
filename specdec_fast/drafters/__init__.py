"""Drafters: what proposes the draft tokens of an iteration. model.py (a draft model's runner),
lookup.py (prompt lookup, no model), eagle3.py (an EAGLE-3 head reading the target's hidden
states), tree.py (a draft model expanding a token tree; token_tree.py
gives the shapes, tree_dynamic.py the per-row dynamic choice). The protocol is in model.py."""
from .eagle3 import Eagle3Drafter
from .lookup import PromptLookupDrafter
from .model import ModelDrafter
from .token_tree import TokenTree, as_token_tree
from .tree import TreeDrafter

__all__ = ["Eagle3Drafter", "ModelDrafter", "PromptLookupDrafter", "TreeDrafter", "TokenTree", "as_token_tree"]
