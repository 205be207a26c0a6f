"""The engine's draft head (generate(draft_head=...), generate(use_mtp=True)): loading it for a target
and building the runner it drafts on (EAGLE-3: PagedEagle3Runner; a target's MTP layer:
PagedMtpRunner, PagedMlaMtpRunner for DeepSeek-V3's; DFlash / DFlash2: their block runners; Gemma 4's assistant:
PagedGemma4AssistantRunner, over the target runner's own caches), with the
target runner set to capture the hidden states the head reads (runners/hidden_capture.py). Under
tensor parallelism the head runs whole on every rank (engine/tensor_parallel.py), but a target's MTP
layer, whose slices each rank reads by the target's plan (TPPagedMtpRunner, TPPagedMlaMtpRunner)."""
from pathlib import Path

import torch

from ..heads import load_draft_head
from ..runners.paged_dflash import PagedDFlashRunner
from ..runners.paged_dflash2 import PagedDFlash2Runner
from ..runners.paged_eagle3 import PagedEagle3Runner
from ..runners.paged_gemma4_assistant import PagedGemma4AssistantRunner
from ..runners.paged_llama_tp import TensorParallelRunner
from ..runners.paged_mtp import mtp_runner, tp_mtp_runner
from .inputs import vocab_size
from .tensor_parallel import whole_vocab_weight


def head_source(path) -> str:
    """A head directory's identity (its resolved path)."""
    return str(Path(path).resolve())


def load_head(draft_head, target, device):
    """The head (a directory: loaded on ``device`` in the target's dtype; a head object: as it
    is, on ``device``), checked against the target's vocabulary."""
    if isinstance(draft_head, torch.nn.Module):
        head = load_draft_head(draft_head)
        first = next(head.parameters(), None)  # None: an MTP layer's slices, read per rank (heads/mtp.py)
        if first is not None and first.device != device:
            raise ValueError(f"draft_head is on {first.device} but model is on {device}")
    else:
        head = load_draft_head(draft_head, device=device, dtype=next(target.parameters()).dtype)
    vocab = vocab_size(target)
    if head.vocab_size != vocab:
        raise ValueError(f"vocab mismatch: the draft head is for a vocabulary of {head.vocab_size} tokens, the "
                         f"target has {vocab}")
    return head


def head_runner(head, target, target_runner, *, tree, max_draft_tokens: int, block_size: int, backend):
    """The head's paged runner; ``target_runner`` (paged, single-process or tensor-parallel) is set
    to capture the hidden states the head reads, checked against the head's width."""
    if not hasattr(target_runner, "capture_hidden_states"):
        raise ValueError(f"draft_head needs a paged target runner (it reads the target's hidden states), got "
                         f"{type(target_runner).__name__}")
    layers = len(target_runner.layers)
    target_runner.capture_hidden_states(head.hidden_indices(layers))
    if target_runner.hidden_capture.width != head.feature_width:
        raise ValueError(f"the draft head reads {head.feature_width} features; the target's "
                         f"{len(head.hidden_indices(layers))} hidden states are "
                         f"{target_runner.hidden_capture.width} wide (a head for another target?)")
    if head.kind == "dflash":
        if tree is not None:
            raise ValueError("tree=... with a DFlash drafter: its block drafts a chain (trees: EAGLE-3 heads or a "
                             "draft model)")
        if not 0 <= head.mask_token_id < vocab_size(target):
            raise ValueError(f"the DFlash mask_token_id {head.mask_token_id} is outside the target's vocabulary")
        runner = PagedDFlash2Runner if getattr(head, "variant", "dflash") == "dflash2" else PagedDFlashRunner
        return runner(head, whole_vocab_weight(target, "embed"), whole_vocab_weight(target, "lm_head"),
                      num_draft_tokens=min(max_draft_tokens, head.block_size - 1), block_size=block_size,
                      backend=backend)
    if head.kind == "gemma4_assistant":  # Gemma 4's assistant: over the target runner's own caches
        if tree is not None:
            raise ValueError("tree=... with a Gemma 4 assistant: it drafts chains (trees: EAGLE-3 heads or a draft model)")
        if isinstance(target_runner, TensorParallelRunner):
            raise ValueError("a Gemma 4 assistant under tensor parallelism is not supported yet (its queries would "
                             "read each rank's heads of the target's K/V)")
        return PagedGemma4AssistantRunner(head, target_runner, backend=backend)
    if head.kind == "mtp":  # the target's own layer: its embedding and LM head
        if isinstance(target_runner, TensorParallelRunner):  # each rank reads its slices of the layer
            return tp_mtp_runner(head, target_runner, num_draft_tokens=max_draft_tokens, block_size=block_size,
                                 backend=backend)
        if head.sharded:
            raise ValueError("this MTP head is read in slices by tensor-parallel ranks; the target runs in one process")
        return mtp_runner(head, whole_vocab_weight(target, "embed"), whole_vocab_weight(target, "lm_head"),
                          num_draft_tokens=max_draft_tokens, block_size=block_size, backend=backend)
    embed = head.embed_tokens.weight if head.embed_tokens is not None else whole_vocab_weight(target, "embed")
    return PagedEagle3Runner(head, embed, num_draft_tokens=max_draft_tokens, block_size=block_size, backend=backend)
