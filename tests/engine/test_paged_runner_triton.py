"""The Llama runner's Triton path (backend='triton': CUDA, or the interpreter here): logits equal
the model's forward (fp32) / within the bf16 tolerance, greedy decoding equals generate with a
head_dim of 12, and the launch count per layer (bench/launch_count.py) stays at its new bound."""
import sys
from pathlib import Path

import pytest
import torch

import specdec_fast.api as api
from specdec_fast.runners.paged_llama import PagedLlamaRunner

from .models import left_padded_prompts, make_model
from .runner_checks import assert_bf16_close_to_forward, assert_runner_matches_forward
from .test_paged_runner import VOCAB, tiny

pytest.importorskip("triton")
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
from launch_count import LaunchCounter, launches_per_layer  # noqa: E402

# Launches per decoder layer on the Triton path: qkv GEMM, rope_append_kv, attention, o GEMM,
# add_rms_norm, gate_up GEMM, silu_mul, down GEMM, add_rms_norm. Before issue 13: 39 (Llama,
# bf16) and 55 (Qwen3: q/k norms) -- the H100 profile's 1435 launches per 32-layer step.
LAUNCHES_PER_LAYER = 9
LAUNCHES_PER_LAYER_UNFUSED = 12  # q, k, v and gate, up as separate GEMMs
LAUNCHES_OUTSIDE_LAYERS_MAX = 16  # packing, cos/sin, embedding, first norm, lm_head (was 22)


@pytest.mark.parametrize("kind,fuse", [("qwen3", True), pytest.param("llama", False, marks=pytest.mark.slow),
                                       pytest.param("qwen2", True, marks=pytest.mark.slow), ("phi3", True),
                                       pytest.param("phi3", False, marks=pytest.mark.slow), ("granite", True),
                                       ("cwm", True), ("ministral3", True)])
def test_logits_equal_hf_forward(kind, fuse, device):
    """fp32: the fused kernels (q/k norm, RoPE + append, add + norm, SwiGLU) and the fused or
    separate projections reproduce the model's own forward within today's 1e-4 (CWM: past a
    sliding layer's window of 4, the window through the fused layer's attention)."""
    model = tiny(kind).to(device)
    runner = PagedLlamaRunner(model, max_new_tokens=8, num_draft_tokens=3, block_size=4, backend="triton",
                         fuse_projections=fuse)
    assert runner.kernels == "triton" and (runner.layers[0].w_qkv is not None) == fuse
    assert_runner_matches_forward(model, runner, VOCAB)


def test_bfloat16_close_to_hf_forward(device):
    model = tiny("qwen3").to(device=device, dtype=torch.bfloat16)
    runner = PagedLlamaRunner(model, max_new_tokens=4, num_draft_tokens=1, backend="triton")
    assert_bf16_close_to_forward(model, runner, VOCAB)


def test_head_dim_12_greedy_equals_generate(device):
    """head_dim 12 (padded to 16 in attention, D/2 = 6 to 8 in RoPE): the model the CLI test
    saves, which the Triton path used to refuse (the CLI test failed on the GPU)."""
    model = make_model("llama", vocab=VOCAB, seed=3).to(device)
    model.generation_config.eos_token_id = None
    ids, mask = (t.to(device) for t in left_padded_prompts([3, 5], vocab=VOCAB, seed=2))
    expected = model.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=4, pad_token_id=0)
    assert api.choose_runner(model, None, 20, backend="triton") == "paged"
    out = api.generate(model, ids, mask, prompt_lookup_num_tokens=2, do_sample=False, max_new_tokens=4, pad_token_id=0,
                       backend="triton", runner="paged")
    assert torch.equal(out, expected)


def test_attention_merged_in_kernel(device, monkeypatch):
    """The runner's attention with the in-kernel split merge (MERGE_IN_KERNEL; forced to 3 splits
    of one 64-token chunk, so a 150-token row really spreads over them): the prefill (the
    validated entry, tickets filled per call) and score calls of 3 and 1 tokens (the direct
    dispatch, the runner's one workspace) give the model's own logits; the workspace serves every
    layer and call and is zero after each."""
    from .runner_checks import hf_logits
    import specdec_fast.kernels.attention.triton as attention_triton

    monkeypatch.setattr(attention_triton, "MERGE_IN_KERNEL", True)
    monkeypatch.setattr(attention_triton, "choose_splits", lambda num_sms, programs, capacity, block_n:
                        (3, block_n))
    model = tiny("qwen2").to(device)  # GQA 4:2 and biases
    runner = PagedLlamaRunner(model, max_new_tokens=8, num_draft_tokens=3, block_size=16, backend="triton")
    context = torch.randint(3, VOCAB, (150,), generator=torch.Generator().manual_seed(4)).tolist()
    logits = runner.prefill(torch.tensor([context], device=device), None).cpu()
    torch.testing.assert_close(logits[0], hf_logits(model, context)[-1], atol=1e-4, rtol=1e-4)
    for tokens, keep in (([4, 9, 2], 2), ([7], 1)):
        out = runner.score(torch.tensor([tokens], device=device)).cpu()
        torch.testing.assert_close(out[0], hf_logits(model, context + tokens)[-len(tokens):], atol=1e-4, rtol=1e-4)
        runner.commit(torch.tensor([keep], device=device))
        context += tokens[:keep]
        assert runner._attn_workspace.all_zero()
    plans = list(runner._plans.values())
    assert len(plans) == 2 and all(p.merge_in_kernel and p.num_splits == 3 for p in plans)
    assert len(runner._attn_workspace._counters) == 1  # 2 KV heads x 1 tile: every call and layer shares it


def _runner_with_layers(layers: int, fuse: bool = True, device: str = "cpu"):
    import transformers as tf

    torch.manual_seed(0)
    config = tf.Qwen3Config(vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=layers,
                            num_attention_heads=2, num_key_value_heads=1, head_dim=16, max_position_embeddings=64)
    model = tf.AutoModelForCausalLM.from_config(config).to(device=device, dtype=torch.bfloat16).eval()
    runner = PagedLlamaRunner(model, max_new_tokens=4, num_draft_tokens=2, block_size=8, backend="triton",
                         fuse_projections=fuse)
    runner.prefill(torch.tensor([[5, 6, 7]], device=device), None)
    return runner


def test_launches_per_layer(device):
    """Torch ops + Triton launches of one warm score(N=3) call, 1 vs 2 layers (Qwen3, bf16: the
    CUDA path's Python code; on CPU counted under the interpreter, the kernels not run)."""
    tokens = torch.tensor([[8, 9, 10]], device=device)
    fused = launches_per_layer(lambda n: _runner_with_layers(n, device=device), tokens, layer_counts=(1, 2))
    assert fused["per_layer"] == LAUNCHES_PER_LAYER, fused["per_layer_by_name"]
    assert fused["per_step_outside_layers"] <= LAUNCHES_OUTSIDE_LAYERS_MAX, fused
    assert fused["per_layer_by_name"]["triton:_rope_append_kv_kernel"] == 1
    unfused = launches_per_layer(lambda n: _runner_with_layers(n, fuse=False, device=device), tokens,
                                 layer_counts=(1, 2))
    assert unfused["per_layer"] == LAUNCHES_PER_LAYER_UNFUSED, unfused["per_layer_by_name"]


def test_launch_counter_counts_what_launches():
    x = torch.randn(4, 8)
    with LaunchCounter() as counter:
        y = x.view(8, 4).t()  # views: nothing
        z = torch.empty(3)  # an uninitialised allocation: nothing
        w = (y * 2).sum()  # two kernels
        w.item()  # a host read: counted as a sync, not a launch
    assert counter.by_name == {"aten.mul": 1, "aten.sum": 1} and counter.syncs == 1 and z.numel() == 3
