"""`specdec-fast generate --prompts FILE.jsonl --output OUT.jsonl`: a data set through generate().

In: one JSON object per line with a "prompt" string (other fields are copied to the output row;
blank lines are ignored). A bad line (not JSON, not an object, no "prompt" string, an empty one,
or one the tokenizer turns into no tokens) is reported by its line number and skipped
(--on-error skip: `specdec-fast: warning: FILE:LINE: ...; skipped` on stderr) or fatal (--on-error
fail: the run ends with `specdec-fast: error: FILE:LINE: ...`; lines that are not rows are found
before any model loads).

Out: one JSON object per finished row, in the input's order: the input's fields, "line" (its line
number), "prompt", "completion" (the new tokens decoded, special tokens skipped), "prompt_tokens",
"new_tokens" (this row's), and the stats of the batch it ran in, "mean_accepted_length",
"acceptance" (alpha), "time_s", "tokens_per_s", "batch_rows" (the engine counts acceptance per
batch: with --batch-size 1 they are the row's own; null without a drafter).

Rows run in batches of --batch-size, left padded, after a one-token call that checks the set-up
(a draft with another vocabulary ends the run whatever --on-error says). Each batch's rows are
written and flushed when it finishes, so a later failure loses no finished row (an exception other
than generate()'s ValueError propagates, the file holding every finished batch). A batch that generate() refuses
(ValueError: a prompt too long for the model, ...) ends the run naming its lines under --on-error
fail; under skip its rows are retried one at a time and the ones that still fail are reported and
skipped. Progress: a tqdm bar with tokens/s and acceptance on a terminal, else one line per batch
on stderr.
"""
import json
import math
import sys
import time
from dataclasses import dataclass


class DatasetError(Exception):
    """A bad line or a refused batch under --on-error fail: one line, `specdec-fast: error: ...`."""


@dataclass
class Row:
    line: int  # 1-based line number in the input file
    record: dict  # the input object
    prompt: str
    ids: list | None = None  # the prompt's token ids


def _warn(message: str) -> None:
    print(f"specdec-fast: warning: {message}; skipped", file=sys.stderr, flush=True)


def _problem(text: str):
    """Why one line of the input is not a row (None when it is one), and the object parsed from it."""
    try:
        record = json.loads(text)
    except json.JSONDecodeError as exc:
        return f"not JSON ({exc})", None
    if not isinstance(record, dict):
        return f"not a JSON object (a {type(record).__name__})", None
    if "prompt" not in record:
        return 'no "prompt" field', None
    if not isinstance(record["prompt"], str):
        return f'"prompt" is not a string (a {type(record["prompt"]).__name__})', None
    if not record["prompt"]:
        return '"prompt" is empty', None
    return None, record


def read_rows(path: str, on_error: str) -> list:
    """The rows of a JSONL file; a bad line is reported by number and skipped, or raises DatasetError."""
    rows = []
    with open(path, encoding="utf-8") as f:
        for number, text in enumerate(f, start=1):
            if not text.strip():
                continue
            problem, record = _problem(text)
            if problem is not None:
                if on_error == "fail":
                    raise DatasetError(f"{path}:{number}: {problem}")
                _warn(f"{path}:{number}: {problem}")
                continue
            rows.append(Row(number, record, record["prompt"]))
    return rows


def encode(tokenizer, prompt: str, chat: bool) -> list:
    """The prompt's token ids: the tokenizer's own special tokens, or with chat=True the chat template
    for one user message with the generation prompt (whose text carries any special tokens)."""
    if not chat:
        return list(tokenizer(prompt).input_ids)
    text = tokenizer.apply_chat_template([{"role": "user", "content": prompt}], tokenize=False,
                                         add_generation_prompt=True)
    return list(tokenizer(text, add_special_tokens=False).input_ids)


def pad_id(tokenizer) -> int:
    """The id left padding uses (masked out, but it must lie in the vocabulary): pad, else EOS, else 0."""
    for value in (tokenizer.pad_token_id, tokenizer.eos_token_id):
        if isinstance(value, int):
            return value
    return 0


def left_pad(sequences, pad: int, device):
    """input_ids, attention_mask [B, longest] with left padding."""
    import torch

    width = max(len(s) for s in sequences)
    ids = torch.full((len(sequences), width), pad, dtype=torch.long)
    mask = torch.zeros((len(sequences), width), dtype=torch.long)
    for i, seq in enumerate(sequences):
        ids[i, width - len(seq):] = torch.tensor(seq, dtype=torch.long)
        mask[i, width - len(seq):] = 1
    return ids.to(device), mask.to(device)


def _number(value, digits: int = 4):
    """A rounded float for JSON: None for NaN / inf (JSON has neither)."""
    return round(float(value), digits) if value is not None and math.isfinite(value) else None


class Totals:
    """Running totals over the batches for the progress line: tokens/s and acceptance (alpha)."""

    def __init__(self):
        self.tokens, self.seconds, self.hist, self.k = 0, 0.0, None, 0

    def add(self, stats, seconds: float) -> None:
        self.tokens += stats.new_tokens
        self.seconds += seconds
        if stats.k:
            self.k = stats.k
            self.hist = list(stats.accepted_hist) if self.hist is None else [a + b for a, b in zip(self.hist, stats.accepted_hist)]

    @property
    def alpha(self):
        if not self.k or not self.hist:
            return None
        accepted = sum(j * c for j, c in enumerate(self.hist))
        examined = sum(min(j + 1, self.k) * c for j, c in enumerate(self.hist))
        return accepted / examined if examined else None

    def text(self) -> str:
        rate = self.tokens / self.seconds if self.seconds > 0 else 0.0
        alpha = self.alpha
        return f"{rate:.1f} tokens/s" + (f", acceptance {alpha:.2f}" if alpha is not None else "")


class Progress:
    """A tqdm bar on a terminal; elsewhere (logs, pipes, tests) one plain line per batch on stderr."""

    def __init__(self, total: int, live: bool, quiet: bool = False):
        self.total, self.done, self.bar, self.quiet = total, 0, None, quiet
        if live:
            from tqdm.auto import tqdm

            self.bar = tqdm(total=total, unit="row", desc="generate", file=sys.stderr)

    def update(self, rows: int, totals: Totals) -> None:
        self.done += rows
        if self.bar is not None:
            self.bar.set_postfix_str(totals.text(), refresh=False)
            self.bar.update(rows)
        elif not self.quiet:
            print(f"specdec-fast: rows {self.done}/{self.total}, {totals.tokens} tokens, {totals.text()}",
                  file=sys.stderr, flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def _output_rows(batch, out, width: int, stats, seconds: float, tokenizer) -> list:
    """One JSON object per row of a finished batch."""
    k = stats.k
    shared = dict(mean_accepted_length=_number(stats.mean_accepted_length) if k else None,
                  acceptance=_number(stats.alpha) if k else None, time_s=round(seconds, 6),
                  tokens_per_s=_number(stats.tokens_per_s, 2), batch_rows=len(batch))
    rows = []
    for i, row in enumerate(batch):
        new = int(stats.tokens_per_row[i])
        completion = tokenizer.decode(out[i, width:width + new].tolist(), skip_special_tokens=True)
        rows.append({**row.record, "line": row.line, "prompt": row.prompt, "completion": completion,
                     "prompt_tokens": len(row.ids), "new_tokens": new, **shared})
    return rows


def encode_rows(rows: list, tokenizer, args) -> list:
    """Each row's token ids (``encode``); a row whose prompt the tokenizer refuses or turns into no
    tokens is reported by line number and dropped, or raises DatasetError (--on-error fail)."""
    good = []
    for row in rows:
        try:
            row.ids = encode(tokenizer, row.prompt, args.chat)
        except Exception as exc:  # noqa: BLE001 - a template's own error (jinja2, ValueError, ...): name the line
            problem = f"the tokenizer refused the prompt ({' '.join(str(exc).split())[:120]})"
        else:
            problem = None if row.ids else "the prompt has no tokens"
        if problem is None:
            good.append(row)
        elif args.on_error == "fail":
            raise DatasetError(f"{args.prompts}:{row.line}: {problem}")
        else:
            _warn(f"{args.prompts}:{row.line}: {problem}")
    if not good:
        raise DatasetError(f"no prompts to generate from in {args.prompts}")
    return good


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())


def run_rows(args, rows: list, tokenizer, generate_batch, device, live_progress=None, quiet: bool = False) -> int:
    """Generate ``rows`` (encoded) in batches of args.batch_size with ``generate_batch(input_ids,
    attention_mask, seed, max_new_tokens=...)`` (returns (tokens, GenerationStats)) and write
    args.output as each batch finishes. First a one-token call checks the set-up (a vocabulary
    mismatch, ...: DatasetError whatever --on-error says, and the first batch's speed is not the
    warm-up's). Returns the exit status (0); raises DatasetError under --on-error fail. quiet: no
    progress lines (a tensor-parallel rank other than 0)."""
    pad = pad_id(tokenizer)
    try:
        generate_batch(*left_pad([rows[0].ids[:1]], pad, device), args.seed, max_new_tokens=1)
    except ValueError as exc:
        raise DatasetError(_one_line(exc)) from None
    live = sys.stderr.isatty() if live_progress is None else live_progress
    totals, progress, written, skipped = Totals(), Progress(len(rows), live and not quiet, quiet), 0, 0

    def run(batch):
        ids, mask = left_pad([row.ids for row in batch], pad, device)
        start = time.perf_counter()
        out, stats = generate_batch(ids, mask, args.seed + batch[0].line)
        seconds = time.perf_counter() - start
        totals.add(stats, seconds)
        return _output_rows(batch, out, ids.shape[1], stats, seconds, tokenizer)

    try:
        with open(args.output, "w", encoding="utf-8") as f:
            for start in range(0, len(rows), args.batch_size):
                batch = rows[start:start + args.batch_size]
                try:
                    results = run(batch)
                except ValueError as exc:  # generate() refused the batch (a prompt too long, ...)
                    if args.on_error == "fail":
                        lines = ",".join(str(row.line) for row in batch)
                        raise DatasetError(f"{args.prompts}:{lines}: {_one_line(exc)}") from None
                    results = []
                    for row in batch:  # which row was it: each alone
                        try:
                            results += run([row])
                        except ValueError as row_exc:
                            _warn(f"{args.prompts}:{row.line}: {_one_line(row_exc)}")
                            skipped += 1
                for result in results:
                    f.write(json.dumps(result, ensure_ascii=False) + "\n")
                f.flush()
                written += len(results)
                progress.update(len(batch), totals)
    finally:
        progress.close()
    print(f"wrote {written} row(s) to {args.output}" + (f" ({skipped} refused by generate, skipped)" if skipped else "")
          + f"; {totals.tokens} new tokens in {totals.seconds:.2f} s, {totals.text()}")
    return 0
