"""GPT-OSS's MXFP4 expert tensors (openai/gpt-oss-20b and -120b as published) read by a
tensor-parallel rank (runners/sharding.py shards_from_safetensors): only this rank's slice of the
packed bytes is read, then dequantized to the layout of the bf16 checkpoints and of transformers'
module (gate_up_proj [E, H, 2I], down_proj [E, I, H]), which runners/_moe.py reads.

Format (OCP Microscaling MXFP4, as transformers' integrations/mxfp4.py reads it), for a tensor
stored as [E, R, K] (gate_up_proj: R = 2I interleaved gate / up, K = H; down_proj: R = H, K = I):
    <name>_blocks [E, R, K / 32, 16] uint8   32 E2M1 values per group of K, two a byte, low nibble first
    <name>_scales [E, R, K / 32] uint8       E8M0: the group's factor is 2^(scale - 127)
    value [e, r, 32 g + 2 j + h] = E2M1[nibble h of blocks[e, r, g, j]] * 2^(scales[e, r, g] - 127)
and the dequantized [E, R, K] is transposed to [E, K, R]. Every value is exact in bfloat16 (two
significant bits), so the dequantization has no rounding: it equals transformers' own.

A rank's slice (sharding_moe.py) is of the dequantized [E, K, R]: of R (gate_up's columns: rows of
the blocks, any range) or of K (down's rows: groups of 32 of the blocks; a range that does not
start or end on a group, I / N = 720 at GPT-OSS's I = 2880 over 4 ranks, reads the groups that hold
it and keeps its part).
"""
import torch

SUFFIXES = ("_blocks", "_scales")
GROUP = 32  # values per scale
E2M1 = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)


def dequantize(blocks: torch.Tensor, scales: torch.Tensor, dtype=torch.bfloat16) -> torch.Tensor:
    """blocks [E, R, G, 16] uint8, scales [E, R, G] uint8 -> [E, G * 32, R] in dtype (one expert at
    a time: a float32 [R, K] of one expert is the most held at once)."""
    experts, rows, groups, width = blocks.shape
    if width * 2 != GROUP or tuple(scales.shape) != (experts, rows, groups):
        raise ValueError(f"MXFP4 blocks {tuple(blocks.shape)} and scales {tuple(scales.shape)} are not "
                         f"[E, R, G, 16] and [E, R, G]")
    lut = torch.tensor(E2M1, dtype=torch.float32, device=blocks.device)
    out = torch.empty(experts, groups * GROUP, rows, dtype=dtype, device=blocks.device)
    for e in range(experts):
        packed = blocks[e].to(torch.int64)
        values = torch.stack((lut[packed & 0x0F], lut[packed >> 4]), dim=-1).reshape(rows, groups, GROUP)
        values = torch.ldexp(values, scales[e].to(torch.int32)[..., None] - 127)
        out[e] = values.reshape(rows, groups * GROUP).t()
    return out


def read_mxfp4(blocks, scales, part, dtype=None) -> torch.Tensor:
    """One MXFP4 tensor: blocks / scales (safetensors slices, get_slice, or tensors) -> this rank's
    part (sharding.Slice of the dequantized [E, K, R]: dim 1 K, dim 2 R; None: whole), dequantized
    to dtype (None: bfloat16, as transformers dequantizes), contiguous."""
    dtype = dtype or torch.bfloat16
    if part is None:
        return dequantize(blocks[:], scales[:], dtype)
    if isinstance(part, tuple) or part.dim not in (1, 2):
        raise ValueError(f"an MXFP4 tensor is sliced along K (dim 1) or R (dim 2) of [E, K, R], got {part}")
    if part.dim == 2:
        return dequantize(blocks[:, part.start:part.stop], scales[:, part.start:part.stop], dtype)
    first, last = part.start // GROUP, -(-part.stop // GROUP)
    out = dequantize(blocks[:, :, first:last], scales[:, :, first:last], dtype)
    return out.narrow(1, part.start - first * GROUP, part.stop - part.start).contiguous()
