"""GPT-OSS's MXFP4 experts read by a tensor-parallel rank (runners/checkpoint_mxfp4.py): the
dequantization equals transformers' own (integrations/mxfp4.py convert_moe_packed_tensors) to the
bit, each rank's slice of the packed bytes gives its slice of the dequantized tensor (K slices
that start and end inside a group of 32 too), and a checkpoint with MXFP4 experts reads as the
model whose experts are their dequantized values; controls: the nibble order and the scale bias."""
import pytest
import torch
from safetensors.torch import load_file, save_file

from specdec_fast.runners.checkpoint_mxfp4 import dequantize, read_mxfp4
from specdec_fast.runners.sharding import LlamaShardPlan, Slice, shards_from_safetensors

from .checkpoint_checks import assert_reads_as_the_model


def _packed(experts, rows, groups, seed):
    gen = torch.Generator().manual_seed(seed)
    blocks = torch.randint(0, 256, (experts, rows, groups, 16), generator=gen, dtype=torch.int32).to(torch.uint8)
    scales = torch.randint(118, 131, (experts, rows, groups), generator=gen, dtype=torch.int32).to(torch.uint8)
    return blocks, scales


def _transformers(blocks, scales, dtype=torch.bfloat16):
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors

    return convert_moe_packed_tensors(blocks.clone(), scales.clone(), dtype=dtype)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_dequantize_equals_transformers(dtype):
    blocks, scales = _packed(3, 10, 4, 0)
    ours = dequantize(blocks, scales, dtype)
    assert ours.shape == (3, 128, 10) and ours.dtype == dtype
    assert torch.equal(ours, _transformers(blocks, scales, dtype))


def test_controls_the_nibble_order_and_the_scale_bias(monkeypatch):
    blocks, scales = _packed(2, 6, 2, 1)
    want = _transformers(blocks, scales)
    swapped = ((blocks & 0x0F) << 4) | (blocks >> 4)
    assert not torch.equal(dequantize(swapped, scales), want)
    assert not torch.equal(dequantize(blocks, scales + 1), want)


@pytest.mark.parametrize("world", [2, 4])
def test_slices_of_the_packed_bytes(world):
    """R slices (gate_up's columns) and K slices (down's rows: 64 / 4 = 16, half a group) of the
    dequantized [E, K, R]."""
    blocks, scales = _packed(3, 12, 2, world)
    whole = dequantize(blocks, scales)  # [3, 64, 12]
    for rank in range(world):
        for dim, size in ((2, 12), (1, 64)):
            width = size // world
            part = Slice(dim, rank * width, (rank + 1) * width)
            got = read_mxfp4(blocks, scales, part)
            assert got.is_contiguous() and torch.equal(got, whole.narrow(dim, part.start, width)), (rank, dim)
    assert torch.equal(read_mxfp4(blocks, scales, None), whole)


def _tiny_gpt_oss():
    import transformers as tf

    torch.manual_seed(0)
    config = tf.GptOssConfig(vocab_size=96, hidden_size=64, intermediate_size=64, num_hidden_layers=2,
                             num_attention_heads=4, num_key_value_heads=2, head_dim=16, num_local_experts=4,
                             num_experts_per_tok=2, sliding_window=8, max_position_embeddings=128,
                             rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
    return tf.AutoModelForCausalLM.from_config(config, attn_implementation="eager").float().eval()


@pytest.mark.parametrize("world", [2, 4])
def test_an_mxfp4_checkpoint_reads_as_its_dequantized_model(world, tmp_path):
    """The published layout: each layer's experts as gate_up_proj / down_proj _blocks + _scales
    (stored [E, R, K]); every rank's shards equal those of the model holding the dequantized
    experts (world 4: down's K slices of 16 inside groups of 32)."""
    model = _tiny_gpt_oss()
    model.save_pretrained(tmp_path)
    state = load_file(tmp_path / "model.safetensors")
    for layer in range(2):
        for proj, (rows, k) in {"gate_up_proj": (128, 64), "down_proj": (64, 64)}.items():
            name = f"model.layers.{layer}.mlp.experts.{proj}"
            blocks, scales = _packed(4, rows, k // 32, 10 * layer + rows)
            del state[name]
            state[name + "_blocks"], state[name + "_scales"] = blocks, scales
            with torch.no_grad():
                getattr(model.model.layers[layer].mlp.experts, proj).copy_(_transformers(blocks, scales).float())
    save_file(state, tmp_path / "model.safetensors", metadata={"format": "pt"})
    for rank in range(world):
        assert_reads_as_the_model(tmp_path, model, world, rank, dtype=torch.float32)


def test_blocks_without_scales_are_refused(tmp_path):
    model = _tiny_gpt_oss()
    model.save_pretrained(tmp_path)
    state = load_file(tmp_path / "model.safetensors")
    name = "model.layers.0.mlp.experts.down_proj"
    state[name + "_blocks"] = _packed(4, 64, 2, 0)[0]
    del state[name]
    save_file(state, tmp_path / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(ValueError, match="down_proj_blocks but no .*down_proj_scales"):
        shards_from_safetensors(str(tmp_path), LlamaShardPlan.for_config(model.config, 2, 0))

