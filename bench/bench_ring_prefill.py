"""The windowed layers' ring cache (runners/paged_cache.py ring_blocks, runners/paged_base.py
ring_chunk) on a GPU: a long prompt's prefill time and the runner's KV bytes with rings at several
prefill chunks, against the whole cache in every layer.

    python bench/bench_ring_prefill.py --gpu [--budget-s S] [--out bench/results/ring_prefill_<device>.json]
        A Mistral-7B-v0.1-shaped model cut to 4 layers (H 4096, 32 heads, 8 KV heads, I 14336, every
        layer windowed at 4096), bf16, random weights, one row of a 16k-token prompt (a budget of
        + 64 new tokens, K = 4): prefill ms (eager, as the engine runs it: the median of 3 after a
        warm-up) and KV bytes, for ring_chunk 1024 / 2048 / 4096 and rings off (ring_windows False).
        Each row's last-position logits are compared with the rings-off row's (max abs diff).
        Predicted before any run: the chunked prefills within ~10-20% of the one pass at chunks of
        2048 and more (each chunk's attention reads at most W + C keys, the one pass the whole lower
        triangle within the window; the products cost the same), slower at 1024 (16 forwards of
        1024 rows through every layer); KV bytes (W + C + K) / 16k of the whole cache's.
    python bench/bench_ring_prefill.py --smoke --out F
        The same code on the CPU (a tiny model, the CPU kernels, one timing per row): not a
        measurement, a check that the device run is not broken on arrival.
"""
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_args import check_mode, mode_parser, results_path  # noqa: E402
from machine import versions  # noqa: E402

GPU = dict(config=dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=4, num_attention_heads=32,
                       num_key_value_heads=8, sliding_window=4096, vocab_size=32000, max_position_embeddings=32768),
           prompt=16384, chunks=(1024, 2048, 4096), reps=3)
SMOKE = dict(config=dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, sliding_window=16, vocab_size=128, max_position_embeddings=512),
             prompt=100, chunks=(8, 16, 32), reps=1)
NEW_TOKENS, K = 64, 4


def _model(shape: dict, dtype, device):
    import transformers as tf

    torch.manual_seed(0)
    config = tf.MistralConfig(**shape["config"])
    with torch.device(device):
        model = tf.AutoModelForCausalLM.from_config(config, dtype=dtype)
    return model.eval()


def _row(model, chunk, prompt: torch.Tensor, reps: int, sync) -> tuple[dict, torch.Tensor]:
    """One variant (chunk None: rings off) -> (its row, the last position's logits)."""
    from specdec_fast.runners import PagedLlamaRunner

    runner = PagedLlamaRunner(model, max_new_tokens=NEW_TOKENS, num_draft_tokens=K)
    if chunk is None:
        runner.ring_windows = False
    else:
        runner.ring_chunk = chunk
    runner.allocate(1, prompt.shape[1] + NEW_TOKENS + K + 1)
    times = []
    for _ in range(reps + 1):  # the first: a warm-up (kernel compiles, caches)
        sync()
        start = time.perf_counter()
        logits = runner.prefill(prompt, None)
        sync()
        times.append(1e3 * (time.perf_counter() - start))
    measured = sorted(times[1:]) if reps > 1 else times[-1:]
    ring = runner.caches[-1].ring_blocks if runner._ring_layers else None
    return {"ring_chunk": chunk, "ring_blocks": ring, "ring_layers": len(runner._ring_layers),
            "prefill_ms": measured[len(measured) // 2], "kv_bytes": runner.kv_bytes}, logits[0].float()


def main(argv=None) -> int:
    args = mode_parser(__doc__, "ring_prefill", gpu="the model above on the GPU",
                       smoke="a tiny model on the CPU; needs --out").parse_args(argv)
    check_mode(args)
    from gpu_timing import RowBudget

    if args.smoke:
        shape, device, dtype, name = SMOKE, "cpu", torch.float32, "cpu (smoke)"
        sync = lambda: None  # noqa: E731
    else:
        shape, device, dtype, name = GPU, "cuda", torch.bfloat16, torch.cuda.get_device_name()
        sync = torch.cuda.synchronize
    out = results_path(args.out, "ring_prefill", name)
    out.parent.mkdir(parents=True, exist_ok=True)
    model = _model(shape, dtype, device)
    gen = torch.Generator().manual_seed(1)
    prompt = torch.randint(3, shape["config"]["vocab_size"], (1, shape["prompt"]), generator=gen).to(device)
    rows, budget = [], RowBudget(args.budget_s)
    whole, reference = None, None
    for chunk in (None, *shape["chunks"]):  # rings off first: the reference of the others
        if not budget.allows(f"ring_chunk={chunk}"):
            continue
        row, logits = _row(model, chunk, prompt, shape["reps"], sync)
        if chunk is None:
            whole, reference = row, logits
        else:
            row["max_abs_diff"] = float((logits - reference).abs().max()) if reference is not None else None
            if whole is not None:
                row["prefill_vs_whole"] = row["prefill_ms"] / whole["prefill_ms"]
                row["kv_vs_whole"] = row["kv_bytes"] / whole["kv_bytes"]
        rows.append(row)
        print(json.dumps(row), flush=True)
        out.write_text(json.dumps({"device": name, **versions(), "prompt": shape["prompt"], "config": shape["config"],
                                   "rows": rows, "not_run": budget.not_run}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
