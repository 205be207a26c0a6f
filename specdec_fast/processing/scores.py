"""output_scores: transformers' ``scores`` are the processed logits of every generated step
(after every logits processor, and after the warpers when sampling: standardise_all), float32.
In a speculative iteration position j of a row is the step at gen_len + j, so the emitted
positions' rows (the accepted drafts and the bonus / correction token) are rows 0..num_accepted
of the processed logits [B, N, V].
"""
import torch


def copy_emitted_scores_(out: torch.Tensor, processed: torch.Tensor, gen_len: torch.Tensor) -> None:
    """out [B, L, V] (the scores buffer, L >= max_new_tokens + N: slack as the engine's token
    buffer has), processed [B, N, V], gen_len int64 [B]: the generated length BEFORE this
    iteration's append. Writes processed[b, j] to out[b, gen_len[b] + j] for every j (in place,
    static shapes, graph safe). Positions past the emitted ones land past the row's new length:
    the next iteration overwrites them (it starts there) and the caller keeps out[b, :final
    gen_len[b]], so num_accepted is not needed. Distinct j -> distinct slots: no write races."""
    batch, n, vocab = processed.shape
    if out.shape[0] != batch or out.shape[2] != vocab or out.shape[1] < n:
        raise ValueError(f"out must be [B={batch}, L >= {n}, V={vocab}], got {tuple(out.shape)}")
    slots = (gen_len.long()[:, None] + torch.arange(n, device=processed.device)).clamp(max=out.shape[1] - 1)
    out.scatter_(1, slots[:, :, None].expand(batch, n, vocab), processed.to(out.dtype))
