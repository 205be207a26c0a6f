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


def test_shrinking_a_head_keeps_its_layer_and_the_kept_tokens_rows():
    """shrink_eagle3_head: fc / attention / norms unchanged, lm_head rows of the kept tokens copied
    (a token the old head lacked gets the fallback row), the MLP's strongest units kept in order."""
    import transformers as tf

    from specdec_fast.heads import Eagle3Head
    from specdec_fast.train import shrink_eagle3_head

    config = tf.LlamaConfig(hidden_size=16, intermediate_size=8, num_hidden_layers=1, num_attention_heads=2,
                            num_key_value_heads=1, vocab_size=12, draft_vocab_size=6,
                            eagle_aux_hidden_state_layer_ids=[0, 1, 2])
    torch.manual_seed(0)
    head = Eagle3Head(config)
    head.set_vocabulary([1, 3, 4, 6, 8, 10])
    mlp = head.midlayer.mlp
    with torch.no_grad():
        for p in head.parameters():
            p.normal_()
        mlp.down_proj.weight[:, [2, 5]] *= 100  # units 2 and 5 dominate
    fallback = torch.randn(12, 16)
    small = shrink_eagle3_head(head, [10, 3, 5], 2, fallback)
    assert small.draft_to_target.tolist() == [3, 5, 10] and small.config.intermediate_size == 2
    assert small.t2d.nonzero().flatten().tolist() == [3, 5, 10]
    assert torch.equal(small.lm_head.weight[0], head.lm_head.weight[1])  # token 3
    assert torch.equal(small.lm_head.weight[1], fallback[5])  # token 5: not in the old vocabulary
    assert torch.equal(small.lm_head.weight[2], head.lm_head.weight[5])  # token 10
    assert torch.equal(small.midlayer.mlp.gate_proj.weight, mlp.gate_proj.weight[[2, 5]])
    assert torch.equal(small.midlayer.mlp.down_proj.weight, mlp.down_proj.weight[:, [2, 5]])
    for name in ("fc.weight", "midlayer.self_attn.q_proj.weight", "midlayer.hidden_norm.weight", "norm.weight"):
        assert torch.equal(small.state_dict()[name], head.state_dict()[name])
    assert small.lm_head.weight.shape == (3, 16) and head.draft_vocab_size == 6  # the old head is untouched
