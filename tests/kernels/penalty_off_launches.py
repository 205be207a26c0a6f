"""The Triton launches of a table of verify / sample / tree_verify calls without penalties, with
their specialisation keys (engine/triton_launches.py): what the penalty-off path must keep
launching, key for key (test_penalties_triton.py compares them with a recording made before the
penalties existed).

Run as a script to (re)record: ``TRITON_INTERPRET=1 python -m tests.kernels.penalty_off_launches``
writes tests/kernels/data/verify_launch_keys_interpreter.json. The recording in the repository was
made at commit 5fab9c4 (before the penalties) and re-recorded once, deliberately, when the
streaming kernel gained two constexprs (SELECTS, UNROLL: its keys gained them at the end, every
other launch's key was unchanged), and once more when the emission kernel gained LANES (its keys
gained ('constexpr', False) at the end; nothing else changed), and once more when the streaming kernel gained
RUNGS_GIVEN (its keys gained ('constexpr', False) at the end: the table's rows stream in one program a row
under the interpreter, so no rungs launch; nothing else changed), and once more when the finishing kernel gained
SEARCH_TILE (its keys gained ('constexpr', 0) at the end; nothing else changed), and once more when the emission
kernel gained SKIP_IDENTITIES (its keys gained ('constexpr', False) at the end; nothing else changed), and once
more when an H200's timings turned the fused finishing search and the emission's identity skips on (2026-11-28:
of the 22 keys, the 4 finishing keys' last constexpr went from 0 to 128, FINISH_SEARCH_TILE = 1024 capped at these
calls' candidate region of 128, and the 6 emission keys' from False to True; nothing else changed), and once
more when the streaming kernel gained SUMS (the 6 streaming keys gained ('constexpr', True) at the end; nothing
else changed), and once more when an H200's timings turned the stream without its sums on for greedy rows
(STREAM_GREEDY_ARGMAX_ONLY, 2026-11-28: the 2 large-vocabulary greedy streaming keys' last constexpr went from
True to False; nothing else changed), and once more when the emission kernel gained EXP_KEYS (2026-12-01: the 8
emission keys gained ('constexpr', True) at the end for the draft sampler's calls, False for the verify's; nothing
else changed);
re-recording is only right for a deliberate change of the
penalty-free kernels. The keys are the interpreter's (the launch plan sizes tiles for the
interpreter): the comparison runs where the test device is the CPU.
"""
import json
import os
from pathlib import Path

RECORDING = Path(__file__).with_name("data") / "verify_launch_keys_interpreter.json"

# (name, B, K, V, draft logits, sampling kwargs, plan overrides): the small-vocabulary kernel,
# the streaming launch (+ finish) forced on 600 values by a candidate region of 128, over the
# host modes that change the launches (greedy, plain, a truncation, unknown).
CALLS = [
    ("small-plain", 3, 3, 111, True, dict(temperature=0.7), {}),
    ("small-greedy", 3, 3, 111, True, dict(temperature=0.0), {}),
    ("small-topk-nodraft", 3, 2, 33, False, dict(top_k=5), {}),
    ("large-plain", 2, 2, 600, True, dict(temperature=0.7), dict(cap=128)),
    ("large-greedy", 2, 2, 600, False, dict(temperature=0.0), dict(cap=128)),
    ("large-combined", 2, 2, 600, True, dict(top_k=20, top_p=0.9, min_p=0.02), dict(cap=128, num_chunks=3)),
]


def _inputs(batch, k, vocab, with_draft, seed):
    import torch

    g = torch.Generator().manual_seed(seed)
    target = torch.randn(batch, k + 1, vocab, generator=g) * 2
    draft = target[:, :k] + torch.randn(batch, k, vocab, generator=g) if with_draft else None
    drafts = torch.randint(0, vocab, (batch, k), generator=g)
    return target, draft, drafts


def record(penalties=None) -> list[dict]:
    """[{call, kernel, key, grid}] of every Triton launch of the table, in order (CPU tensors).
    penalties: None, or a function (batch, vocab) -> PenaltyTensors passed to every call."""
    import torch

    from specdec_fast.engine.triton_launches import TritonLaunches
    from specdec_fast.kernels import make_sampling_tensors
    from specdec_fast.kernels.verify.triton import chain_verify_triton, sample_triton

    rows = []
    for name, batch, k, vocab, with_draft, kw, overrides in CALLS:
        target, draft, drafts = _inputs(batch, k, vocab, with_draft, seed=vocab + k)
        params = make_sampling_tensors(batch, "cpu", seed=3, **kw)
        positions = torch.arange(batch, dtype=torch.int64)
        pen = () if penalties is None else (penalties(batch, vocab),)
        for call, run in (("chain_verify", lambda: chain_verify_triton(target, draft, drafts, params, *pen, **overrides)),
                          ("sample", lambda: sample_triton(target[:, 0].contiguous(), params, positions, 2, *pen,
                                                           **overrides))):
            with TritonLaunches() as rec:
                run()
            rows += [dict(call=f"{name}/{call}", kernel=launch.kernel, key=launch.key, grid=list(launch.grid))
                     for launch in rec.launches]
    return rows


if __name__ == "__main__":
    assert os.environ.get("TRITON_INTERPRET") == "1", "record with TRITON_INTERPRET=1 (the interpreter's plan)"
    RECORDING.parent.mkdir(exist_ok=True)
    RECORDING.write_text(json.dumps(record(), indent=1) + "\n")
    print(f"wrote {RECORDING}")
