"""The Triton launches with and without penalties: the penalty-off path (penalties None, or no
active penalty) launches the kernels of 5fab9c4 with the same specialisation keys; penalised
calls launch the penalised variant of each kernel of the same plan (verify_plan(penalties=True))
without FMA contraction. The PTX side (penalty-free kernels compile to 5fab9c4's instructions)
is in test_verify_triton_compiles.py."""
import json

import pytest
import torch

from specdec_fast.kernels import make_sampling_tensors
from specdec_fast.kernels.penalties import make_penalty_tensors
from specdec_fast.kernels.verify._triton_plan import verify_plan

from .penalty_off_launches import RECORDING, record


def _inactive(batch, vocab):
    return make_penalty_tensors(torch.zeros(batch, 3, dtype=torch.int64), vocab, repetition_penalty=1.0)


@pytest.mark.cpu_only  # the recording holds the interpreter's plan (tiles sized for the CPU)
@pytest.mark.parametrize("penalties", [None, _inactive], ids=["none", "inactive"])
def test_penalty_off_launches_keep_the_recorded_keys(penalties):
    assert record(penalties) == json.loads(RECORDING.read_text())


def test_penalised_launches_follow_the_plan(device):
    from specdec_fast.engine.triton_launches import TritonLaunches
    from specdec_fast.kernels.verify.triton import chain_verify_triton, sample_triton

    g = torch.Generator().manual_seed(1)
    for batch, k, vocab, kw, overrides in ((2, 2, 33, dict(top_k=5), {}), (2, 2, 600, dict(temperature=0.0), {}),
                                           (1, 3, 5003, dict(top_p=0.9), {})):
        target = torch.randn(batch, k + 1, vocab, generator=g).to(device)
        drafts = torch.randint(0, vocab, (batch, k), generator=g).to(device)
        pen = make_penalty_tensors(torch.randint(0, vocab, (batch, 4), generator=g).to(device), vocab,
                                   presence_penalty=0.5)
        params = make_sampling_tensors(batch, device, seed=2, **kw)
        positions = torch.zeros(batch, dtype=torch.int64, device=device)
        for plan, run in ((verify_plan(batch, k, vocab, True, tuple(params.modes), penalties=True),
                           lambda: chain_verify_triton(target, target[:, :k], drafts, params, pen)),
                          (verify_plan(batch, 0, vocab, False, tuple(params.modes), penalties=True),
                           lambda: sample_triton(target[:, 0], params, positions, 2, pen, drafts))):
            with TritonLaunches() as rec:
                run()
            names = [launch.kernel.rsplit(".", 1)[1].removesuffix("_kernel") for launch in rec.launches]
            # the zero fill is a torch op; the rungs launch follows the chunks a row gets on this device
            # (verify_plan sizes them for a GPU, the interpreter streams a row in one program)
            assert names == [n for n in plan["kernels"][1:] if n != "select_rungs_penalised" or torch.device(device).type == "cuda"], \
                (names, plan["kernels"])
            assert all("'enable_fp_fusion': False" in launch.key for launch in rec.launches)


def test_verify_plan_counts_the_count_reads():
    for modes, vocab in ((("plain",), 128256), (("greedy",), 128256), (("top_k", "top_p"), 128256), (None, 1000)):
        off, on = verify_plan(64, 4, vocab, True, modes), verify_plan(64, 4, vocab, True, modes, penalties=True)
        assert on["launches"] == off["launches"] and on["grids"] == off["grids"]
        assert on["kernels"] == [off["kernels"][0]] + [name + "_penalised" for name in off["kernels"][1:]]
        emitted = 0 if modes == ("greedy",) else 2
        assert off["count_reads_per_row"] == 0 and on["count_reads_per_row"] == 9 + emitted
