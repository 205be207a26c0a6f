"""An evaluation-harness-shaped loop through a patched model (specdec_fast.patch_generate) against
the same loop on the unpatched model: what "change one line, keep your code" gives.

The loop: --calls calls of model.generate(input_ids=..., attention_mask=..., max_length=prompt +
--new-tokens, stopping_criteria=[a stop-sequence criterion, as lm-evaluation-harness passes],
pad_token_id=..., use_cache=True, do_sample=False), one held-out prompt each (cycled), batch 1,
as a harness makes them. Three ways, in one run, interleaved per call:
    transformers      the model's own generate (unpatched)
    patched plain     patch_generate(model) with nothing bound: the calls go to transformers too
                      (the patch's own cost, which should be none)
    patched + draft   patch_generate(model, assistant_model=draft): every call speculates on the
                      cached engine
Greedy outputs are checked equal token for token. Tokens/s counts the new tokens (up to the stop).

    python bench/bench_harness.py [--calls 50] [--new-tokens 64] [--threads 1]

Writes bench/results/harness_<device>.json. CPU: the demo pair.
"""
import argparse
import json
import sys
import time
from pathlib import Path

import torch
from transformers import StoppingCriteria, StoppingCriteriaList

import specdec_fast

sys.path.insert(0, str(Path(__file__).resolve().parent))
from machine import cpu_model, versions  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent


class StopSequence(StoppingCriteria):
    """lm-evaluation-harness's stop sequence, token-level: done when the last tokens are it."""

    def __init__(self, sequence):
        self.sequence = torch.tensor(sequence)

    def __call__(self, input_ids, scores, **kwargs):
        n = len(self.sequence)
        if input_ids.shape[1] < n:
            return torch.zeros(input_ids.shape[0], dtype=torch.bool)
        return (input_ids[:, -n:] == self.sequence.to(input_ids.device)).all(-1)


def main(argv=None) -> dict:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from specdec_fast.pair import held_out_prompts

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--calls", type=int, default=50)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    target_dir, draft_dir = specdec_fast.demo_pair()
    tok = AutoTokenizer.from_pretrained(target_dir)
    target = AutoModelForCausalLM.from_pretrained(target_dir).eval()
    draft = AutoModelForCausalLM.from_pretrained(draft_dir).eval()
    stop = tok("\n\n\n").input_ids  # a blank-line run ends a completion
    prompts = [tok(p, return_tensors="pt") for p in held_out_prompts()]

    def loop_call(model, i):
        enc = prompts[i % len(prompts)]
        return model.generate(input_ids=enc.input_ids, attention_mask=enc.attention_mask,
                              max_length=enc.input_ids.shape[1] + args.new_tokens, pad_token_id=tok.pad_token_id,
                              stopping_criteria=StoppingCriteriaList([StopSequence(stop)]), use_cache=True,
                              do_sample=False)

    ways = {"transformers": lambda i: loop_call(target, i)}
    times = {name: 0.0 for name in ("transformers", "patched plain", "patched + draft")}
    tokens = dict.fromkeys(times, 0)
    outputs = {name: [] for name in times}
    loop_call(target, 0)  # warm-up: the first call of a process pays for lazy inits in every way
    with specdec_fast.patch_generate(target):
        loop_call(target, 0)
    with specdec_fast.patch_generate(target, assistant_model=draft):
        loop_call(target, 0)
    for i in range(args.calls):
        for name in times:
            width = prompts[i % len(prompts)].input_ids.shape[1]
            if name == "transformers":
                start = time.perf_counter()
                out = ways["transformers"](i)
                times[name] += time.perf_counter() - start
            else:
                bound = dict(assistant_model=draft) if name == "patched + draft" else {}
                with specdec_fast.patch_generate(target, **bound):
                    start = time.perf_counter()
                    out = loop_call(target, i)
                    times[name] += time.perf_counter() - start
            new = out[0, width:]
            tokens[name] += int((new != tok.pad_token_id).sum()) if tok.pad_token_id is not None else new.numel()
            outputs[name].append(out)
    same = all(torch.equal(a, b) for name in ("patched plain", "patched + draft")
               for a, b in zip(outputs["transformers"], outputs[name]))
    rows = {name: dict(seconds=times[name], new_tokens=tokens[name], tokens_per_s=tokens[name] / times[name])
            for name in times}
    for name, row in rows.items():
        row["speedup_over_transformers"] = row["tokens_per_s"] / rows["transformers"]["tokens_per_s"]
        print(f"{name:16s} {row['new_tokens']:6d} tokens in {row['seconds']:7.2f} s = {row['tokens_per_s']:7.1f} tok/s "
              f"({row['speedup_over_transformers']:.2f}x transformers)")
    print(f"greedy outputs identical to transformers' in every call: {same}")
    result = dict(device=cpu_model(), versions=versions(), threads=args.threads, calls=args.calls,
                  new_tokens=args.new_tokens, models="demo pair (3.8M Llama code model + 0.8M draft), float32, CPU",
                  outputs_identical=same, rows=rows)
    out = Path(args.out) if args.out else ROOT / "bench" / "results" / "harness_cpu.json"
    out.write_text(json.dumps(result, indent=1))
    print(f"wrote {out}")
    return result


if __name__ == "__main__":
    main()
