"""The Triton verify's streaming pass, its two loops side by side in one run (GPU): per-lane
statistics reduced once after the loop (stream_lanes=True) against a block-wide reduction every
step (stream_lanes=False). The launcher picks per plan (_triton_plan.plan_launches) from what
this measured on an H100 (bench/results/h100_2026-11-23/stream_lanes_112bf69.json).

For V in {32000, 128256}, B in {1, 8, 64}, K = 4 with draft logits, modes greedy / T=1 /
top_k=50 (the rows that stream without rungs): chain_verify_triton and sample_triton as CUDA
graph replays under do_bench (median us), GB/s and fraction of the copy-bandwidth roofline
(logits bytes read once), and whether both loops give the reference's tokens.

    python bench/bench_stream_lanes.py [--out bench/results/stream_lanes_<device>.json]
    python bench/bench_stream_lanes.py --smoke   # this code on a tiny shape, CPU interpreter (no numbers)
Not a test: pytest collects nothing here.
"""
import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from machine import versions  # noqa: E402
from verify_gpu_table import _entry, _time, copy_bandwidth, make_logits  # noqa: E402

from specdec_fast.kernels import make_sampling_tensors  # noqa: E402
from specdec_fast.kernels.verify import chain_verify_reference, sample_reference  # noqa: E402

MODES = {"greedy": dict(temperature=0.0), "T=1": {}, "top_k=50": dict(top_k=50)}
SHAPES = [(batch, 4, vocab) for vocab in (32000, 128256) for batch in (1, 8, 64)]


def main(argv=None) -> dict:
    from specdec_fast.kernels.verify.triton import chain_verify_triton, sample_triton

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out")
    ap.add_argument("--smoke", action="store_true", help="tiny shape through the interpreter (set TRITON_INTERPRET=1)")
    args = ap.parse_args(argv)
    if not args.smoke and not torch.cuda.is_available():
        raise SystemExit("needs a CUDA device (or --smoke)")
    device = torch.device("cpu" if args.smoke else "cuda")
    bandwidth = copy_bandwidth(device)
    ov = dict(cap=128, num_chunks=2) if args.smoke else {}  # the smoke shape takes the large-vocabulary path
    rows = []
    for batch, k, vocab in [(2, 2, 600)] if args.smoke else SHAPES:
        target, draft, drafts = make_logits(batch, k, vocab, "random", device,
                                            torch.float32 if args.smoke else torch.bfloat16)
        logits = target[:, 0].contiguous()
        positions = torch.zeros(batch, dtype=torch.int64, device=device)
        verify_bytes = (target.numel() + draft.numel()) * target.element_size()
        sample_bytes = logits.numel() * logits.element_size()
        for mode, kw in MODES.items():
            params = make_sampling_tensors(batch, device, seed=1, **kw)
            expected = chain_verify_reference(target, draft, drafts, params)
            expected_sample = sample_reference(logits, params, positions, 2)
            row = dict(B=batch, K=k, V=vocab, mode=mode, verify_bytes=verify_bytes, sample_bytes=sample_bytes)
            for lanes in (True, False):
                name = "lanes" if lanes else "block_loop"
                got = chain_verify_triton(target, draft, drafts, params, stream_lanes=lanes, **ov)
                got_sample = sample_triton(logits, params, positions, 2, stream_lanes=lanes, **ov)
                row[f"tokens_equal_reference_{name}"] = bool(torch.equal(got[0], expected[0])
                                                             and torch.equal(got[1], expected[1])
                                                             and torch.equal(got_sample, expected_sample))
                row[f"verify_{name}"] = _entry(_time(lambda: chain_verify_triton(target, draft, drafts, params,
                                                                                 stream_lanes=lanes, **ov), args.smoke),
                                               verify_bytes, bandwidth)
                row[f"sample_{name}"] = _entry(_time(lambda: sample_triton(logits, params, positions, 2,
                                                                           stream_lanes=lanes, **ov), args.smoke),
                                               sample_bytes, bandwidth)
            rows.append(row)
            v_new, v_old = row["verify_lanes"], row["verify_block_loop"]
            s_new, s_old = row["sample_lanes"], row["sample_block_loop"]
            print(f"B={batch} V={vocab} {mode}: verify lanes {v_new['median_us']:.1f} us "
                  f"({100 * (v_new['fraction_of_roofline'] or 0):.0f}%) vs block loop {v_old['median_us']:.1f} us "
                  f"({100 * (v_old['fraction_of_roofline'] or 0):.0f}%) | sample {s_new['median_us']:.1f} vs "
                  f"{s_old['median_us']:.1f} us | reference tokens: {row['tokens_equal_reference_lanes']} / "
                  f"{row['tokens_equal_reference_block_loop']}", flush=True)
    if args.smoke:
        print("smoke run: not a measurement; nothing written")
        return dict(rows=rows)
    name = torch.cuda.get_device_name(device)
    result = dict(device=name, versions=versions(), copy_bandwidth_bytes_per_s=bandwidth,
                  timer="CUDA graph replay under triton.testing.do_bench: median (us)",
                  roofline="logits bytes read once / measured copy bandwidth", rows=rows)
    out = Path(args.out or Path(__file__).resolve().parent / "results" /
               f"stream_lanes_{name.lower().replace(' ', '_')}.json")
    out.write_text(json.dumps(result, indent=1))
    print(f"wrote {out}")
    return result


if __name__ == "__main__":
    main()
