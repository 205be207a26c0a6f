"""The MoE MLP's ways on a GPU (runners/_moe.py), timed as CUDA-graph replays, with the bytes each
should read against the HBM roofline.

    python bench/bench_moe.py --gpu [--budget-s S] [--out bench/results/moe_<device>.json]
        Qwen3-30B-A3B's block (H 2048, I 768, 128 experts, top 8) and Mixtral 8x7B's (H 4096,
        I 14336, 8 experts, top 2), bf16, T = 1 / 2 / 5 / 8 / 40 / 128 tokens routed by a random
        router, each way's output checked against the torch gathered one (every_expert's where the
        gathered copies would pass 32 GB: Mixtral at T = 128, not timed there):
          triton_pairs   kernels/moe's "pair" schedule (a GEMV per pair; the Triton runner's way
                         for 3 T k <= E),
          triton_expert  its "expert" schedule (pairs grouped by expert, tl.dot tiles; the Triton
                         runner's way above that), with the sort,
          torch_gathered index_select copies + bmm (the torch runner's way for 3 T k <= E),
          every_expert   every expert over every token as batched products (the torch runner's
                         loop calls above that).
        Bytes: the distinct chosen experts' weights (what a kernel that read each once would read).
        Predicted before any run: triton_pairs near the roofline of the pairs' weights while the
        pairs mostly chose distinct experts, triton_expert near the distinct experts' roofline at
        every T (behind triton_pairs at T = 1 by its sort's launches), torch_gathered ~3x
        triton_pairs (read, write, read), every_expert ~ all E experts' weights.
    python bench/bench_moe.py --cpu [--threads N] [--out bench/results/moe_cpu.json]
        The CPU's ways at Qwen3-30B-A3B's block (the MoE people run on CPUs), float32 and bfloat16,
        T = 1 / 5 / 40, wall-clock medians: cpp (csrc/moe_experts.cpp: the pairs grouped by expert,
        each chosen expert applied once, in place: the C++ runner's way), torch_gathered (the torch
        runner's way for 3 T k <= E; its copies up to 2 GB), every_expert (the torch runner's loop
        calls above that), chosen_only (transformers' loop; the reference of max_abs_diff).
    TRITON_INTERPRET=1 python bench/bench_moe.py --smoke --out F
        The same code on CPU under the interpreter (tiny shapes, one wall-clock call per timing):
        not a measurement, a check that the device run is not broken on arrival.
"""
import json
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_args import check_mode, mode_parser, results_path  # noqa: E402
from machine import versions  # noqa: E402

HBM_BYTES_PER_S = {"H100": 3.35e12, "H200": 4.8e12}  # SXM datasheet peaks
# name -> (hidden H, expert width I, experts E, top k)
SHAPES = {"qwen3_30b_a3b": (2048, 768, 128, 8), "mixtral_8x7b": (4096, 14336, 8, 2)}
TOKENS = (1, 2, 5, 8, 40, 128)
SMOKE_SHAPES = {"tiny": (64, 32, 16, 2)}
GATHER_LIMIT_BYTES = 32e9  # the torch gathered form's copies, at most (the H200 holds 141 GB)
SMOKE_TOKENS = (1, 5, 24)


class _Block:
    """A random MoE block of the given shape, as runners/_moe.MoE reads one (Qwen routing)."""

    def __init__(self, hidden, inter, experts, top_k, dtype, device):
        gen = torch.Generator(device=device).manual_seed(0)  # on the device: Mixtral's experts are 2.8 G values
        make = lambda *shape: (torch.randn(*shape, generator=gen, device=device, dtype=dtype)  # noqa: E731
                               * shape[-1] ** -0.5)
        self.gate = torch.nn.Module()
        self.gate.weight = make(experts, hidden)
        self.experts = torch.nn.Module()
        self.experts.gate_up_proj = torch.nn.Parameter(make(experts, 2 * inter, hidden), requires_grad=False)
        self.experts.down_proj = torch.nn.Parameter(make(experts, hidden, inter), requires_grad=False)
        self.experts.act_fn = F.silu


def _config(top_k):
    return type("Config", (), dict(model_type="qwen3_moe", norm_topk_prob=True, num_experts_per_tok=top_k,
                                   hidden_act="silu"))()


def main(argv=None) -> int:
    parser = mode_parser(__doc__, "moe", gpu="CUDA-graph replays on the GPU",
                         smoke="the GPU mode's code under the interpreter; needs --out",
                         cpu="the CPU's ways (the C++ op, the torch paths)")
    parser.add_argument("--threads", type=int, default=None, help="--cpu: torch threads (default: torch's)")
    args = parser.parse_args(argv)
    check_mode(args)
    if args.cpu:
        return cpu_main(args)
    from gpu_timing import RowBudget, graph_timer

    from specdec_fast.runners._moe import MoE

    if args.smoke:
        device, dtype, name, shapes, token_counts = "cpu", torch.float32, "cpu (smoke: interpreter)", SMOKE_SHAPES, SMOKE_TOKENS

        def time_us(fn):
            start = time.perf_counter()
            fn()
            return 1e6 * (time.perf_counter() - start)
    else:
        device, dtype, name, shapes, token_counts = "cuda", torch.bfloat16, torch.cuda.get_device_name(), SHAPES, TOKENS
        time_us = graph_timer
    peak = next((v for k, v in HBM_BYTES_PER_S.items() if k in name), None)
    out = results_path(args.out, "moe", name)
    out.parent.mkdir(parents=True, exist_ok=True)
    rows, budget = [], RowBudget(args.budget_s)
    for shape, (hidden, inter, experts, top_k) in shapes.items():
        block = _Block(hidden, inter, experts, top_k, dtype, device)
        triton_moe, torch_moe = MoE(block, _config(top_k), "triton"), MoE(block, _config(top_k), "torch")
        expert_bytes = 3 * hidden * inter * block.experts.down_proj.element_size()
        for tokens in token_counts:
            if not budget.allows(f"{shape} T={tokens}"):
                continue
            h = torch.randn(tokens, hidden, generator=torch.Generator().manual_seed(tokens)).to(dtype).to(device)
            weights, chosen = torch_moe.routing(h)
            distinct = int(torch.unique(chosen).numel())
            # the torch gathered copies ([T k] experts' weights) fit: Mixtral's at T = 128 would be 90 GB
            gathers = tokens * top_k * expert_bytes <= GATHER_LIMIT_BYTES
            want = (torch_moe._gathered if gathers else torch_moe._every_expert)(h, weights, chosen).float()
            res = {"shape": shape, "T": tokens, "H": hidden, "I": inter, "E": experts, "k": top_k,
                   "distinct_experts": distinct, "pairs": tokens * top_k,
                   "reference": "torch_gathered" if gathers else "every_expert"}
            for form, fn in (("triton_pairs", lambda: triton_moe._kernels(h, weights, chosen, "pair")),
                             ("triton_expert", lambda: triton_moe._kernels(h, weights, chosen, "expert")),
                             ("torch_gathered", lambda: torch_moe._gathered(h, weights, chosen)),
                             ("every_expert", lambda: torch_moe._every_expert(h, weights, chosen))):
                if form == "torch_gathered" and not gathers:
                    continue
                res[f"{form}_max_abs_diff"] = (fn().float() - want).abs().max().item()
                us = time_us(fn)
                res[f"{form}_us"] = us
                res[f"{form}_roofline_distinct"] = distinct * expert_bytes / (us * 1e-6) / peak if peak else None
            rows.append(res)
            print(json.dumps(res), flush=True)
            out.write_text(json.dumps({"device": name, **versions(), "rows": rows, "not_run": budget.not_run}, indent=2) + "\n")
    out.write_text(json.dumps({"device": name, **versions(), "rows": rows, "not_run": budget.not_run}, indent=2) + "\n")
    print(f"wrote {out}")
    return 0


CPU_TOKENS = (1, 5, 40)
CPU_GATHER_LIMIT_BYTES = 2e9


def cpu_main(args) -> int:
    threads = torch.get_num_threads()
    if args.threads:
        torch.set_num_threads(args.threads)
    try:
        return _cpu_rows(args)
    finally:
        torch.set_num_threads(threads)  # a caller's setting (the test calls main in-process)


def _cpu_rows(args) -> int:
    from bench_cpu_ops import median_ms
    from machine import cpu_model, cpu_simd

    from specdec_fast.runners._moe import MoE

    hidden, inter, experts, top_k = SHAPES["qwen3_30b_a3b"]
    rows = []
    for dtype in (torch.float32, torch.bfloat16):
        block = _Block(hidden, inter, experts, top_k, dtype, "cpu")
        cpp, plain = MoE(block, _config(top_k), "cpp"), MoE(block, _config(top_k), "torch")
        if cpp.kernels != "cpp":
            sys.exit("the C++ op moe_experts did not build (see the warning)")
        expert_bytes = 3 * hidden * inter * block.experts.down_proj.element_size()
        for tokens in CPU_TOKENS:
            h = torch.randn(tokens, hidden, generator=torch.Generator().manual_seed(tokens)).to(dtype)
            weights, chosen = plain.routing(h)
            want = plain._chosen_only(h, weights, chosen).float()
            res = {"shape": "qwen3_30b_a3b", "dtype": str(dtype).removeprefix("torch."), "T": tokens, "pairs": tokens * top_k,
                   "distinct_experts": int(torch.unique(chosen).numel())}
            forms = {"cpp": lambda: cpp._kernels(h, weights, chosen),
                     "torch_gathered": lambda: plain._gathered(h, weights, chosen),
                     "every_expert": lambda: plain._every_expert(h, weights, chosen),
                     "chosen_only": lambda: plain._chosen_only(h, weights, chosen)}
            if tokens * top_k * expert_bytes > CPU_GATHER_LIMIT_BYTES:
                del forms["torch_gathered"]
            for form, fn in forms.items():
                res[f"{form}_max_abs_diff"] = (fn().float() - want).abs().max().item()
                res[f"{form}_ms"] = median_ms(fn, 1, budget_s=0)["median_ms"]  # a warm-up, then the median of 5
            res["cpp_speedup_over_the_torch_runner"] = (
                res["torch_gathered_ms" if 3 * tokens * top_k <= experts else "every_expert_ms"] / res["cpp_ms"])
            rows.append(res)
            print(json.dumps(res), flush=True)
    out = results_path(args.out, "moe", "cpu")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"device": cpu_model(), **cpu_simd(), "threads": torch.get_num_threads(), **versions(),
                               "rows": rows}, indent=2) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
