"""The arguments the mode benchmarks share (bench_delta_rule / bench_mamba2 / bench_mla / bench_mla_prefill / bench_moe /
bench_ring_prefill): one run mode (--cpu / --gpu / --smoke), --out and --budget-s, the checks each mode
needs, and the results file a device's run writes by default."""
import argparse
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]


def mode_parser(doc: str, stem: str, **modes: str) -> argparse.ArgumentParser:
    """An ArgumentParser with one required mode of ``modes`` (cpu / gpu / smoke -> its help), --out (default
    bench/results/<stem>_<device>.json) and --budget-s; the benchmark adds its own arguments."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    group = parser.add_mutually_exclusive_group(required=True)
    for name, help_text in modes.items():
        group.add_argument(f"--{name}", action="store_true", help=help_text)
    parser.add_argument("--out", help=f"JSON path (default bench/results/{stem}_<device>.json)")
    parser.add_argument("--budget-s", type=float, default=float("inf"), help="no new row after this many s")
    return parser


def check_mode(args) -> None:
    """Exits naming why: --smoke without --out (a smoke run is no measurement for bench/results), --gpu without
    a CUDA device."""
    if getattr(args, "smoke", False) and not args.out:
        sys.exit("--smoke needs --out (a smoke run is not a measurement for bench/results)")
    if getattr(args, "gpu", False) and not torch.cuda.is_available():
        other = " or ".join(f"--{m}" for m in ("cpu", "smoke") if hasattr(args, m))
        sys.exit(f"--gpu needs a CUDA device (or {other} on the CPU)")


def mode_device(args) -> tuple:
    """The run mode's (device "cuda" / "cpu", its name for the results, its synchronize: a no-op on the CPU)."""
    if args.gpu:
        return "cuda", torch.cuda.get_device_name(), torch.cuda.synchronize
    return "cpu", "cpu", lambda: None


def results_path(out: str | None, stem: str, device_name: str) -> Path:
    """--out, or bench/results/<stem>_<device name, spaces and slashes as _>.json."""
    tag = device_name.replace(" ", "_").replace("/", "_")
    return Path(out) if out else ROOT / "bench" / "results" / f"{stem}_{tag}.json"


def triton_runs(device) -> bool:
    """The Triton kernels run on ``device``: CUDA, or the interpreter (TRITON_INTERPRET=1, as the test suite sets:
    a --smoke run's Triton ways then run interpreted)."""
    from specdec_fast.kernels._backend import triton_available, triton_interpreting

    return triton_available() and (str(device).startswith("cuda") or triton_interpreting())
