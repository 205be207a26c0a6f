"""Eager calls of one verify case, for a hardware-counter profiler to read (GPU only):

    ncu --clock-control none -k regex:residual --launch-count 8 --section SpeedOfLight ... \
        --csv --page details --log-file F python3 bench/ncu_cases.py --case tree_t1 --calls 1
(`bash bench/run_gpu.sh ncu` runs every case so.)

Cases (V = 128256, bf16 logits, the shapes of issue 25's rows):
  tree_t1          tree_verify B = 1, N = 64 (TokenTree.default), T = 1: select, residual_rows, 5 residual_mass,
                   walk, emit
  chain_b64_greedy chain_verify B = 64, K = 4, greedy: the streaming pass that ran at 36% of the roofline
  chain_b64_t1     chain_verify B = 64, K = 4, T = 1
Each case is called --calls times; nothing is timed here. The profiler reads the kernels it
names (-k), replaying each with the caches flushed, so one call (which also compiles) is enough
to read every launch of a case."""
import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def tree_t1(device):
    from specdec_fast.drafters.token_tree import TokenTree
    from specdec_fast.kernels import make_sampling_tensors
    from specdec_fast.kernels._workspace import KernelWorkspace
    from specdec_fast.kernels.tree_verify.triton import tree_verify_triton

    vocab, n = 128256, 64
    g = torch.Generator(device="cpu").manual_seed(0)
    target = (torch.randn(1, n, vocab, generator=g) * 3).to(device, torch.bfloat16)
    draft = (target.float() + torch.randn(1, n, vocab, generator=g).to(device)).to(torch.bfloat16)
    tree = TokenTree.default(n)
    parents = torch.tensor(tree.parents, device=device).expand(1, -1)
    tokens = torch.randint(0, vocab, (1, n), generator=g).to(device)
    params = make_sampling_tensors(1, device, seed=0, temperature=1.0)
    ws = KernelWorkspace()
    return lambda: tree_verify_triton(target, draft, tokens, parents, params, workspace=ws,
                                      max_children=tree.max_children)


def chain_b64(device, temperature):
    from verify_gpu_table import make_logits

    from specdec_fast.kernels import make_sampling_tensors
    from specdec_fast.kernels._workspace import KernelWorkspace
    from specdec_fast.kernels.verify.triton import chain_verify_triton

    batch, k, vocab = 64, 4, 128256
    target, draft, tokens = make_logits(batch, k, vocab, "random", device, torch.bfloat16)
    params = make_sampling_tensors(batch, device, seed=0, temperature=temperature)
    ws = KernelWorkspace()
    return lambda: chain_verify_triton(target, draft, tokens, params, workspace=ws)


CASES = {"tree_t1": tree_t1, "chain_b64_greedy": lambda d: chain_b64(d, 0.0),
         "chain_b64_t1": lambda d: chain_b64(d, 1.0)}


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
