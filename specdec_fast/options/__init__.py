"""generate()'s options as transformers defines them: rules.py (which options are handled,
accepted or unsupported, by one rule derived from transformers' GenerationConfig), resolve.py
(model.generation_config < generation_config < keywords -> Options), max_length.py (how many
new tokens, as transformers decides)."""
from .resolve import ENGINE_IMPLEMENTS, Options, merge_options, resolve_options

__all__ = ["ENGINE_IMPLEMENTS", "Options", "merge_options", "resolve_options"]
