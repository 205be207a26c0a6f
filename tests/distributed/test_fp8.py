"""Block-quantized FP8 weights read by a tensor-parallel rank (runners/checkpoint_fp8.py): the
dequantization is float(w) * its block's scale, each rank's slice of the FP8 bytes and scale blocks gives
its slice of the dequantized weight (rows and columns that start and end inside a block, tuples of
parts), and a checkpoint whose projections are FP8 (DeepSeek-V3's layout: <name> float8_e4m3fn and
<name>_scale_inv, blocks from the config's weight_block_size) reads as the model holding the dequantized
values, on 2 and 4 ranks; controls: a scale block read one off, and the config's block size ignored."""
import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from specdec_fast.runners.checkpoint_fp8 import dequantize_fp8, read_fp8
from specdec_fast.runners.sharding import LlamaShardPlan, Slice, shards_from_safetensors, shards_from_state

from tests.engine.models import make_model
from .checkpoint_checks import assert_reads_as_the_model

BLOCK = (16, 8)


def _quantize(weight: torch.Tensor, block=BLOCK):
    """weight [R, C] -> (FP8 [R, C], float32 scales [ceil(R / bm), ceil(C / bn)]): each block's max to 448."""
    (bm, bn), (rows, cols) = block, weight.shape
    scales = torch.zeros(-(-rows // bm), -(-cols // bn))
    for i in range(scales.shape[0]):
        for j in range(scales.shape[1]):
            scales[i, j] = weight[i * bm:(i + 1) * bm, j * bn:(j + 1) * bn].abs().max().clamp(min=1e-8) / 448
    expanded = scales.repeat_interleave(bm, 0)[:rows].repeat_interleave(bn, 1)[:, :cols]
    return (weight / expanded).to(torch.float8_e4m3fn), scales


def _reference(fp8, scales, block=BLOCK):
    (bm, bn), (rows, cols) = block, fp8.shape
    return fp8.float() * scales.repeat_interleave(bm, 0)[:rows].repeat_interleave(bn, 1)[:, :cols]


def test_dequantize_and_its_slices():
    """Every block its own scale; slices of rows / columns that cut blocks, and tuples of parts, equal the
    whole dequantized weight's slices (to the bit)."""
    fp8, scales = _quantize(torch.randn(50, 37, generator=torch.Generator().manual_seed(0)))
    whole = _reference(fp8, scales)
    assert torch.equal(dequantize_fp8(fp8, scales, BLOCK, dtype=torch.float32), whole)
    assert torch.equal(read_fp8(fp8, scales, None, BLOCK, torch.float32), whole)
    for part in (Slice(0, 5, 27), Slice(0, 16, 32), Slice(1, 3, 30), Slice(1, 8, 9),
                 (Slice(0, 0, 7), Slice(0, 20, 41)), (Slice(1, 2, 5), Slice(1, 33, 37))):
        parts = part if isinstance(part, tuple) else (part,)
        expected = torch.cat([whole.narrow(p.dim, p.start, p.stop - p.start) for p in parts], dim=parts[0].dim)
        assert torch.equal(read_fp8(fp8, scales, part, BLOCK, torch.float32), expected), part
    assert read_fp8(fp8, scales, Slice(0, 5, 27), BLOCK).dtype == torch.bfloat16  # the default dtype


def _fp8_checkpoint(path):
    """A tiny DeepSeek-V3 (latent attention: q_b rows of 20 a head, kv_b of 24) saved with every 2-D projection
    weight of its layers -- the per-expert ones the checkpoint holds included -- as FP8 + scale blocks of
    16 x 8; -> the model holding the dequantized values."""
    model = make_model("deepseek_v3", seed=2)
    model.save_pretrained(path)
    state = load_file(path / "model.safetensors")
    quantized = [name for name, t in state.items() if name.startswith("model.layers.") and name.endswith("proj.weight")
                 and t.dim() == 2 and "norm" not in name]
    assert any("kv_b_proj" in name for name in quantized) and any("mlp.down_proj" in name for name in quantized)
    with torch.no_grad():
        params = dict(model.named_parameters())
        for name in quantized:
            fp8, scales = _quantize(state[name].float())
            state[name], state[name + "_scale_inv"] = fp8, scales
            values = _reference(fp8, scales)
            if ".experts." in name:  # the checkpoint's per-expert weights: the module's 3-D tensors' rows
                prefix, rest = name.split(".experts.")
                expert, proj = int(rest.split(".")[0]), rest.split(".")[1]
                if proj == "down_proj":
                    params[prefix + ".experts.down_proj"][expert].copy_(values)
                else:
                    rows = params[prefix + ".experts.gate_up_proj"][expert]
                    half = rows.shape[0] // 2
                    (rows[:half] if proj == "gate_proj" else rows[half:]).copy_(values)
            else:
                params[name].copy_(values)
    save_file(state, path / "model.safetensors", metadata={"format": "pt"})
    config = json.loads((path / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "fp8", "weight_block_size": list(BLOCK)}
    (path / "config.json").write_text(json.dumps(config))
    return model


@pytest.mark.parametrize("world", [2, 4])
def test_an_fp8_checkpoint_reads_as_its_dequantized_model(world, tmp_path):
    """Every rank's shards (heads of q_b / kv_b / o_proj cut inside blocks; the latent's projections whole; the
    dense MLP's columns) equal those of the model holding the dequantized weights."""
    model = _fp8_checkpoint(tmp_path)
    for rank in range(world):
        assert_reads_as_the_model(tmp_path, model, world, rank, dtype=torch.float32)


def test_controls_the_scale_blocks(tmp_path, monkeypatch):
    """A reader that takes each row block's neighbour's scales, or ignores the config's block size (128 x 128),
    reads other values."""
    import specdec_fast.runners.sharding as sharding

    model = _fp8_checkpoint(tmp_path)
    plan = LlamaShardPlan.for_config(model.config, 2, 1)
    expected = shards_from_state(model.state_dict(), plan)
    name = "model.layers.0.self_attn.q_b_proj.weight"
    monkeypatch.setattr(sharding, "_fp8_block", lambda path: (128, 128))
    assert not torch.equal(shards_from_safetensors(str(tmp_path), plan, dtype=torch.float32)[name], expected[name])
    monkeypatch.undo()
    real = sharding.read_fp8
    monkeypatch.setattr(sharding, "read_fp8", lambda w, s, part, block, dtype: real(w, torch.roll(s[:], 1, 0), part,
                                                                                   block, dtype))  # each row block's neighbour's
    assert not torch.equal(shards_from_safetensors(str(tmp_path), plan, dtype=torch.float32)[name], expected[name])
