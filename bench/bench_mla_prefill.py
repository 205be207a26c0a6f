"""A latent-attention prefill (runners/paged_mla.py) on the CPU, its attention absorbed (a query of r + dr
dims over the cached latents: what decode runs) against expanded (per-head keys and values, SDPA over the
row's own tokens: PagedMlaRunner.expand_prefill_min), with the logits' largest difference.

    python bench/bench_mla_prefill.py --cpu [--threads N] [--out bench/results/mla_prefill_cpu.json]
        DeepSeek-V3's attention widths (r 512, dr 64, dn 128, dv 128, a query rank of 1536) over 16 heads,
        hidden 2048, 2 layers with small dense MLPs (the attention is what differs), float32, the C++
        backend, one row of 64 / 256 / 1024 tokens: prefill ms each way (median of 3 after a warm-up).
        Predicted from the multiplies: per (query, key) pair and head 1088 absorbed against 320 expanded,
        at 131k more per token and head for the expansion and 65k fewer for the absorbed query: the
        expanded prefill slower at 64 tokens, ahead from a few hundred, ~2-3x at 1024. Measured (this 2-core
        EPYC, 1 thread, mla_prefill_cpu.json): expanded 0.89 / 0.89 / 0.66 of absorbed at 64 / 256 / 1024 --
        ahead already at 64 and only 1.5x at 1024: the projections and MLPs, the same both ways, take most
        of a prefill at these widths.
    python bench/bench_mla_prefill.py --gpu [--budget-s S] [--out bench/results/mla_prefill_<device>.json]
        DeepSeek-V3's attention at full width (128 heads, hidden 7168), 2 layers with small dense MLPs, bf16,
        the Triton kernels, one row of 1k / 2k / 4k tokens: prefill ms each way (synchronised, median of 3
        after a warm-up). Decides PagedMlaRunner.expand_prefill_min on a GPU (SDPA's flash path needs Dk = Dv:
        another backend serves the expanded form). Never run yet.
    python bench/bench_mla_prefill.py --smoke --out F
        Tiny widths: not a measurement, a check that the script runs.
"""
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_args import check_mode, mode_device, mode_parser, results_path  # noqa: E402
from machine import versions  # noqa: E402

CPU = dict(config=dict(hidden_size=2048, intermediate_size=256, num_hidden_layers=2, num_attention_heads=16,
                       num_key_value_heads=16, q_lora_rank=1536, kv_lora_rank=512, qk_rope_head_dim=64,
                       qk_nope_head_dim=128, v_head_dim=128, first_k_dense_replace=2, vocab_size=1024),
           lengths=(64, 256, 1024), reps=3)
GPU = dict(config=dict(CPU["config"], hidden_size=7168, num_attention_heads=128, num_key_value_heads=128,
                       vocab_size=4096), lengths=(1024, 2048, 4096), reps=3)
SMOKE = dict(config=dict(hidden_size=64, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=4, q_lora_rank=24, kv_lora_rank=32, qk_rope_head_dim=8,
                         qk_nope_head_dim=16, v_head_dim=12, first_k_dense_replace=2, vocab_size=128),
             lengths=(8, 40), reps=1)


def main(argv=None) -> int:
    parser = mode_parser(__doc__, "mla_prefill", cpu="the widths above on this CPU",
                         gpu="DeepSeek-V3's full attention width on the GPU", smoke="tiny widths; needs --out")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    check_mode(args)
    import transformers as tf
    from gpu_timing import RowBudget

    from specdec_fast.runners.paged_mla import PagedMlaRunner

    shape = SMOKE if args.smoke else GPU if args.gpu else CPU
    device, name, sync = mode_device(args)
    dtype = torch.bfloat16 if args.gpu else torch.float32
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    with torch.device(device):
        model = tf.AutoModelForCausalLM.from_config(tf.DeepseekV3Config(**shape["config"]), dtype=dtype).eval()
    out = results_path(args.out, "mla_prefill", name)
    rows, gen, budget = [], torch.Generator().manual_seed(1), RowBudget(args.budget_s)
    for length in shape["lengths"]:
        if not budget.allows(f"tokens={length}"):
            continue
        prompt = torch.randint(3, shape["config"]["vocab_size"], (1, length), generator=gen).to(device)
        timings, logits = {}, {}
        for way, threshold in (("absorbed", length + 1), ("expanded", 1)):
            runner = PagedMlaRunner(model, max_new_tokens=4, num_draft_tokens=1)
            runner.expand_prefill_min = threshold
            times = []
            for _ in range(shape["reps"] + 1):  # the first: a warm-up
                sync()
                begin = time.perf_counter()
                logits[way] = runner.prefill(prompt, None).float()
                sync()
                times.append(1e3 * (time.perf_counter() - begin))
            timings[way] = statistics.median(times[1:]) if len(times) > 2 else times[-1]
        row = {"tokens": length, "absorbed_ms": timings["absorbed"], "expanded_ms": timings["expanded"],
               "expanded_vs_absorbed": timings["expanded"] / timings["absorbed"],
               "max_abs_diff": float((logits["expanded"] - logits["absorbed"]).abs().max()),
               "logits_scale": float(logits["absorbed"].abs().max())}
        rows.append(row)
        print(json.dumps(row), flush=True)
        out.parent.mkdir(parents=True, exist_ok=True)  # after every row: a later row's failure keeps these
        out.write_text(json.dumps({"device": "cpu (smoke)" if args.smoke else name, "threads": args.threads,
                                   **versions(), "config": shape["config"], "rows": rows, "not_run": budget.not_run},
                                  indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
