"""CPU timings of the C++ ops that bench_verify.py does not cover, beside their torch references:
the sampler (sample), tree_verify, and the fused Llama ops (rms_norm, silu_mul, rope_qk_,
rope_cos_sin). One process, torch.set_num_threads(--threads).

    python bench/bench_cpu_ops.py [--threads 1] [--repeats 3] [--out bench/results/cpu_ops_<isa>.json]

Sampling ops: logits ~ N(0, 3^2), seed 1, plain sampling unless the row names a mode (the
same modes as bench_verify.py). Llama ops: T tokens of a layer of hidden H, MLP width F, head
dim D (the demo pair's shape, and Llama-2 7B/TinyLlama-like shapes), float32.
"""
import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT))
from machine import cpu_model, cpu_simd, git_commit  # noqa: E402

from specdec_fast.kernels import sample  # noqa: E402
from specdec_fast.kernels._cpp_build import load_cpu_ops  # noqa: E402
from specdec_fast.kernels.llama_ops import cpp as llama_cpp  # noqa: E402
from specdec_fast.kernels.llama_ops import reference as llama_ref  # noqa: E402
from specdec_fast.kernels.tree_verify import tree_verify  # noqa: E402

MODES = {"plain": {}, "top_p=0.9": dict(top_p=0.9),
         "temperature+top_k+top_p+min_p": dict(temperature=0.8, top_k=50, top_p=0.9, min_p=0.02)}
LLAMA_SHAPES = [(5, 128, 512, 64), (5, 2048, 5632, 64), (5, 4096, 11008, 128)]  # (T, H, F, D)


def median_ms(fn, repeats: int, budget_s: float = 0.5) -> dict:
    """Median over `repeats` of the median wall time (ms) of >= 5 calls within budget_s, each after a warm-up."""
    medians = []
    for _ in range(repeats):
        fn()
        times, end = [], time.perf_counter() + budget_s
        while len(times) < 5 or (time.perf_counter() < end and len(times) < 2000):
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
        medians.append(statistics.median(times))
    return {"median_ms": statistics.median(medians), "repeat_medians_ms": medians}


def sampling_rows(repeats: int) -> list[dict]:
    from tests.kernels.tree_cases import random_parents

    g = torch.Generator().manual_seed(0)
    rows = []
    batch, vocab = 8, 32000
    logits = torch.randn(batch, vocab, generator=g) * 3
    for dtype in (torch.float32, torch.float16):
        x = logits.to(dtype)
        for mode, kw in MODES.items():
            if dtype != torch.float32 and mode != "plain":
                continue
            row = {"op": "sample", "B": batch, "V": vocab, "dtype": str(dtype).removeprefix("torch."), "mode": mode}
            for backend in ("cpp", "torch"):
                row[backend] = median_ms(lambda: sample(x, seed=1, backend=backend, check=False, **kw),
                                         repeats if backend == "cpp" else 1)
            rows.append(row)
    batch, nodes = 4, 16
    parents = random_parents(g, batch, nodes)
    target = torch.randn(batch, nodes, vocab, generator=g) * 3
    draft = target + torch.randn(batch, nodes, vocab, generator=g)
    tokens = torch.multinomial(torch.softmax(draft.reshape(-1, vocab), -1), 1, generator=g).reshape(batch, nodes)
    for mode in ("plain", "top_p=0.9"):
        row = {"op": "tree_verify", "B": batch, "N": nodes, "V": vocab, "dtype": "float32", "mode": mode}
        for backend in ("cpp", "torch"):
            row[backend] = median_ms(lambda: tree_verify(target, draft, tokens, parents, seed=1, backend=backend,
                                                         check=False, **MODES[mode]), repeats if backend == "cpp" else 1)
        rows.append(row)
    return rows


def llama_rows(repeats: int) -> list[dict]:
    g = torch.Generator().manual_seed(0)
    rows = []
    for t, h, f, d in LLAMA_SHAPES:
        x, w = torch.randn(t, h, generator=g), torch.randn(h, generator=g)
        gate, up = torch.randn(t, f, generator=g), torch.randn(t, f, generator=g)
        q, k = torch.randn(t, h // d, d, generator=g), torch.randn(t, max(1, h // d // 4), d, generator=g)
        pos, inv_freq = torch.arange(t), 1.0 / (10000 ** (torch.arange(0, d, 2).float() / d))
        cos, sin = llama_ref.rope_cos_sin_reference(pos, inv_freq, 1.0)
        ops = {
            "rms_norm": (lambda: llama_cpp.rms_norm_cpp(x, w, 1e-6), lambda: llama_ref.rms_norm_reference(x, w, 1e-6)),
            "silu_mul": (lambda: llama_cpp.silu_mul_cpp(gate, up), lambda: llama_ref.silu_mul_reference(gate, up)),
            "rope_qk_": (lambda: llama_cpp.rope_qk_cpp(q, k, cos, sin), lambda: llama_ref.rope_qk_reference(q, k, cos, sin)),
            "rope_cos_sin": (lambda: llama_cpp.rope_cos_sin_cpp(pos, inv_freq, 1.0),
                             lambda: llama_ref.rope_cos_sin_reference(pos, inv_freq, 1.0)),
        }
        for name, (ours, ref) in ops.items():
            rows.append({"op": name, "T": t, "H": h, "F": f, "D": d,
                         "cpp": median_ms(ours, repeats), "torch": median_ms(ref, repeats)})
    return rows


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    if not load_cpu_ops():
        raise SystemExit("the C++ CPU ops did not build: nothing to compare")
    rows = sampling_rows(args.repeats) + llama_rows(args.repeats)
    for row in rows:
        shape = {k: v for k, v in row.items() if k not in ("cpp", "torch")}
        print(shape, f"cpp {row['cpp']['median_ms']:.4f} ms, torch {row['torch']['median_ms']:.4f} ms", flush=True)
    report = {"device": f"cpu: {cpu_model()}", **cpu_simd(), "threads": torch.get_num_threads(), "torch": torch.__version__,
              "commit": git_commit(), "timer": f"median over {args.repeats} repeats (torch sampling references: 1) of the "
              "median wall time of >= 5 calls, each after a warm-up", "results": rows}
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
        print(f"wrote {args.out}")
    return report


if __name__ == "__main__":
    main()
