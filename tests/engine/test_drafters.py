"""PromptLookupDrafter on hand-made contexts (left padding, no match, context end)."""
import torch

from specdec_fast.drafters import PromptLookupDrafter
from specdec_fast.engine import DecodeState


def state_for(rows, width=12):
    """seq [B, width + 8] with rows right-aligned in the first `width` slots (left padding 0)."""
    batch = len(rows)
    seq = torch.zeros(batch, width + 8, dtype=torch.long)
    start = torch.tensor([width - len(r) for r in rows])
    for b, r in enumerate(rows):
        seq[b, width - len(r) : width] = torch.tensor(r)
    end = torch.full((batch,), width)
    return DecodeState.create(seq, start, end, params=None, prompt_ids=None, prompt_mask=None, backend=None)


def test_prompt_lookup_drafts():
    rows = [
        [3, 4, 5, 6, 7, 8, 5, 6],  # bigram (5, 6) seen before: copy 7, 8, 5, 6, then the context ends
        [9, 10, 11, 12],           # no earlier match at all
        [0],                       # a real 0 must not match the left padding zeros
        [7, 1, 2, 9, 1, 2, 8, 2],  # bigram (8, 2) unseen; unigram 2: latest earlier occurrence at index 5 -> 8, 2
    ]
    drafter = PromptLookupDrafter(max_ngram=2)
    drafter.start(state_for(rows))
    drafts, logits = drafter.propose(6)
    assert logits is None
    assert drafts.tolist() == [
        [7, 8, 5, 6, -1, -1],
        [-1] * 6,
        [-1] * 6,
        [8, 2, -1, -1, -1, -1],
    ]
