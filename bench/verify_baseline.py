"""The materialising verify step most libraries use (transformers' `_speculative_sampling` style),
as a baseline for bench_verify.py. Not part of the package.

Softmax of both logits into [B, K+1, V] / [B, K, V] probability tensors, the ratio test with
torch.rand coins, clamp(q - p) and renormalise at the first rejection, torch.multinomial for
the emitted token (the bonus from q when all drafts are accepted). Temperature only (no
top-k/top-p/min-p), no -1 padding: the plain-sampling path these libraries take.
"""
import torch


def chain_verify_materialising(
    target_logits: torch.Tensor,
    draft_logits: torch.Tensor,
    draft_tokens: torch.Tensor,
    temperature: float = 1.0,
    generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """target_logits [B, K+1, V], draft_logits [B, K, V], draft_tokens [B, K]
    -> tokens int32 [B, K+1] (-1 padded), num_accepted int32 [B]."""
    batch, k_plus_1, _ = target_logits.shape
    k = k_plus_1 - 1
    rows = torch.arange(batch, device=target_logits.device)
    q = torch.softmax(target_logits.float() / temperature, dim=-1)  # [B, K+1, V]
    p = torch.softmax(draft_logits.float() / temperature, dim=-1)  # [B, K, V]
    x = draft_tokens.long()
    q_x = q[:, :k].gather(-1, x[..., None])[..., 0]
    p_x = p.gather(-1, x[..., None])[..., 0]
    u = torch.rand(batch, k, device=q.device, generator=generator)
    accepted = u < (q_x / p_x).clamp(max=1.0)  # accept with probability min(1, q/p)
    n = accepted.int().cumprod(1).sum(1).long()  # drafts before the first rejection
    rejected = n < k
    residual = (q[rows, n] - p[rows, n.clamp(max=k - 1)]).clamp(min=0)
    residual = residual / residual.sum(-1, keepdim=True).clamp(min=torch.finfo(torch.float32).tiny)
    dist = torch.where(rejected[:, None], residual, q[rows, n])
    y = torch.multinomial(dist, 1, generator=generator)[:, 0]
    positions = torch.arange(k_plus_1, device=q.device)
    tokens = torch.where(positions[None, :k] < n[:, None], x, torch.full_like(x, -1))
    tokens = torch.cat([tokens, torch.full_like(tokens[:, :1], -1)], 1)
    tokens[rows, n] = y
    return tokens.int(), n.int()
