"""Token trees vs chains at the same number of target tokens scored per step.

CPU (default; the demo pair, specdec_fast.pair.demo_pair(), batch 1, held-out prompts in turn):
  1. rank acceptance on calibration prompts (held-out prompts after the evaluation ones): a full
     tree of branching (8, 6) (57 nodes) gives, per decoding mode and way of choosing children,
     P(the accepted child has rank r) at depths 1 and 2
  2. for each budget N (target tokens per step): the chain with K = N - 1 (the chain engine)
     against the best-first N-node tree built from the measured rank acceptance (TokenTree.
     best_first; depth 1's and depth 2's rows, deeper depths as depth 2), with top-b and with
     sampled children, and the dynamic tree with its nodes per depth (tree_dynamic.py: the
     shape chosen per row; the same rank acceptance allocates sampled children): mean accepted length (tokens per
     row-iteration), tokens/s (best of --repeats, configurations round robin), the phase times
     and the draft rows fed per step; plain decoding beside them. Sampling runs each prompt with
     --seeds seeds. Both for the shipped draft and for a lower-agreement one (--draft-noises).
  Writes bench/results/tree_cpu.json (+ tree_cpu.png).

GPU (--gpu; for the next GPU session, bench/run_gpu.sh): the scale benchmark's pair, a Llama-3-8B
  shaped target with random bf16 weights and a draft made of its embedding, first 2 layers, norm
  and head, the target's later o_proj / down_proj scaled so that greedy agreement is
  --agreements (0.6 and 0.8; the scale is found by bisection on teacher-forced prompts). Batch 1,
  prompt 128 random tokens, 128 new, CUDA graphs: plain decoding, chains K = 1..8, trees of 8 to
  64 nodes with depth <= 4 / 8 / any (best-first from the rank acceptance measured on that
  pair), each static and dynamic (-dyn): the best tree's tokens/s against the best chain's, plus tree_verify vs chain_verify
  kernel times (do_bench).
  Writes bench/results/tree_<device>.json.

    python bench/bench_tree.py [--budgets 5,16,32,64] [--max-new-tokens 64] [--prompts 8]
    python bench/bench_tree.py --gpu [--agreements 0.6,0.8]
    python bench/bench_tree.py --gpu --device cpu --tiny    (the GPU code path on a tiny model: a smoke run)
    python bench/bench_tree.py --kernels-only [--quick]     (GPU: tree_verify vs chain_verify kernel times)
    TRITON_INTERPRET=1 python bench/bench_tree.py --kernels-only --smoke --out F   (that code on CPU: a smoke run)
Not a test: pytest collects nothing here.
"""
import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_e2e import environment, load_models, make_prompts, merge_stats  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
MODES = {"greedy": dict(do_sample=False), "sampling": dict(do_sample=True, temperature=0.8, top_p=0.95)}
RANK_TREE = (8, 6)  # branching of the tree that measures rank acceptance (57 nodes)
# Children per mode: greedy rows take the top-b either way (tree_drafter.py). Sampling: i.i.d.
# samples; the draft's top-b (--children sample,top) accepted 0.36-0.85x the chain's tokens per
# step at T 0.8 / top-p 0.95 (bench/results/tree_cpu_052efcb.json): the target's probability of
# the draft's top token (~0.48) is far below the ~0.81 a sample from the draft is accepted with.
CHILDREN = {"greedy": ("sample",), "sampling": ("sample",)}
MAX_DEPTH = 8  # the depth-capped variant of each tree (the draft runs one forward per level)


def pooled_tree_stats(stats_list) -> dict:
    """Sum of the runs' stats.extra['tree'] counters."""
    first = stats_list[0].extra["tree"]
    counts = [[sum(s.extra["tree"]["accepted_rank_by_depth"][d][r] for s in stats_list) for r in range(len(row))]
              for d, row in enumerate(first["accepted_rank_by_depth"])]
    reached = [sum(s.extra["tree"]["reached_by_depth"][d] for s in stats_list) for d in range(len(first["reached_by_depth"]))]
    return dict(first, accepted_rank_by_depth=counts, reached_by_depth=reached)


def rank_acceptance(tree_stats: dict) -> dict:
    """P(accepted child has rank r | depth d - 1 reached) at each depth, from pooled counters."""
    out = {}
    for d, (row, reached) in enumerate(zip(tree_stats["accepted_rank_by_depth"], tree_stats["reached_by_depth"]), 1):
        out[d] = [c / reached if reached else 0.0 for c in row]
    return out


def draft_rows_per_step(tree) -> int:
    """Draft tokens fed per step by TreeDrafter: 1-2 pending + nodes 1..end_d re-fed at each level d < D."""
    ends = [max(tree.level(d)) + 1 for d in range(1, tree.depth)]
    return 2 + sum(end - 1 for end in ends)


class Runner:
    """Runs generate() over the batch-1 prompts in turn (sampling: once per seed); returns
    (seconds, pooled stats)."""

    def __init__(self, target, draft, prompts, new_tokens, mode_opts, device, seeds=1):
        self.target, self.draft, self.prompts, self.new, self.opts, self.device = target, draft, prompts, new_tokens, mode_opts, device
        self.seeds = range(seeds if mode_opts.get("do_sample") else 1)

    def __call__(self, **method):
        from specdec_fast.api import generate

        stats = []
        if "tree" in method or "num_assistant_tokens" in method:
            method = dict(method, assistant_model=self.draft)
        if self.device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        for i, (ids, mask) in enumerate(self.prompts):
            for s in self.seeds:
                seed = dict(seed=1000 * s + i) if self.opts.get("do_sample") else {}
                _, st = generate(self.target, ids, mask, max_new_tokens=self.new, pad_token_id=0, return_stats=True,
                                 **self.opts, **seed, **method)
                stats.append(st)
        if self.device.type == "cuda":
            torch.cuda.synchronize()
        seconds = time.perf_counter() - start
        merged = merge_stats(stats)
        if "tree" in method:
            merged.extra["tree"] = pooled_tree_stats(stats)
        return seconds, merged


def best_of(runner, configs: dict, repeats: int, warmup: bool = False) -> dict:
    """name -> (best seconds, its stats, all seconds), configurations round robin. warmup: one
    untimed run of each configuration first (GPU: Triton compiles each new specialisation on
    first use, seconds each: the H100 run at 58dbb54 with --repeats 1 timed those compiles)."""
    times = {name: [] for name in configs}
    best = {}
    if warmup:
        for method in configs.values():
            runner(**method)
    for _ in range(repeats):
        for name, method in configs.items():
            seconds, stats = runner(**method)
            if not times[name] or seconds < min(times[name]):
                best[name] = stats
            times[name].append(seconds)
    return {name: (min(times[name]), best[name], times[name]) for name in configs}


def row_of(name, kind, budget, mode, seconds, stats, all_seconds, tree=None) -> dict:
    iters = max(stats.iterations, 1)
    row = dict(name=name, kind=kind, budget=budget, mode=mode, seconds=seconds, seconds_all=all_seconds,
               tokens_per_s=stats.new_tokens / seconds, new_tokens=stats.new_tokens, iterations=stats.iterations,
               mean_accepted_length=stats.mean_accepted_length, accepted_hist=stats.accepted_hist,
               draft_ms_per_step=1e3 * stats.draft_s / iters, target_ms_per_step=1e3 * stats.target_s / iters)
    if tree is not None:
        row.update(tree=tree.describe(), parents=list(tree.parents), children=tree.children,
                   draft_rows_per_step=draft_rows_per_step(tree), tree_stats=stats.extra.get("tree"))
    return row


def run_cpu(args) -> dict:
    """Per draft (the shipped one; --draft-noises: copies with relative Gaussian weight noise, a
    lower-agreement pair) and mode: rank acceptance on the calibration prompts, then chains vs
    best-first trees built from it on the evaluation prompts (disjoint held-out prompts)."""
    from specdec_fast.drafters.token_tree import DEMO_SCORE_TEMPERATURE, TokenTree

    sys.path.insert(0, str(ROOT))
    from tests.engine.models import make_draft

    device = torch.device("cpu")
    torch.set_num_threads(args.threads)
    target, shipped, tokenizer, models_desc, _ = load_models(argparse.Namespace(target=None, draft=None, vocab=2048,
                                                                                hidden=256, layers=6))
    target.generation_config.eos_token_id = None
    vocab = target.config.vocab_size
    evaluation = [make_prompts(tokenizer, 1, vocab, args.prompt_len, 1, first=i) for i in range(args.prompts)]
    calibration = [make_prompts(tokenizer, 1, vocab, args.prompt_len, 1, first=i)
                   for i in range(args.prompts, args.prompts + args.calibration_prompts)]
    results, ranks = [], {}
    start = time.perf_counter()
    for noise in args.draft_noises:
        draft = shipped if noise == 0 else make_draft(shipped, noise=noise, seed=5)
        for mode, opts in MODES.items():
            calib = Runner(target, draft, calibration, args.max_new_tokens, opts, device, args.seeds)
            runner = Runner(target, draft, evaluation, args.max_new_tokens, opts, device, args.seeds)
            runner(num_assistant_tokens=4)  # warm-up (C++ build, allocator)
            key = f"noise{noise}-{mode}"
            ranks[key] = {}
            for children in args.children or CHILDREN[mode]:
                _, stats = calib(tree=TokenTree.from_branching(RANK_TREE, children))
                ranks[key][children] = rank_acceptance(stats.extra["tree"])
                print(f"draft noise {noise} {mode} {children}: rank acceptance at depth 1 "
                      f"{[round(a, 3) for a in ranks[key][children][1]]}", flush=True)
            configs, trees = {"plain": {}}, {}
            for n in args.budgets:
                configs[f"chain{n}"] = dict(num_assistant_tokens=n - 1)
                for children in args.children or CHILDREN[mode]:
                    rows = [ranks[key][children][d] for d in (1, 2)]  # per depth; deeper depths use depth 2's
                    variants = {"": None, f"-d{MAX_DEPTH}": MAX_DEPTH} if n > MAX_DEPTH + 1 else {"": None}
                    for suffix, depth in variants.items():
                        name = f"tree{n}-{children}{suffix}"
                        trees[name] = TokenTree.best_first(n, rows, children, max_depth=depth)
                        configs[name] = dict(tree=trees[name])
                    # Dynamic (tree_dynamic.py): the uncapped tree's nodes per depth, chosen per row.
                    name = f"tree{n}-{children}-dyn"
                    trees[name] = TokenTree(trees[f"tree{n}-{children}"].parents, children, dynamic=True, acceptance=rows,
                                            score_temperature=DEMO_SCORE_TEMPERATURE[mode])
                    configs[name] = dict(tree=trees[name])
            for name, (seconds, stats, all_seconds) in best_of(runner, configs, args.repeats).items():
                kind = "plain" if name == "plain" else ("chain" if name.startswith("chain") else "tree")
                budget = 1 if name == "plain" else int(name[5:] if kind == "chain" else name[4:].split("-")[0])
                row = row_of(name, kind, budget, mode, seconds, stats, all_seconds, trees.get(name))
                row.update(draft_noise=noise, alpha=stats.alpha if kind == "chain" else None,
                           max_depth=MAX_DEPTH if name.endswith(f"-d{MAX_DEPTH}") else None,
                           dynamic=name.endswith("-dyn"))
                results.append(row)
                print(f"noise {noise} {mode:8s} {name:14s} accepted {row['mean_accepted_length']:.3f} tokens/s "
                      f"{row['tokens_per_s']:.1f} draft {row['draft_ms_per_step']:.2f} ms target "
                      f"{row['target_ms_per_step']:.2f} ms", flush=True)
    return dict(models=models_desc, settings=vars(args), rank_acceptance=ranks, results=results,
                total_seconds=time.perf_counter() - start, comparison=compare(results, args.draft_noises))


def compare(results, noises) -> list:
    """Per draft, mode and budget: the tree's accepted length and tokens/s over the chain's."""
    out = []
    for noise in noises:
        for mode in MODES:
            rows = [r for r in results if r["mode"] == mode and r["draft_noise"] == noise]
            chains = {r["budget"]: r for r in rows if r["kind"] == "chain"}
            for r in rows:
                if r["kind"] == "tree" and r["budget"] in chains:
                    c = chains[r["budget"]]
                    out.append(dict(draft_noise=noise, mode=mode, budget=r["budget"], tree=r["name"], children=r["children"],
                                    dynamic=r.get("dynamic", False),
                                    chain_alpha=c["alpha"], chain_accepted=c["mean_accepted_length"],
                                    tree_accepted=r["mean_accepted_length"],
                                    accepted_ratio=r["mean_accepted_length"] / c["mean_accepted_length"],
                                    tokens_per_s_ratio=r["tokens_per_s"] / c["tokens_per_s"]))
    return out


def plot(data, path: Path) -> None:
    """Columns: (draft, mode); rows: tokens per step, tokens/s; lines: chain, tree per children mode."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [(noise, mode) for noise in data["settings"]["draft_noises"] for mode in MODES]
    fig, axes = plt.subplots(2, len(panels), figsize=(5 * len(panels), 8), squeeze=False)
    style = {("chain", None, False): ("chain (K = N - 1)", "black", "o"),
             ("top", None, False): ("tree, top-b children", "tab:blue", "s"),
             ("sample", None, False): ("static tree (greedy rows: top-b; sampling: i.i.d. children)", "tab:orange", "^"),
             ("sample", MAX_DEPTH, False): (f"the same, depth <= {MAX_DEPTH}", "tab:red", "v"),
             ("sample", None, True): ("dynamic tree (per-row shape, same nodes per depth)", "tab:green", "D")}
    for col, (noise, mode) in enumerate(panels):
        rows = [r for r in data["results"] if r["mode"] == mode and r["draft_noise"] == noise]
        for (key, depth, dynamic), (label, colour, marker) in style.items():
            sel = sorted((r for r in rows if (r["kind"] == "chain" if key == "chain" else
                                              r["kind"] == "tree" and r["children"] == key and r.get("max_depth") == depth
                                              and r.get("dynamic", False) == dynamic)),
                         key=lambda r: r["budget"])
            if not sel:
                continue
            xs = [r["budget"] for r in sel]
            axes[0][col].plot(xs, [r["mean_accepted_length"] for r in sel], marker=marker, color=colour, label=label)
            axes[1][col].plot(xs, [r["tokens_per_s"] for r in sel], marker=marker, color=colour, label=label)
        plain = [r for r in rows if r["kind"] == "plain"]
        if plain:
            axes[1][col].axhline(plain[0]["tokens_per_s"], color="gray", ls="--", label="plain decoding")
        alpha = next((r["alpha"] for r in rows if r["kind"] == "chain" and r["budget"] == 5), float("nan"))
        draft = "shipped draft" if noise == 0 else f"draft + {noise} weight noise"
        axes[0][col].set_title(f"{draft}, {mode} (chain alpha {alpha:.2f})\ntokens per step", fontsize=10)
        axes[1][col].set_title("tokens/s end to end (CPU, 1 thread)", fontsize=10)
        for ax in (axes[0][col], axes[1][col]):
            ax.set_xscale("log", base=2)
            ax.set_xlabel("target tokens scored per step (N)")
            ax.grid(alpha=0.3)
            ax.legend(fontsize=8)
    env = data["environment"]
    fig.suptitle(f"Token trees vs chains at equal target tokens, demo pair, {env['device']}, commit {env['commit'][:7]}")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


# -- GPU: the scale benchmark ------------------------------------------------------------------
def scale_pair(device, dtype, tiny: bool):
    """(target, draft) sharing weights: an 8B-shaped Llama (random weights) and its first 2 layers."""
    from transformers import LlamaConfig, LlamaForCausalLM

    dims = dict(vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
                num_key_value_heads=8)
    if tiny:
        dims = dict(vocab_size=512, hidden_size=128, intermediate_size=256, num_hidden_layers=4, num_attention_heads=4,
                    num_key_value_heads=2)
    config = LlamaConfig(**dims, max_position_embeddings=4096, eos_token_id=None, bos_token_id=1, pad_token_id=0,
                         initializer_range=0.02)
    torch.manual_seed(0)
    default_dtype = torch.get_default_dtype()
    torch.set_default_dtype(dtype)  # initialise in bf16 directly: an fp32 8B model would take 32 GB first
    try:
        with torch.device(device):
            target = LlamaForCausalLM(config).eval()
    finally:
        torch.set_default_dtype(default_dtype)
    draft_config = LlamaConfig(**{**dims, "num_hidden_layers": 2}, max_position_embeddings=4096, eos_token_id=None,
                               bos_token_id=1, pad_token_id=0)
    with torch.device("meta"):
        draft = LlamaForCausalLM(draft_config).eval()
    draft.model.embed_tokens = target.model.embed_tokens
    draft.model.layers = torch.nn.ModuleList(target.model.layers[:2])
    draft.model.norm, draft.lm_head = target.model.norm, target.lm_head
    draft.model.rotary_emb = target.model.rotary_emb
    originals = [(layer.self_attn.o_proj.weight.detach().clone(), layer.mlp.down_proj.weight.detach().clone())
                 for layer in target.model.layers[2:]]
    return target, draft, originals


@torch.no_grad()
def set_agreement(target, draft, originals, goal: float, device, steps: int = 12) -> tuple[float, float]:
    """Scale the target's layers >= 2 (o_proj, down_proj) by s, bisected on log s, until greedy
    draft/target agreement (teacher-forced on random tokens) is about ``goal``. Returns (s, agreement)."""
    gen = torch.Generator(device="cpu").manual_seed(1)
    tokens = torch.randint(3, target.config.vocab_size, (4, 256), generator=gen).to(device)

    def agreement(scale):
        for layer, (o, d) in zip(target.model.layers[2:], originals):
            layer.self_attn.o_proj.weight.copy_(o * scale)
            layer.mlp.down_proj.weight.copy_(d * scale)
        t = target(tokens).logits.argmax(-1)
        return float((draft(tokens).logits.argmax(-1) == t).float().mean())

    lo, hi = -12.0, 1.0  # log10 s: agreement falls as s grows
    for _ in range(steps):
        mid = (lo + hi) / 2
        if agreement(10**mid) > goal:
            lo = mid
        else:
            hi = mid
    scale = 10 ** ((lo + hi) / 2)
    return scale, agreement(scale)


def _kernel_census(fn) -> dict:
    """Device time per Triton kernel of one eager call (torch.profiler, gpu_timing.profile_kernels):
    which launch of tree_verify costs what (the walk is one program scanning the N nodes in order;
    the residual masses one launch per sibling). An error is recorded, not raised."""
    from gpu_timing import profile_kernels

    try:
        return profile_kernels(fn, iters=5)
    except Exception as error:  # noqa: BLE001 - a profiler failure must not lose the timed row
        return {"error": f"{type(error).__name__}: {str(error)[:200]}"}


def kernel_times(device, vocab: int, quick: bool = False, save=None, smoke: bool = False) -> list:
    """tree_verify vs chain_verify (Triton) at equal target tokens: CUDA graph replays under
    do_bench, median us (verify_gpu_table._time; eager calls would time the Python launchers),
    each call on its own KernelWorkspace as the engine's (no zero fills), with the launches its
    plan makes (tree_verify_plan / verify_plan) and the tree's device time per kernel
    (tree_kernels: families_count_us rows [kernel, launches, us] per call), and the call with each
    walk (tree_verify_us_walk_parallel / _walk_scan, walk_parallel_tokens_equal), and sampled rows
    with the residual launches' identity skips flipped from the default
    (tree_verify_us_skip_identities_flipped, skip_identities_flipped_tokens_equal,
    skip_identities_default: RESIDUAL_SKIP_IDENTITIES) and with the residual masses' launches fused
    or not (the same keys with residual_fused, RESIDUAL_FUSED, and residual_fused_workspace_zero: no
    program gave up at the fused launch's barriers), and greedy rows with the statistics' streaming
    sums flipped (tree_verify_us_argmax_only_flipped, argmax_only_flipped_tokens_equal,
    argmax_only_default: verify's STREAM_GREEDY_ARGMAX_ONLY). save(rows): called
    after every row (a device call's limit then keeps the rows measured). T = 1 first (issue 25's
    target row), then greedy. quick: issue 25's yardstick only (B = 1; the
    chain at K = 8 and the tree at N = 64). Every row also says whether the Triton call gave the
    torch reference's tokens (tokens_equal_reference: the suite checks small vocabularies; this is
    V = 128256 in bf16 on the device). smoke: this code on CPU under the interpreter (one wall-clock
    call per timing, no profiler census; tests/test_bench_tree.py): not a measurement."""
    from verify_gpu_table import _time

    from specdec_fast.kernels import make_sampling_tensors
    from specdec_fast.kernels.tree_verify import tree_verify_reference
    from specdec_fast.kernels.verify import chain_verify_reference
    from specdec_fast.kernels._workspace import KernelWorkspace
    from specdec_fast.kernels.tree_verify._triton_plan import (RESIDUAL_FUSED, RESIDUAL_SKIP_IDENTITIES, WALK_PARALLEL,
                                                               tree_verify_plan)
    from specdec_fast.kernels.verify._triton_plan import STREAM_GREEDY_ARGMAX_ONLY
    from specdec_fast.kernels.tree_verify.triton import tree_verify_triton
    from specdec_fast.kernels.verify.triton import chain_verify_triton, verify_plan
    from specdec_fast.drafters.token_tree import TokenTree

    out = []
    for batch in (1,) if quick else (1, 8):
        for mode, kw in (("T=1", dict(temperature=1.0)), ("greedy", dict(temperature=0.0))):
            # the chain at K = 8 (issue 25's yardstick: tree_verify at N = 64 within 2x of it)
            g = torch.Generator(device="cpu").manual_seed(1)
            target = (torch.randn(batch, 9, vocab, generator=g) * 3).to(device, torch.bfloat16)
            draft = (target[:, :8].float() + torch.randn(batch, 8, vocab, generator=g).to(device)).to(torch.bfloat16)
            tokens = torch.randint(0, vocab, (batch, 8), generator=g).to(device)
            params = make_sampling_tensors(batch, device, seed=0, **kw)
            ws = KernelWorkspace()
            chain8_us = _time(lambda: chain_verify_triton(target, draft, tokens, params, workspace=ws), smoke)["median_us"]
            chain8_launches = verify_plan(batch, 8, vocab, True, tuple(params.modes), workspace=True)["launches"]
            chain8_equal = _same(chain_verify_triton(target, draft, tokens, params, workspace=ws),
                                 chain_verify_reference(target, draft, tokens, params))
            out.append(dict(batch=batch, nodes=None, vocab=vocab, mode=mode, chain_k=8, chain_verify_us=chain8_us,
                            chain_launches=chain8_launches, tokens_equal_reference=chain8_equal))
            print(f"verify B={batch} chain K=8 {mode}: {chain8_us:.1f} us ({chain8_launches} launches; "
                  f"the reference's tokens: {chain8_equal})", flush=True)
            if save:
                save(out)
        for n in (max(NODES_SWEPT),) if quick else NODES_SWEPT:
            for mode, kw in (("T=1", dict(temperature=1.0)), ("greedy", dict(temperature=0.0))):
                g = torch.Generator(device="cpu").manual_seed(0)
                target = (torch.randn(batch, n, vocab, generator=g) * 3).to(device, torch.bfloat16)
                draft = (target.float() + torch.randn(batch, n, vocab, generator=g).to(device)).to(torch.bfloat16)
                tree = TokenTree.default(n)
                parents = torch.tensor(tree.parents, device=device).expand(batch, -1)
                tokens = torch.randint(0, vocab, (batch, n), generator=g).to(device)
                params = make_sampling_tensors(batch, device, seed=0, **kw)
                modes = tuple(params.modes)
                ws_tree, ws_chain = KernelWorkspace(), KernelWorkspace()
                tree_us = _time(lambda: tree_verify_triton(target, draft, tokens, parents, params, workspace=ws_tree,
                                                           max_children=tree.max_children), smoke)["median_us"]
                chain_us = _time(lambda: chain_verify_triton(target, draft[:, :-1], tokens[:, 1:], params,
                                                             workspace=ws_chain), smoke)["median_us"]
                tree_launches = tree_verify_plan(batch, n, vocab, True, modes, tree.max_children,
                                                 workspace=True)["launches"]
                kernels = {"skipped": "smoke run (CPU)"} if smoke else _kernel_census(
                    lambda: tree_verify_triton(target, draft, tokens, parents, params, workspace=ws_tree,
                                               max_children=tree.max_children))
                # the walk both ways (WALK_PARALLEL picks the default, timed above): same tokens?
                ws_walk = {True: KernelWorkspace(), False: KernelWorkspace()}
                walk_call = {form: (lambda form=form: tree_verify_triton(target, draft, tokens, parents, params,
                                                                        workspace=ws_walk[form], walk_parallel=form,
                                                                        max_children=tree.max_children))
                             for form in (True, False)}
                walked = {form: walk_call[form]() for form in (True, False)}
                walk_equal = _same(walked[True], walked[False])
                tree_equal = _same(walked[WALK_PARALLEL], tree_verify_reference(target, draft, tokens, parents, params))
                walk_us = {form: tree_us if form == WALK_PARALLEL else _time(walk_call[form], smoke)["median_us"]
                           for form in (True, False)}
                chain_launches = verify_plan(batch, n - 1, vocab, True, modes, workspace=True)["launches"]
                # each lever flipped beside its default, the same tokens? (issue25_report.tree_flip_ratios reads it)
                if mode != "greedy":  # the residual launches' identity skips and their fusion (greedy has none)
                    levers = [("skip_identities", RESIDUAL_SKIP_IDENTITIES,
                               dict(skip_identities=not RESIDUAL_SKIP_IDENTITIES)),
                              ("residual_fused", RESIDUAL_FUSED, dict(residual_fused=not RESIDUAL_FUSED))]
                else:  # the greedy statistics' streaming sums: the default keeps them exactly where the flag is off
                    levers = [("argmax_only", STREAM_GREEDY_ARGMAX_ONLY, dict(stream_sums=STREAM_GREEDY_ARGMAX_ONLY))]
                skips = {}
                for name, default, flip in levers:
                    ws_flip = KernelWorkspace()
                    flip_call = lambda: tree_verify_triton(target, draft, tokens, parents, params,  # noqa: E731
                                                           workspace=ws_flip, max_children=tree.max_children, **flip)
                    try:  # a failure (a compile error on the device, say) is recorded; the row goes on
                        equal = _same(flip_call(), walked[WALK_PARALLEL])  # one call first, untimed
                        if name == "residual_fused":  # a program that gave up at a barrier leaves a count
                            skips["residual_fused_workspace_zero"] = ws_flip.all_zero()
                            if not skips["residual_fused_workspace_zero"]:  # not timed: each call would wait
                                raise RuntimeError("a program gave up waiting at the fused launch's barrier")
                        skips.update({f"tree_verify_us_{name}_flipped": _time(flip_call, smoke)["median_us"],
                                      f"{name}_flipped_tokens_equal": equal, f"{name}_default": default})
                    except Exception as error:  # noqa: BLE001
                        skips[f"{name}_flipped_error"] = f"{type(error).__name__}: {str(error)[:300]}"
                out.append(dict(batch=batch, nodes=n, vocab=vocab, mode=mode, max_children=tree.max_children,
                                tree_verify_us=tree_us, chain_verify_us=chain_us, tree_launches=tree_launches,
                                chain_launches=chain_launches, tree_kernels=kernels,
                                tree_verify_us_walk_parallel=walk_us[True], tree_verify_us_walk_scan=walk_us[False],
                                walk_parallel_tokens_equal=walk_equal, tokens_equal_reference=tree_equal, **skips))
                print(f"verify B={batch} N={n} {mode}: tree {tree_us:.1f} us ({tree_launches} launches; walk: "
                      f"parallel {walk_us[True]:.1f}, scan {walk_us[False]:.1f}, same tokens: {walk_equal}; "
                      f"the reference's tokens: {tree_equal}), chain {chain_us:.1f} us ({chain_launches})", flush=True)
                if save:
                    save(out)
                if n == max(NODES_SWEPT):  # the statistics pass's vocab chunks a row (waves: see STATS_CHUNKS),
                    # after the row is saved: a device call's cap that cuts the sweep keeps the row
                    out[-1].update(_stats_chunks_sweep(target, draft, tokens, parents, params, tree,
                                                       walked[WALK_PARALLEL], smoke))
                    if save:
                        save(out)
    return out


# The tree's statistics pass splits each of its 2N - 1 rows into verify's vocab chunks: 127 rows x 9
# chunks = 1143 programs at N = 64, V = 128256 on 132 SMs, where the compiled streaming kernel
# (~58 registers x 256 threads, bench/results/verify_stream_ptx_sm90.json) holds ~4 programs an SM:
# 2.2 waves, i.e. 3 (22.1 us of the 69.6 us tree on an H200, h200_2026-11-28c). 8 chunks (1016
# programs, 2 waves of 8 blocks) or 4 (508, one wave of 16 blocks) would take ~16 block-times
# against ~21 by that model (not measured); the sweep times them beside the default.
STATS_CHUNKS = (4, 8)
NODES_SWEPT = (5, 16, 64)


def _stats_chunks_sweep(target, draft, tokens, parents, params, tree, default_result, smoke: bool) -> dict:
    """tree_verify_us_stats_chunks_<c> (its own KernelWorkspace), stats_chunks_<c>_tokens_equal (against the
    default's result) for c in STATS_CHUNKS, stats_chunks_default: the default plan's chunks a row."""
    from verify_gpu_table import _time

    from specdec_fast.kernels._workspace import KernelWorkspace
    from specdec_fast.kernels.tree_verify._triton_plan import tree_plan
    from specdec_fast.kernels.tree_verify.triton import tree_verify_triton
    from specdec_fast.kernels.verify.triton import _num_sms

    batch, n, vocab = target.shape
    plan = tree_plan(batch, n, vocab, True, modes=params.modes, max_children=tree.max_children,
                     num_sms=_num_sms(target.device), interpreting=smoke)
    out = {"stats_chunks_default": plan.stats.select_chunks}
    for chunks in STATS_CHUNKS:
        ws = KernelWorkspace()
        call = lambda: tree_verify_triton(target, draft, tokens, parents, params, workspace=ws,  # noqa: E731
                                          max_children=tree.max_children, stats_chunks=chunks)
        try:
            out[f"stats_chunks_{chunks}_tokens_equal"] = _same(call(), default_result)
            out[f"tree_verify_us_stats_chunks_{chunks}"] = _time(call, smoke)["median_us"]
        except Exception as error:  # noqa: BLE001
            out[f"stats_chunks_{chunks}_error"] = f"{type(error).__name__}: {str(error)[:300]}"
    return out


def _same(got, expected) -> bool:
    """Two verify results (tuples of tensors) equal element for element."""
    return all(torch.equal(a.long(), b.long()) for a, b in zip(got, expected))


def run_gpu(args, save=None) -> dict:
    """save(partial dict): called after every (agreement, mode) group, so a run cut short at its
    device-call limit keeps what it measured; no new group starts after args.budget_s seconds."""
    from specdec_fast.drafters.token_tree import DEMO_SCORE_TEMPERATURE, TokenTree

    device = torch.device(args.device or "cuda")
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    target, draft, originals = scale_pair(device, dtype, args.tiny)
    vocab = target.config.vocab_size
    gen = torch.Generator(device="cpu").manual_seed(3)
    ids = torch.randint(3, vocab, (1, args.prompt_len), generator=gen).to(device)
    prompts = [(ids, torch.ones_like(ids))]
    graphs = dict(cuda_graphs=True) if device.type == "cuda" else {}
    backend = dict(backend="triton") if device.type == "cuda" else {}
    results, ranks, agreements = [], {}, {}
    start = time.perf_counter()
    for goal in args.agreements:
        scale, got = set_agreement(target, draft, originals, goal, device)
        agreements[goal] = dict(scale=scale, measured=got)
        print(f"agreement goal {goal}: scale {scale:.3g}, measured {got:.3f}", flush=True)
        for mode, opts in (("greedy", MODES["greedy"]), ("sampling", dict(do_sample=True, temperature=1.0, top_k=0))):
            if time.perf_counter() - start > args.budget_s:
                print(f"budget {args.budget_s} s reached: agreement {goal} {mode} not run", flush=True)
                continue
            runner = Runner(target, draft, prompts, args.max_new_tokens, opts, device)
            runner(num_assistant_tokens=4, **graphs, **backend)  # warm-up / compile
            _, stats = runner(tree=TokenTree.from_branching(RANK_TREE), **graphs, **backend)
            measured = rank_acceptance(stats.extra["tree"])
            acc = [measured[1], measured[2]]
            ranks[f"{goal}-{mode}"] = acc
            configs = {"plain": dict(**graphs, **backend)}
            trees = {}
            for k in args.chain_ks:
                configs[f"chain{k + 1}"] = dict(num_assistant_tokens=k, **graphs, **backend)
            for n in args.tree_sizes:  # the draft runs one forward per level: depth caps trade tokens for draft time
                for depth in args.tree_depths:
                    if depth is not None and n <= depth + 1:
                        continue
                    name = f"tree{n}-d{depth or 'any'}"
                    trees[name] = TokenTree.best_first(n, acc, "sample", max_depth=depth)
                    configs[name] = dict(tree=trees[name], **graphs, **backend)
                    # the dynamic tree with these nodes per depth (score temperature: the demo pair's, untuned here)
                    trees[name + "-dyn"] = TokenTree(trees[name].parents, "sample", dynamic=True, acceptance=acc,
                                                     score_temperature=DEMO_SCORE_TEMPERATURE[mode])
                    configs[name + "-dyn"] = dict(tree=trees[name + "-dyn"], **graphs, **backend)
            for name, (seconds, st, all_seconds) in best_of(runner, configs, args.repeats, warmup=True).items():
                kind = "plain" if name == "plain" else ("chain" if name.startswith("chain") else "tree")
                budget = 1 if kind == "plain" else int(name[5:] if kind == "chain" else name[4:].split("-")[0])
                row = row_of(name, kind, budget, mode, seconds, st, all_seconds, trees.get(name))
                row.update(agreement=goal)
                results.append(row)
                print(f"agreement {goal} {mode:8s} {name:12s} {row['tokens_per_s']:.1f} tokens/s, accepted "
                      f"{row['mean_accepted_length']:.2f}", flush=True)
            if save is not None:
                save(dict(partial=True, settings=vars(args), agreements=agreements, rank_acceptance=ranks, results=results))
    best = []
    for goal in args.agreements:
        for mode in ("greedy", "sampling"):
            rows = [r for r in results if r["agreement"] == goal and r["mode"] == mode]
            if not rows:  # the group was not run (budget)
                continue
            chain = max((r for r in rows if r["kind"] == "chain"), key=lambda r: r["tokens_per_s"])
            tree = max((r for r in rows if r["kind"] == "tree"), key=lambda r: r["tokens_per_s"])
            plain = next(r for r in rows if r["kind"] == "plain")
            best.append(dict(agreement=goal, mode=mode, best_chain=chain["name"], chain_tokens_per_s=chain["tokens_per_s"],
                             best_tree=tree["name"], tree_tokens_per_s=tree["tokens_per_s"],
                             plain_tokens_per_s=plain["tokens_per_s"], tree_over_chain=tree["tokens_per_s"] / chain["tokens_per_s"]))
            print(best[-1], flush=True)
    kernels = kernel_times(device, vocab) if device.type == "cuda" else []
    return dict(models=f"8B-shaped random Llama{' (tiny smoke config)' if args.tiny else ''}, draft = its first 2 layers",
                settings=vars(args), agreements=agreements, rank_acceptance=ranks, results=results, best=best,
                kernels=kernels, total_seconds=time.perf_counter() - start)


def main(argv=None):
    floats = lambda s: [float(x) for x in s.split(",")]  # noqa: E731
    ints = lambda s: [int(x) for x in s.split(",")]  # noqa: E731
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gpu", action="store_true", help="the scale benchmark (GPU), instead of the demo pair on CPU")
    ap.add_argument("--device")
    ap.add_argument("--tiny", action="store_true", help="--gpu code path on a tiny model (smoke run)")
    ap.add_argument("--budgets", type=ints, default=[5, 16, 32, 64], help="CPU: target tokens per step")
    ap.add_argument("--agreements", type=floats, default=[0.6, 0.8])
    ap.add_argument("--chain-ks", type=ints, default=list(range(1, 9)))
    ap.add_argument("--tree-sizes", type=ints, default=[8, 16, 32, 64])
    ap.add_argument("--tree-depths", type=lambda s: [None if x == "any" else int(x) for x in s.split(",")],
                    default=[4, 8, None], help="GPU: depth caps of the trees (any = none)")
    ap.add_argument("--prompts", type=int, default=8, help="CPU: held-out prompts run in turn (evaluation)")
    ap.add_argument("--calibration-prompts", type=int, default=7, help="CPU: the next held-out prompts (rank acceptance)")
    ap.add_argument("--seeds", type=int, default=4, help="CPU sampling: seeds per prompt")
    ap.add_argument("--children", type=lambda s: tuple(s.split(",")), help="CPU: ways of choosing children (default per mode)")
    ap.add_argument("--draft-noises", type=floats, default=[0.0, 0.3],
                    help="CPU: relative weight noise on the draft (0: the shipped draft; 0.3: agreement ~0.6)")
    ap.add_argument("--prompt-len", type=int, default=None, help="default 96 (CPU) / 128 (GPU)")
    ap.add_argument("--max-new-tokens", type=int, default=None, help="default 64 (CPU) / 128 (GPU)")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--budget-s", type=float, default=float("inf"), help="GPU: no new group after this many seconds")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out")
    ap.add_argument("--no-plot", action="store_true")
    ap.add_argument("--kernels-only", action="store_true",
                    help="GPU: only tree_verify vs chain_verify kernel times (V = 128256), to --out")
    ap.add_argument("--quick", action="store_true", help="--kernels-only: B = 1, chain K = 8 and tree N = 64 only")
    ap.add_argument("--smoke", action="store_true",
                    help="--kernels-only --quick's code on CPU (V = 1000; TRITON_INTERPRET=1): not a measurement")
    args = ap.parse_args(argv)
    if args.kernels_only:
        device = torch.device("cpu" if args.smoke else args.device or "cuda")
        if args.smoke:
            name, timer = "cpu (smoke: interpreter, not a measurement)", "wall clock, one call (smoke)"
        else:
            name, timer = torch.cuda.get_device_name(device), "CUDA graph replay under do_bench, median us"
        slug = "smoke" if args.smoke else name.lower().replace(" ", "_")
        out = Path(args.out or ROOT / "bench" / "results" / f"tree_kernels_{slug}.json")
        head = dict(device=name, environment=environment(device), timer=timer)
        save = lambda rows: out.write_text(json.dumps(dict(head, rows=rows), indent=1))  # noqa: E731
        save(kernel_times(device, 1000 if args.smoke else 128256, quick=args.quick or args.smoke, save=save,
                          smoke=args.smoke))
        print(f"wrote {out}")
        return
    args.prompt_len = args.prompt_len or (128 if args.gpu else 96)
    args.max_new_tokens = args.max_new_tokens or (128 if args.gpu else 64)
    device = torch.device((args.device or "cuda") if args.gpu else "cpu")
    if device.type == "cpu":
        torch.set_num_threads(args.threads)
    env = environment(device)  # at the start: the commit the run used (and its thread count)
    if args.gpu:
        name = torch.cuda.get_device_name(device).lower().replace(" ", "_") if device.type == "cuda" else "cpu_smoke"
        out = Path(args.out or ROOT / "bench" / "results" / f"tree_{name}.json")
        out.parent.mkdir(parents=True, exist_ok=True)
        data = run_gpu(args, save=lambda partial: out.write_text(json.dumps(dict(partial, environment=env), indent=1)))
    else:
        data = run_cpu(args)
        out = Path(args.out or ROOT / "bench" / "results" / "tree_cpu.json")
    data["environment"] = env
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(data, indent=1))
    print(f"wrote {out}")
    if not args.gpu and not args.no_plot:
        plot(data, out.with_suffix(".png"))
        print(f"wrote {out.with_suffix('.png')}")


if __name__ == "__main__":
    main()
