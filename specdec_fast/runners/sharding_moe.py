"""The mixture-of-experts part of the Megatron layout (runners/sharding.py): which slice of each
expert tensor a rank holds, and the checkpoints' per-expert tensors gathered into the 3-D
tensors transformers' MoE blocks hold (the names runners/_moe.py reads).

N ranks, rank r, i = I / N (I: an expert's width, moe_intermediate_size where the config has
one, else intermediate_size), every expert split alike:
    router (mlp.gate / mlp.router, + bias)                      replicated: every rank routes alike
    gate and up rows of every expert                            [r i, (r+1) i) of each
    down columns of every expert                                the matching [r i, (r+1) i)
    GPT-OSS's gate_up bias (interleaved like its columns)       the matching 2 i
    GPT-OSS's down bias                                         replicated; added by rank 0 only
    Llama 4's experts ([E, H, 2I] gate | up columns, [E, I, H])  this rank's gate and up columns, down rows
    Nemotron-H's ungated experts (up [E, I, H], down [E, H, I]) this rank's up rows, down columns; their latent
                                                                projections (fc1 / fc2_latent_proj) replicated
    Qwen2-MoE's shared expert, GLM-4.5's shared experts,        as a dense MLP (its own width / N;
    Llama 4's shared expert, HunYuan's shared_mlp                Llama 4's / HunYuan's an expert's width);
                                                                Qwen's gate (one row) replicated; ERNIE 4.5's
                                                                down bias whole, added by rank 0 only
    GLM-4.5's router correction bias (AFMoE's expert_bias)      replicated
So each rank's block output is a partial sum over its slice of every chosen expert's width
(the combine weights scale each term alike), summed by the all-reduce that ends the MLP, as a
dense layer's down product is.

Checkpoint tensors, by layout (transformers 5.24 save_pretrained, read here):
    Qwen2-MoE / Qwen3-MoE / GLM-4.5   mlp.experts.{e}.gate_proj / up_proj / down_proj.weight   per expert
    Mixtral                 block_sparse_moe.experts.{e}.w1 (gate) / w3 (up) / w2 (down).weight,
                            block_sparse_moe.gate.weight                              per expert
    GPT-OSS (bf16)          mlp.experts.gate_up_proj [E, H, 2I] (gate / up interleaved columns),
                            down_proj [E, I, H], their _bias, mlp.router.weight / bias
    a loaded model          mlp.experts.gate_up_proj [E, 2I, H] (gate rows, then up rows),
                            down_proj [E, H, I] (Mixtral / Qwen), GPT-OSS's as stored
gather_experts() turns the per-expert ones into the 3-D names after the slices are read.
"""
import re

import torch

from ._moe import EXPERTS_OF_INTERMEDIATE_SIZE, MOE_FAMILIES, SHARED_AS_WIDE, MoE

# a checkpoint's per-expert projection: (layer prefix, block name, expert, projection)
PER_EXPERT = re.compile(r"^(.*\.)(mlp|block_sparse_moe)\.experts\.(\d+)\.(gate_proj|up_proj|down_proj|w1|w2|w3)\.weight$")
LAYER = re.compile(r"^model\.layers\.(\d+)\.")  # a decoder layer's names (and prefix): its index
GATE, UP, DOWN = ("gate_proj", "w1"), ("up_proj", "w3"), ("down_proj", "w2")
# checkpoint name -> module name: Mixtral's router; EXAONE MoE's router bias (stored beside the router)
RENAMED = (("block_sparse_moe.gate.weight", "mlp.gate.weight"),
           ("mlp.e_score_correction_bias", "mlp.gate.e_score_correction_bias"),
           ("mlp.gate.moe_statics.e_score_correction_bias", "mlp.gate.e_score_correction_bias"),  # ERNIE 4.5's
           ("mlp.gate.wg.weight", "mlp.gate.weight"),  # HunYuan's router, held as gate.wg
           # AFMoE's router (router.gate) and its correction bias (the block's expert_bias)
           ("mlp.router.gate.weight", "mlp.gate.weight"), ("mlp.expert_bias", "mlp.gate.e_score_correction_bias"))


def moe_sizes(config) -> tuple:
    """(layout "swiglu" / "swiglu_t" / "gpt_oss" or None for a dense family, experts' width I, the shared
    MLP's width or 0)."""
    family = MOE_FAMILIES.get(getattr(config, "model_type", None))
    if family is None or (config.model_type == "nemotron_h" and "moe" not in (config.layers_block_type or ())) or (
            config.model_type == "granitemoehybrid" and not getattr(config, "num_local_experts", 0)):
        return None, 0, 0  # (a dense Nemotron-H's or Granite 4.0's config carries its family's MoE sizes)
    # HunYuan: transformers' experts are intermediate_size wide (Hunyuan-A13B's config also lists moe_intermediate_size
    # per layer, [3072] * 32, which transformers does not read)
    width = (config.intermediate_size if config.model_type in EXPERTS_OF_INTERMEDIATE_SIZE else
             getattr(config, "moe_intermediate_size", None) or config.intermediate_size)
    # Qwen2-MoE's; Nemotron-H's (one ungated shared MLP)
    shared = getattr(config, "shared_expert_intermediate_size", 0) or getattr(
        config, "moe_shared_expert_intermediate_size", 0) or 0
    count = (getattr(config, "n_shared_experts", None) or getattr(config, "num_shared_experts", None)
             or getattr(config, "moe_num_shared_experts", None))  # ERNIE 4.5's name
    if not shared and count:  # GLM-4.5, Solar Open, EXAONE MoE: n shared experts' width as one MLP
        shared = width * int(count)
    if config.model_type in SHARED_AS_WIDE:  # Llama 4, HunYuan: one shared MLP as wide as a routed expert
        shared = width
    return family[3], int(width), int(shared)


def moe_slice_of(plan, name: str, make_slice):
    """(True, this rank's slice of the MoE tensor ``name``: a Slice, a tuple of Slices along one
    dim (concatenated), or None for replicated) or (False, None) for a tensor that is not a MoE
    expert's. make_slice: sharding.Slice."""
    if plan.moe_layout is None:
        return False, None
    i, r = plan.expert_intermediate // plan.world, plan.rank
    own = (r * i, (r + 1) * i)
    match = PER_EXPERT.match(name)
    if match:
        return True, make_slice(1 if match.group(4) in DOWN else 0, *own)
    if (".shared_expert." in name or ".shared_experts." in name or ".shared_mlp." in name) \
            and not name.endswith("shared_expert_gate.weight"):
        if name.endswith("down_proj.bias"):  # ERNIE 4.5's: whole, added by rank 0 only (moe_layer_params)
            return True, None
        s = plan.shared_intermediate // plan.world
        rows = (r * s, (r + 1) * s)
        return True, make_slice(1, *rows) if name.endswith("down_proj.weight") else make_slice(0, *rows)
    gpt_oss, transposed = plan.moe_layout == "gpt_oss", plan.moe_layout in ("gpt_oss", "swiglu_t")
    if name.endswith("mlp.experts.gate_up_proj"):
        if gpt_oss:  # [E, H, 2I], gate / up interleaved: outputs [r i, (r+1) i) are columns [2 r i, 2 (r+1) i)
            return True, make_slice(2, 2 * own[0], 2 * own[1])
        inter, dim = plan.expert_intermediate, 2 if transposed else 1  # [E, 2I, H] (Llama 4: [E, H, 2I]) halves
        return True, (make_slice(dim, *own), make_slice(dim, inter + own[0], inter + own[1]))
    if name.endswith("mlp.experts.up_proj"):  # Nemotron-H's ungated experts: up [E, I, H] rows
        return True, make_slice(1, *own)
    if name.endswith("mlp.experts.gate_up_proj_bias"):  # GPT-OSS [E, 2I], interleaved
        return True, make_slice(1, 2 * own[0], 2 * own[1])
    if name.endswith("mlp.experts.down_proj"):  # GPT-OSS / Llama 4 [E, I, H] rows; Mixtral / Qwen [E, H, I] columns
        return True, make_slice(1 if transposed else 2, *own)
    return False, None


def gather_experts(shards: dict) -> dict:
    """The per-expert checkpoint tensors of ``shards`` (name -> this rank's slice) replaced by the
    3-D tensors of transformers' blocks: prefix + mlp.experts.gate_up_proj [E, 2i, H] (each
    expert's gate rows, then its up rows) and down_proj [E, H, i]; the names transformers renames
    on loading renamed as it does (RENAMED). Each expert's slices are freed as they are stacked."""
    layers: dict = {}
    for name in list(shards):
        match = PER_EXPERT.match(name)
        if match:
            prefix, _, expert, proj = match.groups()
            layers.setdefault(prefix, {}).setdefault(int(expert), {})[proj] = name
    for prefix, experts in layers.items():
        order = sorted(experts)
        if order != list(range(len(order))):
            raise ValueError(f"{prefix}: the checkpoint's experts are not 0..{len(order) - 1} (found {order[:8]}...)")

        def pick(names, projs):
            return shards.pop(next(names[p] for p in projs if p in names))

        if all(not any(p in experts[e] for p in GATE) for e in order):  # ungated experts (Nemotron-H): up alone
            shards[prefix + "mlp.experts.up_proj"] = torch.stack([pick(experts[e], UP) for e in order])
        else:
            gate_up = [torch.cat([pick(experts[e], GATE), pick(experts[e], UP)]) for e in order]
            shards[prefix + "mlp.experts.gate_up_proj"] = torch.stack(gate_up)
            del gate_up
        shards[prefix + "mlp.experts.down_proj"] = torch.stack([pick(experts[e], DOWN) for e in order])
    for old, new in RENAMED:  # transformers' own renames on loading (conversion_mapping.py)
        for name in [n for n in shards if n.endswith(old)]:
            shards[name[: -len(old)] + new] = shards.pop(name)
    return shards


def layer_moe(shards: dict, prefix: str, first_rank: bool, config, kernels: str):
    """The MoE (runners/_moe.MoE) of the layer at ``prefix`` (model.layers.{i}.) from this rank's shards, or
    None for a dense layer; the layer's index from the prefix (HunYuan's top-k per layer)."""
    params = moe_layer_params(shards, prefix, first_rank)
    if params is None:
        return None
    index = LAYER.match(prefix)
    return MoE(params, config, kernels, layer=int(index.group(1)) if index else None)


def layer_mlp(shards: dict, prefix: str, first_rank: bool, config, kernels: str) -> tuple:
    """The feed-forward of the layer at ``prefix`` from this rank's shards: (its MoE, None, None) for a MoE layer, else
    (None, the dense MLP's gate / up / down (weight, bias) pairs -- gate / up by this rank's columns, down by its rows,
    down's bias on rank 0 only: added once to the sum --, ACT2FN[config.hidden_act]). The runners' moe_or_mlp reads
    either (runners/_moe.py)."""
    moe = layer_moe(shards, prefix, first_rank, config, kernels)
    if moe is not None:
        return moe, None, None
    from transformers.activations import ACT2FN

    def pair(name: str, bias: bool = True):
        return shards.get(f"{prefix}mlp.{name}_proj.weight"), shards.get(f"{prefix}mlp.{name}_proj.bias") if bias else None

    return None, (pair("gate"), pair("up"), pair("down", first_rank)), ACT2FN[config.hidden_act]


def moe_layer_params(shards: dict, prefix: str, first_rank: bool) -> dict | None:
    """A layer's MoE tensors by their names under its block (runners/_moe.MoE's), or None for a
    dense layer. GPT-OSS's down bias on rank 0 only (added once to the sum)."""
    block = prefix + "mlp."
    if block + "experts.gate_up_proj" not in shards and block + "experts.up_proj" not in shards:  # (ungated: Nemotron-H)
        return None
    params = {name[len(block):]: tensor for name, tensor in shards.items() if name.startswith(block)}
    if not first_rank:  # the biases added after a row-parallel product: once, by rank 0
        params.pop("experts.down_proj_bias", None)
        for prefix in ("shared_expert", "shared_experts"):
            params.pop(f"{prefix}.down_proj.bias", None)
    return params
