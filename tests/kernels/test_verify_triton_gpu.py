"""GPU-only properties of the Triton verify backend: no host synchronisation, CUDA-graph
capture and replay (skipped without a CUDA device; run on the GPU machine)."""
import pytest
import torch

from specdec_fast.kernels import make_sampling_tensors


def _inputs(batch=4, k=5, vocab=32000, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    target = torch.randn(batch, k + 1, vocab, device="cuda", generator=g).to(torch.bfloat16)
    draft = torch.randn(batch, k, vocab, device="cuda", generator=g).to(torch.bfloat16)
    drafts = torch.randint(0, vocab, (batch, k), device="cuda", generator=g)
    params = make_sampling_tensors(batch, "cuda", temperature=0.8, top_k=50, top_p=0.9, min_p=0.01, seed=7)
    return target, draft, drafts, params


@pytest.mark.gpu
def test_no_host_sync_and_matches_reference():
    from specdec_fast.kernels.verify import chain_verify_reference
    from specdec_fast.kernels.verify.triton import chain_verify_triton

    target, draft, drafts, params = _inputs()
    chain_verify_triton(target, draft, drafts, params)  # compile outside the check
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        tokens, accepted = chain_verify_triton(target, draft, drafts, params)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    expected = chain_verify_reference(target, draft, drafts, params)
    # GPU exp/log are not torch's bit for bit: a decision within rounding of its boundary
    # could differ, which random inputs make vanishingly unlikely.
    assert torch.equal(tokens, expected[0]) and torch.equal(accepted, expected[1])


@pytest.mark.gpu
def test_cuda_graph_replay_matches_eager():
    from specdec_fast.kernels.verify.triton import chain_verify_triton

    target, draft, drafts, params = _inputs()
    eager = chain_verify_triton(target, draft, drafts, params)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        chain_verify_triton(target, draft, drafts, params)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = chain_verify_triton(target, draft, drafts, params)
    new_target, new_draft, new_drafts, _ = _inputs(seed=1)
    target.copy_(new_target)
    draft.copy_(new_draft)
    drafts.copy_(new_drafts)
    graph.replay()
    torch.cuda.synchronize()
    expected = chain_verify_triton(target, draft, drafts, params)
    assert torch.equal(captured[0], expected[0]) and torch.equal(captured[1], expected[1])
    assert not torch.equal(eager[0], expected[0])  # the replay really read the new inputs
