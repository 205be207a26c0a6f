"""Compiles the paged-attention Triton kernels ahead of time for an H100 (sm_90) on a machine
with no GPU: catches what the interpreter cannot (typing, layouts, shared memory, ptxas).
Run in a process WITHOUT TRITON_INTERPRET: python tests/kernels/aot_compile_attention.py [full]"""
import os
import sys

assert os.environ.get("TRITON_INTERPRET") != "1", "run without TRITON_INTERPRET"

from specdec_fast.kernels.attention import triton as attn  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from aot_compile_layer_ops import check_pdl_order  # noqa: E402
from sm90 import CAPABILITY, PDL_TARGET, SHARED_MEMORY_LIMIT, compile_sm90  # noqa: E402

PTRS = {"q_ptr": "Q", "k_ptr": "Q", "v_ptr": "Q", "out_ptr": "Q", "bt_ptr": "*i32", "seq_lens_ptr": "*i32", "sinks_ptr": "*fp32",
        "cu_ptr": "*i32", "ticket_ptr": "*i32", "tree_ptr": "*i64", "part_o_ptr": "*fp32", "part_lse_ptr": "*fp32", "qk_scale": "fp32"}


def compile_split(dtype, block_m, queries, group, head_dim, tree, direct, block_mask=False, merge_last=False, pdl=False,
                  block_n=64, window=False, softcap=False, sinks=False, chunked=False):
    consts = dict(NUM_KV_HEADS=8, GROUP=group, GROUP_P2=group, QUERIES_PER_TILE=queries, BLOCK_M=block_m,
                  BLOCK_N=block_n, HEAD_DIM=head_dim, HEAD_DIM_P2=attn.head_dim_padded(head_dim), PAGE_SIZE=16,
                  HAS_TREE=tree, DIRECT_OUT=direct, IEEE_DOT=dtype == "fp32", BLOCK_MASK=block_mask,
                  HAS_WINDOW=window or chunked, HAS_SOFTCAP=softcap, HAS_SINKS=sinks, CHUNKED=chunked,
                  MERGE_LAST=merge_last, FENCE=merge_last, PDL=pdl)
    types = {name: t.replace("Q", f"*{dtype}") for name, t in PTRS.items()}
    return compile_sm90(attn._paged_attn_split, consts, types, num_warps=8 if block_m >= 128 else 4, num_stages=2,
                        pdl=pdl)


def _prefill_tile(dtype: str, group: int, head_dim: int) -> tuple[int, int, int]:
    """(block_m, queries, block_n) a prefill call gets on the compile target (plan_launch's tiling
    for its shared memory a block)."""
    queries, block_m, block_n = attn.choose_tiling(4096, group, head_dim, 4 if dtype == "fp32" else 2,
                                                   SHARED_MEMORY_LIMIT.get(CAPABILITY))
    return block_m, queries, block_n


MLA_PTRS = {"q_ptr": "Q", "c_ptr": "Q", "out_ptr": "Q", "bt_ptr": "*i32", "seq_lens_ptr": "*i32", "cu_ptr": "*i32",
            "tree_ptr": "*i64", "part_o_ptr": "*fp32", "part_lse_ptr": "*fp32", "qk_scale": "fp32"}


def compile_mla(dtype, heads, rank, rope, tree, direct, tile=None):
    """The MLA kernel (kernels/attention/triton_mla.py) as plan_mla tiles a decode step of ``heads``
    (tile: one of its TILES instead of the default)."""
    from specdec_fast.kernels.attention import triton_mla as mla

    torch_dtype = {"bf16": mla.torch.bfloat16, "fp16": mla.torch.float16, "fp32": mla.torch.float32}[dtype]
    plan = mla.plan_mla(mla.torch.device("cpu"), 1, heads, rank, 1, 4096, num_splits=1, tile=tile, dtype=torch_dtype)
    consts = dict(NUM_HEADS=heads, BLOCK_H=plan.block_h, HEAD_TILES=plan.head_tiles, QUERIES=plan.queries,
                  BLOCK_M=plan.block_m, BLOCK_N=plan.block_n, RANK=rank, RANK_P2=attn.head_dim_padded(rank), ROPE=rope,
                  ROPE_P2=attn.head_dim_padded(rope), PAGE_SIZE=16, HAS_TREE=tree, DIRECT_OUT=direct,
                  IEEE_DOT=dtype == "fp32")
    types = {name: t.replace("Q", f"*{dtype}") for name, t in MLA_PTRS.items()}
    return compile_sm90(mla._mla_attn_split, consts, types, num_warps=plan.num_warps, num_stages=2)


def ptxas_spills(kernel) -> int | None:
    """Bytes ptxas spills for the compiled kernel's PTX (its -v report), or None without Triton's ptxas."""
    import re
    import subprocess
    import tempfile

    try:
        from triton.backends.nvidia.compiler import get_ptxas

        ptxas = get_ptxas(CAPABILITY).path
    except (ImportError, AttributeError, RuntimeError):
        return None
    with tempfile.NamedTemporaryFile("w", suffix=".ptx") as f:
        f.write(kernel.asm["ptx"])
        f.flush()
        arch = f"sm_{CAPABILITY}a" if CAPABILITY >= 90 else f"sm_{CAPABILITY}"
        report = subprocess.run([ptxas, f"-arch={arch}", "-v", f.name, "-o", os.devnull], capture_output=True,
                                text=True).stderr
    return sum(int(n) for n in re.findall(r"(\d+) bytes spill stores", report))


def compile_merge(head_dim=128, pdl=False):
    consts = dict(NUM_HEADS=32, SPLITS_P2=64, HEAD_DIM=head_dim, HEAD_DIM_P2=attn.head_dim_padded(head_dim), PDL=pdl)
    types = dict(part_o_ptr="*fp32", part_lse_ptr="*fp32", out_ptr="*bf16")
    return compile_sm90(attn._merge_splits, consts, types, num_warps=4, pdl=pdl)


def main(full: bool) -> None:
    configs = [("bf16", 32, 8, 4, 128, True, False), ("bf16", 16, 1, 8, 128, False, True),
               ("bf16", 16, 4, 4, 80, False, True), ("fp16", 32, 8, 4, 96, True, False)]  # padded head dims
    if full:  # the prefill tiles the launcher plans on this target (its shared memory: attn.choose_tiling)
        configs += [(dt, bm, q, g, d, tree, direct, bn) for dt in ("bf16", "fp16", "fp32") for tree in (True, False)
                    for direct in (True, False) for g, d in ((8, 128), (4, 64)) for bm, q, bn in [_prefill_tile(dt, g, d)]]
    for cfg in configs:
        kernel = compile_split(*cfg[:7], block_n=cfg[7] if len(cfg) > 7 else 64)
        print("split", cfg, "shared bytes", kernel.metadata.shared)
    # Gemma 4's full layers (head_dim 512): the prefill tile the launcher plans (16 rows) and a tree decode; their
    # fp32 accumulators take a thread's registers: ptxas spills about 100-200 bytes here (64 rows spilled 6-7 KB)
    for cfg in (("bf16", *_prefill_tile("bf16", 2, 512)[:2], 2, 512, False, False), ("bf16", 16, 1, 8, 512, True, False)):
        kernel = compile_split(*cfg, block_n=32)
        spills = ptxas_spills(kernel)
        assert spills is None or spills < 1024, f"head_dim 512 {cfg}: ptxas spills {spills} bytes a thread"
        print("split head_dim 512", cfg, "shared bytes", kernel.metadata.shared, "spills", spills)
    for cfg in (("bf16", 64, 16, 4, 128, False, True), ("bf16", 128, 16, 8, 128, False, False)):  # the block mask
        kernel = compile_split(*cfg, block_mask=True)
        print("split block mask", cfg, "shared bytes", kernel.metadata.shared)
    # a sliding window, soft-capping and sinks (Mistral, Gemma 2 / 3, GPT-OSS), combined in four forms that take
    # every new path between them (each form costs the suite a compile here and in the RTX 30xx test): decode with
    # all three (D 64, GQA 8: GPT-OSS), a tree's split partials, the block mask, the largest (prefill) tile
    for cfg, extra in ((("bf16", 16, 1, 8, 64, False, True), dict(window=True, softcap=True, sinks=True)),
                       (("fp16", 32, 8, 4, 96, True, False), dict(window=True, sinks=True)),
                       (("bf16", 64, 16, 4, 128, False, True), dict(window=True, block_mask=True)),
                       (("bf16", *_prefill_tile("bf16", 8, 128)[:2], 8, 128, False, False),
                        dict(window=True, softcap=True, block_n=_prefill_tile("bf16", 8, 128)[2]))):
        kernel = compile_split(*cfg, **extra)
        print("split window / softcap / sinks", cfg, extra, "shared bytes", kernel.metadata.shared)
    # chunked attention (Llama 4; the window's walk with each row's first key at its chunk's start): a chain of 8's
    # split partials (one integer expression of the window's), and a tree's (its nodes' chunks by their depths, the
    # ancestors below dropped from each row's bits in a loop)
    for tree in (False, True):
        kernel = compile_split("bf16", 32, 8, 4, 128, tree, False, chunked=True)
        print("split chunked", "tree" if tree else "chain", "shared bytes", kernel.metadata.shared)
    # the in-kernel merge (the last split merges after a fenced ticket): decode and a chain of 5
    for cfg in (("bf16", 16, 1, 4, 128, False, False), ("bf16", 32, 8, 4, 128, True, False),
                ("fp16", 16, 4, 4, 80, False, False)):
        kernel = compile_split(*cfg, merge_last=True)
        print("split merge in kernel", cfg, "shared bytes", kernel.metadata.shared)
    # MLA (DeepSeek-V3: 128 heads, 512 + 64; GLM-4.7-Flash: 20 heads), decode and a tree's split partials:
    # within shared memory and, at R = 512 in bf16, without spills (chunks of 32 entries spilled 96 bytes)
    from specdec_fast.kernels.attention.triton_mla import TILES

    mla_forms = [(("bf16", 128, 512, 64, False, True), None), (("bf16", 20, 512, 64, True, False), None),
                 (("fp16", 128, 512, 64, True, True), None), (("fp32", 4, 32, 8, False, True), None),
                 (("fp32", 128, 512, 64, True, False), None)]  # fp32 at R = 512 keeps the narrow tile (the wide spills)
    mla_forms += [(("bf16", 128, 512, 64, False, False), tile) for tile in TILES[1:]]  # the benchmark's wider tiles
    for cfg, tile in mla_forms:
        kernel = compile_mla(*cfg, tile=tile)
        spills = ptxas_spills(kernel) if cfg[0] != "fp32" else None
        print("mla", cfg, tile, "shared bytes", kernel.metadata.shared, "spilled bytes", spills)
        assert not spills, f"the MLA kernel {cfg} {tile} spills {spills} bytes"
    compile_merge()
    compile_merge(head_dim=112)
    compile_merge(head_dim=512)  # MLA's merge: the latent's 512 dims
    if not PDL_TARGET:  # triton < 3.5 or a GPU before sm_90 (kernels/_triton_compat.py): the launchers never ask for PDL
        print("merge ok (no PDL forms: triton < 3.5 or a target before sm_90)")
        return
    # the GEMV layer's PDL chain (runners/paged_llama.py GEMV_PDL): one-row decode (direct and
    # split with the in-kernel merge), a chain of 5, the merge launch
    for cfg, merge_last in ((("bf16", 16, 1, 4, 128, False, True), False), (("bf16", 16, 1, 4, 128, False, False), True),
                            (("bf16", 32, 8, 4, 128, False, False), False)):
        check_pdl_order(f"split {cfg} merge_last={merge_last}",
                        compile_split(*cfg, merge_last=merge_last, pdl=True).asm["ptx"],
                        compile_split(*cfg, merge_last=merge_last).asm["ptx"])
    check_pdl_order("merge", compile_merge(pdl=True).asm["ptx"], compile_merge().asm["ptx"])
    print("merge ok")


if __name__ == "__main__":
    main(full=len(sys.argv) > 1 and sys.argv[1] == "full")
