"""Eager calls of one verify case, for a hardware-counter profiler to read (GPU only):

    ncu --clock-control none -k regex:residual --launch-count 8 --section SpeedOfLight ... \
        --csv --page details --log-file F python3 bench/ncu_cases.py --case tree_t1 --calls 1
(`bash bench/run_gpu.sh ncu` runs every case so.)

Cases (V = 128256, bf16 logits, the shapes of issue 25's rows):
  tree_t1          tree_verify B = 1, N = 64 (TokenTree.default), T = 1: select, residual_rows, 5 residual_mass,
                   walk, emit
  chain_b64_greedy chain_verify B = 64, K = 4, greedy: the streaming pass that ran at 36% of the roofline
  chain_b64_t1     chain_verify B = 64, K = 4, T = 1
  chain_b1_<mode>  chain_verify B = 1, K = 4, mode greedy / t1 / topk50 / topp09: the B = 1 rows of issue 25
                   (12 / 27 / 86 / 110 us on the H200 where the targets are 8 / 15 / 30 / 30)
  tree_b8_t1       tree_verify B = 8, N = 64, T = 1 (its residual launches: 234 of 403 us)
  chain_b1_topk50_search0  chain_b1_topk50 with the finishing launch's earlier search
                   (_triton_plan.FINISH_SEARCH_TILE = 0; the fused search of 1024 is the default since 2026-11-28)
Each case is called --calls times; nothing is timed here. The profiler reads the kernels it
names (-k), replaying each with the caches flushed, so one call (which also compiles) is enough
to read every launch of a case."""
import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def tree_t1(device, batch=1):
    from specdec_fast.drafters.token_tree import TokenTree
    from specdec_fast.kernels import make_sampling_tensors
    from specdec_fast.kernels._workspace import KernelWorkspace
    from specdec_fast.kernels.tree_verify.triton import tree_verify_triton

    vocab, n = 128256, 64
    g = torch.Generator(device="cpu").manual_seed(0)
    target = (torch.randn(batch, n, vocab, generator=g) * 3).to(device, torch.bfloat16)
    draft = (target.float() + torch.randn(batch, n, vocab, generator=g).to(device)).to(torch.bfloat16)
    tree = TokenTree.default(n)
    parents = torch.tensor(tree.parents, device=device).expand(batch, -1)
    tokens = torch.randint(0, vocab, (batch, n), generator=g).to(device)
    params = make_sampling_tensors(batch, device, seed=0, temperature=1.0)
    ws = KernelWorkspace()
    return lambda: tree_verify_triton(target, draft, tokens, parents, params, workspace=ws,
                                      max_children=tree.max_children)


def chain(device, batch, overrides=None, **sampling):
    from verify_gpu_table import make_logits

    from specdec_fast.kernels import make_sampling_tensors
    from specdec_fast.kernels._workspace import KernelWorkspace
    from specdec_fast.kernels.verify.triton import chain_verify_triton

    k, vocab = 4, 128256
    target, draft, tokens = make_logits(batch, k, vocab, "random", device, torch.bfloat16)
    params = make_sampling_tensors(batch, device, seed=0, **sampling)
    ws = KernelWorkspace()
    return lambda: chain_verify_triton(target, draft, tokens, params, workspace=ws, **(overrides or {}))


CASES = {"tree_t1": tree_t1, "tree_b8_t1": lambda d: tree_t1(d, batch=8),
         "chain_b64_greedy": lambda d: chain(d, 64, temperature=0.0),
         "chain_b64_t1": lambda d: chain(d, 64, temperature=1.0),
         "chain_b1_greedy": lambda d: chain(d, 1, temperature=0.0),
         "chain_b1_t1": lambda d: chain(d, 1, temperature=1.0),
         "chain_b1_topk50": lambda d: chain(d, 1, temperature=1.0, top_k=50),
         "chain_b1_topp09": lambda d: chain(d, 1, temperature=1.0, top_p=0.9),
         "chain_b1_topk50_search0": lambda d: chain(d, 1, dict(finish_search_tile=0), temperature=1.0, top_k=50),
         # B = 64 top_p = 0.9 took 2230 us against 791 for top_k = 50 on the H200 (h200_2026-11-28c): every row's
         # threshold on the finishing launch's second pass, one program a row (verify_kernel_split.py says which launch)
         "chain_b64_topk50": lambda d: chain(d, 64, temperature=1.0, top_k=50),
         "chain_b64_topp09": lambda d: chain(d, 64, temperature=1.0, top_p=0.9)}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--case", choices=sorted(CASES), required=True)
    ap.add_argument("--calls", type=int, default=3)
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("ncu_cases.py needs a CUDA device")
    call = CASES[args.case]("cuda")
    for _ in range(args.calls):
        call()
    torch.cuda.synchronize()
    print(f"{args.case}: {args.calls} calls done")


if __name__ == "__main__":
    main()
