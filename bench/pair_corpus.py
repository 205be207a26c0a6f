"""The corpus of the demo pair: CPython's own standard library sources, split by module.

Training files: every ``.py`` file under ``sysconfig.get_paths()["stdlib"]`` in sorted path
order, except
  - site-packages (third-party code, differs per machine),
  - the test suites (test/, tests/, idlelib/idle_test/, lib2to3/tests/ ...): they are large
    (820 of ~1700 files in 3.11), repetitive, and would dominate a ~10 MB corpus,
  - encodings/ (generated charmap tables: hex literals, not code anyone completes) and
    pydoc_data/ (one 700 KB string of help text),
  - the HELD_OUT modules below, which are never trained on and provide the evaluation text
    and the demo prompts.
"""
import re
import sysconfig
from pathlib import Path

import torch

# Fixed held-out modules (paths relative to the stdlib directory). Small, self-contained,
# typical library code; present in every CPython 3.10-3.13.
HELD_OUT = (
    "bisect.py",
    "calendar.py",
    "colorsys.py",
    "csv.py",
    "fnmatch.py",
    "fractions.py",
    "glob.py",
    "graphlib.py",
    "heapq.py",
    "json/decoder.py",
    "json/encoder.py",
    "queue.py",
    "sched.py",
    "shlex.py",
    "textwrap.py",
)

EXCLUDED_DIRS = {"site-packages", "test", "tests", "idle_test", "encodings", "pydoc_data", "__pycache__"}


def stdlib_dir() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def _relative_py_files(root: Path) -> list[str]:
    names = []
    for path in root.rglob("*.py"):
        rel = path.relative_to(root)
        if any(part in EXCLUDED_DIRS or part.startswith("config-") for part in rel.parts[:-1]):
            continue
        names.append(rel.as_posix())
    return sorted(names)


def read_source(root: Path, rel: str) -> str:
    return (root / rel).read_text(encoding="utf-8", errors="replace")


def split_files(root: Path | None = None) -> tuple[list[str], list[str]]:
    """(training files, held-out files), relative paths in sorted order."""
    root = root or stdlib_dir()
    files = _relative_py_files(root)
    missing = [name for name in HELD_OUT if name not in files]
    if missing:
        raise FileNotFoundError(f"held-out modules missing from {root}: {missing}")
    held = set(HELD_OUT)
    return [f for f in files if f not in held], list(HELD_OUT)


def encode_stream(tokenizer, texts: list[str]) -> torch.Tensor:
    """All texts as one int64 stream [N], each followed by the tokenizer's eos token."""
    ids = []
    for ids_one in tokenizer(texts, add_special_tokens=False)["input_ids"]:
        ids.extend(ids_one)
        ids.append(tokenizer.eos_token_id)
    return torch.tensor(ids, dtype=torch.int64)


def corpus_streams(tokenizer, root: Path | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(training stream, held-out stream) of the corpus in ``tokenizer``'s ids (encode_stream)."""
    root = root or stdlib_dir()
    train_files, held_files = split_files(root)
    return tuple(encode_stream(tokenizer, [read_source(root, f) for f in files]) for files in (train_files, held_files))


_DEF = re.compile(r"^(    )?def \w+.*:\s*$")


def _docstring_end(lines: list[str], first: int) -> int | None:
    """Index of the line closing the docstring that opens at lines[first], else None."""
    text = lines[first].strip()
    quote = text[:3] if text[:3] in ('"""', "'''") else None
    if quote is None:
        return None
    if text.count(quote) >= 2:
        return first
    for i in range(first + 1, len(lines)):
        if quote in lines[i]:
            return i
    return None


def prompt_from_module(source: str, max_lines: int = 14) -> str:
    """A completion prompt: the module's first one-line-signature function with a short docstring,
    cut after the docstring and the body's first line (the model continues the body).
    Fallback: the first def and its next two lines. Deterministic.

    The final newline is left off: byte-level BPE merges a newline with the next line's
    indentation ("\\n        "), so a prompt ending in a bare "\\n" ends on a token split the
    models never saw in training (measured: they then start a new top-level def).
    """
    lines = source.splitlines(keepends=True)
    starts = [i for i, line in enumerate(lines) if _DEF.match(line)]
    for start in starts:
        end = _docstring_end(lines, start + 1) if start + 1 < len(lines) else None
        if end is not None and end + 2 - start <= max_lines and lines[end + 1].strip():
            return "".join(lines[start : end + 2]).rstrip("\n")
    start = starts[0] if starts else 0
    return "".join(lines[start : start + 3]).rstrip("\n")


def target_continuations(target, stream, rows: int, new_tokens: int, *, seed: int, prompt_tokens: int = 64,
                         chunk: int = 64, greedy_only: bool = False, stop_at_eos: bool = True,
                         chunk_seed: int | None = None, log=None):
    """The demo target's own text: ``rows`` windows of ``prompt_tokens`` tokens of ``stream`` (a 1-D
    tensor of target tokens; random starts) continued by ``new_tokens`` tokens of the target, in
    chunks of ``chunk`` rows: greedy for even chunks, sampled at temperature 0.8 for odd ones (every
    chunk greedy with ``greedy_only``); rows that reach EOS end there (pad after it) unless not
    ``stop_at_eos``. Seeds: ``seed`` draws the starts, ``chunk_seed`` (default ``seed``) + i samples
    chunk i. -> int64 [rows, prompt_tokens + new_tokens], target tokens.
    What a drafter sees at decoding time is the target's own text, not the corpus's."""
    import torch

    import specdec_fast

    gen = torch.Generator().manual_seed(seed)
    starts = torch.randint(0, stream.numel() - prompt_tokens, (rows,), generator=gen)
    prompts = torch.stack([stream[s: s + prompt_tokens] for s in starts.tolist()])
    out = []
    for i, part in enumerate(prompts.split(chunk)):
        sampled = i % 2 and not greedy_only
        mode = dict(do_sample=True, temperature=0.8, top_p=1.0, top_k=0) if sampled else dict(do_sample=False)
        eos = {} if stop_at_eos else dict(eos_token_id=None, pad_token_id=0)
        first = seed if chunk_seed is None else chunk_seed
        text = specdec_fast.generate(target, part, max_new_tokens=new_tokens, seed=first + i, **eos, **mode)
        pad = target.generation_config.pad_token_id or 0  # a chunk whose rows all ended early is shorter
        out.append(torch.nn.functional.pad(text, (0, prompt_tokens + new_tokens - text.shape[1]), value=pad))
        if log is not None and i % 8 == 0:
            log(f"target text: chunk {i + 1} of {-(-rows // chunk)}")
    specdec_fast.release_engines(target)
    return torch.cat(out)
