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
                  block_n=64, window=False, softcap=False, sinks=False):
    consts = dict(NUM_KV_HEADS=8, GROUP=group, GROUP_P2=group, QUERIES_PER_TILE=queries, BLOCK_M=block_m,
                  BLOCK_N=block_n, HEAD_DIM=head_dim, HEAD_DIM_P2=attn.head_dim_padded(head_dim), PAGE_SIZE=16,
                  HAS_TREE=tree, DIRECT_OUT=direct, IEEE_DOT=dtype == "fp32", BLOCK_MASK=block_mask,
                  HAS_WINDOW=window, HAS_SOFTCAP=softcap, HAS_SINKS=sinks, MERGE_LAST=merge_last, FENCE=merge_last,
                  PDL=pdl)
    types = {name: t.replace("Q", f"*{dtype}") for name, t in PTRS.items()}
    return compile_sm90(attn._paged_attn_split, consts, types, num_warps=8 if block_m >= 128 else 4, num_stages=2,
                        pdl=pdl)


def _prefill_tile(dtype: str, group: int, head_dim: int) -> tuple[int, int, int]:
    """(block_m, queries, block_n) a prefill call gets on the compile target (plan_launch's tiling
    for its shared memory a block)."""
    queries, block_m, block_n = attn.choose_tiling(4096, group, head_dim, 4 if dtype == "fp32" else 2,
                                                   SHARED_MEMORY_LIMIT.get(CAPABILITY))
    return block_m, queries, block_n


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
    # the in-kernel merge (the last split merges after a fenced ticket): decode and a chain of 5
    for cfg in (("bf16", 16, 1, 4, 128, False, False), ("bf16", 32, 8, 4, 128, True, False),
                ("fp16", 16, 4, 4, 80, False, False)):
        kernel = compile_split(*cfg, merge_last=True)
        print("split merge in kernel", cfg, "shared bytes", kernel.metadata.shared)
    compile_merge()
    compile_merge(head_dim=112)
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
