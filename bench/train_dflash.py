"""Train a DFlash block drafter for the demo target (specdec_fast/assets/pair/dflash/ when it pays)
from the target's own hidden states and outputs on the demo corpus (CPython's stdlib, held-out
modules excluded: bench/pair_corpus.py), with specdec_fast/train/dflash.py.

    .venv/bin/python bench/train_dflash.py --minutes 28    # the drafter of bench/results/dflash_training.json
    .venv/bin/python bench/train_dflash.py --minutes 5 --out /tmp/dflash --results /tmp/dflash.json
    .venv/bin/python bench/train_dflash.py --variant dflash2 --init DIR --lr 5e-4 --minutes 20   # DFlash2 from a DFlash

The drafter: --layers Qwen3-style layers of the target's width (256; 8 heads / 2 KV heads of 32),
intermediate --intermediate, a block of --block-size (K <= block_size - 1), reading the outputs of
target layers --target-layers (DFlash numbering: layer i = transformers' hidden_states[i + 1]);
mask token: the least frequent token of the training stream (the demo tokenizer has no spare
special token; DFlash adds one to its targets' vocabularies). Training text: the target's own
continuations (DFlash trains on its target's regenerated responses): --teacher-rows windows of 64
corpus tokens continued by --teacher-new target tokens, half greedy, half sampled at T 0.8
(pair_corpus.target_continuations); --teacher-rows 0 trains on corpus windows of --seq-len tokens
instead (the first drafter's recipe). --anchors blocks per window, AdamW with warm-up and cosine
decay, --minutes or --steps; loss decay by block position as DFlash's (train/dflash.py).

Not shipped: the 28-minute block-8 drafter trained on corpus text (bench/results/dflash_training.json)
accepts 2.2 tokens per iteration on the held-out prompts against the draft model's 3.5
(heads_pair_cpu_*.json); the 45-minute block-16 drafter trained on the target's own text
(`--block-size 16 --minutes 45 --target-layers 1 2 3`, dflash_b16_training.json) 2.9 at K=4 and 3.4
at K=15, and both run slower than plain decoding on a CPU (heads_dflash_b16_cpu_avx512.json), so
the pair has no dflash/ directory.

Writes the drafter in the published layout (config.json + model.safetensors) and a JSON record:
sizes, held-out chained top-1 agreement per block position (greedy acceptance of draft i given
drafts < i accepted, teacher-forced on the target's own greedy continuations of 16 held-out
windows), wall time, machine.
"""
import argparse
import copy
import json
import sys
import time
from collections import Counter
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from machine import cpu_model, versions  # noqa: E402
from pair_corpus import corpus_streams, target_continuations  # noqa: E402
from train_eagle3 import log  # noqa: E402

REPO = Path(__file__).resolve().parent.parent


@torch.no_grad()
def held_out_agreement(head, target, text: torch.Tensor) -> list:
    """text [N, T]: the target's greedy continuations of held-out windows."""
    from specdec_fast.train.dflash import dflash_loss

    _, agree = dflash_loss(head, target, text, 8, torch.Generator().manual_seed(0))
    return [round(a, 4) for a in agree]


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=REPO / "specdec_fast" / "assets" / "pair" / "dflash")
    ap.add_argument("--results", type=Path, default=REPO / "bench" / "results" / "dflash_training.json")
    ap.add_argument("--minutes", type=float, default=25.0)
    ap.add_argument("--steps", type=int, default=100000)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq-len", type=int, default=256, help="corpus windows' length (with --teacher-rows 0)")
    ap.add_argument("--teacher-rows", type=int, default=3072, help="rows of the target's own text (0: the corpus)")
    ap.add_argument("--teacher-new", type=int, default=192, help="target tokens per row after 64 corpus tokens")
    ap.add_argument("--anchors", type=int, default=16)
    ap.add_argument("--block-size", type=int, default=8)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--intermediate", type=int, default=688)
    ap.add_argument("--target-layers", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--variant", choices=("dflash", "dflash2"), default="dflash",
                    help="dflash2: DFlash plus its in-block convolutions and candidate selector (heads/dflash2.py)")
    ap.add_argument("--selector-rank", type=int, default=64, help="dflash2: the selector's codebook rank")
    ap.add_argument("--selector-top-k", type=int, default=16, help="dflash2: candidates rescored per position")
    ap.add_argument("--conv-taps", type=int, default=2, help="dflash2: the in-block convolutions' taps")
    ap.add_argument("--init", type=Path, default=None,
                    help="start from this drafter (published layout; its shape, block and target layers are kept)")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)

    from transformers import AutoModelForCausalLM, AutoTokenizer, Qwen3Config

    from specdec_fast import demo_pair, load_draft_head, save_draft_head
    from specdec_fast.heads import DFlash2Head, DFlashHead
    from specdec_fast.train import train_dflash

    target_dir, _ = demo_pair()
    tokenizer = AutoTokenizer.from_pretrained(target_dir)
    target = AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.float32).eval().requires_grad_(False)
    train_stream, held_stream = corpus_streams(tokenizer)
    counts = Counter(train_stream.tolist())
    mask_token = min(range(target.config.vocab_size), key=lambda t: (counts.get(t, 0), t))
    log(f"tokens: train {train_stream.numel()}, held out {held_stream.numel()}; mask token {mask_token} "
        f"({counts.get(mask_token, 0)} occurrences)")
    tc = target.config
    config = Qwen3Config(hidden_size=tc.hidden_size, intermediate_size=args.intermediate, num_hidden_layers=args.layers,
                         num_attention_heads=tc.num_attention_heads, num_key_value_heads=tc.num_key_value_heads,
                         head_dim=tc.head_dim, vocab_size=tc.vocab_size, max_position_embeddings=tc.max_position_embeddings,
                         rms_norm_eps=tc.rms_norm_eps, rope_parameters=dict(tc.rope_parameters),
                         num_target_layers=tc.num_hidden_layers, block_size=args.block_size, tie_word_embeddings=True,
                         dflash_config=dict(mask_token_id=mask_token, target_layer_ids=list(args.target_layers)))
    init = load_draft_head(args.init) if args.init else None
    if init is not None:  # its shape, block, target layers and mask token
        config = copy.deepcopy(init.config)
        args.block_size, args.layers = init.block_size, config.num_hidden_layers
        args.intermediate, args.target_layers = config.intermediate_size, list(config.dflash_config["target_layer_ids"])
        mask_token = int(config.dflash_config["mask_token_id"])
    if args.variant == "dflash2":
        config.dflash_config = dict(config.dflash_config, selector_rank=args.selector_rank,
                                    selector_top_k=args.selector_top_k, conv_kernel_size=args.conv_taps,
                                    conv_group_size=16)
    torch.manual_seed(args.seed)
    head = (DFlash2Head if args.variant == "dflash2" else DFlashHead)(config)
    if init is not None:  # a fresh DFlash2 head's convolutions are the identity: it starts as the init drafter
        missing, unexpected = head.load_state_dict(init.state_dict(), strict=False)
        if unexpected:
            raise SystemExit(f"--init {args.init}: weights this {args.variant} drafter has no place for: {unexpected}")
        log(f"started from {args.init}; new: {missing}")
    params = sum(p.numel() for p in head.parameters())
    log(f"{head.label} drafter: {params} parameters, block {args.block_size}, layers {args.layers}")
    t0 = time.perf_counter()
    held = target_continuations(target, held_stream, 16, args.teacher_new or args.seq_len - 64, seed=args.seed + 1,
                                greedy_only=True, stop_at_eos=False)
    if args.teacher_rows:
        sequences = target_continuations(target, train_stream, args.teacher_rows, args.teacher_new, seed=args.seed + 2,
                                         stop_at_eos=False, log=log)
    else:
        count = train_stream.numel() // args.seq_len
        sequences = train_stream[: count * args.seq_len].view(count, args.seq_len)
    teacher_seconds = time.perf_counter() - t0
    log(f"training rows {tuple(sequences.shape)}, held-out rows {tuple(held.shape)} ({teacher_seconds:.0f} s)")
    before = held_out_agreement(head, target, held)
    info = train_dflash(head, target, sequences, steps=args.steps, minutes=args.minutes, batch_size=args.batch,
                        anchors_per_row=args.anchors, lr=args.lr, seed=args.seed, log=log)
    after = held_out_agreement(head, target, held)
    log(f"held-out chained greedy agreement per block position: before {before}, after {after}")
    save_draft_head(head, args.out)
    size = sum(f.stat().st_size for f in args.out.iterdir())
    results = dict(drafter=dict(variant=args.variant, init=str(args.init) if args.init else None, params=params,
                                layers=args.layers, intermediate=args.intermediate,
                                block_size=args.block_size, target_layer_ids=list(args.target_layers),
                                mask_token_id=mask_token, bytes_on_disk=size),
                   training=dict(info, batch=args.batch, rows=list(sequences.shape), anchors=args.anchors, lr=args.lr,
                                 text="target" if args.teacher_rows else "corpus",
                                 teacher_seconds=round(teacher_seconds, 1)),
                   held_out_agreement_per_position=after, held_out_agreement_untrained=before,
                   held_out_windows=int(held.shape[0]), device=f"cpu: {cpu_model()}", threads=torch.get_num_threads(),
                   versions=versions(), command="python bench/train_dflash.py " + " ".join(argv or sys.argv[1:]))
    args.results.parent.mkdir(parents=True, exist_ok=True)
    args.results.write_text(json.dumps(results, indent=1) + "\n")
    log(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
