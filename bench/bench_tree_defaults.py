"""Greedy tree=True candidates on the demo pair (CPU, 1 thread): the default static tree (depth <= 8)
against the dynamic tree with the same nodes per depth (depth <= 8) and without the depth cap,
at 16 and 32 nodes, beside chains K = 4 / 8; shipped draft and draft + 0.3 weight noise; 8
prompts, best of 3 rounds. Decides TokenTree.recommended (specdec_fast/drafters/token_tree.py).
Writes bench/results/tree_defaults_cpu.json.   python bench/bench_tree_defaults.py
"""
import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench_e2e import environment  # noqa: E402
from bench_tree import MODES, Runner, best_of, load_models, make_prompts  # noqa: E402
from specdec_fast.drafters.token_tree import TokenTree  # noqa: E402
from tests.engine.models import make_draft  # noqa: E402


def main():
    torch.set_num_threads(1)
    target, shipped, tok, _, _ = load_models(argparse.Namespace(target=None, draft=None, vocab=2048, hidden=256, layers=6))
    target.generation_config.eos_token_id = None
    V = target.config.vocab_size
    prompts = [make_prompts(tok, 1, V, 96, 1, first=i) for i in range(8)]
    out = []
    for noise in (0.0, 0.3):
        draft = shipped if noise == 0 else make_draft(shipped, noise=noise, seed=5)
        r = Runner(target, draft, prompts, 64, MODES["greedy"], torch.device("cpu"))
        r(num_assistant_tokens=4)
        for n in (16, 32):
            configs = {"chain5": dict(num_assistant_tokens=4), "chain9": dict(num_assistant_tokens=8),
                       f"static{n}-d8": dict(tree=TokenTree.default(n, greedy=True)),
                       f"dynamic{n}-d8": dict(tree=TokenTree.dynamic_tree(n, greedy=True, max_depth=8)),
                       f"dynamic{n}": dict(tree=TokenTree.dynamic_tree(n, greedy=True, max_depth=None))}
            for name, (sec, st, alls) in best_of(r, configs, 3).items():
                row = dict(noise=noise, n=n, name=name, tokens_per_s=st.new_tokens / sec, accepted=st.mean_accepted_length,
                           draft_ms=1e3 * st.draft_s / st.iterations, target_ms=1e3 * st.target_s / st.iterations, seconds_all=alls)
                out.append(row)
                print(noise, n, name, f"{row['tokens_per_s']:.1f} tok/s accepted {row['accepted']:.3f} draft {row['draft_ms']:.2f} target {row['target_ms']:.2f}", flush=True)
    path = Path(__file__).resolve().parent / "results" / "tree_defaults_cpu.json"
    path.write_text(json.dumps(dict(environment=environment(torch.device("cpu")), results=out), indent=1))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
