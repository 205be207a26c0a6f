"""The Triton tree_verify kernels compile for an H100 (sm_90) with Triton's real compiler and
ptxas, on a machine without a GPU (the interpreter used elsewhere in CI never compiles)."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

from .test_verify_triton_compiles import _has_nvidia_backend

pytest.importorskip("triton")


@pytest.mark.slow
@pytest.mark.skipif(not _has_nvidia_backend(), reason="triton without its nvidia backend")
def test_tree_verify_kernels_compile_for_sm90():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    script = Path(__file__).with_name("_compile_tree_verify_kernels.py")
    done = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    # 8 kernels (residual rows, masses with and without SKIP_IDENTITIES, the fused masses, 2 walks, the parallel
    # walk, emit) x 2 shapes
    assert done.stdout.count("compiled") == 16
