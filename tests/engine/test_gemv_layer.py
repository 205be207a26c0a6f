"""The Llama runner's GEMV layer (runners/paged_llama.py _decode_gemv: the Triton skinny linear
with the RMSNorms, SwiGLU and residual adds fused into the products; CUDA, or the interpreter
here): logits equal the model's forward in float32 (Qwen3's q/k norms, Qwen2's biases, Llama),
bf16 stays within the tolerance of the cuBLAS layer, 6 launches a layer, greedy generate through
the engine equals transformers' generate, and the runners it cannot serve say why."""
import sys
from pathlib import Path

import pytest
import torch

import specdec_fast.api as api
import specdec_fast.runners.paged_llama as paged_llama
from specdec_fast.runners.paged_llama import PagedLlamaRunner

from .models import left_padded_prompts, make_model
from .runner_checks import assert_bf16_close_to_forward, assert_runner_matches_forward
from .test_paged_runner import VOCAB, tiny
from .test_paged_runner_triton import _runner_with_layers

pytest.importorskip("triton")
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
from launch_count import launches_per_layer  # noqa: E402

# qkv (input norm fused), rope_append_kv, attention, o (+ residual), gate_up (norm fused), down
# (SwiGLU fused, + residual): the 9 of the cuBLAS layer less add_rms_norm x 2 and silu_mul; with
# more than SILU_FUSED_MAX_ROWS rows silu_mul runs apart (7).
LAUNCHES_PER_LAYER = {1: 6, 3: 7}


def _gemv_runner(model, **kw):
    runner = PagedLlamaRunner(model, backend="triton", **kw)
    runner.set_gemv_layer(True)
    return runner


@pytest.mark.parametrize("kind", ["qwen3", pytest.param("qwen2", marks=pytest.mark.slow),
                                  pytest.param("llama", marks=pytest.mark.slow), "phi3", "smollm3", "cwm", "ministral3"])
def test_logits_equal_hf_forward(kind, device, monkeypatch):
    """float32: the prefill (27 token rows: the cuBLAS layer) and the score calls (3-12 rows: the
    GEMV layer) give the model's own logits within the runner tests' 1e-4; the GEMV path ran."""
    model = tiny(kind).to(device)
    runner = _gemv_runner(model, max_new_tokens=8, num_draft_tokens=3, block_size=4)
    calls = []
    real = runner._decode_gemv
    monkeypatch.setattr(runner, "_decode_gemv", lambda *a: calls.append(a[0].shape[0]) or real(*a))
    assert_runner_matches_forward(model, runner, VOCAB)
    assert calls and max(calls) <= paged_llama.GEMV_MAX_ROWS


def test_one_row_steps_equal_hf_forward(device):
    """One token row per step (plain decoding at B = 1: SwiGLU fused into the down product, the
    one-row inner product): every step's logits are the model's own (float32, 1e-4)."""
    from .runner_checks import hf_logits

    model = tiny("llama").to(device)
    runner = _gemv_runner(model, max_new_tokens=6, num_draft_tokens=0, block_size=4)
    context = [5, 9, 3, 7]
    runner.prefill(torch.tensor([context], device=device), None)
    for token in (11, 4, 8):
        logits = runner.score(torch.tensor([[token]], device=device)).cpu()
        runner.commit(torch.ones(1, dtype=torch.int32, device=device))
        context.append(token)
        torch.testing.assert_close(logits[0, 0], hf_logits(model, context)[-1], atol=1e-4, rtol=1e-4)


def test_bfloat16_close_to_hf_forward(device):
    model = tiny("qwen3").to(device=device, dtype=torch.bfloat16)
    assert_bf16_close_to_forward(model, _gemv_runner(model, max_new_tokens=4, num_draft_tokens=1), VOCAB)


@pytest.mark.parametrize("n", [1, 3])
def test_launches_per_layer(n, device):
    """One warm score(N=n) call, 1 vs 2 layers (Qwen3, bf16), kernels counted without running."""
    assert paged_llama.SILU_FUSED_MAX_ROWS == 1  # the table above assumes it

    def make(layers):
        runner = _runner_with_layers(layers, device=device)
        runner.set_gemv_layer(True)
        return runner

    counted = launches_per_layer(make, torch.arange(8, 8 + n, device=device)[None], layer_counts=(1, 2))
    assert counted["per_layer"] == LAUNCHES_PER_LAYER[n], counted["per_layer_by_name"]
    assert counted["per_layer_by_name"]["triton:_skinny_linear_kernel"] == 4
    assert counted["per_layer_by_name"].get("triton:_silu_mul_kernel", 0) == (n > 1)


def test_greedy_generate_equals_transformers(device, monkeypatch):
    """GEMV_LAYER on for every runner: speculative greedy decoding (target and draft runners both
    on the GEMV layer for their decode steps) gives transformers' greedy tokens (float32)."""
    monkeypatch.setattr(paged_llama, "GEMV_LAYER", True)
    model = make_model("llama", vocab=VOCAB, seed=3).to(device)
    draft = make_model("llama", vocab=VOCAB, seed=4).to(device)
    for m in (model, draft):
        m.generation_config.eos_token_id = None
    ids, mask = (t.to(device) for t in left_padded_prompts([3, 5], vocab=VOCAB, seed=2))
    expected = model.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=6, pad_token_id=0)
    out = api.generate(model, ids, mask, assistant_model=draft, num_assistant_tokens=3, do_sample=False,
                       max_new_tokens=6, pad_token_id=0, backend="triton", runner="paged")
    assert torch.equal(out, expected)


@pytest.mark.parametrize("drafter", ["model", "plain"])
def test_static_graph_twin(drafter, device, monkeypatch):
    """The graph code path (cuda_graphs="static": the captured steps run eagerly with the graph
    checks -- static arguments, no rebinding, the same launches every call) with the GEMV layer
    in the target and draft runners: transformers' greedy tokens, every iteration after the
    first through the graph code."""
    monkeypatch.setattr(paged_llama, "GEMV_LAYER", True)
    model = make_model("llama", vocab=VOCAB, seed=3).to(device)
    model.generation_config.eos_token_id = None
    ids, mask = (t.to(device) for t in left_padded_prompts([4], vocab=VOCAB, seed=5))
    expected = model.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=7, pad_token_id=0)
    extra = {}
    if drafter == "model":
        draft = make_model("llama", vocab=VOCAB, seed=4).to(device)
        draft.generation_config.eos_token_id = None
        extra = dict(assistant_model=draft, num_assistant_tokens=2)
    out, stats = api.generate(model, ids, mask, do_sample=False, max_new_tokens=7, pad_token_id=0, backend="triton",
                              runner="paged", cuda_graphs="static", return_stats=True, **extra)
    assert torch.equal(out, expected)
    assert stats.graph_mode == "static" and stats.graph_replays["verify"] == stats.iterations - 1


@pytest.mark.gpu
@pytest.mark.parametrize("pdl", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cuda_graphs_on_the_gpu(pdl, dtype, monkeypatch):
    """The GEMV layer in captured CUDA graphs (target and draft), with and without the chain of
    programmatic dependent launches (GEMV_PDL: the capture turns them into programmatic graph
    edges): the tokens of the graphs equal the same call without graphs, and in float32
    transformers' greedy generate."""
    monkeypatch.setattr(paged_llama, "GEMV_LAYER", True)
    monkeypatch.setattr(paged_llama, "GEMV_PDL", pdl)
    model = make_model("llama", vocab=VOCAB, seed=3).to("cuda", dtype)
    draft = make_model("llama", vocab=VOCAB, seed=4).to("cuda", dtype)
    for m in (model, draft):
        m.generation_config.eos_token_id = None
    ids, mask = (t.to("cuda") for t in left_padded_prompts([4, 7], vocab=VOCAB, seed=5))
    outs = {}
    for graphs in (False, True):
        outs[graphs], stats = api.generate(model, ids, mask, assistant_model=draft, num_assistant_tokens=3,
                                           do_sample=False, max_new_tokens=12, pad_token_id=0, backend="triton",
                                           runner="paged", cuda_graphs=graphs, return_stats=True)
    assert stats.graph_replays["verify"] >= 1, stats
    assert torch.equal(outs[True], outs[False])
    if dtype == torch.float32:
        expected = model.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=12, pad_token_id=0)
        assert torch.equal(outs[True], expected)


def test_reasons_where_it_cannot_run(device):
    model = tiny("llama").to(device)
    unfused = PagedLlamaRunner(model, max_new_tokens=4, backend="triton", fuse_projections=False)
    with pytest.raises(ValueError, match="not fused"):
        unfused.set_gemv_layer(True)
    assert not unfused.gemv_layer
    unfused.set_gemv_layer(False)  # turning it off always works
    gelu = make_model("llama", vocab=VOCAB, seed=5)
    gelu.config.hidden_act = "gelu"
    with pytest.raises(ValueError, match="SiLU"):
        PagedLlamaRunner(gelu.to(device), max_new_tokens=4, backend="triton").set_gemv_layer(True)
    with pytest.raises(ValueError, match="Triton path"):
        PagedLlamaRunner(tiny("llama"), max_new_tokens=4, backend="torch").set_gemv_layer(True)
    granite = PagedLlamaRunner(tiny("granite").to(device), max_new_tokens=4, backend="triton")
    with pytest.raises(ValueError, match=r"no residual_multiplier \(0.4\)"):  # its fused adds would drop it
        granite.set_gemv_layer(True)


def test_pdl_reaches_every_product(device, monkeypatch):
    """set_gemv_layer(True, pdl=True): every product of a one-row step and the lm_head, and each
    layer's rope_append_kv and attention, are asked for a programmatic dependent launch (used on
    CUDA only; kernels/linear/triton.py, cache_ops/triton_rope.py, attention/triton.py), with the
    same logits; pdl=None leaves the choice as it was, and off sends pdl=False again."""
    import specdec_fast.kernels.linear.triton as gemv_kernels

    seen = {"products": [], "rope_append_kv": [], "attention": []}

    def recording(name, fn):
        return lambda *a, pdl=False, **k: seen[name].append(pdl) or fn(*a, pdl=pdl, **k)

    monkeypatch.setattr(gemv_kernels, "skinny_linear_triton", recording("products", gemv_kernels.skinny_linear_triton))
    model = tiny("llama").to(device)
    runner = _gemv_runner(model, max_new_tokens=4, num_draft_tokens=0, block_size=4)
    runner._ops = (runner._ops[0], recording("rope_append_kv", runner._ops[1]), runner._ops[2])
    runner.prefill(torch.tensor([[5, 9, 3]], device=device), None)
    runner._triton = (runner._triton[0], recording("attention", runner._triton[1]), runner._triton[2])  # set by prefill
    logits = {}
    layers = len(runner.layers)
    for pdl in (False, True):
        runner.set_gemv_layer(True, pdl=pdl)
        for calls in seen.values():
            calls.clear()
        logits[pdl] = runner.score(torch.tensor([[11]], device=device))
        runner.commit(torch.zeros(1, dtype=torch.int32, device=device))  # the same context for the next call
        # qkv, o, gate_up, down per layer and the lm_head; one rope_append_kv and attention per layer
        assert seen == {"products": [pdl] * (4 * layers + 1), "rope_append_kv": [pdl] * layers,
                        "attention": [pdl] * layers}
    torch.testing.assert_close(logits[True], logits[False], atol=0, rtol=0)
    runner.set_gemv_layer(True)
    assert runner.gemv_pdl is True
    assert paged_llama.GEMV_PDL is False  # off by default: never run on a GPU
