"""The C++ ops built for the vector widths other machines get. The library built here takes one
path (16 lanes on an AVX-512 machine); the same sources built with -mno-avx512f take the AVX2
paths (8 lanes), and with -march=x86-64 the 4-lane / portable paths that aarch64 and older x86
machines build. The second build also spells its shuffles as GCC 9-11 must
(-DSPECDEC_NO_SHUFFLEVECTOR, csrc/vec_shuffle.h: Ubuntu 22.04 ships GCC 11).

Each build (csrc/paged_attention.cpp + csrc/skinny_linear.cpp + csrc/rng.cpp, compiled as one
translation unit) is loaded under a scratch op namespace: its paged attention must match float64
SDPA over test_paged_attention.py's tables, its skinny_linear must equal this machine's bit for
bit (one summation order on every width), and csrc/rng.cpp's Gumbel noise (philox.h gumbel_block:
eight Philox calls a step on AVX2) the spec's."""
import os
import platform
import re
from pathlib import Path

import pytest
import torch

from specdec_fast.kernels import _cpp_build
from tests.kernels.attention_cases import make_case, sdpa_oracle
from tests.kernels.test_rng_cpp import GUMBEL_BLOCKS, gumbel_block_is_the_spec
from tests.kernels.test_paged_attention import BLOCK_CASES, CASES, TOL
from tests.kernels.test_paged_attention_chunk import CASES as CHUNK_CASES, _seed as chunk_seed, chunk_oracle
from tests.kernels.test_paged_attention_window import CASES as WINDOW_CASES

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"), reason="x86 vector widths"),
    pytest.mark.skipif(os.environ.get("SPECDEC_FAST_NO_CPP") == "1", reason="the C++ backend is off"),
]

SOURCES = ("paged_attention.cpp", "skinny_linear.cpp", "rng.cpp")
# name -> (extra compiler flags, attention lanes, skinny_linear tiles, CPU flags it needs to run here).
# A build of the width this machine's own library takes is skipped: the suite's tests of the C++ ops
# test those paths already (on an AVX2 machine the "avx2" build is its -march=native build again).
BUILDS = {
    "avx2": (["-mno-avx512f"], 8, "avx2", {"avx2", "fma"}),
    "sse2_gcc11_shuffles": (["-march=x86-64", "-DSPECDEC_NO_SHUFFLEVECTOR"], 4, "generic", set()),
}


def _build(name, tmp_path_factory):
    flags, lanes, tiles, needs = BUILDS[name]
    if not needs <= set(_cpp_build._cpu_tag().split()):
        pytest.skip(f"this CPU lacks {sorted(needs)}")
    if tiles == _cpp_build.cpu_isa():
        pytest.skip(f"this machine's own build takes the {tiles} paths (the other C++ tests cover them)")
    ninja = _cpp_build._ninja_bin_dir()
    if ninja is None:
        pytest.skip("ninja is not installed")
    from torch.utils import cpp_extension

    namespace = f"specdec_width_{name}"
    folder = tmp_path_factory.mktemp(name)
    paths = []
    for source in SOURCES:
        src = (_cpp_build.csrc_dir() / source).read_text()
        src, n = re.subn(r"TORCH_LIBRARY_FRAGMENT\(specdec_fast,", f"TORCH_LIBRARY_FRAGMENT({namespace},", src)
        src, m = re.subn(r"TORCH_LIBRARY_IMPL\(specdec_fast,", f"TORCH_LIBRARY_IMPL({namespace},", src)
        assert n == 1 and m == 1, f"{source}'s op registration changed: update this test"
        paths.append(Path(folder) / source)
        paths[-1].write_text(src)
    # One translation unit including the three, as the package's own build does (_cpp_build.UNITY_GROUPS):
    # torch's headers parsed once a build, not three times
    unity = Path(folder) / "unity.cpp"
    unity.write_text("".join(f'#include "{p.name}"\n' for p in paths))
    path_before = os.environ.get("PATH", "")
    os.environ["PATH"] = ninja + os.pathsep + path_before
    try:
        cpp_extension.load(name=namespace, sources=[str(unity)], extra_cflags=_cpp_build.CFLAGS + flags,
                           extra_ldflags=_cpp_build.LDFLAGS, extra_include_paths=[str(_cpp_build.csrc_dir())],
                           build_directory=str(folder), is_python_module=False)
    finally:
        os.environ["PATH"] = path_before
    ops = getattr(torch.ops, namespace)
    assert ops.paged_attention_lanes() == lanes and ops.skinny_linear_isa() == tiles
    return ops


@pytest.mark.parametrize("name", list(BUILDS))
def test_the_other_widths_give_this_machines_results(name, tmp_path_factory):
    """One test per build, so that each is compiled once whichever xdist worker runs it."""
    ops = _build(name, tmp_path_factory)
    _paged_attention_matches_sdpa(name, ops)
    _skinny_linear_equals_this_machines_bit_for_bit(name, ops)
    for v0, n in GUMBEL_BLOCKS:  # philox.h's noise loop: AVX2's eight Philox calls a step, or the portable loop
        gumbel_block_is_the_spec(ops, v0, n)


def _paged_attention_matches_sdpa(name, ops):
    tables = [(case, True) for case in CASES.values()] + [((*c[:7], False, c[7]), False) for c in BLOCK_CASES.values()]
    for i, ((seq, ql, hq, hkv, d, bs, dtype, tree, strided), causal) in enumerate(tables):
        case = make_case(seq, ql, hq, hkv, d, bs, dtype, tree=tree, strided=strided, seed=i)
        out = ops.paged_attention(case.q.contiguous(), case.k_cache, case.v_cache, case.block_table.contiguous(),
                                  case.seq_lens, case.cu_query_lens, case.tree_mask, d ** -0.5, causal)
        tol = TOL[dtype]
        torch.testing.assert_close(out.double(), sdpa_oracle(case, causal=causal), atol=tol, rtol=tol,
                                   msg=lambda m: f"{name} build, case {i}: {m}")
    # the sliding window's key masks and soft-capping, per width (a window's first key mid-vector)
    for key, (seq, ql, hq, hkv, d, bs, dtype, tree, causal, window, cap) in WINDOW_CASES.items():
        case = make_case(seq, ql, hq, hkv, d, bs, dtype, tree=tree, seed=len(key))
        out = ops.paged_attention(case.q.contiguous(), case.k_cache, case.v_cache, case.block_table.contiguous(),
                                  case.seq_lens, case.cu_query_lens, case.tree_mask, d ** -0.5, causal, window or 0,
                                  cap or 0.0)
        torch.testing.assert_close(out.double(), sdpa_oracle(case, causal=causal, window=window, softcap=cap),
                                   atol=TOL[dtype], rtol=TOL[dtype], msg=lambda m: f"{name} build, {key}: {m}")
    # chunked attention: each row's first key (rounded down to the width's chunk of keys) and each query's
    for key, (seq, ql, hq, hkv, d, bs, dtype, causal, chunk) in CHUNK_CASES.items():
        case = make_case(seq, ql, hq, hkv, d, bs, dtype, seed=chunk_seed(key))
        out = ops.paged_attention(case.q.contiguous(), case.k_cache, case.v_cache, case.block_table.contiguous(),
                                  case.seq_lens, case.cu_query_lens, None, d ** -0.5, causal, 0, 0.0, None, chunk)
        torch.testing.assert_close(out.double(), chunk_oracle(case, causal, chunk), atol=TOL[dtype], rtol=TOL[dtype],
                                   msg=lambda m: f"{name} build, {key}: {m}")


def _skinny_linear_equals_this_machines_bit_for_bit(name, ops):
    assert _cpp_build.load_cpu_ops(), "this machine's own C++ build failed"
    gen = torch.Generator().manual_seed(0)
    for m, k, n in ((1, 33, 111), (2, 128, 40), (5, 688, 300), (6, 256, 17), (8, 96, 64), (16, 40, 33)):
        x = torch.randn(m, k, generator=gen)
        bias, residual = torch.randn(n, generator=gen), torch.randn(m, n, generator=gen)
        for w in (torch.randn(n, k, generator=gen), torch.randn(k, n, generator=gen).t()):  # rows / cols layouts
            for b, r in ((None, None), (bias, residual)):
                want = torch.ops.specdec_fast.skinny_linear(x, w, b, r)
                got = ops.skinny_linear(x, w, b, r)
                assert torch.equal(got, want), f"{name} build, M={m} K={k} N={n}, layout {tuple(w.stride())}"


def test_this_machines_build_reports_its_width():
    if not _cpp_build.load_cpu_ops():
        pytest.skip("the C++ backend did not build here")
    expected = {"avx512": 16, "avx2": 8, "generic": 4}[_cpp_build.cpu_isa()]
    assert torch.ops.specdec_fast.paged_attention_lanes() == expected
