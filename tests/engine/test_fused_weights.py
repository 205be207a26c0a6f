"""fuse_projections: q/k/v and gate/up concatenated WITHOUT a second copy of the weights. The
model's parameters become views of the runner's concatenated tensors: the model's own forward
is unchanged (bit for bit), the model + runner hold every weight byte once, the old storages
are released, a second runner reuses the concatenation, and save_pretrained / from_pretrained
round-trips the values."""
import gc

import pytest
import torch

from specdec_fast.runners._fused_weights import concat_parameters, unique_storage_bytes
from specdec_fast.runners.paged_llama import PagedLlamaRunner

from .runner_checks import assert_runner_matches_forward
from .test_paged_runner import VOCAB, tiny


def _param_bytes(model) -> int:
    return sum(p.numel() * p.element_size() for p in model.parameters())


def _runner_tensors(runner):
    for layer in runner.layers:
        yield from (layer.w_qkv, layer.b_qkv, layer.w_gate_up, layer.b_gate_up)
        for w, b in (layer.q, layer.k, layer.v, layer.o, layer.gate, layer.up, layer.down):
            yield w
            yield b


@pytest.mark.parametrize("kind", ["llama", "qwen2"])
def test_model_forward_unchanged_and_no_second_copy(kind):
    model = tiny(kind)
    ids = torch.tensor([[5, 9, 3, 17, 4]])
    with torch.no_grad():
        before = model(input_ids=ids).logits
    weight_bytes = _param_bytes(model)
    assert unique_storage_bytes(model.parameters()) == weight_bytes  # every parameter its own storage
    old_q = model.model.layers[0].self_attn.q_proj.weight.detach()
    old_storage = old_q.untyped_storage().data_ptr()
    del old_q

    runner = PagedLlamaRunner(model, max_new_tokens=8, num_draft_tokens=3, block_size=4, fuse_projections=True)
    layer, attn = runner.layers[0], model.model.layers[0].self_attn
    # the model's parameters are views of the runner's concatenations (same storage, in order)
    assert attn.q_proj.weight.untyped_storage().data_ptr() == layer.w_qkv.untyped_storage().data_ptr()
    assert attn.q_proj.weight.data_ptr() == layer.w_qkv.data_ptr()
    assert attn.v_proj.weight.data_ptr() == layer.w_qkv[layer.q_cols + layer.kv_cols:].data_ptr()
    assert model.model.layers[0].mlp.up_proj.weight.data_ptr() == layer.w_gate_up[layer.inter:].data_ptr()
    assert isinstance(attn.q_proj.weight, torch.nn.Parameter)
    if kind == "qwen2":
        assert attn.k_proj.bias.data_ptr() == layer.b_qkv[layer.q_cols:].data_ptr()
    # memory: model + runner hold the weights once, and no parameter keeps an old storage
    gc.collect()
    held = list(model.parameters()) + list(_runner_tensors(runner))
    assert unique_storage_bytes(held) == weight_bytes
    # every fused projection now lives in one of the runner's concatenations (an address compare with
    # the old storage cannot say this: a caching allocator, CUDA's, may hand that address to a new tensor)
    fused = {t.untyped_storage().data_ptr() for t in (*(lay.w_qkv for lay in runner.layers),
                                                      *(lay.w_gate_up for lay in runner.layers))}
    projections = [getattr(block, name).weight for block_layer in model.model.layers
                   for block, names in ((block_layer.self_attn, ("q_proj", "k_proj", "v_proj")),
                                        (block_layer.mlp, ("gate_proj", "up_proj"))) for name in names]
    assert {w.untyped_storage().data_ptr() for w in projections} <= fused
    with torch.no_grad():
        after = model(input_ids=ids).logits
    assert torch.equal(before, after)
    # the runner over fused weights is exact too (CPU kernels, fused weights)
    assert_runner_matches_forward(model, runner, VOCAB)


def test_second_runner_reuses_the_concatenation():
    model = tiny("llama")
    first = PagedLlamaRunner(model, max_new_tokens=4, num_draft_tokens=1, fuse_projections=True)
    second = PagedLlamaRunner(model, max_new_tokens=4, num_draft_tokens=1, fuse_projections=True)
    assert second.layers[1].w_qkv.data_ptr() == first.layers[1].w_qkv.data_ptr()
    assert second.layers[1].w_gate_up.data_ptr() == first.layers[1].w_gate_up.data_ptr()
    held = list(model.parameters()) + list(_runner_tensors(first)) + list(_runner_tensors(second))
    assert unique_storage_bytes(held) == _param_bytes(model)


def test_save_and_reload_round_trip(tmp_path):
    import transformers as tf

    model = tiny("qwen2")
    PagedLlamaRunner(model, max_new_tokens=4, num_draft_tokens=1, fuse_projections=True)
    model.save_pretrained(tmp_path)
    loaded = tf.AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    for (name, p), (name2, p2) in zip(model.named_parameters(), loaded.named_parameters()):
        assert name == name2 and torch.equal(p, p2), name


def test_default_is_on_with_triton_only(device):
    """Fused projections by default where the kernels are Triton's: on CUDA (the automatic choice)
    or asked for; not on CPU kernels."""
    model = tiny("llama").to(device)
    default = PagedLlamaRunner(model, max_new_tokens=4, num_draft_tokens=1).layers[0].w_qkv
    assert (default is not None) == (device == "cuda")
    assert PagedLlamaRunner(model, max_new_tokens=4, num_draft_tokens=1, backend="triton").layers[0].w_qkv is not None


def test_concat_parameters_rules():
    a, b = torch.nn.Parameter(torch.randn(3, 4)), torch.nn.Parameter(torch.randn(2, 4))
    values = torch.cat([a.detach(), b.detach()])
    fused = concat_parameters([a, b])
    assert torch.equal(fused, values) and a.data_ptr() == fused.data_ptr() and a.requires_grad
    assert concat_parameters([a, b]).data_ptr() == fused.data_ptr()  # adjacent already: a view, no copy
    with pytest.raises(ValueError, match="one dtype"):
        concat_parameters([torch.randn(2, 4), torch.randn(2, 5)])


@pytest.mark.gpu
def test_cuda_memory_allocated_unchanged():
    """On the GPU: after the runner fuses (and the old storages are freed), the allocator holds
    the same number of bytes as before (the caching allocator may keep the freed blocks reserved)."""
    model = tiny("llama").to("cuda", torch.bfloat16)
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    runner = PagedLlamaRunner(model, max_new_tokens=4, num_draft_tokens=1)  # CUDA: fused by default
    assert runner.layers[0].w_qkv is not None
    gc.collect()
    torch.cuda.synchronize()
    assert torch.cuda.memory_allocated() - before <= 2 * 4096, "inv_freq and small runner state only"
