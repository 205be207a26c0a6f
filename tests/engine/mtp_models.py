"""A tiny GLM-4.5 (glm4_moe) or DeepSeek-V3 (deepseek_v3: an MLA layer) checkpoint with an MTP layer
(model.layers.{L}.*, as GLM-4.x and DeepSeek-V3 ship it), or a Qwen3-Next / Qwen3.5 one (qwen3_next,
qwen3_5_text: mtp.*, as Qwen ships it, under vLLM's qwen3_next_mtp names), written to a directory and
loaded from it: transformers' MtpModel (this package's reader for Qwen's) reads the layer from the
target's checkpoint (config.name_or_path)."""
import os

import torch

from .models import VOCAB, _config

LAYERS = 2
QWEN_KINDS = ("qwen3_next", "qwen3_5_text", "qwen3_5_moe_text")  # their MTP layer under Qwen's names (mtp.*)


def glm_with_mtp(directory, *, vocab: int = VOCAB, seed: int = 0, std: float = 0.05, copy: float = 1.0,
                 init_std: float = 0.15, kind: str = "glm4_moe"):
    """(target, directory): a ``kind`` target of LAYERS layers (tied embeddings) whose checkpoint
    holds one MTP layer. The layer's eh_proj passes the token's normed embedding (plus noise) and
    its block's weights are small random ones, so post_norm(x) is near the next token's embedding
    and the tied LM head drafts "the same token again": greedy text of a random model repeats
    tokens, so drafts get accepted, while every weight of the block still shapes the logits."""
    import transformers as tf
    from safetensors.torch import load_file, save_file

    torch.manual_seed(seed)
    config = _config(kind, vocab, LAYERS)
    config.tie_word_embeddings = True
    qwen = kind in QWEN_KINDS
    if qwen:
        config.mtp_num_hidden_layers = 1
    else:
        config.num_nextn_predict_layers = 1
    config.initializer_range = init_std  # as models.make_model: spread logits (fewer near-ties)
    model = tf.AutoModelForCausalLM.from_config(config).eval()
    model.save_pretrained(directory)
    path = os.path.join(directory, "model.safetensors")
    weights = load_file(path)
    hidden = config.hidden_size
    # GLM-4.5's names, or Qwen's (its block mtp.layers.0, its own tensors MTP_OWN_NAMES' first names)
    prefix, own = (("mtp.layers.0.", {"enorm": "mtp.pre_fc_norm_embedding", "hnorm": "mtp.pre_fc_norm_hidden",
                                      "shared_head.norm": "mtp.norm", "eh_proj": "mtp.fc"}) if qwen else
                   (f"model.layers.{LAYERS}.", {n: f"model.layers.{LAYERS}.{n}" for n in
                                               ("enorm", "hnorm", "shared_head.norm", "eh_proj")}))
    unit = 0.0 if qwen else 1.0  # a norm's unit weight: Qwen's norms scale by 1 + w
    gen = torch.Generator().manual_seed(seed + 1)
    for name, tensor in list(weights.items()):  # the block: the last layer's names (a MoE layer), new values
        if name.startswith(f"model.layers.{LAYERS - 1}."):
            new = prefix + name[len(f"model.layers.{LAYERS - 1}."):]
            if name.endswith("norm.weight"):
                weights[new] = unit + 0.1 * torch.randn(tensor.shape, generator=gen)
            elif name.endswith("e_score_correction_bias"):
                weights[new] = 0.1 * torch.randn(tensor.shape, generator=gen)
            else:
                weights[new] = std * torch.randn(tensor.shape, generator=gen)
    for norm in ("enorm", "hnorm", "shared_head.norm"):
        weights[f"{own[norm]}.weight"] = unit + 0.1 * torch.randn(hidden, generator=gen)
    eh_proj = 0.05 * torch.randn(hidden, 2 * hidden, generator=gen)
    eh_proj[:, :hidden] += copy * torch.eye(hidden)  # cat(enorm(embedding), hnorm(h)): the embedding passes
    weights[f"{own['eh_proj']}.weight"] = eh_proj
    save_file(weights, path, metadata={"format": "pt"})
    target = tf.AutoModelForCausalLM.from_pretrained(directory).eval()
    if not qwen:  # transformers finds MTP weights by the class's patterns, which name the real layers (GLM-4.5's
        # 46 / 92, DeepSeek-V3's 61; Qwen's ^mtp.* holds)
        target._keys_to_ignore_on_load_unexpected = [rf"model\.layers\.{LAYERS}\..*"]
    return target


def mtp_reference(target):
    """The reference MTP model of ``target``: transformers' MtpModel (GLM-4.5, DeepSeek-V3), or for Qwen's (which
    transformers does not run) QwenMtpReference."""
    if target.config.model_type in QWEN_KINDS:
        from specdec_fast.heads.mtp_checkpoint import CheckpointMtpModel

        class QwenMtpReference(CheckpointMtpModel):
            """The layer as this package reads it (transformers' MtpLayer around transformers' own decoder layer:
            SDPA, causal without a mask) with the two methods of transformers' MtpModel the tests call."""

            # the target's embeddings read on the layer's device: on_device moves a copy of this module, not the
            # target it closes over
            def forward_layer(self, index, hidden, position_ids, cache, input_ids):
                embeds = torch.nn.functional.embedding(input_ids, target.get_input_embeddings().weight.to(hidden.device))
                rotary = self.rotary_emb(hidden, position_ids)
                return self.layers[index](embeds, hidden, rotary, None, position_ids, cache)

            def _project_to_logits(self, hidden):
                return torch.nn.functional.linear(hidden, target.get_output_embeddings().weight.to(hidden.device))

        return QwenMtpReference.from_checkpoint(target, target.config.name_or_path, target.device).eval()
    from transformers.modeling_layers import MtpModel

    return MtpModel.from_pretrained(target).eval()
