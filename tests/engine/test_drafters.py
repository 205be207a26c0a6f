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
    return DecodeState.create(seq, start, end, params=None, backend=None)


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


def test_model_drafter_returns_logits_only_when_a_row_samples():
    """All-greedy batches: no draft logits (the verify's p is one-hot(draft) either way:
    tests/kernels/test_verify_semantics.py::test_greedy_drafts_need_no_draft_logits); a batch
    with a sampling row: the [B, K, V] logits, in the draft runner's dtype."""
    from specdec_fast.drafters import ModelDrafter
    from specdec_fast.engine import SpeculativeDecoder
    from specdec_fast.kernels import make_sampling_tensors
    from specdec_fast.runners import PagedLlamaRunner

    from .models import left_padded_prompts, make_draft
    from .test_paged_runner import VOCAB, tiny

    target, draft = tiny("llama"), make_draft(tiny("llama"), noise=0.1)
    ids, mask = left_padded_prompts([5, 9], vocab=VOCAB, seed=3)
    for temperature, has_logits in ((0.0, False), (torch.tensor([0.0, 0.8]), True), (0.7, True)):
        decoder = SpeculativeDecoder(
            PagedLlamaRunner(target, max_new_tokens=8, num_draft_tokens=3),
            ModelDrafter(PagedLlamaRunner(draft, max_new_tokens=8, num_draft_tokens=3)), k=3,
            params=make_sampling_tensors(2, "cpu", temperature=temperature, seed=0), max_new_tokens=8)
        decoder._prefill(ids, mask)
        drafts, logits = decoder.drafter.propose(3)
        assert drafts.shape == (2, 3) and (logits is not None) == has_logits
        if has_logits:
            assert logits.shape == (2, 3, VOCAB) and logits.dtype == torch.float32
