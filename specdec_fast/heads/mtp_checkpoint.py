"""CheckpointMtpModel: an MTP layer that transformers does not load, read from the target's checkpoint
-- Qwen3-Next's and Qwen3.5's ``mtp.*`` (transformers' Qwen3Next / Qwen3_5 models drop ^mtp.* on
loading and have no MtpModel for it; vLLM's qwen3_next_mtp / qwen3_5_mtp run it).

The layer is vLLM's Qwen3NextMultiTokenPredictor with one layer:
    x0 = fc(cat(pre_fc_norm_embedding(embed(x_{t+1})), pre_fc_norm_hidden(h_t)))   [H]
    x  = a gated full-attention decoder layer of the target's family over x0 (mtp.layers.0)
    m  = norm(x); logits = the target's lm_head(m)
which is transformers' MtpLayer (transformers.modeling_layers) with enorm = pre_fc_norm_embedding,
hnorm = pre_fc_norm_hidden, eh_proj = fc, mtp_block = the decoder layer and post_norm = norm: this module
builds that MtpLayer around the target's own decoder layer class and norm class (Qwen3NextRMSNorm's
x (1 + w)) and fills it from the checkpoint, read by the names runners/sharding.py gives the layer
(layout_name: the tensor-parallel ranks read their slices under the same names). What MtpHead reads of
transformers' MtpModel is here: layers (the one MtpLayer), config (the block's: heads/mtp.mtp_block_config),
rotary_emb (the target's, not a child module), use_shared_post_norm.
"""
import torch
from torch import nn

from .mtp import mtp_block_config

# the layer's own tensors under sharding.py's MTP names (model.layers.{L}.<name>) -> transformers' MtpLayer's
_OWN = (("enorm.", "enorm."), ("hnorm.", "hnorm."), ("eh_proj.", "eh_proj."), ("shared_head.norm.", "post_norm."))


def _layer_state(shards: dict, prefix: str) -> dict:
    """model.layers.{L}.* (sharding.mtp_layer_shards' names) -> the MtpLayer's state_dict names: its own
    tensors (_OWN), and mtp_block.* for the decoder block's."""
    state = {}
    for name, tensor in shards.items():
        local = name[len(prefix):]
        own = next((mine + local[len(theirs):] for theirs, mine in _OWN if local.startswith(theirs)), None)
        state[own if own is not None else "mtp_block." + local] = tensor
    return state


class CheckpointMtpModel(nn.Module):
    """The target's MTP layer read from its checkpoint (module docstring); build it with from_checkpoint."""

    use_shared_post_norm = False

    def __init__(self, layer: nn.Module, config, rotary):
        super().__init__()
        self.config = config
        self.layers = nn.ModuleList([layer])
        self.__dict__["rotary_emb"] = rotary  # the target's (not this module's child: not copied, not saved)

    @classmethod
    def from_checkpoint(cls, target, path, device) -> "CheckpointMtpModel":
        """The MTP layer of ``target`` (a Qwen3-Next / Qwen3.5 causal LM) read from the checkpoint directory
        ``path`` onto ``device`` in the target's dtype: built on the meta device, then given the checkpoint's
        tensors (no second copy); ValueError where the checkpoint has no such layer or the tensors do not
        fit the block transformers builds from the config."""
        from transformers.modeling_layers import MtpLayer

        from ..runners.sharding import LlamaShardPlan, mtp_layer_shards

        config = target.config
        decoder = target.get_decoder()
        last = decoder.layers[-1]
        block_config = mtp_block_config(config)
        with torch.device("meta"):
            layer = MtpLayer(block_config, type(last), type(last.input_layernorm), 0)
        plan = LlamaShardPlan.for_config(config, 1, 0)  # one rank: every tensor whole
        index = config.num_hidden_layers
        dtype = next(target.parameters()).dtype
        shards = mtp_layer_shards(path, plan, index, dtype=dtype, device=device)
        state = _layer_state(shards, f"model.layers.{index}.")
        missing, unexpected = layer.load_state_dict(state, strict=False, assign=True)
        if missing or unexpected:
            raise ValueError(f"the checkpoint's MTP layer does not fit a {type(last).__name__} built from the config: "
                             f"missing {sorted(missing)[:6]}, unexpected {sorted(unexpected)[:6]}")
        left = [name for name, t in layer.state_dict(keep_vars=True).items() if t.is_meta]
        buffers = [name for name, t in layer.named_buffers() if t.is_meta]
        if left or buffers:
            raise ValueError(f"the MTP layer has tensors the checkpoint does not give: {sorted(left + buffers)[:6]}")
        return cls(layer, block_config, decoder.rotary_emb)
