"""specdec-fast: a pure-Python wheel (py3-none-any).

One import package, ``specdec_fast``. The top-level ``kernels/`` folder is installed as
``specdec_fast.kernels`` and ``csrc/`` as ``specdec_fast.csrc`` (C++ sources as package data,
compiled on first use, never at install time). Nothing named ``kernels`` is installed at top
level: a different PyPI package owns that name.
"""
import re
from pathlib import Path

from setuptools import setup

HERE = Path(__file__).parent
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
    # torch is not pinned here: a CPU machine installs the CPU build first (see README),
    # a GPU machine keeps the CUDA build it has.
    install_requires=["torch>=2.4", "numpy"],
    extras_require={
        "triton": ["triton>=3.0"],
        "hf": ["transformers>=4.45", "safetensors", "tokenizers"],
    },
    entry_points={"console_scripts": ["specdec-fast=specdec_fast.cli:main"]},
    classifiers=["Programming Language :: Python :: 3", "License :: OSI Approved :: Apache Software License"],
)
