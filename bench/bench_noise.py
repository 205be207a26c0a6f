"""The emission's noise alone: what drawing one token from a row's residual r >= 0 costs per vocab
entry, in three noise forms side by side (issue 25). On an H200 the B = 64, T = 1 emission took
169 of the verify's 254 us at 272 instructions per vocab entry (Nsight Compute,
bench/results/h200_2026-11-27b). Its sm_90a PTX spends about 100 of them on a whole
Philox4x32-10 per entry, of which one word of four is used, and about 60 on three logs (the
residual's and Gumbel's two).

Forms: a key per entry v; the token is the key's argmax, ties to the lowest index.
  none           r                                               the bytes and the argmax alone
  gumbel_1word   log r + G(word 0 of Philox(v))                  the noise before 2026-11-28
  gumbel_4words  log r + G(word v % 4 of Philox(v // 4))         one Philox call per four entries:
                                                                 kernels/rng's since (the verify
                                                                 kernels, the torch reference and
                                                                 the C++ backend; H200: 46.4 against
                                                                 62.1 us at B = 64, h200_2026-11-27c)
  race_4words    r / E, E = -log U(word v % 4 of Philox(v // 4)) an exponential race: no log of r,
                                                                 one log of noise. With E = exp(-G)
                                                                 it is gumbel_4words' draw (argmax
                                                                 log r - log E = argmax r / E), the
                                                                 same tokens up to rounding
Here G = -log(-log U) with U in (0, 1), Philox's counter is (v or v // 4, position, offset, stream),
and r = 0 never wins. Each noise form draws exactly from r / sum(r). The race would change the
noise function once more (the torch reference and the C++ backend with the kernels); this
benchmark measures what that would buy.

The grid is the verify emission's (kernels/verify/_triton_plan.py: B = 64 -> 64 x 9 programs of
14336 entries, 1024 at a time); r is float32 [B, V]; the chunks' winners are merged by torch
outside the timed kernel.

    python bench/bench_noise.py [--out bench/results/noise_<device>.json]    CUDA graph replays, B 64 / 8 / 1
    TRITON_INTERPRET=1 python bench/bench_noise.py --smoke [--out F]        the kernel against torch, CPU
Each row says whether the kernel's tokens equal a torch computation of the same form (the noise
bits from kernels/rng/reference.py).
"""
import argparse
import json
import sys
from pathlib import Path

import torch
import triton
import triton.language as tl

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

from specdec_fast.kernels.rng import STREAM_TOKEN  # noqa: E402
from specdec_fast.kernels.rng.reference import MASK32, gumbel, philox, uniform_open  # noqa: E402
from specdec_fast.kernels.rng.triton import gumbel_from_bits, philox_words, uniform_open_from_bits  # noqa: E402

FORMS = {"none": 0, "gumbel_1word": 1, "gumbel_4words": 2, "race_4words": 3}
NEG_INF = float("-inf")
_NEG_INF = tl.constexpr(NEG_INF)  # what @triton.jit code may read


@triton.jit
def _bits_4words(seed, offset, position, stream, first, BLOCK_V: tl.constexpr):
    """uint32 [BLOCK_V] for entries first .. first + BLOCK_V - 1 (first a multiple of 4): entry v
    takes word v % 4 of Philox(v // 4), one call per four entries."""
    groups = first // 4 + tl.arange(0, BLOCK_V // 4)
    c0, c1, c2, c3 = philox_words(seed, offset, position + groups * 0, stream, groups)
    return tl.interleave(tl.interleave(c0, c2), tl.interleave(c1, c3))  # c0[0] c1[0] c2[0] c3[0] c0[1] ...


@triton.jit
def noise_argmax_kernel(r_ptr, val_ptr, idx_ptr, seed_ptr, offset_ptr, position, V, NCHUNK,
                        STREAM: tl.constexpr, CHUNK: tl.constexpr, BLOCK_V: tl.constexpr, FORM: tl.constexpr):
    """grid (B, NCHUNK): program (b, c) writes the largest key of row b over entries
    [c * CHUNK, (c + 1) * CHUNK) and its lowest index to val / idx [B * NCHUNK]."""
    b = tl.program_id(0)
    c = tl.program_id(1)
    seed = tl.load(seed_ptr + b)
    offset = tl.load(offset_ptr + b)
    lane = tl.arange(0, BLOCK_V)
    pos = position + lane * 0
    best = tl.full([BLOCK_V], _NEG_INF, tl.float32)
    arg = tl.zeros([BLOCK_V], tl.int32)
    start = c * CHUNK
    for v0 in range(0, CHUNK, BLOCK_V):
        idx = start + v0 + lane
        inside = idx < V
        r = tl.load(r_ptr + b.to(tl.int64) * V + idx, mask=inside, other=0.0)
        positive = inside & (r > 0)
        if FORM == 0:
            key = tl.where(inside, r, _NEG_INF)
        elif FORM == 1:  # word 0 of Philox(v): the noise before 2026-11-28 (philox_bits draws the 4-word spec since)
            w0, _, _, _ = philox_words(seed, offset, pos, STREAM, idx)
            g = gumbel_from_bits(w0)
            key = tl.where(positive, tl.log(tl.where(positive, r, 1.0)) + g, _NEG_INF)
        elif FORM == 2:
            g = gumbel_from_bits(_bits_4words(seed, offset, position, STREAM, start + v0, BLOCK_V))
            key = tl.where(positive, tl.log(tl.where(positive, r, 1.0)) + g, _NEG_INF)
        else:
            e = -tl.log(uniform_open_from_bits(_bits_4words(seed, offset, position, STREAM, start + v0, BLOCK_V)))
            key = tl.where(positive, tl.div_rn(r, e), _NEG_INF)
        better = key > best  # ascending entries per lane: the first maximum stays
        best = tl.where(better, key, best)
        arg = tl.where(better, idx, arg)
    top = tl.max(best, axis=0)
    tl.store(val_ptr + b * NCHUNK + c, top)
    tl.store(idx_ptr + b * NCHUNK + c, tl.min(tl.where(best == top, arg, 2147483647), axis=0))


def draw(r, seed, offset, position, form, chunk, block_v):
    """(launch, tokens): launch() runs the kernel (what is timed); tokens() merges its chunks'
    winners (ties to the lowest chunk, then index) into int64 [B]."""
    batch, vocab = r.shape
    nchunk = triton.cdiv(vocab, chunk)
    val = torch.empty((batch, nchunk), dtype=torch.float32, device=r.device)
    idx = torch.empty((batch, nchunk), dtype=torch.int32, device=r.device)

    def launch():
        noise_argmax_kernel[(batch, nchunk)](r, val, idx, seed, offset, position, vocab, nchunk, STREAM=STREAM_TOKEN,
                                             CHUNK=chunk, BLOCK_V=block_v, FORM=FORMS[form], num_warps=4)

    def tokens():
        launch()
        return idx.gather(1, val.argmax(1, keepdim=True))[:, 0].long()

    return launch, tokens


def torch_keys(r, seed, offset, position, form):
    """The same keys in torch (float32), the noise bits from kernels/rng/reference.py's philox (gumbel_4words:
    its random_bits, the kernels' spec since 2026-11-28)."""
    vocab = r.shape[1]
    v = torch.arange(vocab, device=r.device, dtype=torch.int64)[None, :]
    s, o = seed[:, None], offset[:, None]
    if form == "none":
        return r
    if form == "gumbel_1word":  # word 0 of Philox(v), the noise before 2026-11-28
        bits = philox(v, torch.full_like(v, position), o & MASK32, (((o >> 32) << 8) | STREAM_TOKEN) & MASK32,
                      s & MASK32, (s >> 32) & MASK32)[0]
    else:
        words = philox(v // 4, torch.full_like(v, position), o & MASK32, (((o >> 32) << 8) | STREAM_TOKEN) & MASK32,
                       s & MASK32, (s >> 32) & MASK32)
        words = torch.stack(torch.broadcast_tensors(*words), -1)  # [B, V, 4]
        bits = words.gather(-1, (v % 4).expand(r.shape[0], -1)[..., None])[..., 0]
    positive = r > 0
    if form == "race_4words":
        return torch.where(positive, r / -torch.log(uniform_open(bits)), NEG_INF)
    return torch.where(positive, torch.log(torch.where(positive, r, 1.0)) + gumbel(bits), NEG_INF)


def residuals(batch, vocab, device, seed=0):
    """float32 [B, V]: max(q - p, 0) of softmaxes of N(0, 3^2) logits and a draft 1 apart, zero
    where the draft is larger (about half the entries), as at a rejection."""
    g = torch.Generator().manual_seed(seed)
    target = torch.randn(batch, vocab, generator=g) * 3
    draft = target + torch.randn(batch, vocab, generator=g)
    return (torch.softmax(target, -1) - torch.softmax(draft, -1)).clamp(min=0).to(device)


def run(shapes, device, smoke: bool) -> list:
    from specdec_fast.kernels.verify._triton_plan import plan_launches

    rows = []
    for batch, vocab in shapes:
        r = residuals(batch, vocab, device)
        seed = torch.arange(batch, dtype=torch.int64, device=device) * 7919 + 11
        offset = torch.arange(batch, dtype=torch.int64, device=device) * 3 + (5 << 32)
        position = 6
        if smoke:
            chunk, block_v = 512, 128
        else:
            sms = torch.cuda.get_device_properties(device).multi_processor_count
            plan = plan_launches(batch, 4, vocab, True, num_sms=sms, interpreting=False, modes=frozenset({"plain"}))
            chunk, block_v = plan.emit_chunk, plan.emit_block_v
        for form in FORMS:
            launch, tokens = draw(r, seed, offset, position, form, chunk, block_v)
            expected = torch_keys(r, seed, offset, position, form).argmax(1)
            row = dict(batch=batch, vocab=vocab, form=form, chunk=chunk, block_v=block_v,
                       grid=[batch, triton.cdiv(vocab, chunk)],
                       tokens_equal_torch=bool(torch.equal(tokens(), expected)))
            if not smoke:
                from gpu_timing import graph_timer

                row["us"] = graph_timer(launch)
                row["GBps"] = r.numel() * 4 / (row["us"] * 1e-6) / 1e9
            rows.append(row)
            print(json.dumps(row), flush=True)
        for row in rows[-len(FORMS):]:
            if "us" in row:
                row["over_today"] = row["us"] / next(x["us"] for x in rows[-len(FORMS):] if x["form"] == "gumbel_1word")
    return rows


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--smoke", action="store_true", help="CPU interpreter, B = 3, V = 1000: not a measurement")
    ap.add_argument("--out", help="JSON path (default bench/results/noise_<device>.json; --smoke: none)")
    args = ap.parse_args(argv)
    if args.smoke:
        device, shapes = torch.device("cpu"), [(3, 1000)]
    else:
        if not torch.cuda.is_available():
            raise SystemExit("bench_noise.py times CUDA graph replays: it needs a GPU (--smoke runs on the CPU)")
        device, shapes = torch.device("cuda"), [(64, 128256), (8, 128256), (1, 128256)]
    from machine import versions

    rows = run(shapes, device, args.smoke)
    name = "cpu_interpreter" if args.smoke else torch.cuda.get_device_name().lower().replace(" ", "_")
    result = dict(device=name, versions=versions(), smoke=args.smoke, timer=None if args.smoke else
                  "CUDA graph replay (gpu_timing.graph_timer), median us", rows=rows)
    out = args.out or (None if args.smoke else str(ROOT / "bench" / "results" / f"noise_{name}.json"))
    if out:
        Path(out).write_text(json.dumps(result, indent=1) + "\n")
        print(f"wrote {out}")
    return result


if __name__ == "__main__":
    main()
