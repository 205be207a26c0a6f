"""The GPU rows of issues 23 and 28: drafters that read the target's hidden states at the 8B shape.

    target   bench/scale_models.py's Llama-3-8B-shaped target (random bf16 weights, on the device)
    draft    the scale benchmark's 2-layer draft (the target's own first 2 layers, embedding, head)
    eagle3   an EAGLE-3 head of the published Llama-3.1-8B shape: fc 3 x 4096 -> 4096, one decoder
             layer (q/k/v over 8192 inputs, 32 / 8 heads, MLP 14336), its own lm_head over a draft
             vocabulary of 32000 tokens, aux layers vLLM's default (2, 16, 29)
    dflash   a DFlash drafter of the published shape: 5 Qwen3-style layers at the target's width
             (MLP 14336), block 16, target_layer_ids DFlash's default rule

Random weights, so acceptance is not what a trained drafter would get: what this measures is the
COST. Each drafter runs generate() (Triton, CUDA graphs) after a warm-up call; the engine's phase
timer gives draft ms and target ms per iteration. Then, for a grid of acceptance rates alpha (the
scale benchmark sets the draft model's by its residual scale: 0.6 / 0.8 / 0.9 in earlier runs),
Leviathan's Theorem 3.8 turns the measured costs into tokens/s at EQUAL acceptance:
    tokens per iteration E = (1 - alpha^(K+1)) / (1 - alpha),  tok/s = E / (draft_ms + target_ms)
A prediction from measured costs, labelled as such in the JSON; the measured tok/s of each run
(at its own, near-zero, acceptance) is recorded too.

    python bench/bench_heads_gpu.py [--k 2 3 4 6] [--dflash-k 7 15] [--out ...]
    python bench/bench_heads_gpu.py --tiny   # the same code on tiny shapes on the CPU (no numbers)
Writes bench/results/heads_gpu_<device>.json. Not a test.
"""
import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from machine import versions, write_result  # noqa: E402
from scale_models import LLAMA3_8B, TINY, build_target, draft_of, set_residual_scale  # noqa: E402

ALPHAS = (0.6, 0.7, 0.8, 0.9)


def eagle3_head(target, device, dtype, tiny: bool):
    """An EAGLE-3 head of the published Llama-3.1-8B shape (tiny: of TINY's), random weights."""
    import transformers as tf

    from specdec_fast.heads import Eagle3Head

    c = target.config
    config = tf.LlamaConfig(hidden_size=c.hidden_size, intermediate_size=c.intermediate_size, num_hidden_layers=1,
                            num_attention_heads=c.num_attention_heads, num_key_value_heads=c.num_key_value_heads,
                            vocab_size=c.vocab_size, draft_vocab_size=256 if tiny else 32000,
                            rope_parameters=dict(c.rope_parameters), rms_norm_eps=c.rms_norm_eps,
                            max_position_embeddings=c.max_position_embeddings)
    with torch.device(device):
        head = Eagle3Head(config)
    head = head.to(dtype)
    head.set_vocabulary(torch.arange(head.draft_vocab_size))
    return head.eval().requires_grad_(False)


def dflash_head(target, device, dtype, tiny: bool, block_size: int = 16):
    """A DFlash drafter of the published shape: 5 layers at the target's width (tiny: 2)."""
    import transformers as tf

    from specdec_fast.heads import DFlashHead

    c = target.config
    layers = 2 if tiny else 5
    config = tf.Qwen3Config(hidden_size=c.hidden_size, intermediate_size=c.intermediate_size, num_hidden_layers=layers,
                            num_attention_heads=c.num_attention_heads, num_key_value_heads=c.num_key_value_heads,
                            head_dim=c.hidden_size // c.num_attention_heads, vocab_size=c.vocab_size,
                            rope_parameters=dict(c.rope_parameters), rms_norm_eps=c.rms_norm_eps,
                            num_target_layers=c.num_hidden_layers, block_size=block_size,
                            dflash_config=dict(mask_token_id=c.vocab_size - 1))
    with torch.device(device):
        head = DFlashHead(config)
    return head.to(dtype).eval().requires_grad_(False)


def tokens_per_iteration(alpha: float, k: int) -> float:
    return float(k + 1) if alpha >= 1 else (1 - alpha ** (k + 1)) / (1 - alpha)


def run(target, ids, new_tokens: int, repeats: int, device, **kw) -> dict:
    """One warm-up call, then ``repeats`` timed calls; the fastest call's figures."""
    import specdec_fast

    opts = dict(max_new_tokens=new_tokens, do_sample=False, return_stats=True)
    if device.type == "cuda":
        opts.update(backend="triton", cuda_graphs=True)
    specdec_fast.generate(target, ids, **opts, **kw)
    best = None
    for _ in range(repeats):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        _, stats = specdec_fast.generate(target, ids, **opts, **kw)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        seconds = time.perf_counter() - start
        if best is None or seconds < best[0]:
            best = (seconds, stats)
    seconds, stats = best
    iterations = max(stats.iterations, 1)
    row = dict(seconds=round(seconds, 4), tokens_per_s=round(new_tokens / seconds, 2), iterations=stats.iterations)
    if "assistant_model" in kw or "draft_head" in kw:
        row.update(draft_ms_per_iter=round(1000 * stats.draft_s / iterations, 4),
                   target_ms_per_iter=round(1000 * stats.target_s / iterations, 4),
                   mean_accepted_length=round(stats.mean_accepted_length, 3), alpha=round(stats.alpha, 3))
    return row


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tiny", action="store_true", help="tiny shapes on the CPU: the code path, no numbers")
    ap.add_argument("--k", type=int, nargs="+", default=[2, 3, 4, 6], help="chains' K (draft model, EAGLE-3 head)")
    ap.add_argument("--dflash-k", type=int, nargs="+", default=[7, 15], help="DFlash's K (block 16: up to 15)")
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--out")
    args = ap.parse_args(argv)
    if not args.tiny and not torch.cuda.is_available():
        raise SystemExit("needs a CUDA device (or --tiny)")
    device = torch.device("cpu" if args.tiny else "cuda")
    dtype = torch.float32 if args.tiny else torch.bfloat16
    target = build_target(TINY if args.tiny else LLAMA3_8B, device, dtype=dtype)
    set_residual_scale(target, 0.1)  # the scale benchmark's stand-in regime (acceptance is not the point here)
    draft = draft_of(target, 2)
    heads = dict(eagle3=eagle3_head(target, device, dtype, args.tiny), dflash=dflash_head(target, device, dtype, args.tiny))
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(3, target.config.vocab_size - 1, (1, args.prompt_len), generator=gen).to(device)
    rows = dict(plain=run(target, ids, args.new_tokens, args.repeats, device))
    plain_ms = 1000 * rows["plain"]["seconds"] / args.new_tokens
    print(f"plain: {rows['plain']['tokens_per_s']} tok/s ({plain_ms:.3f} ms per token)", flush=True)
    for k in args.k:
        rows[f"draft K={k}"] = run(target, ids, args.new_tokens, args.repeats, device, assistant_model=draft,
                                   num_assistant_tokens=k)
        rows[f"eagle3 K={k}"] = run(target, ids, args.new_tokens, args.repeats, device, draft_head=heads["eagle3"],
                                    num_assistant_tokens=k)
    for k in args.dflash_k:
        rows[f"dflash K={k}"] = run(target, ids, args.new_tokens, args.repeats, device, draft_head=heads["dflash"],
                                    num_assistant_tokens=k)
    for name, row in rows.items():
        if "draft_ms_per_iter" not in row:
            continue
        k = int(name.split("K=")[1])
        per_step = row["draft_ms_per_iter"] / (1 if name.startswith("dflash") else k)
        row["draft_cost_per_step_over_target_token"] = round(per_step / plain_ms, 4)  # Leviathan's c
        row["predicted_tokens_per_s_at_alpha"] = {
            str(a): round(1000 * tokens_per_iteration(a, k) / (row["draft_ms_per_iter"] + row["target_ms_per_iter"]), 1)
            for a in ALPHAS}
        print(f"{name}: draft {row['draft_ms_per_iter']} ms + target {row['target_ms_per_iter']} ms per iteration, "
              f"c = {row['draft_cost_per_step_over_target_token']}; predicted tok/s at alpha "
              f"{row['predicted_tokens_per_s_at_alpha']}", flush=True)
    params = {name: sum(p.numel() for p in module.parameters()) for name, module in
              (("target", target), ("eagle3", heads["eagle3"]), ("dflash", heads["dflash"]))}
    params["draft (shared with the target)"] = sum(p.numel() for p in draft.model.layers.parameters())
    result = dict(device=torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu (tiny smoke: no numbers)",
                  versions=versions(), shapes="tiny" if args.tiny else "Llama-3-8B target, published head shapes",
                  parameters=params, prompt_len=args.prompt_len, new_tokens=args.new_tokens, repeats=args.repeats,
                  prediction="tokens/s at equal acceptance alpha from the measured per-iteration costs by Leviathan's "
                             "Theorem 3.8 (random-weight drafters: their own acceptance is near zero)",
                  command="python bench/bench_heads_gpu.py " + " ".join(argv if argv is not None else sys.argv[1:]),
                  rows=rows)
    if args.tiny:
        print("tiny smoke run: not a measurement; nothing written")
        return result
    write_result(result, "heads_gpu", torch.cuda.get_device_name(device), args.out)
    return result


if __name__ == "__main__":
    main()
