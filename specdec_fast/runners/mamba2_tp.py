"""A Mamba2 mixer of one tensor-parallel rank's heads, from its shards (runners/sharding.py's `_mamba2_slice_of`): the
layers of Nemotron-H (runners/paged_nemotron_h_tp.py), Granite 4.0-H and Bamba (runners/paged_granite_hybrid_tp.py),
Falcon-H1 (runners/paged_falcon_h1_tp.py).

Each rank scans its heads (H / N) and keeps their states; B and C of its groups (G / N), or, with fewer groups than
ranks, of the one group its heads belong to, which N / G ranks share. The gated norm normalises a group's channels: a
group of this rank's alone is normed as on one process; a shared one takes its sum of squares from every rank that
holds part of it (group_sum: one all-reduce of [T, G, 1] a layer).
"""
from types import SimpleNamespace

import torch

from .mamba2 import Mamba2


def group_sum(tp, plan):
    """The gated norm's sums of squares over a group whose channels several ranks hold (fewer groups than ranks), or
    None where each group is one rank's: this rank's sums [T, 1, 1] placed in its group's column of a [T, G, 1]
    tensor, summed over every rank by one all-reduce, its column read back."""
    groups = plan.mamba2[2]
    if groups % plan.world == 0:
        return None
    first = plan.mamba2_groups[0]

    def summed(partial: torch.Tensor) -> torch.Tensor:
        full = partial.new_zeros(*partial.shape[:-2], groups, 1)
        full[..., first:first + 1, :] = partial
        return tp.all_reduce_(full)[..., first:first + 1, :]

    return summed


def tp_mamba2(get, config, tp, plan, norm_eps: float, norm_before_gate: bool = False, **falcon) -> Mamba2:
    """A Mamba2 mixer of this rank's heads: get(name) reads its layer's "mamba.*" shards; norm_eps the gated norm's (no
    norm where the layer has none), norm_before_gate Falcon-H1's order; falcon: its ssm_in_multiplier and this rank's
    mup_vector (Mamba2's attributes of those names)."""
    heads, head_dim, groups, state = plan.mamba2
    weight = get("mamba.norm.weight")
    norm = torch.nn.Identity() if weight is None else SimpleNamespace(weight=weight, variance_epsilon=norm_eps,
                                                                       norm_before_gate=norm_before_gate)
    mixer = Mamba2(SimpleNamespace(
        in_proj=SimpleNamespace(weight=get("mamba.in_proj.weight"), bias=None),
        out_proj=SimpleNamespace(weight=get("mamba.out_proj.weight"), bias=None),
        conv1d=SimpleNamespace(weight=get("mamba.conv1d.weight"), bias=get("mamba.conv1d.bias")),
        dt_bias=get("mamba.dt_bias"), A_log=get("mamba.A_log"), D=get("mamba.D"), norm=norm,
        num_heads=heads // plan.world, head_dim=head_dim, n_groups=plan.mamba2_groups[1] - plan.mamba2_groups[0],
        ssm_state_size=state, time_step_limit=config.time_step_limit, **falcon))
    mixer.group_sum, mixer.group_width = group_sum(tp, plan), heads * head_dim // groups
    return mixer
