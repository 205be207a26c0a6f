"""specdec-fast: a pure-Python wheel (py3-none-any).

One import package, ``specdec_fast``. The top-level ``kernels/`` folder is installed as
``specdec_fast.kernels`` and ``csrc/`` as ``specdec_fast.csrc`` (C++ sources as package data,
compiled on first use, never at install time). Nothing named ``kernels`` is installed at top
level: a different PyPI package owns that name.
"""
import re
import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = Path(__file__).parent


class build_py_fresh(build_py):
    """Stages the package afresh on every build. setuptools copies into build/lib and reuses it, so a
    module deleted or renamed in the source still shipped in the next wheel built from the same tree
    (pip wheel ., pip install ., make wheel); the wheel now holds what the source holds."""

    def run(self):
        shutil.rmtree(Path(self.build_lib) / "specdec_fast", ignore_errors=True)
        super().run()


VERSION = re.search(r'__version__ = "([^"]+)"', (HERE / "specdec_fast" / "_version.py").read_text()).group(1)


def subpackages(folder: str, prefix: str) -> list[str]:
    """Every folder under ``folder`` that holds an __init__.py, as dotted names under ``prefix``."""
    root = HERE / folder
    names = [prefix]
    for init in sorted(root.rglob("__init__.py")):
        rel = init.parent.relative_to(root)
        if rel.parts:
            names.append(".".join((prefix, *rel.parts)))
    return names


setup(
    name="specdec-fast",
    version=VERSION,
    description="Speculative decoding with fused Triton verify and paged attention kernels",
    long_description=(HERE / "README.md").read_text(encoding="utf-8"),
    long_description_content_type="text/markdown",
    license="Apache-2.0",
    python_requires=">=3.10",
    packages=subpackages("specdec_fast", "specdec_fast")
    + subpackages("kernels", "specdec_fast.kernels")
    + ["specdec_fast.csrc"],
    package_dir={
        "specdec_fast": "specdec_fast",
        "specdec_fast.kernels": "kernels",
        "specdec_fast.csrc": "csrc",
    },
    package_data={
        "specdec_fast.csrc": ["*.cpp", "*.h", "*.cu", "*.cuh"],
        "specdec_fast": ["assets/**/*"],
    },
    include_package_data=False,
    # What the default path needs, so that `pip install specdec-fast` then `specdec-fast demo`,
    # the CLI and generate() work:
    # - torch (not pinned: a CPU machine installs the CPU build first, see README; a GPU
    #   machine keeps the CUDA build it has) and numpy;
    # - ninja: the C++ CPU backend compiles on first use through torch.utils.cpp_extension,
    #   which needs it; without it every CPU kernel falls back to the torch reference (5-230x
    #   slower per kernel, 5-8x end to end on the demo pair). A C++ compiler cannot be declared
    #   here: the fallback warning names it;
    # - transformers, tokenizers, safetensors: generate() takes a transformers model, the CLI
    #   and the demo load checkpoints and tokenizers with them. Core, not an extra: every
    #   entry point but the bare kernels needs them, and the console script is installed
    #   either way. `import specdec_fast` and specdec_fast.kernels still work without them.
    #   transformers >= 5.4: the options follow transformers 5's generate (lengths, defaults); 4.x
    #   breaks: 4.45.0 fails output_scores / output_logits (TypeError: forward() got an unexpected
    #   keyword argument 'logits_to_keep') and pair.load_cross_draft(dtype=...), and 4.45.0 and
    #   4.57.6 log "Both `max_new_tokens` ... and `max_length`(=20) seem to have been set" on every
    #   call that gives max_new_tokens. Within 5.x, each release's generate() / forward() checked
    #   against ours (tests of lengths, scores, options and GPT-2; 2026-11-27, CPU): 5.0-5.2 stop a
    #   call without max_new_tokens at other lengths than 5.3+ and warn about the default length;
    #   5.0-5.3's GPT-2 under SDPA ignores scale_attn_weights / scale_attn_by_inverse_layer_idx
    #   (their eager path and 5.4+ apply them, as our runner does). 5.4.0 to 5.24.0 pass; the
    #   whole suite passes on 5.4.0 (re-run by directory 2026-11-28: 6 tests had come to assume a
    #   newer transformers -- fields of 5.14 / 5.15, a watermark dict generate takes from 5.16,
    #   Qwen3-Next's cache of 5.5 / 5.15 -- and were made portable; the package needed no change).
    #   The repetition penalty's left pads differ by version (5.23 skips them): the engine follows
    #   the installed one (processing/penalties.py).
    # - torch >= 2.6: the whole suite ran on CPU with torch 2.6.0 (+ transformers 5.24, triton 3.6);
    #   transformers 5.24 disables torch below 2.6 ("PyTorch >= 2.6 is required"; 5.0 asked for 2.2),
    #   so with an older torch pip would install a transformers that cannot run a model. 2.4 / 2.5
    #   with an older transformers 5.x were not tried.
    install_requires=["torch>=2.6", "numpy", "ninja", "transformers>=5.4", "tokenizers", "safetensors"],
    extras_require={
        "triton": ["triton>=3.4"],  # Triton kernels on a GPU (kernels/_backend.py MIN_TRITON; CUDA torch brings one)
    },
    entry_points={"console_scripts": ["specdec-fast=specdec_fast.cli:main"]},
    cmdclass={"build_py": build_py_fresh},
    classifiers=["Programming Language :: Python :: 3", "License :: OSI Approved :: Apache Software License"],
)
