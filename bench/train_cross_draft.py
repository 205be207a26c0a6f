"""Train the cross-tokenizer draft shipped in specdec_fast/assets/cross_draft/: a small Llama with
its OWN byte-level BPE tokenizer (vocabulary 2048, digits split one by one, <pad> at id 0 so that
no token id coincides with the demo target's), on the demo pair's corpus (bench/pair_corpus.py:
CPython's stdlib, the same held-out modules). It drafts for the demo target (vocabulary 4096)
through drafters/cross_tokenizer.py (generate(..., tokenizer=, assistant_tokenizer=)).

    .venv/bin/python bench/train_cross_draft.py            # defaults = the shipped draft

Two stages, in the draft's own tokens (its vocabulary is not the target's, so no logit distillation):
  1. next-token cross-entropy on the corpus (--steps);
  2. sequence-level distillation (--distill-steps): the demo target continues --distill-prompts
     windows of the training corpus (64 of its tokens each, --distill-new more: greedy for half
     of them, sampled at temperature 0.8 for the rest, through specdec_fast.generate), the text is
     re-encoded into the draft's tokens, and the draft trains on it (one window in four from the
     corpus). What the draft must predict is the target's text, not the corpus.
The shape is the demo draft's (hidden 128, 2 layers) with half its vocabulary; the weights are
stored as float16 (1.1 MB; load with dtype=torch.float32, as specdec_fast.pair.load_cross_draft
does) so the package stays small; stage 2 starts from the float16-rounded stage 1, as stored
(--stage 2 resumes from the stored draft: how the shipped one was made).

Fixed seeds, deterministic corpus order; --steps or --minutes, whichever ends first (the schedule
follows the larger fraction, as bench/train_pair.py). Writes bench/results/cross_draft_training.json
(steps, seconds, held-out loss per token and per byte beside the demo draft's, machine).
--threads 1 (default): see bench/train_pair.py on the shared 2-core box.
"""
import argparse
import json
import math
import os
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from machine import cpu_model, versions  # noqa: E402
from pair_corpus import encode_stream, read_source, split_files, stdlib_dir, target_continuations  # noqa: E402
from train_pair import (DRAFT, EOS, eval_windows, held_out_loss, log, logits_of,  # noqa: E402
                        param_counts, train)

REPO = Path(__file__).resolve().parent.parent
VOCAB = 2048
PAD = "<pad>"


def train_tokenizer(texts: list[str], out_dir: Path, vocab: int = VOCAB):
    """Byte-level BPE of ``vocab`` tokens, digits split one by one; <pad> = 0, <|endoftext|> = 1
    (bos / eos), then the 256 byte symbols: every id differs from the demo target's."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                                 pre_tokenizers.ByteLevel(add_prefix_space=False)])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab, min_frequency=2, special_tokens=[PAD, EOS],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(texts, trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=EOS, eos_token=EOS, pad_token=PAD, unk_token=EOS)
    fast.model_max_length = 2048
    fast.save_pretrained(out_dir)
    _finalise(out_dir)
    return fast


def _finalise(out_dir: Path) -> None:
    """Loadable by transformers 4.x and 5.x; decoding gives the source back exactly (no clean-up)."""
    config_path = out_dir / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config.update(tokenizer_class="PreTrainedTokenizerFast", clean_up_tokenization_spaces=False)
    config_path.write_text(json.dumps(config, indent=2) + "\n")
    special = {"bos_token": EOS, "eos_token": EOS, "pad_token": PAD, "unk_token": EOS}
    (out_dir / "special_tokens_map.json").write_text(json.dumps(special, indent=2) + "\n")


def build_model(tokenizer, vocab: int, max_len: int = 2048):
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=vocab, max_position_embeddings=max_len, tie_word_embeddings=True, rms_norm_eps=1e-5,
                         rope_theta=10000.0, bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                         pad_token_id=tokenizer.pad_token_id, **DRAFT)
    return LlamaForCausalLM(config)


def save_and_reload(model, tokenizer, out: Path):
    """Stores the draft in float16 with its tokenizer; returns it as stored, in float32."""
    model.half().save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    _finalise(out)
    return model.float()


@torch.no_grad()
def target_text_stream(args, train_texts: list[str], tokenizer) -> torch.Tensor:
    """The demo target's own text, in the draft's tokens: --distill-prompts windows of the training
    corpus (64 target tokens each) continued by --distill-new tokens, greedy for even chunks of 64
    rows and sampled (temperature 0.8) for odd ones (pair_corpus.target_continuations), each text
    followed by <|endoftext|>."""
    from specdec_fast.drafters.token_bytes import TokenBytes, incomplete_tail
    from specdec_fast.pair import load_demo_pair

    target_tok, target, _ = load_demo_pair()
    rows = target_continuations(target, encode_stream(target_tok, train_texts), args.distill_prompts, args.distill_new,
                                seed=args.seed + 2, chunk_seed=args.seed, log=log)  # the seeds it always used
    tcodec, dcodec = TokenBytes(target_tok), TokenBytes(tokenizer)
    ids = []
    for row in rows.tolist():
        text = tcodec.bytes_of(row)
        ids += dcodec.encode(text[: len(text) - incomplete_tail(text)]) + [tokenizer.eos_token_id]
    return torch.tensor(ids, dtype=torch.int64)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=REPO / "specdec_fast" / "assets" / "cross_draft")
    ap.add_argument("--results", type=Path, default=REPO / "bench" / "results" / "cross_draft_training.json")
    ap.add_argument("--steps", type=int, default=3000)
    ap.add_argument("--minutes", type=float, default=30.0)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--eval-windows", type=int, default=64)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--distill-steps", type=int, default=1500)
    ap.add_argument("--distill-minutes", type=float, default=20.0)
    ap.add_argument("--distill-lr", type=float, default=1e-3)
    ap.add_argument("--distill-prompts", type=int, default=4096)
    ap.add_argument("--distill-new", type=int, default=128)
    ap.add_argument("--stage", type=int, choices=(1, 2), default=1,
                    help="1: both stages; 2: stage 2 only, from the draft stored in --out (and its record in --results)")
    args = ap.parse_args(argv)

    torch.set_num_threads(args.threads)
    os.environ.setdefault("RAYON_NUM_THREADS", str(args.threads))
    wall = time.perf_counter()
    root = stdlib_dir()
    train_files, held_files = split_files(root)
    train_texts = [read_source(root, f) for f in train_files]
    held_texts = [read_source(root, f) for f in held_files]
    t0 = time.perf_counter()
    if args.stage == 1:
        tokenizer = train_tokenizer(train_texts, args.out)
        log(f"tokenizer ({VOCAB}) trained in {time.perf_counter() - t0:.0f}s")
    else:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(args.out)
    train_stream, held_stream = encode_stream(tokenizer, train_texts), encode_stream(tokenizer, held_texts)
    held_bytes = sum(len(t.encode("utf-8")) for t in held_texts)  # <|endoftext|> has no text
    log(f"tokens: train {train_stream.numel()}, held out {held_stream.numel()}")
    windows = eval_windows(held_stream, args.seq_len, args.eval_windows)

    if args.stage == 1:
        torch.manual_seed(args.seed)
        model = build_model(tokenizer, VOCAB)
        log(f"draft: {param_counts(model)}")
        info = train(model, train_stream, steps=args.steps, minutes=args.minutes, batch=args.batch, seq_len=args.seq_len,
                     lr=args.lr, seed=args.seed + 1, name="cross draft")
        info["held_out_loss"] = round(held_out_loss(logits_of(model, windows), windows), 4)
        model = save_and_reload(model, tokenizer, args.out)  # float16 on disk: stage 2 starts from what is stored
        stage1 = info
    else:
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(args.out, dtype=torch.float32)
        stage1 = json.loads(args.results.read_text())["stage1_cross_entropy"]
        log(f"stage 1 reused from {args.out}")
    t0 = time.perf_counter()
    text_stream = target_text_stream(args, train_texts, tokenizer)
    log(f"stage 2: {text_stream.numel()} draft tokens of the target's text in {time.perf_counter() - t0:.0f}s")
    corpus = train_stream[: text_stream.numel() // 3]  # one window in four from the corpus
    distill = train(model, torch.cat([text_stream, corpus]), steps=args.distill_steps, minutes=args.distill_minutes,
                    batch=args.batch, seq_len=args.seq_len, lr=args.distill_lr, seed=args.seed + 3, name="cross draft, stage 2")
    distill.update(generate_seconds=round(time.perf_counter() - t0 - distill["seconds"], 1),
                   draft_tokens_of_target_text=text_stream.numel(), corpus_tokens_mixed_in=corpus.numel())
    loss = held_out_loss(logits_of(model, windows), windows)
    save_and_reload(model, tokenizer, args.out)
    size = sum(f.stat().st_size for f in args.out.iterdir())
    pair = json.loads((REPO / "bench" / "results" / "pair_training.json").read_text())
    per_byte = held_stream.numel() / held_bytes  # draft tokens per byte (over all held-out text)
    demo_per_byte = pair["corpus"]["held_out_tokens"] / held_bytes
    results = {
        "tokenizer": {"vocab": VOCAB, "kind": "byte-level BPE, digits split, <pad>=0 <|endoftext|>=1",
                      "held_out_tokens": held_stream.numel(), "held_out_bytes": held_bytes,
                      "bytes_per_token": round(1 / per_byte, 3), "demo_bytes_per_token": round(1 / demo_per_byte, 3)},
        "shape": DRAFT, "params": param_counts(model), "stored_dtype": "float16", "bytes_on_disk": size,
        "stage1_cross_entropy": stage1,
        "stage2_sequence_distillation": {**distill, "prompts": args.distill_prompts, "new_tokens": args.distill_new,
                                         "lr": args.distill_lr},
        "held_out_loss": round(loss, 4),
        # per byte: loss per token x tokens per byte over all held-out text (the eval windows are its first 64 x 256 tokens)
        "held_out_loss_per_byte": round(loss * per_byte, 4),
        "demo_draft_held_out_loss_per_byte": round(pair["draft"]["held_out_loss"] * demo_per_byte, 4),
        "demo_target_held_out_loss_per_byte": round(pair["target"]["held_out_loss"] * demo_per_byte, 4),
        "log_vocab": round(math.log(VOCAB), 4),
        "seconds_total": round(time.perf_counter() - wall, 1),
        "device": f"cpu: {cpu_model()}", "threads": torch.get_num_threads(), **versions(),
        "command": "python bench/train_cross_draft.py " + " ".join(argv if argv is not None else sys.argv[1:]),
    }
    args.results.parent.mkdir(parents=True, exist_ok=True)
    args.results.write_text(json.dumps(results, indent=1) + "\n")
    log(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
