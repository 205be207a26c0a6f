"""Plots of one bench_e2e.py run (reads its JSON; matplotlib, Agg backend):

    <stem>_speedup_vs_k.png   batch 1: measured speedup over plain decoding vs K, beside
                              Leviathan Theorem 3.8's prediction from the measured alpha and c
    <stem>_acceptance.png     acceptance rate per draft position (pooled over the K runs)
    <stem>_batch.png          tokens/s vs batch size

    python bench/plot_e2e.py bench/results/e2e_pair_cpu.json

One column per decoding mode (greedy, sampling). Not a test: pytest collects nothing here.
"""
import argparse
import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

STYLE = {  # method -> (label, colour, marker)
    "hf_generate": ("transformers generate (target only)", "tab:gray", "s"),
    "specdec_plain": ("specdec_fast plain (target only)", "black", "o"),
    "specdec_draft": ("specdec_fast + draft model", "tab:blue", "o"),
    "specdec_prompt_lookup": ("specdec_fast + prompt lookup", "tab:orange", "^"),
    "hf_assisted": ("transformers assisted (draft)", "tab:purple", "D"),
}


def _rows(data, **match):
    return [r for r in data["results"] if all(r.get(k) == v for k, v in match.items())]


def _mode_label(data, mode):
    opts = data["modes"][mode]
    extra = ", ".join(f"{k} {v}" for k, v in opts.items() if k != "do_sample")
    return mode + (f" ({extra})" if extra else "")


def _suptitle(fig, data, what):
    env, s = data["environment"], data["settings"]
    fig.suptitle(f"{what}\n{env['device']}, {env['cpu_threads']} thread(s); {data['models']}\n"
                 f"{s['max_new_tokens']} new tokens per row, best of {s['repeats']} (round robin); runner: {data['runner'].split(' (')[0]}",
                 fontsize=9)


def plot_speedup_vs_k(data, path):
    modes = list(data["modes"])
    fig, axes = plt.subplots(1, len(modes), figsize=(6 * len(modes), 5.6), sharey=True, squeeze=False)
    for ax, mode in zip(axes[0], modes):
        for method in ("specdec_draft", "specdec_prompt_lookup"):
            rows = sorted(_rows(data, mode=mode, batch=1, method=method), key=lambda r: r["k"])
            label, colour, marker = STYLE[method]
            ks = [r["k"] for r in rows]
            ax.plot(ks, [r["measured_speedup"] for r in rows], marker=marker, color=colour, label=f"{label}: measured")
            ax.plot(ks, [r["predicted_speedup"] for r in rows], marker=marker, color=colour, linestyle="--", alpha=0.6,
                    markerfacecolor="none", label=f"{label}: Thm 3.8 from measured alpha, c")
            offset = (3, -17) if method == "specdec_draft" else (3, 5)
            for r in rows[:: max(len(rows) // 3, 1)]:
                ax.annotate(f"a={r['alpha']:.2f}\nc={r['cost_ratio']:.2f}", (r["k"], r["measured_speedup"]), fontsize=6,
                            color=colour, textcoords="offset points", xytext=offset)
        ax.axhline(1.0, color="black", linewidth=0.8, linestyle=":")
        for method in ("hf_generate", "hf_assisted"):  # references without a fixed K
            for r in _rows(data, mode=mode, batch=1, method=method):
                label, colour, _ = STYLE[method]
                ax.axhline(r["measured_speedup"], color=colour, linewidth=1, linestyle="-.",
                           label=label + (" (its own K schedule)" if method == "hf_assisted" else ""))
        ax.set_title(_mode_label(data, mode), fontsize=10)
        ax.set_xticks(sorted({r["k"] for r in _rows(data, mode=mode, batch=1, method="specdec_draft")}))
        ax.set_xlabel("K (draft tokens per iteration)")
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("speedup over specdec_fast plain decoding (x)")
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, fontsize=7.5, loc="lower center", ncol=3)
    _suptitle(fig, data, "Speedup vs K at batch 1 (1.0 = plain decoding, same engine)")
    fig.tight_layout(rect=(0, 0.1, 1, 1))
    fig.savefig(path, dpi=120)
    plt.close(fig)


def pooled_acceptance(rows):
    """P(draft i accepted | drafts before it accepted) for i = 1..max K, pooled over runs with
    different K (each run's accepted_hist[j] = row-iterations with j drafts accepted), and the
    number of row-iterations that reached each position."""
    kmax = max(r["k"] for r in rows)
    reached, accepted = [0] * kmax, [0] * kmax
    for r in rows:
        hist = r["accepted_hist"]
        for i in range(r["k"]):
            reached[i] += sum(hist[i:])
            accepted[i] += sum(hist[i + 1 :])
    return [a / n if n else float("nan") for a, n in zip(accepted, reached)], reached


def plot_acceptance(data, path):
    modes = list(data["modes"])
    fig, axes = plt.subplots(1, len(modes), figsize=(6 * len(modes), 5.2), sharey=True, squeeze=False)
    for ax, mode in zip(axes[0], modes):
        for method in ("specdec_draft", "specdec_prompt_lookup"):
            rows = _rows(data, mode=mode, batch=1, method=method)
            if not rows:
                continue
            rates, reached = pooled_acceptance(rows)
            label, colour, marker = STYLE[method]
            positions = range(1, len(rates) + 1)
            ks = sorted(r["k"] for r in rows)
            k4 = min(rows, key=lambda r: abs(r["k"] - 4))
            ax.plot(positions, rates, marker=marker, color=colour,
                    label=f"{label} (pooled over K={ks[0]}..{ks[-1]}; alpha at K={k4['k']}: {k4['alpha']:.2f})")
            ax.axhline(k4["alpha"], color=colour, linewidth=0.8, linestyle=":")
            for i, (rate, n) in enumerate(zip(rates, reached), 1):
                if rate == rate:
                    ax.annotate(f"n={n}", (i, rate), fontsize=6, color=colour, textcoords="offset points",
                                xytext=(-8, 6 if method == "specdec_draft" else -12))
        ax.set_ylim(0, 1.05)
        ax.set_xticks(list(positions))
        ax.set_title(_mode_label(data, mode), fontsize=10)
        ax.set_xlabel("draft position i")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.14))
    axes[0][0].set_ylabel("P(draft i accepted | drafts before it accepted)")
    _suptitle(fig, data, "Acceptance per draft position at batch 1 (n: row-iterations reaching the position; dotted: alpha)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_batch(data, path):
    modes = list(data["modes"])
    fig, axes = plt.subplots(1, len(modes), figsize=(6 * len(modes), 4.5), sharey=True, squeeze=False)
    batch_k = data["settings"]["batch_k"]
    for ax, mode in zip(axes[0], modes):
        batches = sorted({r["batch"] for r in _rows(data, mode=mode)})
        for method in ("hf_generate", "specdec_plain", "specdec_draft", "specdec_prompt_lookup"):
            points = [(b, r["tokens_per_s"]) for b in batches for r in _rows(data, mode=mode, batch=b, method=method)
                      if method not in ("specdec_draft", "specdec_prompt_lookup") or r["k"] == batch_k]
            if not points:
                continue
            label, colour, marker = STYLE[method]
            if method in ("specdec_draft", "specdec_prompt_lookup"):
                label += f" (K={batch_k})"
            ax.plot(*zip(*points), marker=marker, color=colour, label=label)
        ax.set_xscale("log", base=2)
        ax.set_xticks(batches, [str(b) for b in batches])
        ax.set_title(_mode_label(data, mode), fontsize=10)
        ax.set_xlabel("batch size (held-out prompts, left padded)")
        ax.grid(alpha=0.3)
    axes[0][0].set_ylim(0, 1.08 * max(r["tokens_per_s"] for r in data["results"] if r["method"] in STYLE))
    axes[0][0].set_ylabel("new tokens/s (all rows)")
    axes[0][0].legend(fontsize=7, loc="upper left")
    _suptitle(fig, data, "Throughput vs batch size")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_all(json_path) -> list:
    """Writes the three PNGs beside the JSON; returns their paths."""
    json_path = Path(json_path)
    data = json.loads(json_path.read_text())
    paths = []
    for suffix, fn in (("speedup_vs_k", plot_speedup_vs_k), ("acceptance", plot_acceptance), ("batch", plot_batch)):
        path = json_path.with_name(f"{json_path.stem}_{suffix}.png")
        fn(data, path)
        paths.append(path)
    return paths


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("json", help="a bench_e2e.py result, e.g. bench/results/e2e_pair_cpu.json")
    for path in plot_all(ap.parse_args(argv).json):
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
