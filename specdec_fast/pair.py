"""The demo pair shipped with the package: a Llama target and a ~10x smaller Llama draft
sharing one byte-level BPE tokenizer, trained on CPython's standard library sources by
bench/train_pair.py (held-out modules never trained on; see bench/results/pair_training.json).

Layout (inside the installed package). Each model directory holds its tokenizer, as Hugging
Face's convention has it (AutoTokenizer.from_pretrained(target_dir) works; 0.26 MB a copy):
    specdec_fast/assets/pair/target/      config.json, generation_config.json, model.safetensors (float32),
                                          tokenizer.json, tokenizer_config.json, special_tokens_map.json
    specdec_fast/assets/pair/draft/       the same files for the draft (the same tokenizer)
    specdec_fast/assets/pair/held_out.json  held-out module names, prompts and an eval snippet
    specdec_fast/assets/pair/eagle3/      an EAGLE-3 head for the target (bench/train_eagle3.py), in the
                                          published layout: config.json, model.safetensors
    specdec_fast/assets/cross_draft/        a draft for the same target with ANOTHER tokenizer (its own
                                          byte-level BPE of 2048 tokens; bench/train_cross_draft.py),
                                          float16 on disk: drafts through generate(tokenizer=,
                                          assistant_tokenizer=) (drafters/cross_tokenizer.py)
"""
import json
from functools import lru_cache
from pathlib import Path

PAIR_DIR = Path(__file__).resolve().parent / "assets" / "pair"
CROSS_DRAFT_DIR = Path(__file__).resolve().parent / "assets" / "cross_draft"
_MODEL_FILES = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json")
_REQUIRED = tuple(f"{model}/{name}" for model in ("target", "draft") for name in _MODEL_FILES) + ("held_out.json",)


def _check_pair() -> Path:
    missing = [name for name in _REQUIRED if not (PAIR_DIR / name).is_file()]
    if missing:
        raise FileNotFoundError(
            f"the demo pair is incomplete under {PAIR_DIR} (missing: {', '.join(missing)}); "
            "reinstall specdec-fast or rebuild it with `python bench/train_pair.py`"
        )
    return PAIR_DIR


def demo_pair() -> tuple[str, str]:
    """(target_dir, draft_dir) as str, each loadable with AutoModelForCausalLM.from_pretrained
    and AutoTokenizer.from_pretrained (both hold the one shared tokenizer)."""
    root = _check_pair()
    return str(root / "target"), str(root / "draft")


def eagle3_head_dir() -> str | None:
    """The shipped EAGLE-3 head's directory (specdec_fast.load_draft_head), or None when absent."""
    path = PAIR_DIR / "eagle3"
    return str(path) if (path / "config.json").is_file() and (path / "model.safetensors").is_file() else None


def tokenizer_dir() -> str:
    """A directory holding the pair's tokenizer (AutoTokenizer.from_pretrained): the target's,
    which holds it like the draft's does."""
    return str(_check_pair() / "target")


@lru_cache(maxsize=1)
def _held_out() -> dict:
    return json.loads((_check_pair() / "held_out.json").read_text(encoding="utf-8"))


def held_out_prompts(n: int | None = None) -> list[str]:
    """The first n (all if None) fixed code prompts from modules the pair never saw."""
    prompts = _held_out()["prompts"]
    if n is None:
        return list(prompts)
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise ValueError(f"n must be a non-negative int or None, got {n!r}")
    return list(prompts[:n])


def held_out_modules() -> list[str]:
    """The stdlib modules held out of training (relative paths)."""
    return list(_held_out()["modules"])


def held_out_snippet() -> str:
    """About 512 tokens of held-out source text, for quick loss / agreement checks."""
    return _held_out()["eval_snippet"]


def load_demo_pair(device="cpu", dtype=None):
    """(tokenizer, target, draft): the pair loaded with transformers' Auto classes, in eval mode.

    dtype: None keeps the stored float32; e.g. torch.bfloat16 on a GPU.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    target_dir, draft_dir = demo_pair()
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir())
    kwargs = {} if dtype is None else {"dtype": dtype}
    target = AutoModelForCausalLM.from_pretrained(target_dir, **kwargs).to(device).eval()
    draft = AutoModelForCausalLM.from_pretrained(draft_dir, **kwargs).to(device).eval()
    return tokenizer, target, draft


def cross_draft() -> str:
    """The directory of the draft with another tokenizer (AutoModelForCausalLM with
    dtype=torch.float32, and AutoTokenizer: its own tokenizer)."""
    missing = [n for n in _MODEL_FILES if not (CROSS_DRAFT_DIR / n).is_file()]
    if missing:
        raise FileNotFoundError(f"the cross-tokenizer draft is incomplete under {CROSS_DRAFT_DIR} (missing: "
                                f"{', '.join(missing)}); rebuild it with `python bench/train_cross_draft.py`")
    return str(CROSS_DRAFT_DIR)


def load_cross_draft(device="cpu", dtype=None):
    """(assistant_tokenizer, draft): the draft with another tokenizer, in eval mode, float32 unless
    ``dtype`` says otherwise (it is stored as float16 to keep the package small)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = cross_draft()
    draft = AutoModelForCausalLM.from_pretrained(path, dtype=dtype or torch.float32).to(device).eval()
    return AutoTokenizer.from_pretrained(path), draft
