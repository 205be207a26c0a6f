"""Compiles the Llama-layer Triton kernels (kernels/llama_ops/triton.py, cache_ops/triton_rope.py,
linear/triton.py) ahead of time for an H100 (sm_90) on a machine with no GPU: typing, layouts,
register use and ptxas, which the interpreter does not check. Run WITHOUT TRITON_INTERPRET:
    python tests/kernels/aot_compile_layer_ops.py"""
import itertools
import os

assert os.environ.get("TRITON_INTERPRET") != "1", "run without TRITON_INTERPRET"

import triton  # noqa: E402

from sm90 import PDL_TARGET, compile_sm90  # noqa: E402  (beside this script: sys.path[0])
from specdec_fast.kernels.cache_ops import triton_rope  # noqa: E402
from specdec_fast.kernels.llama_ops import triton as ops  # noqa: E402


def compile_kernel(fn, pointers: dict, consts: dict, floats=(), num_warps=4, pdl=False, ptx=False, specialise=None,
                   num_stages=None):
    """(shared bytes, registers or None), or the PTX when ptx. specialise, num_stages: compile_sm90's."""
    kernel = compile_sm90(fn, consts, {**dict.fromkeys(floats, "fp32"), **pointers}, num_warps=num_warps, pdl=pdl,
                          specialise=specialise, num_stages=num_stages)
    if ptx:
        return kernel.asm["ptx"]
    return kernel.metadata.shared, kernel.n_regs if hasattr(kernel, "n_regs") else None


def first_global_access(ptx: str) -> int:
    """Offset in the PTX of its first global load, store or asynchronous copy (-1: none)."""
    found = [i for i in (ptx.find("ld.global"), ptx.find("st.global"), ptx.find("atom.global"), ptx.find("cp.async"))
             if i >= 0]
    return min(found) if found else -1


def check_pdl_order(name: str, pdl_ptx: str, plain_ptx: str) -> None:
    """A PDL form's PTX: griddepcontrol.wait, then launch_dependents, before any global load,
    store or copy; the plain form has no griddepcontrol."""
    wait, trigger = pdl_ptx.find("griddepcontrol.wait"), pdl_ptx.find("griddepcontrol.launch_dependents")
    assert 0 <= wait < trigger < first_global_access(pdl_ptx), name
    assert "griddepcontrol" not in plain_ptx, name
    print(name, "pdl: griddepcontrol.wait < launch_dependents < first global access")


def main() -> None:
    for dt in ("bf16", "fp16", "fp32"):
        ptrs = {n: f"*{dt}" for n in ("x_ptr", "delta_ptr", "w_ptr", "res_ptr", "out_ptr")}
        for has_delta, write in ((True, True), (True, False), (False, False)):
            info = compile_kernel(ops._add_rms_norm_kernel, ptrs, dict(HAS_DELTA=has_delta, WRITE_RES=write, ROWS=1, BLOCK=4096),
                                  floats=("eps",), num_warps=16)
            print("add_rms_norm", dt, has_delta, write, info)
        ptrs = {n: f"*{dt}" for n in ("gate_ptr", "up_ptr", "out_ptr")}
        print("silu_mul", dt, compile_kernel(ops._silu_mul_kernel, ptrs, dict(ROWS=1, BLOCK=1024)))
        ptrs = {n: f"*{dt}" for n in ("q_ptr", "k_ptr", "v_ptr", "cos_ptr", "sin_ptr", "qw_ptr", "kw_ptr",
                                      "k_cache_ptr", "v_cache_ptr", "qs_ptr")}
        ptrs.update(bt_ptr="*i32", lens_ptr="*i32", cu_ptr="*i32")
        # (Hq, Hkv, D, q/k norms, Ministral 3's query scale, rotated dims: GLM-4.5-Air's half of 128, and with norms)
        for hq, hkv, d, norm, q_scale, rot in ((32, 8, 128, False, False, 128), (16, 8, 128, True, False, 128),
                                               (12, 2, 80, False, False, 80), (32, 8, 128, False, True, 128),
                                               (96, 8, 128, False, False, 64), (16, 8, 128, True, False, 64)):
            partial = dict(ROTARY=rot, PASS_P2=triton.next_power_of_2(d - rot), V_HALF_P2=triton.next_power_of_2(d // 2))
            consts = dict(HQ=hq, HKV=hkv, HQ_P2=triton.next_power_of_2(hq), HKV_P2=hkv, HEAD_DIM=d,
                          HALF_P2=triton.next_power_of_2(rot // 2), PAGE_SIZE=16, BLOCK_B=8, TOKENS=1, QK_NORM=norm,
                          PDL=False, Q_SCALE=q_scale,  # constexprs, else compiled as runtime ints with both branches
                          **(partial if rot < d else dict(ROTARY=0, PASS_P2=1, V_HALF_P2=1)))
            info = compile_kernel(triton_rope._rope_append_kv_kernel, ptrs, consts, floats=("q_eps", "k_eps"))
            print("rope_append_kv", dt, hq, hkv, d, norm, q_scale, rot, info)
            if dt == "bf16" and PDL_TARGET and not q_scale and rot == d:  # the GEMV layer's PDL chain (triton >= 3.5)
                check_pdl_order(f"rope_append_kv {hq} {hkv} {d} {norm}",
                                compile_kernel(triton_rope._rope_append_kv_kernel, ptrs, dict(consts, PDL=True),
                                               floats=("q_eps", "k_eps"), pdl=True, ptx=True),
                                compile_kernel(triton_rope._rope_append_kv_kernel, ptrs, consts,
                                               floats=("q_eps", "k_eps"), ptx=True))
    # the skinny linear of the GEMV layer (kernels/linear/triton.py): each prologue on both inner
    # products (one row: elementwise; 16 rows: tl.dot) in bf16, and fp16 / fp32 (fp32: the exact dot)
    from specdec_fast.kernels.linear import triton as gemv

    for dt, prologues in (("bf16", gemv.PROLOGUES), ("fp16", ("none",)), ("fp32", ("rms_norm",))):
        ptrs = {n: f"*{dt}" for n in ("x_ptr", "w_ptr", "b_ptr", "r_ptr", "nw_ptr", "y_ptr")}
        for prologue in prologues:
            for rows in (1, 5):
                config = gemv.default_config(rows, 4096, True)
                _, block_m, even_n, even_k, block_k = gemv._launch(rows, 4096, 4096, config)
                consts = dict(PROLOGUE=gemv.PROLOGUES.index(prologue), HAS_BIAS=True, HAS_RES=prologue != "rms_norm",
                              EVEN_N=even_n, EVEN_K=even_k, DOT_F32=dt == "fp32", BLOCK_M=block_m,
                              BLOCK_N=config.block_n, BLOCK_K=block_k, PDL=False)
                info = compile_kernel(gemv._skinny_linear_kernel, ptrs, consts, floats=("eps",),
                                      num_warps=config.num_warps)
                print("skinny_linear", dt, prologue, rows, info)
                if dt == "bf16" and PDL_TARGET:  # the programmatic-dependent-launch form: nothing global read before the wait
                    code = compile_kernel(gemv._skinny_linear_kernel, ptrs, dict(consts, PDL=True), floats=("eps",),
                                          num_warps=config.num_warps, pdl=True, ptx=True)
                    wait = code.find("griddepcontrol.wait")
                    assert 0 <= code.find("prefetch.global.L2") < wait < first_global_access(code), (prologue, rows)
                    assert "griddepcontrol.wait" not in compile_kernel(
                        gemv._skinny_linear_kernel, ptrs, consts, floats=("eps",), num_warps=config.num_warps, ptx=True)
                    print("skinny_linear pdl", dt, prologue, rows, "prefetch < griddepcontrol.wait < first global load")
    # kernels/moe's two schedules: the pairs GEMV (triton.py) and the expert-grouped tl.dot kernel
    # (triton_grouped.py), in the runner's forms: gate_up with SwiGLU, down scaled, GPT-OSS's
    # gate_up (interleaved, biased, transposed: unit stride along the rows, as the JIT specialises
    # a stride of 1) and its down (biased, scaled); whole tiles (EVEN_*: every model's shape) and
    # ragged ones. Pointers aligned and strides divisible by 16 as the JIT specialises Qwen3-30B-A3B's
    # (N and K are never specialised: do_not_specialize)
    from specdec_fast.kernels.moe import triton as moe
    from specdec_fast.kernels.moe import triton_grouped as grouped

    forms = {"swiglu_gate_up": (moe.ACT_CODES["silu"], False, False, "s_wk"),
             "down_scaled": (0, False, True, "s_wk"),
             "gpt_oss_gate_up": (moe.ACT_CODES["gpt_oss"], True, False, "s_wn"),
             "gpt_oss_down": (0, True, True, "s_wn")}
    strides = dict(s_xt=2048, s_we=1536 * 2048, s_wn=2048, s_wk=1536, s_be=1536, s_ot=768)
    for dt in ("bf16", "fp32"):
        ptrs = {"x_ptr": f"*{dt}", "w_ptr": f"*{dt}", "b_ptr": f"*{dt}", "out_ptr": f"*{dt}", "e_ptr": "*i64",
                "order_ptr": "*i64", "offsets_ptr": "*i64", "s_ptr": "*fp32"}
        # ragged tiles in bf16 only (fp32 differs in the dot's precision, not the masks): 24 compiles, not 32
        for (form, (act, biased, scaled, unit_stride)), even in itertools.product(
                forms.items(), (True, False) if dt == "bf16" else (True,)):
            flags = dict(ACT=act, HAS_BIAS=biased, HAS_SCALE=scaled, EVEN_N=even, EVEN_K=even, **{unit_stride: 1})
            kernels = {"moe_pairs": (moe._moe_pairs_kernel, dict(
                           BLOCK_N=moe.BLOCK_N, BLOCK_K=moe.BLOCK_K, TILE_ROWS=moe.BLOCK_N * (1 + (act == 2)))),
                       "moe_grouped": (grouped._moe_grouped_kernel, dict(
                           DOT_F32=dt == "fp32", BLOCK_M=16, BLOCK_N=grouped.BLOCK_N, BLOCK_K=grouped.BLOCK_K,
                           TILE_ROWS=grouped.BLOCK_N * (1 + (act == 2))))}
            for name, (fn, tiles) in kernels.items():
                consts = dict(flags, PAIRS_PER_TOKEN=8 if act else 1, **tiles)
                info = compile_kernel(fn, ptrs, consts, floats=("alpha", "limit"), specialise=strides)
                print(name, dt, form, "even" if even else "ragged", info)
                if dt == "bf16" and even:  # whole tiles stream in 16-byte loads (masks along K split them into 2-byte ones)
                    ptx = compile_kernel(fn, ptrs, consts, floats=("alpha", "limit"), specialise=strides, ptx=True)
                    assert ptx.count("ld.global.v4") + ptx.count("cp.async.cg.shared.global") >= 4, (name, form)
                    # scalar 2-byte loads: the pairs GEMV's token value a step, the epilogue's bias (once a tile)
                    assert biased or ptx.count("ld.global.b16") <= 1, (name, form)
    # Nemotron-H's ungated relu^2 experts' up product (bf16, whole tiles: its epilogue is the only difference)
    for name, fn, tiles in (("moe_pairs", moe._moe_pairs_kernel, dict(BLOCK_N=moe.BLOCK_N, BLOCK_K=moe.BLOCK_K)),
                            ("moe_grouped", grouped._moe_grouped_kernel, dict(
                                DOT_F32=False, BLOCK_M=16, BLOCK_N=grouped.BLOCK_N, BLOCK_K=grouped.BLOCK_K))):
        consts = dict(ACT=moe.ACT_CODES["relu2"], HAS_BIAS=False, HAS_SCALE=False, EVEN_N=True, EVEN_K=True, s_wk=1,
                      PAIRS_PER_TOKEN=6, TILE_ROWS=tiles["BLOCK_N"], **tiles)
        ptrs = {"x_ptr": "*bf16", "w_ptr": "*bf16", "b_ptr": "*bf16", "out_ptr": "*bf16", "e_ptr": "*i64",
                "order_ptr": "*i64", "offsets_ptr": "*i64", "s_ptr": "*fp32"}
        print(name, "bf16 relu2_up even", compile_kernel(fn, ptrs, consts, floats=("alpha", "limit"), specialise=strides))
    # the wider tiles of prefills, SwiGLU gate_up (two weight tiles: the most registers; fp32 at 64 rows: the
    # most shared memory, 98 KB of an RTX 30xx's 99 KB at 3 stages, the launcher's num_stages)
    for dt, rows in (("bf16", 32), ("bf16", grouped.MAX_BLOCK_M), ("fp32", grouped.MAX_BLOCK_M)):
        consts = dict(ACT=1, HAS_BIAS=False, HAS_SCALE=False, s_wk=1, PAIRS_PER_TOKEN=8, DOT_F32=dt == "fp32",
                      BLOCK_M=rows, BLOCK_N=grouped.BLOCK_N, BLOCK_K=grouped.BLOCK_K, TILE_ROWS=grouped.BLOCK_N,
                      EVEN_N=True, EVEN_K=True)
        ptrs = {"x_ptr": f"*{dt}", "w_ptr": f"*{dt}", "b_ptr": f"*{dt}", "out_ptr": f"*{dt}", "order_ptr": "*i64",
                "offsets_ptr": "*i64", "s_ptr": "*fp32"}
        info = compile_kernel(grouped._moe_grouped_kernel, ptrs, consts, floats=("alpha", "limit"), specialise=strides,
                              num_stages=grouped.NUM_STAGES)
        print("moe_grouped", dt, "BLOCK_M", rows, info)
    compile_recurrent_steps()
    compile_chunk_scan()
    print("layer ops ok")


def compile_recurrent_steps() -> None:  # and kernels/causal_conv's convolution
    """kernels/recurrent's score-call kernel in the forms the runners launch, at their models' sizes: the Gated
    DeltaNet (Qwen3-Next: bf16 q / k / v, 128 x 128 heads), KDA (Kimi Linear: a decay a key channel), Mamba2
    (Nemotron-H: float32 v = dt x, the [P, N] = [64, 128] layout), lightning (MiniMax: float32, 128 x 128), and the
    token-tree form (parents), and Mamba1's (Falcon-Mamba-7B: one head of [N = 16, C = 8192], its decay rates A times
    a step a channel: [16, 128] tiles)."""
    from specdec_fast.kernels.recurrent import triton as recurrent

    # (q / k / v dtype, Dk, Dv, G_MODE: 0 a decay a head, 1 a key row, 2 rates times a step a value column, the delta
    # rule, q / k norms, parents)
    forms = {"gated_deltanet": ("bf16", 128, 128, 0, True, True, False),
             "gated_deltanet_tree": ("bf16", 128, 128, 0, True, True, True),
             "kda": ("bf16", 128, 128, 1, True, True, False), "mamba2": ("fp32", 128, 64, 0, False, False, False),
             "lightning": ("fp32", 128, 128, 0, False, False, False),
             "mamba1": ("bf16", 16, 8192, 2, False, False, False), "mamba1_tree": ("bf16", 16, 8192, 2, False, False, True)}
    for name, (dt, dk, dv, g_mode, delta, norm, tree) in forms.items():
        ptrs = {"q_ptr": f"*{dt}", "k_ptr": f"*{dt}", "v_ptr": f"*{dt}", "g_ptr": "*fp32", "rates_ptr": "*fp32",
                "beta_ptr": f"*{dt}", "real_ptr": "*u8", "start_ptr": "*i64", "slot_ptr": "*i64", "parent_ptr": "*i64",
                "committed_ptr": "*fp32", "snap_ptr": "*fp32", "o_ptr": "*fp32"}
        block_k = triton.next_power_of_2(dk)
        consts = dict(DK=dk, DV=dv, BLOCK_K=block_k, BLOCK_V=min(dv, recurrent.TILE_ELEMENTS // block_k),
                      G_MODE=g_mode, DELTA=delta, QK_NORM=norm, EPS=1e-6, HAS_PARENT=tree)
        kernel = compile_sm90(recurrent._recurrent_steps_kernel, consts, {"scale": "fp32", **ptrs},
                              num_warps=max(1, min(4, block_k * consts["BLOCK_V"] // 512)))
        from aot_compile_attention import ptxas_spills  # here: that module imports this one

        spills = ptxas_spills(kernel)
        print("recurrent_steps", name, "shared", kernel.metadata.shared, "spill bytes", spills)
        assert not spills, (name, spills)  # the [Dk, BLOCK_V] state tile stays in registers
    # kernels/causal_conv: the Gated DeltaNet's / Mamba's convolution (bf16, kernel 4, a bias, silu), as a chain and a
    # tree, and LFM2's (kernel 3, no activation)
    from specdec_fast.kernels.causal_conv import triton as conv

    for name, (dt, kernel, silu, tree) in {"k4_silu": ("bf16", 4, True, False), "k4_silu_tree": ("bf16", 4, True, True),
                                           "lfm2_k3": ("bf16", 3, False, False)}.items():
        ptrs = {"x_ptr": f"*{dt}", "w_ptr": f"*{dt}", "bias_ptr": f"*{dt}", "committed_ptr": f"*{dt}",
                "snap_ptr": f"*{dt}", "start_ptr": "*i64", "slot_ptr": "*i64", "real_ptr": "*u8", "parent_ptr": "*i64",
                "y_ptr": f"*{dt}"}
        consts = dict(K=kernel, BLOCK_C=conv.BLOCK_C, HAS_BIAS=True, SILU=silu, HAS_PARENT=tree)
        kernel_ = compile_sm90(conv._conv_steps_kernel, consts, ptrs, num_warps=4)
        spills = ptxas_spills(kernel_)
        print("conv_steps", name, "shared", kernel_.metadata.shared, "spill bytes", spills)
        assert not spills, (name, spills)



def compile_chunk_scan() -> None:
    """kernels/chunk_scan's prefill carry in the forms the runners launch, at their models' sizes, as the launcher sets
    them (BLOCK_V, warps, one stage): the Gated DeltaNet (Qwen3-Next: the delta rule, a decay a head, 128 x 128 states,
    chunks of 64), KDA (a decay a key row), Mamba2 (Nemotron-H: no delta rule, the [N, P] = [128, 64] view),
    lightning (128 x 128) -- bf16 models' "tf32" dots, no spills -- and a float32 model's Gated
    DeltaNet ("tf32x3": it compiles and fits; ptxas spilled 376 bytes a thread when this was written)."""
    from aot_compile_attention import ptxas_spills  # here: that module imports this one
    from specdec_fast.kernels.chunk_scan import triton as chunk

    # (L, Dk, Dv, the delta rule, a decay a key row, the dots' precision)
    forms = {"gated_deltanet": (64, 128, 128, True, False, "tf32"), "kda": (64, 128, 128, True, True, "tf32"),
             "mamba2": (64, 128, 64, False, False, "tf32"), "lightning": (64, 128, 128, False, False, "tf32"),
             "gated_deltanet_fp32": (64, 128, 128, True, False, "tf32x3")}
    for name, (size, dk, dv, delta, rows, precision) in forms.items():
        ptrs = {arg: "*fp32" for arg in ("qd_ptr", "kd_ptr", "a_ptr", "u_ptr", "w_ptr", "decay_ptr", "state_ptr",
                                         "o_ptr")}
        block_k = triton.next_power_of_2(dk)
        consts = dict(DK=dk, DV=dv, L=size, BLOCK_L=size, BLOCK_K=block_k, BLOCK_V=chunk.BLOCK_V, DELTA=delta,
                      ROW_DECAY=rows, PRECISION=precision)
        kernel = compile_sm90(chunk._chunk_scan_kernel, consts, ptrs, num_warps=4 if size * block_k <= 8192 else 8,
                              num_stages=1)
        spills = ptxas_spills(kernel)
        print("chunk_scan", name, "shared", kernel.metadata.shared, "spill bytes", spills)
        assert precision == "tf32x3" or not spills, (name, spills)  # the state tile and operands stay in registers


if __name__ == "__main__":
    main()
