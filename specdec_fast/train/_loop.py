"""The optimisation loop both head trainers share (eagle3.py, dflash.py): AdamW (betas 0.9 / 0.95,
no weight decay), linear warm-up over the first 5% then cosine decay to 2% of the rate, gradients
clipped at norm 1, whichever of ``steps`` / ``minutes`` ends first; the trainer supplies the loss
of a batch of sequence rows."""
import math
import time

import torch


def train_head(head, params: list, sequences: torch.Tensor, batch_loss, *, steps: int, minutes: float | None,
               batch_size: int, lr: float, seed: int, log=None, agreement: str = "top-1 agreement") -> dict:
    """Trains ``params`` of ``head`` in place: each step draws ``batch_size`` rows of ``sequences``
    [N, T] (a torch.Generator seeded with ``seed``, which batch_loss may draw from too) and
    minimises batch_loss(rows [batch_size, T], generator) -> (loss, per-position agreements).
    -> dict(steps, seconds, final_loss, final_agreement: the means over the last 20 steps)."""
    for p in params:
        p.requires_grad_(True)
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=0.0, betas=(0.9, 0.95))
    gen = torch.Generator().manual_seed(seed)
    head.train()
    start, history, step = time.perf_counter(), [], 0
    for step in range(steps):
        elapsed = (time.perf_counter() - start) / 60
        if minutes is not None and elapsed >= minutes:
            break
        fraction = max(step / steps, elapsed / minutes if minutes else 0.0)
        scale = min(1.0, fraction / 0.05) * 0.5 * (1 + math.cos(math.pi * min(fraction, 1.0)))
        for group in opt.param_groups:
            group["lr"] = lr * max(scale, 0.02)
        rows = torch.randint(0, sequences.shape[0], (batch_size,), generator=gen)
        loss, agree = batch_loss(sequences[rows], gen)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        history.append((float(loss.detach()), agree))
        if log is not None and (step % 50 == 0 or step == steps - 1):
            log(f"step {step}: loss {float(loss):.3f}, {agreement} per position {[round(a, 3) for a in agree]}")
    head.eval()
    for p in params:
        p.requires_grad_(False)
    last = history[-20:]
    width = len(last[0][1]) if last else 0
    return dict(steps=step + 1, seconds=time.perf_counter() - start,
                final_loss=sum(h[0] for h in last) / max(len(last), 1),
                final_agreement=[sum(h[1][j] for h in last) / max(len(last), 1) for j in range(width)])
