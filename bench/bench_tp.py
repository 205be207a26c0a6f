"""Tensor parallelism: what the collectives cost per step, measured on CPU ranks (gloo), the two
ways to verify vocab-parallel logits side by side, and the NVLink model's predictions for a
70B-shaped target on 8 GPUs (bench/tp_model.py: a PREDICTION, labelled so in the JSON).

    .venv/bin/python bench/bench_tp.py [--ranks 2] [--batches 1,8,32] [--repeats 20]

Measured (each rank a spawned process, 1 intra-op thread, gloo over TCP on one machine):
  decoding   the demo pair (Llama target 4 layers / hidden 256 / V 4096, draft 2 layers), greedy,
             K = 4, B = 1 and 8, through generate(process_group=): per target scoring step the
             all-reduces (count, bytes, ms) and the logits all-gather, per draft token the same
             with the draft sharded; the target step time beside a single process's.
  verify     V = 128256, K = 4, B = 1/8/32, float32: (a) gather the [B, K+1, V/N] shards, then
             chain_verify (C++) on whole rows; (b) the sharded-statistics verify
             (bench/tp_sharded_verify.py: two all-gathers of per-row statistics; a torch
             prototype, its compute not optimised: compare the collectives). Both give the same
             tokens (checked).
Writes bench/results/tp_cpu_<isa>.json with the machine (bench/machine.py).
"""
import argparse
import datetime
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

import machine  # noqa: E402
import tp_model  # noqa: E402


def _median_ms(fn, repeats: int) -> float:
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def _summary(trace, forwards: int) -> dict:
    """Per forward: count, bytes and ms of each collective kind in a group's trace."""
    out = {}
    for name in ("all_reduce", "all_gather"):
        entries = [(b, s) for n, b, s in trace if n == name]
        out[name] = dict(per_forward=len(entries) / forwards, bytes_per_forward=sum(b for b, _ in entries) / forwards,
                         ms_per_forward=sum(s for _, s in entries) / forwards * 1e3)
    return out


def _difference(total: dict, part: dict, total_forwards: int, part_forwards: int, forwards: int) -> dict:
    """The collectives of the other runner: (total x total_forwards - part x part_forwards) / forwards."""
    return {name: {key: (total[name][key] * total_forwards - part[name][key] * part_forwards) / forwards
                   for key in total[name]} for name in total}


def _decoding(rank, group_pg, specdec_fast, repeats: int) -> dict:
    """The demo pair through generate(process_group=), collectives traced."""
    from specdec_fast.pair import load_demo_pair

    tokenizer, target, draft = load_demo_pair()
    target.generation_config.eos_token_id = None
    prompt = tokenizer.encode("def binary_search(a, x):\n")
    out = {}
    for batch in (1, 8):
        ids = torch.tensor([prompt] * batch)
        kw = dict(assistant_model=draft, max_new_tokens=48, do_sample=False, num_assistant_tokens=4, return_stats=True)
        single = [specdec_fast.generate(target, ids, **kw)[1] for _ in range(repeats)]
        row = dict(single_target_ms_per_iteration=statistics.median(s.target_s / s.iterations for s in single) * 1e3,
                   single_draft_ms_per_iteration=statistics.median(s.draft_s / s.iterations for s in single) * 1e3)
        for sharded in (False, True):
            engine_kw = dict(kw, process_group=group_pg, shard_draft=sharded)
            specdec_fast.generate(target, ids, **engine_kw)  # builds the engine
            engine = next(e for e in specdec_fast.engine.cached_engines(target) if e.tp is not None and
                          e.shard_draft == sharded)
            engine.tp.trace = []
            runs = [specdec_fast.generate(target, ids, **engine_kw)[1] for _ in range(repeats)]
            trace, engine.tp.trace = engine.tp.trace, None
            iterations = sum(s.iterations for s in runs)
            target_forwards = iterations + len(runs)  # a scoring step per iteration + the prefill of each call
            name = "draft sharded" if sharded else "draft replicated"
            row[name] = dict(target_ms_per_iteration=statistics.median(s.target_s / s.iterations for s in runs) * 1e3,
                             draft_ms_per_iteration=statistics.median(s.draft_s / s.iterations for s in runs) * 1e3,
                             tokens_per_s=statistics.median(s.tokens_per_s for s in runs))
            if not sharded:
                target_only = _summary(trace, target_forwards)
                row[name]["collectives_per_target_forward"] = target_only
            else:  # the draft's: K one-token forwards per iteration (+ its prefill), beside the target's
                draft_forwards = 4 * iterations + len(runs)
                row[name]["collectives_per_draft_forward"] = _difference(_summary(trace, 1), target_only, 1,
                                                                          target_forwards, draft_forwards)
        row["single_tokens_per_s"] = statistics.median(s.tokens_per_s for s in single)
        out[f"B={batch}"] = row
    return out


def _verify(rank, group, batches, repeats: int) -> dict:
    import tp_sharded_verify as sv

    from specdec_fast.kernels import chain_verify
    from specdec_fast.kernels.sampling_params import make_sampling_tensors

    vocab, k, n = 128256, 4, group.size
    part, start = vocab // n, rank * (vocab // n)
    out = {}
    for batch in batches:
        gen = torch.Generator().manual_seed(batch)
        full = torch.randn(batch, k + 1, vocab, generator=gen) * 3  # the same on every rank (seeded)
        draft_logits = full[:, :k] + torch.randn(batch, k, vocab, generator=gen)
        drafts = draft_logits.argmax(-1)
        params = make_sampling_tensors(batch, "cpu", temperature=1.0, seed=7)
        local = full[..., start:start + part].contiguous()
        gathered = group.gather_vocab(local)
        tokens_a = chain_verify(gathered, draft_logits, drafts, temperature=1.0, seed=params.seed, offset=0, check=False)
        tokens_b = sv.sharded_verify(local, draft_logits, drafts, params, start, group.all_gather)
        same = torch.equal(tokens_a[0], tokens_b[0]) and torch.equal(tokens_a[1], tokens_b[1])
        group.trace = []
        gather_ms = _median_ms(lambda: group.gather_vocab(local), repeats)
        gather_trace, group.trace = group.trace, []
        verify_ms = _median_ms(lambda: chain_verify(gathered, draft_logits, drafts, temperature=1.0, seed=params.seed,
                                                    offset=0, check=False), repeats)
        stats1 = sv.local_round1(local, drafts, params, start)
        stats_ms = _median_ms(lambda: (group.all_gather(stats1), group.all_gather(stats1[:, 0])), repeats)
        stats_trace, group.trace = group.trace, None
        sharded_ms = _median_ms(lambda: sv.sharded_verify(local, draft_logits, drafts, params, start, group.all_gather),
                                repeats)
        out[f"B={batch}"] = dict(
            same_tokens=same,
            all_gather=dict(collective_ms=gather_ms, bytes_sent_per_rank=gather_trace[0][1],
                            bytes_gathered=gather_trace[0][1] * n, verify_ms_cpp=verify_ms, total_ms=gather_ms + verify_ms),
            sharded_stats=dict(collective_ms=stats_ms, rounds=2,
                               bytes_sent_per_rank=stats_trace[0][1] + stats_trace[1][1],
                               total_ms_torch_prototype=sharded_ms))
    return out


def _worker(rank: int, world: int, tmp: str, batches, repeats: int) -> None:
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{tmp}/store", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=600))
    import specdec_fast
    from specdec_fast.distributed import TensorParallelGroup

    group = TensorParallelGroup(dist.group.WORLD)
    result = dict(decoding=_decoding(rank, dist.group.WORLD, specdec_fast, max(3, repeats // 4)),
                  verify=_verify(rank, group, batches, repeats))
    if rank == 0:
        with open(os.path.join(tmp, "result.json"), "w") as f:
            json.dump(result, f)
    dist.barrier()
    os._exit(0)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--batches", default="1,8,32")
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    batches = [int(b) for b in args.batches.split(",")]
    tmp = tempfile.mkdtemp(prefix="bench_tp_")
    load_before = os.getloadavg()  # the CI box is shared: gloo's latencies move with its load
    import torch.multiprocessing as mp

    mp.start_processes(_worker, args=(args.ranks, tmp, batches, args.repeats), nprocs=args.ranks, start_method="spawn")
    with open(os.path.join(tmp, "result.json")) as f:
        measured = json.load(f)
    info = {"machine": machine.cpu_model(), **machine.cpu_simd(), **machine.versions(),
            "ranks": args.ranks, "backend": "gloo (TCP, one machine)", "threads_per_rank": 1,
            "load_average_1_5_15_min": {"before": load_before, "after": os.getloadavg()}, "cpus": os.cpu_count(),
            "measured_on_cpu": measured, "nvlink_model": tp_model.predictions(batches=tuple(batches))}
    out = Path(args.out) if args.out else HERE / "results" / f"tp_cpu_{info['cpu_isa']}.json"
    out.write_text(json.dumps(info, indent=1))
    print(f"wrote {out}")
    _print(info)
    return 0


def _print(info: dict) -> None:
    m = info["measured_on_cpu"]
    for batch, row in m["decoding"].items():
        rep, shd = row["draft replicated"], row["draft sharded"]
        for what, c in (("target forward", rep["collectives_per_target_forward"]),
                        ("draft forward (sharded)", shd["collectives_per_draft_forward"])):
            print(f"decoding {batch}, per {what}: {c['all_reduce']['per_forward']:.1f} all-reduces "
                  f"({c['all_reduce']['bytes_per_forward'] / 1024:.1f} KiB, {c['all_reduce']['ms_per_forward']:.2f} ms) + "
                  f"{c['all_gather']['per_forward']:.1f} all-gather ({c['all_gather']['bytes_per_forward'] / 1024:.1f} KiB, "
                  f"{c['all_gather']['ms_per_forward']:.2f} ms)")
        print(f"decoding {batch}: target step {rep['target_ms_per_iteration']:.2f} ms over {info['ranks']} ranks vs "
              f"{row['single_target_ms_per_iteration']:.2f} ms alone; {rep['tokens_per_s']:.0f} tok/s (draft "
              f"replicated), {shd['tokens_per_s']:.0f} (sharded) vs {row['single_tokens_per_s']:.0f} alone")
    for batch, row in m["verify"].items():
        a, s = row["all_gather"], row["sharded_stats"]
        print(f"verify {batch}: gather {a['collective_ms']:.2f} ms ({a['bytes_gathered'] / 2**20:.1f} MiB) + verify "
              f"{a['verify_ms_cpp']:.2f} ms | sharded stats: 2 rounds {s['collective_ms']:.2f} ms "
              f"({s['bytes_sent_per_rank']} B per rank); same tokens: {row['same_tokens']}")
    for r in info["nvlink_model"]["verify_pricing"]:
        print(f"NVLink model {r['target']} TP{r['ranks']} B={r['batch']}: gather {r['all_gather']['total_us']:.0f} us, "
              f"sharded {r['sharded_stats']['total_us']:.0f} us -> {r['faster']}")
    for r in info["nvlink_model"]["speculative_70B_on_8_B1"]:
        print(f"PREDICTION 70B on 8 GPUs, B=1, K=4, {r['draft']} alpha {r['alpha']}: plain {r['plain_tok_s']:.0f} tok/s, "
              f"speculative {r['speculative_tok_s']:.0f} tok/s = {r['speedup']:.2f}x (c = {r['c']:.3f})")


if __name__ == "__main__":
    sys.exit(main())
