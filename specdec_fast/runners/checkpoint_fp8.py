"""Block-quantized FP8 weights (DeepSeek-V3 / R1, MiniMax-M2, Qwen3-*-FP8, GLM-4.5-FP8 as published:
transformers' "fp8" quant_method) read by a tensor-parallel rank (runners/sharding.py
shards_from_safetensors): only this rank's rows or columns of the FP8 bytes and the scale blocks that
cover them are read, then dequantized.

Format: <name> [R, C] float8_e4m3fn and <name>_scale_inv [ceil(R / bm), ceil(C / bn)] float32 (bm x bn:
the config's quantization_config.weight_block_size, 128 x 128 as published), value[r, c] =
float(<name>[r, c]) * <name>_scale_inv[r // bm, c // bn], in float32, then cast to the model dtype --
transformers' own dequantization (FineGrainedFP8's, which CPU loading and dequantize=True run).

The runners multiply in the model dtype, so a dequantized checkpoint takes twice the FP8 bytes (bf16):
DeepSeek-V3's 671B would not fit 8 H200s that way; MiniMax-M2's 230B or Qwen3-235B's do.
"""
import math

import torch

SCALE_SUFFIX = "_scale_inv"
FP8_DTYPES = tuple(getattr(torch, name) for name in ("float8_e4m3fn", "float8_e5m2") if hasattr(torch, name))


def dequantize_fp8(weight: torch.Tensor, scales: torch.Tensor, block: tuple, origin: tuple = (0, 0),
                   dtype=torch.bfloat16) -> torch.Tensor:
    """weight [r, c] (FP8: a piece of a tensor starting at row / column ``origin``), scales [sr, sc] (the
    scale blocks from block row origin[0] // bm and column origin[1] // bn on) -> [r, c] in dtype."""
    (bm, bn), (r0, c0) = block, origin
    rows = (torch.arange(weight.shape[0], device=weight.device) + r0) // bm - r0 // bm
    cols = (torch.arange(weight.shape[1], device=weight.device) + c0) // bn - c0 // bn
    factor = scales.float()[rows][:, cols]
    return (weight.float() * factor).to(dtype)


def read_fp8(weight, scales, part, block: tuple, dtype=None) -> torch.Tensor:
    """One FP8 tensor: weight / scales (safetensors slices, get_slice, or tensors) -> this rank's part
    (sharding.Slice along dim 0 or 1, a tuple of them along one dim: concatenated; None: whole),
    dequantized to dtype (None: bfloat16), contiguous."""
    dtype = dtype or torch.bfloat16
    if part is None:
        return dequantize_fp8(weight[:], scales[:], block, dtype=dtype)
    pieces = []
    for piece in part if isinstance(part, tuple) else (part,):
        if piece.dim not in (0, 1):
            raise ValueError(f"an FP8 weight is sliced along its rows (0) or columns (1), got {piece}")
        size = block[piece.dim]
        first, last = piece.start // size, math.ceil(piece.stop / size)
        if piece.dim == 0:
            w, s, origin = weight[piece.start:piece.stop], scales[first:last], (piece.start, 0)
        else:
            w, s, origin = weight[:, piece.start:piece.stop], scales[:, first:last], (0, piece.start)
        pieces.append(dequantize_fp8(w, s, block, origin, dtype))
    return (pieces[0] if len(pieces) == 1 else torch.cat(pieces, dim=part[0].dim)).contiguous()
