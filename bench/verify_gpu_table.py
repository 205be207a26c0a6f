"""The GPU table of the verify step and the draft sampler (issue 12), for bench_verify.py --gpu.

For B in {1, 8, 64}, V in {32000, 128256}, K = 4, bf16 logits and the sampling modes below:
the engine's prepared path (chain_verify_triton / sample_triton with SamplingTensors made
once and a KernelWorkspace: no zero fill; "triton_zero_fill": the same call without one, as a
plain caller makes it) beside the torch reference (the spec), plain PyTorch (verify_anchors.py) and FlashInfer
(when importable), each captured in a CUDA graph and replayed under triton.testing.do_bench
(median and 20/80% quantiles; eager do_bench, flagged, when a capture fails; do_bench flushes
L2 before every replay, so even B = 1 reads its logits from HBM, where the engine would find
them L2-hot just after the LM head). Bandwidth is the
logits read once (target + draft for verify, one row per batch row for sample) over the time;
the roofline divides those bytes by this device's measured bandwidth (the larger of a copy's
and a sum's: gpu_timing.hbm_ceiling_bandwidth). Greedy rows also time
"triton_no_draft_logits": the call as the engine makes it when every row is greedy (its
ModelDrafter keeps no draft logits then; p is one-hot at the draft token), 5 of the 9
distributions at K = 4, its bandwidth over the target logits alone. Each row also says
whether our tokens equal the reference's and how the Triton kernels settled the thresholds
(kernels/verify/_triton_select_finish.py paths: top set / gathered by chunks / fallback sweeps), and the
plan (verify_plan: launches, passes over the logits) the timing should be read against.
Greedy and plain (T > 0 without top-k / top-p / min-p) rows also time the Triton column with
the host modes withheld ("triton_modes_unknown": SamplingTensors.modes = None, every launch):
what leaving out the finishing launch (and, greedy, the emission launch) saves.

--smoke runs the same code on tiny shapes on CPU under the Triton interpreter, timing single
calls with a wall clock: it proves the script runs, not how fast anything is.

--data random: target logits N(0, 3^2), draft = target + N(0, 1) (the issue's measurements);
--data peaked: an LLM-like profile (8 tokens 10-16 above a N(0, 1.5^2) bulk: ~90% of the mass).
"""
import argparse
import dataclasses
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_timing import RowBudget, hbm_ceiling_bandwidth  # noqa: E402
from machine import versions  # noqa: E402
from verify_anchors import flashinfer_fns, torch_sample, torch_verify  # noqa: E402

from specdec_fast.kernels import make_sampling_tensors  # noqa: E402
from specdec_fast.kernels.verify import chain_verify_reference, sample_reference  # noqa: E402

MODES = {
    "greedy": dict(temperature=0.0),
    "T=1": {},
    "top_k=50": dict(top_k=50),
    "top_k=1000": dict(top_k=1000),
    "top_p=0.9": dict(top_p=0.9),
    "min_p=0.1": dict(min_p=0.1),
    "top_k=50+top_p=0.9": dict(top_k=50, top_p=0.9),
}
GPU_SHAPES = [(batch, 4, vocab) for vocab in (32000, 128256) for batch in (1, 8, 64)]
# --smoke: every mode on a small vocabulary (the one-kernel path), two modes on V = 600 with the
# candidate region forced down to 128 (the streaming + finishing kernels).
SMOKE_SHAPES = [(2, 2, 64), (1, 1, 600)]
# --quick: the rows issue 25 sets targets for (B = 1 and 64 at V = 128256; greedy, T = 1, top-k, top-p)
QUICK_SHAPES = [(1, 4, 128256), (64, 4, 128256)]
QUICK_MODES = ("greedy", "T=1", "top_k=50", "top_p=0.9")
SMOKE_CAP = 128
SMOKE_LARGE_MODES = ("T=1", "top_k=50+top_p=0.9")
PATH_NAMES = {1: "top_set", 2: "gathered_by_chunks", 4: "swept_by_one_program", 8: "single_key"}


def side_by_side_args(doc: str, argv, add=None):
    """(args, device) of a side-by-side verify bench (bench_stream_lanes, bench_verify_latency,
    verify_kernel_split): --out, --smoke (a tiny shape through the CPU interpreter), --budget-s, and what
    add(parser) adds; SystemExit without a CUDA device unless --smoke."""
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out")
    ap.add_argument("--smoke", action="store_true", help="tiny shape through the interpreter (set TRITON_INTERPRET=1)")
    ap.add_argument("--budget-s", type=float, default=float("inf"), help="no new row after this many seconds")
    if add is not None:
        add(ap)
    args = ap.parse_args(argv)
    if not args.smoke and not torch.cuda.is_available():
        raise SystemExit("needs a CUDA device (or --smoke)")
    return args, torch.device("cpu" if args.smoke else "cuda")


def make_logits(batch, k, vocab, data, device, dtype, seed=0):
    """(target [B, K+1, V], draft [B, K, V], drafts int64 [B, K] sampled from the draft)."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    if data == "peaked":  # ~90% of the mass on 8 tokens, the rest over a N(0, 1.5^2) bulk
        target = torch.randn(batch, k + 1, vocab, generator=g) * 1.5
        top = torch.randint(0, vocab, (batch, k + 1, 8), generator=g)
        target.scatter_add_(-1, top, 10 + 6 * torch.rand(batch, k + 1, 8, generator=g))
    else:
        target = torch.randn(batch, k + 1, vocab, generator=g) * 3
    draft = target[:, :k] + torch.randn(batch, k, vocab, generator=g)
    drafts = torch.multinomial(torch.softmax(draft.reshape(-1, vocab), -1), 1, generator=g).reshape(batch, k)
    return target.to(device, dtype), draft.to(device, dtype), drafts.to(device)


@dataclasses.dataclass
class VerifyCase:
    """One row of a side-by-side verify benchmark: the logits of make_logits, the sampler's input
    (logits [B, V]: target position 0; positions zeros [B]) and the torch reference's answers for
    these sampling params (chain_verify; sample in stream 2)."""

    batch: int
    k: int
    vocab: int
    mode: str
    target: torch.Tensor
    draft: torch.Tensor
    drafts: torch.Tensor
    logits: torch.Tensor
    positions: torch.Tensor
    params: object
    expected: tuple
    expected_sample: torch.Tensor

    def same_tokens(self, got, got_sample) -> bool:
        """chain_verify's (tokens, accepted) and sample's tokens equal the reference's."""
        return bool(torch.equal(got[0], self.expected[0]) and torch.equal(got[1], self.expected[1])
                    and torch.equal(got_sample, self.expected_sample))


def verify_cases(shapes, modes: dict, device, dtype, budget: RowBudget, keep=lambda mode: True):
    """VerifyCase for each (B, K, V) of shapes ("random" logits) and each mode (name -> sampling
    kwargs) that keep(mode) admits and the budget allows (a left-out row is named in budget.not_run)."""
    for batch, k, vocab in shapes:
        target, draft, drafts = make_logits(batch, k, vocab, "random", device, dtype)
        logits = target[:, 0].contiguous()
        positions = torch.zeros(batch, dtype=torch.int64, device=device)
        for mode, kw in modes.items():
            if not keep(mode) or not budget.allows(f"B={batch} K={k} V={vocab} {mode}"):
                continue
            params = make_sampling_tensors(batch, device, seed=1, **kw)
            yield VerifyCase(batch, k, vocab, mode, target, draft, drafts, logits, positions, params,
                             chain_verify_reference(target, draft, drafts, params),
                             sample_reference(logits, params, positions, 2))


def _time(fn, smoke: bool) -> dict:
    """Median / 20% / 80% microseconds of fn(): graph replays under do_bench on a GPU."""
    if smoke:
        fn()
        t0 = time.perf_counter()
        fn()
        us = (time.perf_counter() - t0) * 1e6
        return {"median_us": us, "q20_us": us, "q80_us": us, "timer": "wall clock, one call (smoke)"}
    from triton.testing import do_bench

    try:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):
                fn()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            fn()
        run, timer = graph.replay, "CUDA graph replay, do_bench"
    except Exception as error:  # noqa: BLE001 - some baselines sync or do not capture
        torch.cuda.synchronize()
        run, timer = fn, f"eager do_bench (capture failed: {type(error).__name__}: {str(error)[:120]})"
    median, q20, q80 = do_bench(run, quantiles=[0.5, 0.2, 0.8])
    return {"median_us": median * 1e3, "q20_us": q20 * 1e3, "q80_us": q80 * 1e3, "timer": timer}


def roofline_bandwidth(device) -> dict | None:
    """The roofline's bandwidth (gpu_timing.hbm_ceiling_bandwidth: the larger of a copy's and a
    read's bytes per second; the verify reads its logits and writes a few tokens); None on CPU."""
    return hbm_ceiling_bandwidth(device) if device.type == "cuda" else None


def bandwidth_fields(bandwidth: dict | None) -> dict:
    """The report's fields for roofline_bandwidth's answer."""
    bw = bandwidth or {}
    return {"copy_bandwidth_bytes_per_s": bw.get("copy_Bps"), "read_bandwidth_bytes_per_s": bw.get("read_Bps"),
            "roofline": f"logits bytes read once / measured {bw.get('basis', '-')} bandwidth"}


def _summarise_paths(paths: torch.Tensor) -> dict:
    """How many distributions settled each stage's threshold by each route."""
    out = {}
    for stage, shift in (("top_k", 0), ("top_p", 4), ("min_p", 8)):
        for bit, name in PATH_NAMES.items():
            n = int(((paths >> shift) & bit).ne(0).sum())
            if n:
                out[f"{stage}:{name}"] = n
    return out


def _entry(timing: dict, bytes_read: int, bandwidth) -> dict:
    us = timing["median_us"]
    entry = dict(timing, GB_per_s=bytes_read / (us * 1e-6) / 1e9)
    entry["fraction_of_roofline"] = bytes_read / bandwidth / (us * 1e-6) if bandwidth else None
    return entry


def run_table(smoke: bool = False, data: str = "random", quick: bool = False, budget_s: float = float("inf")) -> dict:
    """The table (see the module doc). quick: issue 25's rows only (QUICK_SHAPES x QUICK_MODES);
    budget_s: no new row starts after that many seconds (the rows so far are returned, and
    "not_run" names the rows left out), so a device call's limit keeps what was measured."""
    from specdec_fast.kernels.verify.triton import KernelWorkspace, chain_verify_triton, sample_triton, verify_plan

    device = torch.device("cpu" if smoke else "cuda")
    if not smoke and not torch.cuda.is_available():
        raise SystemExit("--gpu needs a CUDA device (use --smoke on CPU)")
    dtype = torch.float32 if smoke else torch.bfloat16
    flashinfer, flashinfer_note = None, "not tried (smoke)"
    if not smoke:
        try:
            import flashinfer  # noqa: F401
            flashinfer_note = getattr(flashinfer, "__version__", "unknown version")
        except Exception as error:  # noqa: BLE001 - any import failure means: no column
            flashinfer_note = f"not importable: {type(error).__name__}: {error}"
        print(f"flashinfer: {flashinfer_note}", flush=True)
    measured = roofline_bandwidth(device)
    bandwidth = measured and measured["ceiling_Bps"]
    results, budget = [], RowBudget(budget_s)
    shapes = SMOKE_SHAPES if smoke else QUICK_SHAPES if quick else GPU_SHAPES
    for batch, k, vocab in shapes:
        target, draft, drafts = make_logits(batch, k, vocab, data, device, dtype)
        logits = target[:, 0].contiguous()
        positions = torch.zeros(batch, dtype=torch.int64, device=device)
        target_bytes = target.numel() * target.element_size()
        verify_bytes = target_bytes + draft.numel() * draft.element_size()
        sample_bytes = logits.numel() * logits.element_size()
        for mode, kw in MODES.items():
            if smoke and vocab > 64 and mode not in SMOKE_LARGE_MODES or quick and mode not in QUICK_MODES:
                continue
            if not budget.allows(f"B={batch} K={k} V={vocab} {mode}"):
                continue
            ov = dict(cap=SMOKE_CAP) if smoke else {}
            params = make_sampling_tensors(batch, device, seed=1, **kw)
            full = dict(temperature=kw.get("temperature", 1.0), top_k=kw.get("top_k", 0), top_p=kw.get("top_p", 1.0),
                        min_p=kw.get("min_p", 0.0))
            unknown = dataclasses.replace(params, modes=None)  # every launch, as before the host modes
            ws_verify, ws_sample = KernelWorkspace(), KernelWorkspace()  # the engine's calls: no zero fill
            verify = {
                "triton": lambda: chain_verify_triton(target, draft, drafts, params, workspace=ws_verify, **ov),
                "triton_zero_fill": lambda: chain_verify_triton(target, draft, drafts, params, **ov),
                "reference": lambda: chain_verify_reference(target, draft, drafts, params),
                "torch": lambda: torch_verify(target, draft, drafts, **full),
            }
            sample = {
                "triton": lambda: sample_triton(logits, params, positions, 2, workspace=ws_sample, **ov),
                "triton_zero_fill": lambda: sample_triton(logits, params, positions, 2, **ov),
                "reference": lambda: sample_reference(logits, params, positions, 2),
                "torch": lambda: torch_sample(logits, **full),
            }
            nbytes = {}  # entries that read other bytes than the table's
            if params.modes == {"greedy"}:  # the engine's greedy call: no draft logits (ModelDrafter keeps none)
                ws_greedy = KernelWorkspace()
                verify["triton_no_draft_logits"] = lambda: chain_verify_triton(target, None, drafts, params,
                                                                               workspace=ws_greedy, **ov)
                nbytes["triton_no_draft_logits"] = target_bytes
            if params.modes <= {"greedy", "plain"}:  # launches left out: time the full sequence beside
                verify["triton_modes_unknown"] = lambda: chain_verify_triton(target, draft, drafts, unknown, **ov)
                sample["triton_modes_unknown"] = lambda: sample_triton(logits, unknown, positions, 2, **ov)
            notes = {}
            if flashinfer is not None:
                fi_verify, fi_sample = flashinfer_fns(flashinfer, full)
                for table, fn, name in ((verify, fi_verify, "flashinfer_verify"), (sample, fi_sample, "flashinfer_sample")):
                    if callable(fn):
                        table["flashinfer"] = (lambda f, *a: lambda: f(*a))(fn, *((target, draft, drafts) if table is verify else (logits,)))
                    else:
                        notes[name] = fn
            tokens, accepted, paths = chain_verify_triton(target, draft, drafts, params, return_paths=True, **ov)
            expected = chain_verify_reference(target, draft, drafts, params)
            row = {
                "B": batch, "K": k, "V": vocab, "mode": mode, "dtype": str(dtype).removeprefix("torch."),
                "verify_bytes": verify_bytes, "sample_bytes": sample_bytes,
                "tokens_equal_reference": bool(torch.equal(tokens, expected[0]) and torch.equal(accepted, expected[1])),
                "sample_equal_reference": bool(torch.equal(sample["triton"](), sample["reference"]())),
                "workspace_tokens_equal": bool(all(torch.equal(a, b) for a, b in zip(verify["triton"](), (tokens, accepted)))),
                **({"no_draft_logits_tokens_equal_reference": all(
                    torch.equal(a, b) for a, b in zip(verify["triton_no_draft_logits"](),
                                                      chain_verify_reference(target, None, drafts, params)))}
                   if "triton_no_draft_logits" in verify else {}),
                "threshold_routes": _summarise_paths(paths),
                "plan": verify_plan(batch, k, vocab, True, _plan_modes(kw), workspace=True),
                "launches": {"verify": verify_plan(batch, k, vocab, True, _plan_modes(kw), workspace=True)["launches"],
                             "sample": verify_plan(batch, 0, vocab, False, _plan_modes(kw), workspace=True)["launches"],
                             "verify_zero_fill": verify_plan(batch, k, vocab, True, _plan_modes(kw))["launches"],
                             "verify_modes_unknown": verify_plan(batch, k, vocab, True, None)["launches"],
                             "sample_modes_unknown": verify_plan(batch, 0, vocab, False, None)["launches"],
                             **({"verify_no_draft_logits": verify_plan(batch, k, vocab, False, ("greedy",),
                                                                       workspace=True)["launches"]}
                                if "triton_no_draft_logits" in verify else {})},
                "verify": {}, "sample": {}, "notes": notes,
            }
            for table, key, table_bytes in ((verify, "verify", verify_bytes), (sample, "sample", sample_bytes)):
                for name, fn in table.items():
                    try:
                        row[key][name] = _entry(_time(fn, smoke), nbytes.get(name, table_bytes), bandwidth)
                    except Exception as error:  # noqa: BLE001 - a baseline failing is a result
                        row[key][name] = {"error": f"{type(error).__name__}: {str(error)[:200]}"}
            results.append(row)
            print(_line(row), flush=True)
    return {
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu (Triton interpreter, smoke)",
        "data": data,
        **bandwidth_fields(measured),
        "flashinfer": flashinfer_note,
        "versions": versions(),
        "timer": "CUDA graph replay under triton.testing.do_bench: median, 20/80% quantiles (us)"
        if not smoke else "wall clock of one call after one warm-up (smoke: not a measurement)",
        "selection": "quick (issue 25's rows)" if quick else "full",
        "not_run": budget.not_run,
        "results": results,
    }


def _plan_modes(kw: dict) -> tuple:
    if kw.get("temperature") == 0.0:
        return ("greedy",)
    modes = tuple(m for m in ("top_k", "top_p", "min_p") if m in kw)
    return modes or ("plain",)


def _line(row: dict) -> str:
    def cell(entry):
        if "median_us" not in entry:
            return "error"
        frac = entry.get("fraction_of_roofline")
        return f"{entry['median_us']:.1f} us" + (f" ({100 * frac:.0f}%)" if frac else "")

    verify = ", ".join(f"{n} {cell(e)}" for n, e in row["verify"].items())
    sample = ", ".join(f"{n} {cell(e)}" for n, e in row["sample"].items())
    same = "" if row["tokens_equal_reference"] and row["sample_equal_reference"] else " [tokens differ from the reference]"
    return f"B={row['B']} V={row['V']} {row['mode']}: verify {verify} | sample {sample}{same}"
