"""Plot of one bench_scale.py run (reads its JSON; matplotlib, Agg backend): one panel per
(agreement, batch, mode, graphs): tokens/s vs K of speculative decoding, measured (solid) and as
Leviathan Theorem 3.8 predicts from each run's alpha and c (ours_plain x predicted, dashed),
beside ours plain, transformers generate and assisted generation, and the HBM ceiling of plain
decoding (horizontal lines).

    python bench/plot_scale.py bench/results/scale_<device>.json     -> the .png beside it
"""
import argparse
import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

LINES = {"ours_plain": ("ours plain", "black"), "hf_generate": ("transformers generate", "tab:gray"),
         "hf_assisted": ("transformers assisted", "tab:purple")}


def plot(path) -> Path:
    path = Path(path)
    data = json.loads(path.read_text())
    groups = {}
    for row in data["rows"]:
        if "error" in row:
            continue
        key = (row["goal_agreement"], row["batch"], row["mode"], bool(row.get("cuda_graphs")))
        groups.setdefault(key, []).append(row)
    if not groups:
        raise ValueError(f"{path} has no rows")
    cols = min(3, len(groups))
    nrows = (len(groups) + cols - 1) // cols
    fig, axes = plt.subplots(nrows, cols, figsize=(5.2 * cols, 3.8 * nrows), squeeze=False)
    for ax, ((goal, batch, mode, graphs), rows) in zip(axes.flat, sorted(groups.items())):
        spec = sorted((r for r in rows if r["method"].startswith("ours_K")), key=lambda r: r["k"])
        by_name = {r["method"]: r for r in rows}
        if spec:
            ks = [r["k"] for r in spec]
            ax.plot(ks, [r["tokens_per_s"] for r in spec], "o-", color="tab:blue", label="ours speculative (measured)")
            if "ours_plain" in by_name:
                plain = by_name["ours_plain"]["tokens_per_s"]
                ax.plot(ks, [plain * r["predicted_speedup"] for r in spec], "o--", color="tab:blue", alpha=0.5,
                        label="Theorem 3.8 from alpha, c")
        for name, (label, colour) in LINES.items():
            if name in by_name:
                ax.axhline(by_name[name]["tokens_per_s"], color=colour, linestyle="-", linewidth=1, label=label)
        ceiling = batch * data["ceiling_tok_s_b1"]
        top = max(r["tokens_per_s"] * max(1.0, r.get("predicted_speedup") or 1.0) for r in rows)
        if ceiling < 3 * top:  # on a CPU smoke run the GPU-style ceiling is far off scale
            ax.axhline(ceiling, color="tab:red", linestyle=":", label="HBM ceiling, plain")
        agreement = rows[0]["agreement"]
        ax.set_title(f"agreement {agreement:.2f} (set), batch {batch}, {mode}{', CUDA graphs' if graphs else ''}\n"
                     f"plain-decoding HBM ceiling {ceiling:.0f} tok/s", fontsize=9)
        ax.xaxis.get_major_locator().set_params(integer=True)
        ax.set_xlabel("K (draft tokens per iteration)")
        ax.set_ylabel("tokens/s")
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(groups):]:
        ax.axis("off")
    axes.flat[0].legend(fontsize=7)
    fig.suptitle(f"{data['device']}: {data['models']}\n{data['acceptance_note']}", fontsize=8)
    fig.tight_layout()
    out = path.with_suffix(".png")
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("json")
    print(plot(ap.parse_args(argv).json))


if __name__ == "__main__":
    main()
