"""Issue 25's targets against what `bash bench/run_gpu.sh limits` measured, and what the
measurements say about the levers that are off until a GPU times them.

    python bench/issue25_report.py [--results bench/results] [--device h100] [--out FILE.json]

Reads each benchmark's JSON for the device, named as run_gpu.sh writes them (<dev>: the GPU's
name, lower case, spaces as underscores): verify_<dev>.json (bench_verify.py --gpu), profile_step_<dev>.json and
profile_step_b8_<dev>.json (profile_step.py at B = 1 and 8), tree_kernels_<dev>.json
(bench_tree.py --kernels-only), attention_<dev>.json (bench_attention.py --gpu),
stream_lanes_<dev>.json (bench_stream_lanes.py), verify_latency_<dev>.json
(bench_verify_latency.py). A file that is missing, or a row a budget left out, gives "not
measured" for its lines; nothing is estimated.

Prints one markdown table (target, measured, met?) and one of the levers:
  - GEMV_LAYER (runners/paged_llama.py): the GEMV layer's graph replay against the cuBLAS
    layer's at every batch and step width measured, with the same greedy tokens (argmax agreement);
  - GEMV_PDL: the PDL chain against the GEMV layer without it, no error (and GEMV_LAYER on);
  - BLAS_CUBLASLT: the step with torch's matmuls through cuBLASLt against cuBLAS (profile_step's
    "cublaslt" rows; no flag yet: "on" says one is worth adding);
  - MERGE_IN_KERNEL (kernels/attention/triton.py): the in-kernel merge against the merge launch
    per shape, same outputs;
  - TREE_WALK_PARALLEL (kernels/tree_verify/_triton_plan.py WALK_PARALLEL): tree_verify with the
    parallel walk against the scan, N = 64, T = 1 and greedy, same tokens;
  - RESIDUAL_SKIP_IDENTITIES (kernels/tree_verify/_triton_plan.py): tree_verify with the residual
    launches' identity skips against without, the sampled rows, same tokens;
  - RESIDUAL_FUSED (kernels/tree_verify/_triton_plan.py): tree_verify with the residual masses in one
    launch against residual_rows + a launch per k, the sampled rows, same tokens, and no program
    given up at a barrier (the workspace back at zero);
  - TREE_STATS_CHUNKS=<c> (no flag yet: bench_tree.py's STATS_CHUNKS): tree_verify with the statistics
    pass split into c vocab chunks a row against the default split, N = 64, same tokens ("on": a
    wave-fitting rule for the statistics' grid is worth writing);
  - FINISH_SEARCH_TILE=1024, EMIT_SKIP_IDENTITIES, EMIT_ONE_ROW_BLOCK_V=256 (kernels/verify/_triton_plan.py; on
    since an H200 timed them on 2026-11-28) and DEFAULTS_OF_2026_11_28 (the three together):
    bench_verify_latency's ways, each the defaults with the lever flipped: the lever on over off, verify
    and sampler, every batch and mode it measured, the reference's tokens ("on": keep it on);
  - FINISH_GATHER_BLOCK_V=4096 / =8192 (8192 on from B = 64 since an H200 timed it on 2026-11-30) and
    EMIT_SAMPLER_EXP_KEYS (on since 2026-11-30, predicted from the sampler's registers, not yet timed): the same
    ways, the lever on over off;
  each "on" where no row is slower by more than NOISE and one is faster by more than NOISE;
  - STREAM_GREEDY_ARGMAX_ONLY (kernels/verify/_triton_plan.py): bench_stream_lanes' greedy rows, each
    loop without the streaming sums over the same loop with them, and bench_tree's greedy rows
    (tree_verify with the flag flipped), the reference's tokens;
  - STREAM_ARGMAX_UNROLL=2 / =4 (kernels/verify/_triton_plan.py): bench_stream_lanes' greedy rows, the
    argmax-only per-lane loop 2 / 4 blocks a step over one, the reference's tokens; "(the plan's)": the plan's
    own loop over one block a step where it unrolls (up to 4 since an H200 timed it on 2026-11-28; the rows
    record the planned unroll), with the greedy rows of `bench_stream_lanes --greedy-batches`
    (stream_lanes_greedy_<device>.json) beside the quick ones;
  - the streaming variants per row: the fastest variant with the reference's tokens;
  - the verify's slowest kernels per batch and mode (verify_kernel_split.py: device time per kernel).
A lever whose measured rows say on while rows it needs were not measured (profile_step at B = 8,
attention shapes a budget left out) reads "incomplete"; flipping any lever is the session's
decision (the suite on CUDA must pass with it on).
"""
import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
NOISE = 0.02  # graph-replay medians of one run agree within ~1-2% (bench/results/h100_2026-11-23)
ARGMAX_AGREEMENT = 0.99  # bf16 roundings of two product orders may flip a near-tie, rarely

VERIFY_TARGETS_B1_US = {"greedy": 8.0, "T=1": 15.0, "top_k=50": 30.0, "top_p=0.9": 30.0}
VERIFY_TARGET_B64_ROOFLINE = {"greedy": 0.60, "T=1": 0.60}
PLAIN_TARGET = {1: 0.85, 8: 0.80}  # fraction of the HBM ceiling, B = 1 / 8
TREE_TARGET_RATIO = 2.0  # tree_verify T=1 N=64 over chain_verify K=8, B = 1


def load(results: Path, name: str, device: str) -> dict | None:
    """results/<name>_<device>.json (as run_gpu.sh names it), parsed, or None."""
    path = results / f"{name}_{device}.json"
    return json.loads(path.read_text()) if path.exists() else None


def _line(rows: list, what: str, measured: float | None, target: str, met: bool | None, fmt: str) -> None:
    rows.append({"what": what, "measured": None if measured is None else float(fmt.format(measured)),
                 "target": target, "met": met})


def verify_lines(report: dict | None, rows: list) -> None:
    """B = 1 latency (the engine's call: prepared, workspace; greedy also without draft logits) and
    B = 64 roofline fractions, V = 128256, K = 4."""
    by_key = {(r["B"], r["V"], r["mode"]): r for r in (report or {}).get("results", [])}
    for mode, target in VERIFY_TARGETS_B1_US.items():
        row = by_key.get((1, 128256, mode))
        columns = ["triton", "triton_no_draft_logits"] if mode == "greedy" else ["triton"]
        for column in columns:
            entry = (row or {}).get("verify", {}).get(column, {})
            us = entry.get("median_us")
            ok = None if us is None else us <= target and row["tokens_equal_reference"]
            _line(rows, f"verify B=1 {mode} ({column}) us", us, f"<= {target:g}", ok, "{:.1f}")
    for mode, target in VERIFY_TARGET_B64_ROOFLINE.items():
        row = by_key.get((64, 128256, mode))
        frac = (row or {}).get("verify", {}).get("triton", {}).get("fraction_of_roofline")
        ok = None if frac is None else frac >= target and row["tokens_equal_reference"]
        _line(rows, f"verify B=64 {mode} fraction of roofline", frac, f">= {target:g}", ok, "{:.3f}")


def plain_lines(reports: dict, rows: list) -> None:
    """Plain decoding's fraction of the HBM ceiling at N = 1: the best of the layer forms."""
    for batch, target in PLAIN_TARGET.items():
        step = ((reports.get(batch) or {}).get("steps") or {}).get("N=1")
        forms = {}
        if step:
            forms["cublas"] = step.get("fraction_of_hbm_ceiling")
            for key in ("gemv_layer", "gemv_layer_pdl"):
                forms[key] = (step.get(key) or {}).get("fraction_of_hbm_ceiling")
        forms = {k: v for k, v in forms.items() if v is not None}
        best = max(forms.values()) if forms else None
        name = max(forms, key=forms.get) if forms else "-"
        _line(rows, f"plain decoding B={batch} fraction of HBM ceiling (best: {name})", best, f">= {target:g}",
              None if best is None else best >= target, "{:.3f}")


def _tree_row(report: dict | None, **match) -> dict | None:
    """bench_tree's first kernel row at batch 1, T = 1, with the given fields (nodes=64 / chain_k=8)."""
    return next((r for r in (report or {}).get("rows", []) if r.get("batch") == 1 and r.get("mode") == "T=1"
                 and all(r.get(k) == v for k, v in match.items())), None)


def tree_lines(report: dict | None, rows: list) -> None:
    """The tree's ratio; met only where both calls gave the reference's tokens (bench_tree's
    tokens_equal_reference on each row)."""
    chain_row, tree_row = _tree_row(report, chain_k=8) or {}, _tree_row(report, nodes=64) or {}
    chain, tree = chain_row.get("chain_verify_us"), tree_row.get("tree_verify_us")
    ratio = tree / chain if tree is not None and chain else None
    exact = chain_row.get("tokens_equal_reference") is True and tree_row.get("tokens_equal_reference") is True
    _line(rows, "tree_verify T=1 N=64 over chain_verify K=8, B=1", ratio, f"<= {TREE_TARGET_RATIO:g}",
          None if ratio is None else ratio <= TREE_TARGET_RATIO and exact, "{:.2f}")


def tree_kernel_split(report: dict | None) -> list:
    """The tree_verify T=1 N=64 B=1 row's device time per kernel (bench_tree's tree_kernels:
    [kernel, launches, us] per call), slowest first: which launch the 2x target waits on."""
    census = (_tree_row(report, nodes=64) or {}).get("tree_kernels") or {}
    return [{"kernel": name.removeprefix("other: "), "launches": launches, "us": round(us, 1)}
            for name, launches, us in census.get("families_count_us", [])]


def verify_kernel_split(report: dict | None, top: int = 3) -> list:
    """verify_kernel_split.py's rows: per batch and mode, the verify's device time (the GPU's busy time a
    call) and its ``top`` slowest kernels [kernel, launches, us], the reference's tokens or not."""
    out = []
    for r in (report or {}).get("rows", []):
        census = r.get("verify") or {}
        out.append({"row": f"B={r['B']} {r['mode']}", "busy_us": round(1e3 * census["gpu_busy_ms"], 1)
                    if "gpu_busy_ms" in census else None,
                    "kernels": [[name, launches, round(us, 1)] for name, launches, us in
                                census.get("families_count_us", [])[:top]],
                    "error": census.get("error"), "tokens_equal_reference": r.get("tokens_equal_reference")})
    return out


def gemv_levers(reports: dict) -> dict:
    """GEMV_LAYER / GEMV_PDL from profile_step's rows (every batch and step width measured)."""
    steps = [(batch, n, row) for batch, rep in reports.items() if rep
             for n, row in (rep.get("steps") or {}).items()]
    missing = [f"B={batch} not measured" for batch, rep in reports.items() if not rep]
    layer, pdl, why_layer, why_pdl = {}, {}, [], []
    for batch, n, row in steps:
        base, gemv, chain = row.get("graph_ms"), row.get("gemv_layer") or {}, row.get("gemv_layer_pdl") or {}
        where = f"B={batch} {n}"
        if base is None or "graph_ms" not in gemv:
            why_layer.append(f"{where}: GEMV layer not measured")
            continue
        agree = gemv.get("argmax_agreement", 0.0)
        layer[where] = gemv["graph_ms"] / base
        if agree < ARGMAX_AGREEMENT:
            why_layer.append(f"{where}: argmax agreement {agree:.3f} < {ARGMAX_AGREEMENT}")
        if "error" in chain:
            why_pdl.append(f"{where}: {chain['error'][:120]}")
        elif "graph_ms" in chain:
            pdl[where] = chain["graph_ms"] / gemv["graph_ms"]
            if chain.get("argmax_agreement", 0.0) < ARGMAX_AGREEMENT:
                why_pdl.append(f"{where}: argmax agreement {chain['argmax_agreement']:.3f}")
        else:
            why_pdl.append(f"{where}: PDL chain not measured")
    out = {}
    for name, ratios, why, over in (("GEMV_LAYER", layer, why_layer, "the cuBLAS layer"),
                                    ("GEMV_PDL", pdl, why_pdl, "the GEMV layer without PDL")):
        out[name] = _advice(ratios, why, f"graph ms over {over}", missing)
    if out["GEMV_LAYER"]["advice"] != "on" and out["GEMV_PDL"]["advice"] in ("on", "incomplete"):
        out["GEMV_PDL"]["advice"] = "off"
        out["GEMV_PDL"]["why"].append("needs GEMV_LAYER on")
    return out


def blas_lever(reports: dict) -> dict:
    """BLAS_CUBLASLT (not a flag yet: runners/paged_llama.py would set torch's preferred BLAS library for
    its captures) from profile_step's "cublaslt" rows: graph ms with cuBLASLt's matmuls over cuBLAS's, every
    batch and step width measured."""
    ratios, why = {}, []
    missing = [f"B={batch} not measured" for batch, rep in reports.items() if not rep]
    for batch, rep in reports.items():
        for n, row in ((rep or {}).get("steps") or {}).items():
            lt = row.get("cublaslt") or {}
            if "error" in lt:
                why.append(f"B={batch} {n}: {lt['error'][:120]}")
            elif row.get("graph_ms") and "graph_ms" in lt:
                ratios[f"B={batch} {n}"] = lt["graph_ms"] / row["graph_ms"]
    return _advice(ratios, why, "graph ms with cuBLASLt's matmuls over cuBLAS's", missing)


def walk_lever(report: dict | None) -> dict:
    """TREE_WALK_PARALLEL (kernels/tree_verify/_triton_plan.py WALK_PARALLEL) from bench_tree's
    kernel rows: tree_verify with the parallel walk over the scan, same tokens."""
    ratios, why = {}, []
    for r in (report or {}).get("rows", []):
        if r.get("nodes") is None or "tree_verify_us_walk_parallel" not in r:
            continue
        where = f"B={r['batch']} N={r['nodes']} {r['mode']}"
        ratios[where] = r["tree_verify_us_walk_parallel"] / r.get("tree_verify_us_walk_scan", r["tree_verify_us"])
        if not r.get("walk_parallel_tokens_equal", False):
            why.append(f"{where}: other tokens than the scan")
    return _advice(ratios, why, "tree_verify us with the parallel walk over the scan")


def tree_flip_ratios(report: dict | None, name: str, flipped_what: str, prefix: str = "") -> tuple[dict, list]:
    """(ratios, why) of a lever bench_tree times flipped beside its default on some kernel rows:
    tree_verify_us_<name>_flipped, <name>_default (the lever's default), <name>_flipped_tokens_equal,
    <name>_flipped_error; each ratio the lever on over off; prefix: before each row's name."""
    ratios, why = {}, []
    for r in (report or {}).get("rows", []):
        where = f"{prefix}B={r['batch']} N={r['nodes']} {r['mode']}"
        if f"{name}_flipped_error" in r:
            why.append(f"{where}: {r[f'{name}_flipped_error']}")
        if r.get("nodes") is None or f"tree_verify_us_{name}_flipped" not in r:
            continue
        flipped, default = r[f"tree_verify_us_{name}_flipped"], r["tree_verify_us"]
        ratios[where] = default / flipped if r.get(f"{name}_default") else flipped / default
        if not r.get(f"{name}_flipped_tokens_equal", False):
            why.append(f"{where}: other tokens with the {flipped_what} flipped")
    return ratios, why


def tree_skip_lever(report: dict | None) -> dict:
    """RESIDUAL_SKIP_IDENTITIES (kernels/tree_verify/_triton_plan.py) from bench_tree's sampled kernel
    rows: tree_verify with the residual launches' identity skips over without them, same tokens
    (the row times the flipped default beside the default)."""
    ratios, why = tree_flip_ratios(report, "skip_identities", "skips")
    return _advice(ratios, why, "tree_verify us with the residual launches' identity skips over without")


def tree_fused_lever(report: dict | None) -> dict:
    """RESIDUAL_FUSED (kernels/tree_verify/_triton_plan.py) from bench_tree's sampled kernel rows:
    tree_verify with the residual masses in one launch over residual_rows + one launch per k, same
    tokens, and the workspace back at zero after the fused calls (a program that gave up waiting at
    a barrier leaves a count there: its results were wrong, whatever the tokens)."""
    ratios, why = tree_flip_ratios(report, "residual_fused", "residual launches fused")
    for r in (report or {}).get("rows", []):
        if r.get("residual_fused_workspace_zero") is False:
            why.append(f"B={r['batch']} N={r['nodes']} {r['mode']}: a program gave up at the fused launch's barrier")
    return _advice(ratios, why, "tree_verify us with the residual masses in one launch over a launch per k")


def tree_stats_chunks_levers(report: dict | None) -> dict:
    """TREE_STATS_CHUNKS=<c> from bench_tree's N = 64 kernel rows: tree_verify with the statistics pass
    in c vocab chunks a row over the default split (stats_chunks_default), the same tokens."""
    found = {}
    for r in (report or {}).get("rows", []):
        for key in r:
            if key.startswith("stats_chunks_") and key.endswith(("_tokens_equal", "_error")):
                found.setdefault(int(key.split("_")[2]), []).append(r)
    if not found:
        return {"TREE_STATS_CHUNKS": _advice({}, [], "tree_verify us with the statistics in other chunks a row "
                                                     "over the default split")}
    levers = {}
    for chunks, rows in sorted(found.items()):
        ratios, why = {}, []
        for r in rows:
            where = f"B={r['batch']} N={r['nodes']} {r['mode']} (default {r.get('stats_chunks_default')} chunks)"
            if f"stats_chunks_{chunks}_error" in r:
                why.append(f"{where}: {r[f'stats_chunks_{chunks}_error']}")
            if f"tree_verify_us_stats_chunks_{chunks}" in r:
                ratios[where] = r[f"tree_verify_us_stats_chunks_{chunks}"] / r["tree_verify_us"]
                if not r.get(f"stats_chunks_{chunks}_tokens_equal", False):
                    why.append(f"{where}: other tokens with {chunks} chunks")
        levers[f"TREE_STATS_CHUNKS={chunks}"] = _advice(
            ratios, why, f"tree_verify us with the statistics in {chunks} chunks a row over the default split")
    return levers


def merge_lever(report: dict | None) -> dict:
    """MERGE_IN_KERNEL from bench_attention's rows (the automatic plans of both forms). The flag
    changes every shape's plan; the shapes the run left out (--quick: B = 32, 2k and 32k contexts;
    a budget) are named in the report's not_run / selection, not guessed."""
    rows = (report or {}).get("results", [])
    missing = [f"not run: {', '.join(report['not_run'])}"] if report and report.get("not_run") else []
    ratios, why = {}, []
    for r in rows:
        for n in (1, 5):
            if f"in_kernel_N{n}_us" in r and f"triton_N{n}_us" in r:
                ratios[f"B={r['B']} {r['context']} N={n}"] = r[f"in_kernel_N{n}_us"] / r[f"triton_N{n}_us"]
            for key, which in (("in_kernel_max_abs_diff", "the two merges"), ("sweep_max_abs_diff", "forced splits")):
                diff = r.get(f"{key}_N{n}")
                if diff is not None and diff > 2e-2:  # bf16 outputs of fp32 partials merged in another order
                    why.append(f"B={r['B']} context={r['context']} N={n}: {which}' outputs differ by {diff:.3g}")
    return _advice(ratios, why, "in-kernel merge us over the merge launch", missing)


def latency_lever(report: dict | None, way: str, what: str) -> dict:
    """A lever of bench_verify_latency.py (way: the defaults with the lever flipped, e.g. search_tile ->
    _triton_plan.FINISH_SEARCH_TILE): its verify and sampler times with the lever on over off in every
    row measured (the row's <way>_default_on says which of "now" and the way has it on; rows of an
    earlier run without it timed a candidate that was off), with the reference's tokens."""
    ratios, why = {}, []
    for r in (report or {}).get("rows", []):
        if f"error_{way}" in r:
            why.append(f"B={r['B']} {r['mode']}: {r[f'error_{way}']}")
        if f"verify_{way}_us" not in r or "verify_now_us" not in r:
            continue
        where = f"B={r['B']} {r['mode']}"
        on, off = ("now", way) if r.get(f"{way}_default_on", False) else (way, "now")
        for call in ("verify", "sample"):
            ratios[f"{where} {call}"] = r[f"{call}_{on}_us"] / r[f"{call}_{off}_us"]
        if not r.get(f"tokens_equal_reference_{way}", False):
            why.append(f"{where}: other tokens than the reference")
    missing = [f"not run: {', '.join(report['not_run'])}"] if report and report.get("not_run") else []
    return _advice(ratios, why, what, missing)


def _advice(ratios: dict, why: list, what: str, missing: list = ()) -> dict:
    """ratios: row -> the lever's time over the default's. on: no row slower by more than NOISE, one
    faster by more than NOISE, nothing in why; off: measured and not so; incomplete: would be on,
    but rows it needs were not measured (missing); unmeasured: no ratio."""
    if not ratios:
        return {"advice": "unmeasured", "ratios": {}, "what": what, "why": why + list(missing)}
    faster = max(ratios.values()) <= 1 + NOISE and min(ratios.values()) < 1 - NOISE
    advice = "off" if not faster or why else "incomplete" if missing else "on"
    return {"advice": advice, "ratios": {k: round(v, 3) for k, v in ratios.items()}, "what": what,
            "why": why + list(missing)}


def _variant_ratios(report: dict | None, pairs, ratios: dict, why: list) -> list:
    """Into ``ratios`` ("B=.. V=.. mode label call" -> variant over base, verify and sampler) and ``why``
    (other tokens than the reference), for each bench_stream_lanes row holding both: pairs of
    (variant, bases, label), the first of the bases the row has. Returns what the run left out (its
    budget's not_run)."""
    for r in (report or {}).get("rows", []):
        for variant, bases, label in pairs:
            base = next((b for b in bases if f"verify_{b}" in r), None)
            if f"verify_{variant}" not in r or base is None:
                continue
            where = f"B={r['B']} V={r['V']} {r['mode']} {label}"
            for call in ("verify", "sample"):
                ratios[f"{where} {call}"] = r[f"{call}_{variant}"]["median_us"] / r[f"{call}_{base}"]["median_us"]
            if not r.get(f"tokens_equal_reference_{variant}", False):
                why.append(f"{where}: other tokens than the reference")
    return [f"not run: {', '.join(report['not_run'])}"] if report and report.get("not_run") else []


def argmax_lever(report: dict | None, tree: dict | None = None) -> dict:
    """STREAM_GREEDY_ARGMAX_ONLY (kernels/verify/_triton_plan.py) from bench_stream_lanes' greedy rows:
    each loop without its sums over the same loop with them (lanes_argmax_only / lanes_sums,
    block_argmax_only / block_sums; files written before those two existed, when the default kept the
    sums: over lanes / block_loop), verify and sampler, the reference's tokens; and from bench_tree's
    greedy kernel rows (tree): tree_verify without the sums over with them (the row times the flip
    beside the default)."""
    ratios, why = tree_flip_ratios(tree, "argmax_only", "sums", prefix="tree ")
    missing = _variant_ratios(report, [("lanes_argmax_only", ("lanes_sums", "lanes"), "lanes"),
                                       ("block_argmax_only", ("block_sums", "block_loop"), "block_loop")], ratios, why)
    return _advice(ratios, why, "us without the streaming sums over with them (greedy rows)", missing)


def argmax_unroll_lever(report: dict | None, unroll: int) -> dict:
    """STREAM_ARGMAX_UNROLL=<unroll> (kernels/verify/_triton_plan.py) from bench_stream_lanes' greedy rows:
    the argmax-only per-lane loop ``unroll`` blocks a step over one block a step, verify and sampler, the
    reference's tokens."""
    ratios, why = {}, []
    missing = _variant_ratios(report, [(f"lanes_argmax_only_unroll{unroll}", ("lanes_argmax_only",), "lanes")],
                              ratios, why)
    return _advice(ratios, why, f"us of the argmax-only stream {unroll} blocks a step over 1 (greedy rows)", missing)


def argmax_unroll_rule_lever(report: dict | None) -> dict:
    """STREAM_ARGMAX_UNROLL as the plan takes it (at most what leaves a lane two steps, the cheapest rounding by
    STREAM_ARGMAX_STEP_COST, the lanes rounded up to whole steps: _triton_plan) from bench_stream_lanes' greedy rows
    that record it (planned_unroll_verify / _sample): the plan's own loop ("lanes": its unroll and its rounded
    lanes) over the same loop one block a step ("lanes_argmax_only"), the calls the plan unrolls, the reference's
    tokens ("on": keep the rule). Not the pinned lanes_argmax_only_unroll<n>: a pinned unroll is not rounded
    (B = 128's lanes of 63 blocks would run it one block a step)."""
    ratios, why = {}, []
    for r in (report or {}).get("rows", []):
        for call in ("verify", "sample"):
            n = r.get(f"planned_unroll_{call}", 1)
            if n == 1 or f"{call}_lanes" not in r or f"{call}_lanes_argmax_only" not in r:
                continue
            where = f"B={r['B']} V={r['V']} {r['mode']} {call} {n} blocks a step"
            ratios[where] = r[f"{call}_lanes"]["median_us"] / r[f"{call}_lanes_argmax_only"]["median_us"]
            if not r.get("tokens_equal_reference_lanes", False):
                why.append(f"{where}: other tokens than the reference")
    missing = [f"not run: {', '.join(report['not_run'])}"] if report and report.get("not_run") else []
    return _advice(ratios, why, "us of the argmax-only stream as planned over 1 block a step (greedy rows)", missing)


def stream_variants(report: dict | None) -> list:
    """Per row of bench_stream_lanes: the plan's loop ('lanes') and the fastest variant with the
    reference's tokens."""
    out = []
    for r in (report or {}).get("rows", []):
        times = {k.removeprefix("verify_"): v["median_us"] for k, v in r.items()
                 if k.startswith("verify_") and isinstance(v, dict) and "median_us" in v
                 and r.get(f"tokens_equal_reference_{k.removeprefix('verify_')}")}
        if "lanes" not in times:
            continue
        best = min(times, key=times.get)
        out.append({"row": f"B={r['B']} V={r['V']} {r['mode']}", "lanes_us": round(times["lanes"], 1), "best": best,
                    "best_us": round(times[best], 1), "best_over_lanes": round(times[best] / times["lanes"], 3)})
    return out


def suite_line(results: Path, device: str) -> str | None:
    """The last line of the suite's log on the device (gpu_tests_<dev>.log), if there is one."""
    log = results / f"gpu_tests_{device}.log"
    lines = [line for line in log.read_text(errors="replace").splitlines() if line.strip()] if log.exists() else []
    return lines[-1] if lines else None


# bench_verify_latency's ways as levers: name -> (way, what its ratios are: the lever on over off)
LATENCY_LEVERS = {
    "FINISH_SEARCH_TILE=1024": ("search_tile", "us with the finishing launch's fused search over without"),
    "EMIT_SKIP_IDENTITIES": ("emit_skip_identities", "us with the emission's identity skips over without"),
    "EMIT_ONE_ROW_BLOCK_V=256": ("emit_one_row_block", "B = 1 us with the emission in blocks of 256 over 1024"),
    "DEFAULTS_OF_2026_11_28": ("earlier_defaults", "us with the three levers above over the plan before them"),
    "FINISH_GATHER_BLOCK_V=4096": ("finish_gather_4096", "us with the finishing launch's second pass in blocks of "
                                                          "4096 over 2048"),
    "FINISH_GATHER_BLOCK_V=8192": ("finish_gather_8192", "us with the finishing launch's second pass in blocks of "
                                                          "8192 over 2048"),
    # the verify's columns run the same plan both ways (its keys stay the probability): the sampler's decide
    "EMIT_SAMPLER_EXP_KEYS": ("emit_prob_keys", "us with the draft sampler's keys weighted by exp(std - m) over "
                                                "the probability (verify: the same plan)"),
}


def build(results: Path, device: str) -> dict:
    verify = load(results, "verify", device)
    plain = {1: load(results, "profile_step", device), 8: load(results, "profile_step_b8", device)}
    rows: list = []
    verify_lines(verify, rows)
    plain_lines(plain, rows)
    tree = load(results, "tree_kernels", device)
    tree_lines(tree, rows)
    latency = load(results, "verify_latency", device)
    lanes = load(results, "stream_lanes", device)
    greedy_lanes = load(results, "stream_lanes_greedy", device)  # bench_stream_lanes --greedy-batches: the rule's rows
    unroll_rows = {"rows": (lanes or {}).get("rows", []) + (greedy_lanes or {}).get("rows", []),
                   "not_run": (lanes or {}).get("not_run", []) + (greedy_lanes or {}).get("not_run", [])}
    return {"device": device, "targets": rows, "levers": {**gemv_levers(plain), "BLAS_CUBLASLT": blas_lever(plain),
                                                          "MERGE_IN_KERNEL": merge_lever(load(results, "attention", device)),
                                                          "TREE_WALK_PARALLEL": walk_lever(tree),
                                                          "RESIDUAL_SKIP_IDENTITIES": tree_skip_lever(tree),
                                                          "RESIDUAL_FUSED": tree_fused_lever(tree),
                                                          **tree_stats_chunks_levers(tree),
                                                          **{name: latency_lever(latency, way, what)
                                                             for name, (way, what) in LATENCY_LEVERS.items()},
                                                          "STREAM_GREEDY_ARGMAX_ONLY": argmax_lever(lanes, tree),
                                                          **{f"STREAM_ARGMAX_UNROLL={n}": argmax_unroll_lever(lanes, n)
                                                             for n in (2, 4)},
                                                          "STREAM_ARGMAX_UNROLL (the plan's)": argmax_unroll_rule_lever(unroll_rows)},
            "stream_variants": stream_variants(lanes),
            "verify_kernels": verify_kernel_split(load(results, "verify_kernels", device)),
            "tree_kernels": tree_kernel_split(tree),
            "suite": suite_line(results, device)}


def markdown(report: dict) -> str:
    mark = {True: "yes", False: "no", None: "not measured"}
    lines = [f"Issue 25 on {report['device']}", "", "| target | measured | goal | met |", "|---|---|---|---|"]
    for r in report["targets"]:
        lines.append(f"| {r['what']} | {'-' if r['measured'] is None else r['measured']} | {r['target']} | {mark[r['met']]} |")
    lines += ["", "| lever | advice | ratios | why not |", "|---|---|---|---|"]
    for name, lever in report["levers"].items():
        ratios = ", ".join(f"{row} {ratio}" for row, ratio in lever["ratios"].items()) or "-"
        lines.append(f"| {name} | {lever['advice']} | {lever['what']}: {ratios} | {'; '.join(lever['why'])} |")
    if report["stream_variants"]:
        lines += ["", "| streaming row | lanes us | fastest | us | over lanes |", "|---|---|---|---|---|"]
        lines += [f"| {v['row']} | {v['lanes_us']} | {v['best']} | {v['best_us']} | {v['best_over_lanes']} |"
                  for v in report["stream_variants"]]
    if report["tree_kernels"]:
        lines += ["", "| tree_verify T=1 N=64 B=1 kernel | launches | us (eager, per call) |", "|---|---|---|"]
        lines += [f"| {k['kernel']} | {k['launches']:g} | {k['us']} |" for k in report["tree_kernels"]]
    if report.get("verify_kernels"):
        lines += ["", "| verify row | GPU busy us | slowest kernels (launches, us per call) | reference's tokens |",
                  "|---|---|---|---|"]
        lines += [f"| {v['row']} | {'-' if v['busy_us'] is None else v['busy_us']} | "
                  f"{'; '.join(f'{n} x{c:g} {u}' for n, c, u in v['kernels']) or v['error'] or '-'} | "
                  f"{mark[v['tokens_equal_reference']]} |" for v in report["verify_kernels"]]
    lines += ["", f"suite: {report['suite'] or 'no log'}"]
    return "\n".join(lines)


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--results", default=str(ROOT / "bench" / "results"))
    ap.add_argument("--device", default=None, help="<dev> of the file names, e.g. nvidia_h100_80gb_hbm3 (default: "
                                                  "this machine's GPU)")
    ap.add_argument("--out", help="also write the report as JSON here")
    args = ap.parse_args(argv)
    device = args.device
    if device is None:
        import torch

        if not torch.cuda.is_available():
            sys.exit("no GPU here: name the device of the files (--device h100)")
        device = torch.cuda.get_device_name().lower().replace(" ", "_")
    report = build(Path(args.results), device.lower())
    print(markdown(report))
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=1) + "\n")
    return report


if __name__ == "__main__":
    main()
