"""The C++ paged attention (csrc/paged_attention.cpp) built for the vector widths other machines
get: the library built here takes one path (16 lanes on an AVX-512 machine); the same source built
with -mno-avx512f takes the 8-lane AVX2 path, and with -march=x86-64 the 4-lane SSE2 path (the one
aarch64 and older x86 machines build). Each build is loaded under a scratch op namespace and must
match float64 SDPA over the attention tables of test_paged_attention.py."""
import os
import platform
import re
from pathlib import Path

import pytest
import torch

from specdec_fast.kernels import _cpp_build
from tests.kernels.attention_cases import make_case, sdpa_oracle
from tests.kernels.test_paged_attention import BLOCK_CASES, CASES, TOL

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"), reason="x86 vector widths"),
    pytest.mark.skipif(os.environ.get("SPECDEC_FAST_NO_CPP") == "1", reason="the C++ backend is off"),
]

# name -> (extra compiler flags, the lanes that build must report, CPU flags it needs to run here)
BUILDS = {
    "avx2": (["-mno-avx512f"], 8, {"avx2", "fma"}),
    "sse2": (["-march=x86-64"], 4, set()),
}


def _build(name: str, tmp_path_factory, monkeypatch) -> object:
    flags, _, needs = BUILDS[name]
    if not needs <= set(_cpp_build._cpu_tag().split()):
        pytest.skip(f"this CPU lacks {sorted(needs)}")
    ninja = _cpp_build._ninja_bin_dir()
    if ninja is None:
        pytest.skip("ninja is not installed")
    from torch.utils import cpp_extension

    namespace = f"specdec_attn_{name}"
    src = (_cpp_build.csrc_dir() / "paged_attention.cpp").read_text()
    src, n = re.subn(r"TORCH_LIBRARY(_FRAGMENT)?\(specdec_fast,", f"TORCH_LIBRARY({namespace},", src)
    src, m = re.subn(r"TORCH_LIBRARY_IMPL\(specdec_fast,", f"TORCH_LIBRARY_IMPL({namespace},", src)
    assert n == 1 and m == 1, "the op's registration changed: update this test"
    folder = tmp_path_factory.mktemp(name)
    path = Path(folder) / f"paged_attention_{name}.cpp"
    path.write_text(src)
    monkeypatch.setenv("PATH", ninja + os.pathsep + os.environ.get("PATH", ""))
    cpp_extension.load(name=namespace, sources=[str(path)], extra_cflags=_cpp_build.CFLAGS + flags,
                       extra_ldflags=_cpp_build.LDFLAGS, extra_include_paths=[str(_cpp_build.csrc_dir())],
                       build_directory=str(folder), is_python_module=False)
    return getattr(torch.ops, namespace)


@pytest.mark.parametrize("name", list(BUILDS))
def test_other_vector_widths_match_sdpa(name, tmp_path_factory, monkeypatch):
    ops = _build(name, tmp_path_factory, monkeypatch)
    assert ops.paged_attention_lanes() == BUILDS[name][1]
    tables = [(case, True) for case in CASES.values()] + [((*c[:7], False, c[7]), False) for c in BLOCK_CASES.values()]
    for i, ((seq, ql, hq, hkv, d, bs, dtype, tree, strided), causal) in enumerate(tables):
        case = make_case(seq, ql, hq, hkv, d, bs, dtype, tree=tree, strided=strided, seed=i)
        q = case.q.contiguous()
        out = ops.paged_attention(q, case.k_cache, case.v_cache, case.block_table.contiguous(), case.seq_lens,
                                  case.cu_query_lens, case.tree_mask, d ** -0.5, causal)
        tol = TOL[dtype]
        torch.testing.assert_close(out.double(), sdpa_oracle(case, causal=causal), atol=tol, rtol=tol,
                                   msg=lambda m: f"{name} build, case {i}: {m}")


def test_this_machines_build_reports_its_width():
    if not _cpp_build.load_cpu_ops():
        pytest.skip("the C++ backend did not build here")
    expected = {"avx512": 16, "avx2": 8, "generic": 4}[_cpp_build.cpu_isa()]
    assert torch.ops.specdec_fast.paged_attention_lanes() == expected
