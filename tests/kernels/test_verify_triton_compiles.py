"""The Triton verify kernels compile for an H100 (sm_90) with Triton's real compiler and
ptxas, on a machine without a GPU (the interpreter used elsewhere in CI never compiles); the
penalty-free kernels compile to the PTX they had before the penalties existed."""
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

triton = pytest.importorskip("triton")
PTX_TRITON = "3.6.0"  # the Triton that wrote data/verify_ptx_sm90.json (requirements/dev-cpu.txt pins it)


def _has_nvidia_backend() -> bool:
    from triton.backends import backends

    return "nvidia" in backends


@pytest.mark.slow
@pytest.mark.skipif(not _has_nvidia_backend(), reason="triton without its nvidia backend")
def test_verify_kernels_compile_for_sm90():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    script = Path(__file__).with_name("_compile_verify_kernels.py")
    done = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    # 3 shapes x (stream, finish, emit) + the small-vocab pair; greedy: the selection kernel alone (3 shapes);
    # penalised: 2 shapes x 3 + the small-vocab pair + greedy's selection; the per-lane emission (plain,
    # penalised, the sampler's); the rungs launch of the large-vocabulary verify shapes with modes unknown (B = 1
    # and 64, and B = 1 penalised; the B = 1 sampler's streaming grid is one wave: no rungs launch); the
    # finishing kernels with the earlier search (FINISH_SEARCH_TILE = 0: plain, penalised, the sampler's) and the
    # fused search's 2048 tile; the emission without its identity skips (EMIT_SKIP_IDENTITIES off; B = 1 and 64);
    # the greedy streaming pass with its sums (STREAM_GREEDY_ARGMAX_ONLY off: B = 1, B = 64 plain and penalised,
    # the sampler's); the B = 64 greedy verify's stream (4 blocks a step) and that stream one block a step
    # the finishing kernel's second pass in blocks of 2048 and 4096 (B = 64 takes 8192: FINISH_GATHER_BLOCK_V); the
    # draft sampler's emission with probability-weighted keys (EMIT_SAMPLER_EXP_KEYS off: B = 1 and 64)
    assert done.stdout.count("compiled") == 45
    # The penalty-free kernels' PTX instructions (debug lines aside) equal those recorded at 5fab9c4, before
    # the penalties (kernels/penalties/triton.py: the flag compiles their code out; same triton pin).
    # The greedy-mode selection kernels were re-recorded when SELECTS (no row uses top-k / top-p / min-p)
    # began compiling the selection code out of them; with SELECTS set (modes unknown) the PTX is unchanged.
    # All were re-recorded once more when the tickets began resetting themselves (a caller's
    # KernelWorkspace needs no zero fill): 13 of the 14 changed, by the predicated
    # atom.global.gpu.relaxed.exch that last_program_of / last_rows_of gained (the finishing kernel
    # also gained the stores zeroing its row's candidate counters). Register numbering and debug
    # lines aside, the emission kernel's PTX diff at B = 64 was exactly that exchange (5 lines).
    # The emission at B = 64 was re-recorded when the plans began taking its per-lane pass where a
    # program streams more than one block (2026-11-27, from an H200's timing): its hash is now the
    # per-lane kernel's, the one the script's "emit_kernel+lanes" line compiles too.
    # The two verify streaming kernels with modes unknown were re-recorded when their rungs moved to a launch
    # of their own (RUNGS_GIVEN, 2026-11-27, from an H200's measurements): they load the rungs instead of
    # placing them; with RUNGS_GIVEN off (the greedy entries, the B = 1 sampler) the PTX is unchanged.
    # The finishing kernels and the emission were re-recorded when an H200's timings turned on the fused search
    # (FINISH_SEARCH_TILE = 1024), the emission's identity skips and its 256-value block at B = 1 (2026-11-28):
    # the new finishing hashes are those the script's "+search1024" lines had before, the B = 64 emission's the
    # old "+skips" line's, and the "+search0" / "+no_skips" (B = 64) lines now give the hashes recorded before.
    # The two large-vocabulary greedy streaming kernels were re-recorded when an H200's timings turned on the
    # stream without its sums (STREAM_GREEDY_ARGMAX_ONLY, 2026-11-28): the "+sums" lines give the hashes before.
    # The four emission kernels were re-recorded when the Gumbel noise began drawing four vocab indices from
    # one Philox call (kernels/rng/__init__.py, 2026-11-28): the B = 64 per-lane loop went from 2324 to 1993
    # PTX lines a step at the same 168 registers (bench/results/verify_stream_ptx_sm90.json emit_rows).
    # The B = 64 greedy verify's stream joined the recording when an H200's timing made it take 4 blocks a
    # step (STREAM_ARGMAX_UNROLL, 2026-11-28); the script's "+unroll1" line gives the kernel it took before.
    # The emission kernels and the greedy selection kernels were re-recorded when their token writers began
    # mapping a row without a maximum (a NaN row: BIG_INDEX) to token 0 (found_or_zero, 2026-11-29): once a
    # row, outside every loop: the B = 64 emission 3209 -> 3227 PTX lines, the B = 64 greedy stream 1460 -> 1469.
    # The two verify finishing kernels were re-recorded when the script began compiling them with the CHUNK and
    # BLOCK_C kernels/verify/triton.py launches them with (their own chunks: 10240 / 129024 values at B = 1 / 64;
    # it had passed the streaming launch's, 2048 / 65536: the same code, a loop trip count no launch ran).
    # The four emission kernels were re-recorded when their Gumbel-max took its ratio form (keys prob / E, one
    # logarithm a value instead of three, kernels/verify/_triton_emit.py, 2026-11-29): the B = 64 per-lane loop
    # went from 1993 to 1397 PTX lines a step, its FMAs (libdevice's log polynomial) from 288 to 96.
    # The B = 64 finishing kernel was re-recorded when an H200's timing made its second pass take blocks of 8192
    # (FINISH_GATHER_BLOCK_V at B >= 64, 2026-11-30): the script's "+gather2048" line gives the hash before. The
    # B = 1 sampler's emission was re-recorded when its keys began weighing the noise by exp(std - m)
    # (EMIT_SAMPLER_EXP_KEYS, 2026-11-30): the "+prob_keys" line gives the hash before.
    if triton.__version__ != PTX_TRITON:  # another Triton writes other PTX: the compiles above are the check
        return
    hashes = dict(re.findall(r"compiled (\S+ \S+ B=\d+ K=\d+ V=\d+(?: modes=\S+)?) .*ptx=(\w+)", done.stdout))
    before = json.loads(Path(__file__).with_name("data").joinpath("verify_ptx_sm90.json").read_text())
    assert {name: hashes.get(name) for name in before} == before


@pytest.mark.slow
@pytest.mark.skipif(not _has_nvidia_backend(), reason="triton without its nvidia backend")
def test_the_shapes_triton_failed_on_compile_for_sm90():
    """The shapes whose emit_penalised_kernel Triton 3.6 failed to compile for sm_90 at K = 1 (an
    H100 run of 2026-11-24) and one an attempted workaround broke: KNOWN_HARD."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    script = Path(__file__).with_name("_compile_verify_kernels.py")
    done = subprocess.run([sys.executable, str(script), "--grid", "--known-hard", "--jobs", "2"], env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr[-4000:]
    assert re.search(r"grid: \d+ kernels compiled, 0 failed", done.stdout), done.stdout


@pytest.mark.slow
@pytest.mark.skipif(not _has_nvidia_backend(), reason="triton without its nvidia backend")
@pytest.mark.skipif(not os.environ.get("SPECDEC_COMPILE_GRID"),
                    reason="7-9 min on a loaded 2-core machine: set SPECDEC_COMPILE_GRID=1 to run it")
def test_verify_kernels_compile_for_sm90_over_a_grid_of_shapes():
    """Every K in 1..8 with each logits dtype, B, V, draft / penalty / host-mode setting (the quick
    slice of _compile_verify_kernels.py --grid; run --grid for all of it): Triton's compiler failed
    on emit_penalised_kernel at K = 1 for some small vocabularies and not their neighbours."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    script = Path(__file__).with_name("_compile_verify_kernels.py")
    done = subprocess.run([sys.executable, str(script), "--grid", "--quick", "--jobs", "2"], env=env,
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout + done.stderr[-4000:]
    # 69 shapes (64 grid cells and KNOWN_HARD's 5), each distinct compilation once
    assert "grid: 124 kernels compiled, 0 failed" in done.stdout, done.stdout
