"""output_scores: the processed rows of the emitted positions land at gen_len + j."""
import torch

from specdec_fast.processing import copy_emitted_scores_


def test_emitted_rows_accumulate_like_transformers_scores():
    batch, n, vocab, max_new = 2, 3, 7, 6
    out = torch.zeros(batch, max_new + n, vocab)
    gen_len = torch.zeros(batch, dtype=torch.long)
    steps = [[] for _ in range(batch)]
    gen = torch.Generator().manual_seed(0)
    for accepted in ([2, 0], [0, 1], [1, 2]):  # per row: drafts accepted this iteration
        processed = torch.randn(batch, n, vocab, generator=gen)
        copy_emitted_scores_(out, processed, gen_len)
        for b, j in enumerate(accepted):
            steps[b] += [processed[b, i] for i in range(j + 1)]
        gen_len += torch.tensor(accepted) + 1
    for b in range(batch):
        assert torch.equal(out[b, : int(gen_len[b])], torch.stack(steps[b]))
