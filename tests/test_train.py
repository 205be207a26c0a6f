"""specdec_fast.train: the masks and batches the head trainers build (EAGLE-3's training-time test,
DFlash's anchored blocks) are what decoding sees; the draft vocabulary is the most frequent tokens."""
import torch

from specdec_fast.train import choose_draft_vocabulary
from specdec_fast.train.dflash import block_batch
from specdec_fast.train.eagle3 import ttt_attention_mask


def test_ttt_mask_sees_the_context_causally_and_its_own_drafts_diagonally():
    mask = ttt_attention_mask(3, 2, "cpu").int()
    causal = [[1, 0, 0], [1, 1, 0], [1, 1, 1]]
    diagonal = [[1, 0, 0], [0, 1, 0], [0, 0, 1]]
    assert mask.tolist() == [c + d + d for c, d in zip(causal, diagonal)]  # step 2: context, step-1 and step-2 drafts


def test_dflash_blocks_open_at_their_anchor_and_see_the_context_before_it():
    class Head:
        block_size, mask_token_id = 3, 99

    ids = torch.arange(10, 20)[None]  # tokens 10..19 at positions 0..9
    tokens, positions, labels, visible = block_batch(Head, ids, torch.tensor([[2, 6]]))
    assert tokens.tolist() == [[12, 99, 99, 16, 99, 99]]
    assert positions.tolist() == [[2, 3, 4, 6, 7, 8]]
    assert labels.tolist() == [[-1, 2, 3, -1, 6, 7]]  # the target's distribution at a + i - 1: the token at a + i
    assert visible[0, :3].sum(-1).tolist() == [2, 2, 2] and visible[0, 3:].sum(-1).tolist() == [6, 6, 6]


def test_draft_vocabulary_is_the_most_frequent_tokens_sorted():
    text = torch.tensor([[5, 5, 5, 1, 1, 7, 2, 2, 2, 2]])
    assert choose_draft_vocabulary(text, 3, 10).tolist() == [1, 2, 5]
