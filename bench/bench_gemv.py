"""The Triton skinny linear (kernels/linear/triton.py) against cuBLAS on the 8B-shaped layer's
products, and its fused prologues against the launches they replace.

    python bench/bench_gemv.py --gpu [--out bench/results/gemv_<device>.json]
    python bench/bench_gemv.py --tiny     # CPU, the interpreter, tiny shapes (the test runs it)

Per product (qkv, o, gate_up, down, lm_head of Llama-3-8B's shapes, bf16) and rows M (1, 2, 4,
5, 8, 16: decode steps of B * (K + 1) tokens):
  - "cublas": F.linear(x, W) (+ residual for o / down), what the runner's cuBLAS layer runs;
  - "triton": skinny_linear_triton with the default tiles, and every CONFIG_CANDIDATES entry
    ("triton <N>x<K> w<warps> s<stages>"): the sweep that decides the defaults;
  - "cublas + separate ops" vs "triton fused": the launches the GEMV layer replaces
    (add_rms_norm + F.linear for qkv / gate_up / lm_head, silu_mul + F.linear + add for down)
    against the one fused launch; for down also "triton + separate silu_mul" (what the GEMV layer
    runs above SILU_FUSED_MAX_ROWS rows).
Each time is us per call as CUDA-graph replays, over enough weight copies that the weights
streamed per replay exceed the L2 cache (an o_proj of 32 MB would otherwise stay in the H100's
50 MB L2 and time L2, not HBM); GB/s = weight + activation bytes / time, and the fraction of the
HBM ceiling of bench/profile_step.py (gpu_timing.hbm_ceiling_bandwidth: the larger of a copy's and
a sum's measured bandwidth). Every Triton
row's output is checked against F.linear's (bf16 tolerance) before it is timed.
"""
import argparse
import json
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

LLAMA_8B = dict(hidden=4096, inter=14336, heads=32, kv_heads=8, vocab=128256)
TINY = dict(hidden=64, inter=96, heads=4, kv_heads=2, vocab=200)
ROWS = (1, 2, 4, 5, 8, 16)
L2_BYTES = 50 << 20  # H100 SXM: 50 MB of L2; the weights of one replay exceed 4x this


def products(shape: dict) -> dict:
    """name -> (N, K, fused prologue, residual): the runner's GEMV layer (runners/paged_llama.py)."""
    h, f = shape["hidden"], shape["inter"]
    d = h // shape["heads"]
    return {"qkv": ((shape["heads"] + 2 * shape["kv_heads"]) * d, h, "rms_norm", False),
            "o": (h, h, "none", True), "gate_up": (2 * f, h, "rms_norm", False),
            "down": (h, f, "silu_mul", True), "lm_head": (shape["vocab"], h, "rms_norm", False)}


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    mode = ap.add_mutually_exclusive_group(required=True)
    mode.add_argument("--gpu", action="store_true")
    mode.add_argument("--tiny", action="store_true")
    ap.add_argument("--rows", default=",".join(map(str, ROWS)))
    ap.add_argument("--no-sweep", action="store_true", help="the default tiles only")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    if args.tiny:
        os.environ.setdefault("TRITON_INTERPRET", "1")
    import torch
    import torch.nn.functional as F

    from machine import cpu_model, versions

    from specdec_fast.kernels.linear.triton import CONFIG_CANDIDATES, block_m_for, default_config, skinny_linear_triton
    from specdec_fast.kernels.llama_ops.triton import add_rms_norm_triton, silu_mul_triton

    device = "cuda" if args.gpu else "cpu"
    shape = LLAMA_8B if args.gpu else TINY
    dtype = torch.bfloat16
    if args.gpu:
        from gpu_timing import graph_timer, hbm_ceiling_bandwidth

        measured = hbm_ceiling_bandwidth(device)
        bandwidth = measured["ceiling_Bps"]
        name = torch.cuda.get_device_name()
    else:
        from profile_step import median_ms

        measured, bandwidth, name = None, None, f"cpu: {cpu_model()} (interpreter)"

    def timed(fns) -> float:
        """us per call of the calls fns (one per weight copy)."""
        def run():
            for fn in fns:
                fn()
        if args.gpu:
            return graph_timer(run, reps=20) / len(fns)
        return 1e3 * median_ms(run, 3, lambda: None) / len(fns)

    rows_list = [int(r) for r in args.rows.split(",")]
    out = []
    gen = torch.Generator(device=device).manual_seed(0)
    for prod, (n, k, prologue, residual) in products(shape).items():
        weight_bytes = n * k * 2
        copies = max(1, -(-4 * L2_BYTES // weight_bytes)) if args.gpu else 1
        weights = [torch.randn(n, k, device=device, dtype=dtype, generator=gen) / k ** 0.5 for _ in range(copies)]
        norm_w = torch.rand(k, device=device, dtype=dtype, generator=gen) + 0.5
        for m in rows_list:
            width = 2 * k if prologue == "silu_mul" else k
            x = torch.randn(m, width, device=device, dtype=dtype, generator=gen)
            res = torch.randn(m, n, device=device, dtype=dtype, generator=gen) if residual else None
            nbytes = weight_bytes + (m * width + m * n * (2 if residual else 1)) * 2

            def row(method, us, **extra):
                r = dict(product=prod, N=n, K=k, rows=m, method=method, us=us, bytes=nbytes, GBps=nbytes / us / 1e3,
                         **extra)
                if bandwidth:
                    r["fraction_of_hbm_ceiling"] = nbytes / (us * 1e-6) / bandwidth
                out.append(r)
                print(f"{prod:8s} M={m:2d} {method:34s} {us:9.2f} us {r['GBps']:8.1f} GB/s"
                      + (f" {100 * r['fraction_of_hbm_ceiling']:5.1f}%" if bandwidth else ""), flush=True)

            # plain products (no prologue): the kernel against cuBLAS, the default tiles and the sweep
            xk = x[:, :k].contiguous()
            want = F.linear(xk, weights[0]) if res is None else res + F.linear(xk, weights[0])
            row("cublas", timed([lambda w=w: F.linear(xk, w) if res is None else torch.add(res, F.linear(xk, w))
                                 for w in weights]))
            default = default_config(m, n, args.gpu)
            configs = [default] + ([] if args.no_sweep or not args.gpu else
                                   [c for c in CONFIG_CANDIDATES[block_m_for(m)] if c != default])
            for config in configs:
                got = skinny_linear_triton(xk, weights[0], None, res, config=config)
                err = (got.float() - want.float()).abs().max().item()
                scale = want.float().abs().max().item()
                label = "triton" if config == default else \
                    f"triton {config.block_n}x{config.block_k} w{config.num_warps} s{config.num_stages}"
                if not err <= 0.02 * scale + 1e-3:
                    print(f"  {label}: max error {err} against cuBLAS (scale {scale}): not timed", flush=True)
                    out.append(dict(product=prod, rows=m, method=label, error=err, scale=scale))
                    continue
                row(label, timed([lambda w=w: skinny_linear_triton(xk, w, None, res, config=config) for w in weights]),
                    config=config.__dict__)
            # the fused prologue against the launches it replaces
            if prologue == "rms_norm":
                separate = [lambda w=w: F.linear(add_rms_norm_triton(xk, None, norm_w, 1e-5)[1], w) for w in weights]
                fused = [lambda w=w: skinny_linear_triton(xk, w, prologue="rms_norm", norm_weight=norm_w, eps=1e-5)
                         for w in weights]
            elif prologue == "silu_mul":
                separate = [lambda w=w: torch.add(res, F.linear(silu_mul_triton(x[:, :k], x[:, k:]), w)) for w in weights]
                fused = [lambda w=w: skinny_linear_triton(x, w, None, res, prologue="silu_mul") for w in weights]
            else:
                continue
            row(f"cublas + separate {prologue}", timed(separate))
            row(f"triton fused {prologue}", timed(fused))
            if prologue == "silu_mul":  # the GEMV layer's choice above SILU_FUSED_MAX_ROWS rows
                row("triton + separate silu_mul",
                    timed([lambda w=w: skinny_linear_triton(silu_mul_triton(x[:, :k], x[:, k:]), w, None, res)
                           for w in weights]))
        del weights
    result = dict(device=name, **versions(), dtype="bf16", shape=shape, hbm_ceiling=measured,
                  l2_bytes_assumed=L2_BYTES, command="python bench/bench_gemv.py " + " ".join(argv or sys.argv[1:]),
                  rows=out)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(result, indent=1))
        print(f"wrote {args.out}")
    return result


if __name__ == "__main__":
    main()
