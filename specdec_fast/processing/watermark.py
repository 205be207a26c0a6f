"""generate(watermarking_config=WatermarkingConfig(...)): Kirchenbauer et al.'s green-list
watermark, transformers' WatermarkLogitsProcessor, at every speculative position.

Where: last, as in transformers' _get_logits_processor ("watermarking should be after all logits
processing is finished", transformers #34630): after every processor and, when sampling, after
every warper. So a sampled call runs all its warpers in the stage (warpers.stage_warpers_on) and
the kernels sample the watermarked logits at temperature 1 with no truncation.

How: transformers' own processor, built as generate() builds it
(``config.construct_processor(vocab_size, device)``), called per row and position with the exact
input_ids transformers would pass there (user.py's loop). The processor is a function of those
input_ids: it re-seeds its generator from the last ``context_width`` tokens ("lefthash") or from
the candidate token as well ("selfhash") at every call, so calls for drafts that are later
rejected change nothing. Eager by nature (a host read of the last token per row and position,
then a randperm of the vocabulary on a generator seeded from it): not graph safe.

vocab_size: transformers passes ``model.config.get_text_config().vocab_size``; the stage passes
the width V of the logits it processes, which is the same number for the models here (the
lm_head has config.vocab_size rows).

Not taken: SynthID (SynthIDTextWatermarkingConfig). Its processor keeps state from call to call
(the last n-gram, the history of contexts seen, a call count) which per-position calls, drafts
that are later rejected included, would corrupt; options/rules.py refuses it before the call
(under patch_generate the call goes to transformers' generate).
"""
from functools import lru_cache

import torch

from .user import UserProcessors

GRAPH_NOTE = ("watermarking_config runs transformers' WatermarkLogitsProcessor on the host per row and position "
              "(exact input_ids), which a CUDA graph cannot replay")


def watermarking_config(value):
    """The option's value as a validated transformers WatermarkingConfig: one, or its dict (as
    GenerationConfig converts it), on every transformers (generate's keyword takes the dict from
    5.16; before, GenerationConfig.update kept the dict and its validate() raised AttributeError).
    ValueError for anything else, SynthID's config included."""
    from transformers.generation import WatermarkingConfig

    if isinstance(value, dict):
        value = WatermarkingConfig.from_dict(value)
    if not isinstance(value, WatermarkingConfig):
        raise ValueError(f"watermarking_config must be a transformers WatermarkingConfig or its dict "
                         f"(Kirchenbauer et al.'s green list), got {type(value).__name__}")
    value.validate()
    return value


@lru_cache(maxsize=8)
def _processor(fields: tuple, vocab_size: int, device: str):
    """transformers' processor for a config's fields, shared by every stage that asks for the same
    one: building it draws a permutation of 1,000,003 ids (18-25 ms on this project's 2-core CPU
    machine, the first in a process 0.9 s), and every call builds a stage for the target and one
    for the draft. Sharing is safe:
    the processor re-seeds its generator at every use and holds nothing else that changes."""
    from transformers.generation import WatermarkingConfig

    return WatermarkingConfig(**dict(fields)).construct_processor(vocab_size, torch.device(device))


def watermark_stage(value, vocab_size: int, device) -> UserProcessors:
    """The eager stage that watermarks logits [B, N, V] in place (module docstring)."""
    fields = tuple(sorted(watermarking_config(value).to_dict().items()))
    stage = UserProcessors([_processor(fields, int(vocab_size), str(torch.device(device)))])
    stage.graph_note = GRAPH_NOTE
    return stage
