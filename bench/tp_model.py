"""A stated model of tensor-parallel decoding on NVLink GPUs: PREDICTIONS, not measurements (no
multi-GPU machine was available). bench/bench_tp.py writes its output beside the CPU (gloo)
measurements.

Per forward of a Llama-shaped model over N ranks (runners/paged_llama_tp.py):
    t = W / N / BW  +  L * t_layer  +  KV / BW  +  (2L + 1) * t_allreduce(T * H * 2 bytes)
        +  t_allgather(T * V * 2 bytes)                                    (the last two: N > 1)
W: the weight bytes a forward streams (every layer + the lm_head; embeddings are rows looked
up, not streamed); KV: this rank's KV-cache bytes read (local KV heads x context x batch); T: the
token rows of the forward (B for plain decoding and draft steps, B (K + 1) for the target's
scoring); bf16 throughout.
    t_allreduce(b) = lat + 2 (N - 1) / N * b / bus        (ring: reduce-scatter + all-gather)
    t_allgather(b) = lat + (N - 1) / N * b / bus          (b: the gathered total)

Calibration, from this project's own H100 measurements (bench/results/h100_2026-11-23/, one
GPU, CUDA graphs): plain decoding of the 8B-shaped model ran at 144.8 tok/s with 15.01 GB of
weights per step; less L * t_layer of launch cost (9 launches per layer at ~2 us per graph node:
engine/loop.py's estimate), that is an effective streaming bandwidth BW = 15.01 GB / (6.91 ms -
0.58 ms) = 2.37 TB/s per GPU, assumed to hold per rank. Verify kernel times (Triton, graph
replay, T=1, V=128256, K=4): 35.7 / 98.1 / 529 us at B = 1 / 8 / 64 (verify_13f7d4f.json; plain
decoding: that file's sample times), interpolated linearly in B.

Assumptions (not measured here; what NCCL's own benchmarks report for 8 H100 SXM on NVSwitch,
order of magnitude): bus bandwidth 360 GB/s for large messages; a small collective costs
lat = 10 us under CUDA graphs (5-20 us: ``latency_us`` may be changed); collectives do not
overlap compute (this runner issues them in line); acceptance alpha of each draft is a free
parameter (Chen et al.'s measured 1.92-2.46x at K = 4 with their c = 1.8 / 14.1 ms imply alpha
~0.66-0.82 under Leviathan's formula).
"""
import json
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results" / "h100_2026-11-23"

SHAPES = {  # Llama 3.x shapes (params: layers + lm_head + embedding)
    "70B": dict(layers=80, hidden=8192, heads=64, kv_heads=8, head_dim=128, inter=28672, vocab=128256),
    "8B": dict(layers=32, hidden=4096, heads=32, kv_heads=8, head_dim=128, inter=14336, vocab=128256),
    "1B": dict(layers=16, hidden=2048, heads=32, kv_heads=8, head_dim=64, inter=8192, vocab=128256),
}
BYTES = 2  # bf16
ASSUMED = dict(bus_GBps=360.0, latency_us=10.0, launch_us_per_layer=18.0, context=1024)
CHEN = dict(xsum_nucleus=1.92, xsum_greedy=2.01, humaneval_nucleus=2.46, k=4, draft_ms=1.8, target_ms=14.1,
            setup="Chinchilla 70B on 16 TPU v4, 4B draft (8 layers), batch 1, K = 4 (Chen et al. 2023, Table 1)")


def layer_params(s: dict) -> int:
    h, d = s["hidden"], s["head_dim"]
    attn = h * s["heads"] * d * 2 + h * s["kv_heads"] * d * 2  # q, o; k, v
    return attn + 3 * h * s["inter"]


def streamed_bytes(s: dict) -> int:
    """Weight bytes one forward streams: every layer and the lm_head."""
    return (s["layers"] * layer_params(s) + s["vocab"] * s["hidden"]) * BYTES


def calibration() -> dict:
    """Effective HBM streaming bandwidth and verify times from the project's H100 files."""
    head = json.loads((RESULTS / "scale_headline_13f7d4f.json").read_text())
    plain = next(r for r in head["rows"] if r["method"] == "ours_plain" and r["batch"] == 1)
    step_s = 1.0 / plain["tokens_per_s"]
    launch_s = SHAPES["8B"]["layers"] * ASSUMED["launch_us_per_layer"] * 1e-6
    verify = json.loads((RESULTS / "verify_13f7d4f.json").read_text())
    rows = [r for r in verify["results"] if r["V"] == 128256 and r["mode"] == "T=1"]
    return dict(bw_Bps=head["weight_bytes_per_step"] / (step_s - launch_s), plain_8b_tok_s=plain["tokens_per_s"],
                weight_bytes_8b=head["weight_bytes_per_step"],
                verify_us_by_batch={r["B"]: r["verify"]["triton"]["median_us"] for r in rows},
                sample_us_by_batch={r["B"]: r["sample"]["triton"]["median_us"] for r in rows},
                source="bench/results/h100_2026-11-23/scale_headline_13f7d4f.json, verify_13f7d4f.json (one H100)")


def allreduce_s(nbytes: float, ranks: int, a: dict) -> float:
    return 0.0 if ranks == 1 else a["latency_us"] * 1e-6 + 2 * (ranks - 1) / ranks * nbytes / (a["bus_GBps"] * 1e9)


def allgather_s(total: float, ranks: int, a: dict) -> float:
    return 0.0 if ranks == 1 else a["latency_us"] * 1e-6 + (ranks - 1) / ranks * total / (a["bus_GBps"] * 1e9)


def verify_s(batch: int, cal: dict, key: str = "verify_us_by_batch") -> float:
    """The measured Triton verify (full vocabulary; key="sample_us_by_batch": plain decoding's
    sample), linear in B between the measured batches."""
    pts = sorted((int(b), t) for b, t in cal[key].items())
    for (b0, t0), (b1, t1) in zip(pts, pts[1:]):
        if batch <= b1:
            return (t0 + (t1 - t0) * (batch - b0) / (b1 - b0)) * 1e-6
    return pts[-1][1] * batch / pts[-1][0] * 1e-6


def forward(shape: str, ranks: int, tokens_per_row: int, batch: int, cal: dict, a: dict = ASSUMED) -> dict:
    """One forward's predicted seconds and its parts (the model in the module docstring)."""
    s = SHAPES[shape]
    rows = tokens_per_row * batch
    local_kv = max(1, s["kv_heads"] // ranks)
    kv = batch * a["context"] * s["layers"] * 2 * local_kv * s["head_dim"] * BYTES
    weights = streamed_bytes(s) / ranks
    reduce_bytes = rows * s["hidden"] * BYTES
    parts = dict(weights_s=weights / cal["bw_Bps"], kv_s=kv / cal["bw_Bps"],
                 launch_s=s["layers"] * a["launch_us_per_layer"] * 1e-6,
                 allreduce_s=(2 * s["layers"] + 1) * allreduce_s(reduce_bytes, ranks, a),
                 gather_s=allgather_s(rows * s["vocab"] * BYTES, ranks, a))
    return dict(parts, total_s=sum(parts.values()), weight_bytes_per_rank=weights,
                allreduce_bytes_per_forward=(2 * s["layers"] + 1) * reduce_bytes if ranks > 1 else 0,
                allreduces=(2 * s["layers"] + 1) if ranks > 1 else 0,
                gather_bytes_per_rank=rows * s["vocab"] * BYTES / ranks if ranks > 1 else 0)


def expected_tokens(alpha: float, k: int) -> float:
    """Leviathan et al.: tokens per iteration with acceptance alpha and K drafts."""
    return (1 - alpha ** (k + 1)) / (1 - alpha)


def speculative(target: str, draft: str, draft_ranks: int, ranks: int, k: int, alpha: float, batch: int, cal: dict,
                a: dict = ASSUMED) -> dict:
    plain = forward(target, ranks, 1, batch, cal, a)["total_s"] + verify_s(batch, cal, "sample_us_by_batch")
    score = forward(target, ranks, k + 1, batch, cal, a)["total_s"]
    draft_token = forward(draft, draft_ranks, 1, batch, cal, a)["total_s"]
    iteration = k * draft_token + score + verify_s(batch, cal)
    tokens = expected_tokens(alpha, k) * batch
    return dict(draft=f"{draft} {'sharded' if draft_ranks > 1 else 'replicated'}", alpha=alpha, k=k,
                plain_tok_s=batch / plain, speculative_tok_s=tokens / iteration, speedup=tokens / iteration * plain / batch,
                draft_token_ms=draft_token * 1e3, score_ms=score * 1e3, c=draft_token / score)


def verify_pricing(target: str, ranks: int, k: int, batch: int, cal: dict, a: dict = ASSUMED) -> dict:
    """Per scoring step: gather the logits, then verify whole rows (what the runner does), against
    verify on the shards with two rounds of per-row statistics (bench/tp_sharded_verify.py): its
    kernels read 1/N of the target's rows but all of a replicated draft's, plus ~2 launches."""
    s = SHAPES[target]
    vocab, rows = s["vocab"], batch * (k + 1)
    gather_total = rows * vocab * BYTES
    full = verify_s(batch, cal)
    per_row = (verify_s(64, cal) - verify_s(1, cal)) / 63
    fixed = full - per_row * batch
    share = ((k + 1) / ranks + k) / (2 * k + 1)  # of the bytes a row's verify reads (target K+1, draft K)
    sharded_compute = fixed + per_row * batch * share + 2 * 3e-6
    stats_bytes = ranks * (rows * 16 + batch * 20)  # gathered: fp32 max / sum-exp / draft logit / argmax; 5 per row
    gather = dict(bytes_gathered=gather_total, bytes_sent_per_rank=gather_total / ranks,
                  collective_us=allgather_s(gather_total, ranks, a) * 1e6, verify_us=full * 1e6)
    sharded = dict(bytes_gathered=stats_bytes, rounds=2, collective_us=2 * allgather_s(stats_bytes, ranks, a) * 1e6,
                   verify_us=sharded_compute * 1e6, note="temperature-only rows; top-k / top-p / min-p need >= 2 more rounds")
    step = forward(target, ranks, k + 1, batch, cal, a)["total_s"] - forward(target, ranks, k + 1, batch, cal, a)["gather_s"]
    for option in (gather, sharded):
        option["total_us"] = option["collective_us"] + option["verify_us"]
        option["of_scoring_step"] = option["total_us"] * 1e-6 / (step + option["total_us"] * 1e-6)
    return dict(target=target, ranks=ranks, batch=batch, k=k, vocab=vocab, all_gather=gather, sharded_stats=sharded,
                faster="all_gather" if gather["total_us"] <= sharded["total_us"] else "sharded_stats",
                difference_us=gather["total_us"] - sharded["total_us"])


def predictions(alphas=(0.6, 0.7, 0.8), k: int = 4, batches=(1, 8, 32)) -> dict:
    cal = calibration()
    out = dict(label="PREDICTION from a stated model (bench/tp_model.py), not a measurement: no multi-GPU machine "
                     "was available", assumed=dict(ASSUMED), calibration=cal, chen_et_al_measured=CHEN,
               shapes={name: dict(s, streamed_GB=streamed_bytes(s) / 1e9) for name, s in SHAPES.items()})
    out["70B_on_8"] = {f"B={b}": dict(plain=forward("70B", 8, 1, b, cal), scoring=forward("70B", 8, k + 1, b, cal))
                       for b in batches}
    out["speculative_70B_on_8_B1"] = [speculative("70B", draft, dr, 8, k, alpha, 1, cal)
                                      for draft in ("8B", "1B") for dr in (1, 8) for alpha in alphas]
    out["verify_pricing"] = [verify_pricing(t, n, k, b, cal) for t, n in (("8B", 2), ("70B", 8)) for b in batches]
    lat = dict(ASSUMED)
    sensitivity = []
    for latency in (5.0, 20.0):
        lat["latency_us"] = latency
        sensitivity.append(dict(latency_us=latency, plain_tok_s=1 / forward("70B", 8, 1, 1, cal, lat)["total_s"],
                                best=max((speculative("70B", d, dr, 8, k, 0.8, 1, cal, lat) for d in ("8B", "1B")
                                          for dr in (1, 8)), key=lambda r: r["speedup"])))
    out["latency_sensitivity_B1_alpha0.8"] = sensitivity
    return out
