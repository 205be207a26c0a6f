"""What a user would write instead of our verify / sample kernels, for bench_verify.py's GPU
table. Not part of the package.

plain PyTorch (the anchor of bench/results/h100_3dca4fa/torch_sampling_anchor.json): transformers-style
logits warpers (temperature; top-k by torch.topk; top-p by sort + softmax + cumsum; min-p
against the max probability), softmax, the ratio test with torch.rand coins, the residual
max(q - p, 0) at the first rejection, and the token by an exponential race
(argmax dist / Exp(1), the Gumbel-max trick in multiplicative form). No host sync, so it
replays in a CUDA graph. Tokens are distributed like ours but not the same draws.

FlashInfer (when `import flashinfer` works): its sampling from logits / probabilities for the
draft sampler, and for verify softmax (+ its top-k / top-p renormalisation) then
chain_speculative_sampling. Each mode reports why it is missing when the installed release
lacks a function.
"""
import inspect

import torch


def warp(logits: torch.Tensor, temperature: float, top_k: int, top_p: float, min_p: float) -> torch.Tensor:
    """transformers' warpers on logits [..., V] (float32): -inf where removed."""
    x = logits.float() / max(temperature, 1e-6)
    if top_k:
        kth = torch.topk(x, min(top_k, x.shape[-1]), dim=-1).values[..., -1:]
        x = x.masked_fill(x < kth, float("-inf"))
    if top_p < 1.0:
        ascending, order = torch.sort(x, dim=-1)
        cumulative = ascending.softmax(-1).cumsum(-1)
        remove = cumulative <= 1 - top_p
        remove[..., -1:] = False
        x = x.masked_fill(remove.scatter(-1, order, remove), float("-inf"))
    if min_p > 0.0:
        probs = x.softmax(-1)
        x = x.masked_fill(probs < min_p * probs.amax(-1, keepdim=True), float("-inf"))
    return x


def _race(dist: torch.Tensor) -> torch.Tensor:
    """One index per row of dist [N, V] (non-negative), by argmax dist / Exp(1)."""
    return (dist / torch.empty_like(dist).exponential_()).argmax(-1)


def torch_verify(target, draft, tokens, temperature=1.0, top_k=0, top_p=1.0, min_p=0.0):
    """target [B, K+1, V], draft [B, K, V], tokens [B, K] -> (tokens [B, K+1], num_accepted [B])."""
    batch, k_plus_1, _ = target.shape
    k = k_plus_1 - 1
    rows = torch.arange(batch, device=target.device)
    if temperature == 0.0:
        best = target.argmax(-1)
        accepted = (tokens == best[:, :k]).int().cumprod(1).sum(1)
        y = best[rows, accepted]
    else:
        q = warp(target, temperature, top_k, top_p, min_p).softmax(-1)
        p = warp(draft, temperature, top_k, top_p, min_p).softmax(-1)
        x = tokens.long()
        q_x = q[:, :k].gather(-1, x[..., None])[..., 0]
        p_x = p.gather(-1, x[..., None])[..., 0]
        coins = torch.rand(batch, k, device=target.device)
        accepted = ((p_x > 0) & (coins * p_x < q_x)).int().cumprod(1).sum(1)
        residual = (q[rows, accepted] - p[rows, accepted.clamp(max=k - 1)]).clamp(min=0)
        rejected = (accepted < k)[:, None] & (residual.sum(-1, keepdim=True) > 0)
        y = _race(torch.where(rejected, residual, q[rows, accepted]))
    out = torch.where(torch.arange(k, device=target.device)[None, :] < accepted[:, None], tokens.long(), -1)
    out = torch.cat([out, torch.full_like(out[:, :1], -1)], 1)
    out[rows, accepted] = y
    return out, accepted


def torch_sample(logits, temperature=1.0, top_k=0, top_p=1.0, min_p=0.0):
    """logits [B, V] -> token [B]."""
    if temperature == 0.0:
        return logits.argmax(-1)
    return _race(warp(logits, temperature, top_k, top_p, min_p).softmax(-1))


def flashinfer_fns(flashinfer, mode: dict):
    """(verify fn or reason, sample fn or reason) for one sampling mode, from FlashInfer."""
    sampling = flashinfer.sampling
    t = mode.get("temperature", 1.0)
    k, p, mp = mode.get("top_k", 0), mode.get("top_p", 1.0), mode.get("min_p", 0.0)

    def probs(logits):
        if t == 0.0:
            return torch.nn.functional.one_hot(logits.argmax(-1), logits.shape[-1]).float()
        out = (logits.float() / t).softmax(-1)
        flat = out.reshape(-1, out.shape[-1])
        if k:
            flat = sampling.top_k_renorm_probs(flat, k)
        if p < 1.0:
            flat = sampling.top_p_renorm_probs(flat, p)
        return flat.reshape(out.shape)

    if mp > 0.0:
        verify = "no min-p renormalisation in FlashInfer: chain_speculative_sampling needs probabilities"
    elif not hasattr(sampling, "chain_speculative_sampling"):
        verify = "flashinfer.sampling.chain_speculative_sampling missing"
    else:
        takes_uniforms = "uniform_samples" in inspect.signature(sampling.chain_speculative_sampling).parameters

        def verify(target, draft, tokens):
            q, d = probs(target), probs(draft)
            if takes_uniforms:
                u = torch.rand(tokens.shape[0], tokens.shape[1] + 1, device=target.device)
                return sampling.chain_speculative_sampling(d, tokens.int(), u, q)
            return sampling.chain_speculative_sampling(d, tokens.int(), q)

    if t == 0.0:
        sample = "greedy: argmax (nothing to sample)"
    elif mp > 0.0 and hasattr(sampling, "min_p_sampling_from_probs"):
        def sample(logits):
            return sampling.min_p_sampling_from_probs((logits.float() / t).softmax(-1), mp)
    elif k and p < 1.0 and hasattr(sampling, "top_k_top_p_sampling_from_logits"):
        def sample(logits):
            return sampling.top_k_top_p_sampling_from_logits(logits.float() / t, k, p)
    elif k and hasattr(sampling, "top_k_sampling_from_probs"):
        def sample(logits):
            return sampling.top_k_sampling_from_probs((logits.float() / t).softmax(-1), k)
    elif p < 1.0 and hasattr(sampling, "top_p_sampling_from_probs"):
        def sample(logits):
            return sampling.top_p_sampling_from_probs((logits.float() / t).softmax(-1), p)
    elif hasattr(sampling, "sampling_from_logits"):
        def sample(logits):
            return sampling.sampling_from_logits(logits.float() / t)
    elif hasattr(sampling, "sampling_from_probs"):
        def sample(logits):
            return sampling.sampling_from_probs((logits.float() / t).softmax(-1))
    else:
        sample = "no matching flashinfer.sampling function in this release"
    return verify, sample
