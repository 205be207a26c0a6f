"""Gemma4AssistantHead: Gemma 4's published drafter (Gemma4AssistantForCausalLM, google/gemma-4-*-assistant) as a
draft head; what generate(assistant_model=<a Gemma 4 assistant>) drafts with on a Gemma 4 target.

The assistant has no KV cache of its own: every layer of its text decoder reuses K/V (num_kv_shared_layers =
num_hidden_layers), those of the TARGET's last layer of each type that writes K/V (transformers' "store" layers,
returned as shared_kv_states). transformers' Gemma4AssistantCandidateGenerator drafts, after each verify:
    h  = the target's final-norm hidden state at the last accepted token (hidden_states[-1]), x = the token after it
    repeat K times, at ONE position p (the token x's, len(input_ids) - 1) and over the same target K/V:
        e = pre_projection(cat(target_embed(x), h))                  [H_a] (target_embed: scaled by sqrt(H))
        o = the assistant's decoder over e (each layer's queries at p attend over the target's K/V of its type,
            every key: a bidirectional mask, the last sliding_window keys on the sliding layers), then its norm
        logits = lm_head(o) (or the ordered embedding's: top centroids' tokens only, use_ordered_embeddings)
        x = the drafted token, h = post_projection(o)                [H_t]
It reads the K/V of positions 0 .. len(input_ids) - 1, the last of which is the target's entry of a draft it
rejected there (or none, where every draft was accepted); here the head reads the target's committed K/V, 0 .. p - 1
(runners/paged_gemma4_assistant.py): its reference in the tests is transformers' module fed those, and speculative
decoding is exact for any draft law. The weights are the module's own (shared, not copied); this object is what the
engine reads of a head: kind, config, vocabulary, the target features it reads, the module.
"""
from torch import nn

ASSISTANT_CLASSES = ("Gemma4AssistantForCausalLM",)


def is_gemma4_assistant(module) -> bool:
    """Whether ``module`` is transformers' Gemma 4 assistant (by class name: transformers may predate it)."""
    return type(module).__name__ in ASSISTANT_CLASSES


class Gemma4AssistantHead(nn.Module):
    """A Gemma 4 assistant as a draft head (module docstring). ``assistant``: transformers'
    Gemma4AssistantForCausalLM; its weights are this head's (shared)."""

    kind = "gemma4_assistant"
    sharded = False

    def __init__(self, assistant):
        super().__init__()
        if not is_gemma4_assistant(assistant):
            raise ValueError(f"a Gemma4AssistantHead takes transformers' Gemma4AssistantForCausalLM, got "
                             f"{type(assistant).__name__}")
        text = assistant.config.get_text_config()
        if text.num_kv_shared_layers != text.num_hidden_layers:
            raise ValueError("a Gemma 4 assistant whose layers do not all read the target's K/V is not one this "
                             f"package runs (num_kv_shared_layers {text.num_kv_shared_layers} of {text.num_hidden_layers})")
        self.assistant = assistant
        self.config = text
        self.vocab_size = self.draft_vocab_size = int(text.vocab_size)
        self.backbone_hidden_size = int(assistant.config.backbone_hidden_size)
        # K where the call gives none: the assistant's generation_config.num_assistant_tokens, as transformers'
        # candidate generator reads it (None: the engine's default)
        k = getattr(getattr(assistant, "generation_config", None), "num_assistant_tokens", None)
        self.default_k = k if isinstance(k, int) and not isinstance(k, bool) and k > 0 else None

    @property
    def feature_width(self) -> int:
        """Columns of the target features an entry reads: the target's final-norm hidden state [H_t]."""
        return self.backbone_hidden_size

    def hidden_indices(self, target_layers: int | None = None) -> tuple:
        """The target hidden states the head reads: the final norm's (output_hidden_states[L])."""
        if target_layers is None:
            raise ValueError("a Gemma 4 assistant reads the target's final-norm states: give the target's layer count")
        return (target_layers,)
