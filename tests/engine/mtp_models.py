"""A tiny GLM-4.5 (glm4_moe) or DeepSeek-V3 (deepseek_v3: an MLA layer) checkpoint with an MTP layer
(model.layers.{L}.*, as GLM-4.x and DeepSeek-V3 ship it), written to a directory and loaded from it:
transformers' MtpModel reads the layer from the target's checkpoint (config.name_or_path)."""
import os

import torch

from .models import VOCAB, _config

LAYERS = 2


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
    config.num_nextn_predict_layers = 1
    config.initializer_range = init_std  # as models.make_model: spread logits (fewer near-ties)
    model = tf.AutoModelForCausalLM.from_config(config).eval()
    model.save_pretrained(directory)
    path = os.path.join(directory, "model.safetensors")
    weights = load_file(path)
    hidden, prefix = config.hidden_size, f"model.layers.{LAYERS}."
    gen = torch.Generator().manual_seed(seed + 1)
    for name, tensor in list(weights.items()):  # the block: the last layer's names (a MoE layer), new values
        if name.startswith(f"model.layers.{LAYERS - 1}."):
            new = prefix + name[len(f"model.layers.{LAYERS - 1}."):]
            if name.endswith("norm.weight"):
                weights[new] = 1 + 0.1 * torch.randn(tensor.shape, generator=gen)
            elif name.endswith("e_score_correction_bias"):
                weights[new] = 0.1 * torch.randn(tensor.shape, generator=gen)
            else:
                weights[new] = std * torch.randn(tensor.shape, generator=gen)
    for norm in ("enorm", "hnorm", "shared_head.norm"):
        weights[f"{prefix}{norm}.weight"] = 1 + 0.1 * torch.randn(hidden, generator=gen)
    eh_proj = 0.05 * torch.randn(hidden, 2 * hidden, generator=gen)
    eh_proj[:, :hidden] += copy * torch.eye(hidden)  # cat(enorm(embedding), hnorm(h)): the embedding passes
    weights[f"{prefix}eh_proj.weight"] = eh_proj
    save_file(weights, path, metadata={"format": "pt"})
    target = tf.AutoModelForCausalLM.from_pretrained(directory).eval()
    # transformers finds MTP weights by the class's patterns, which name the real layers (GLM-4.5's 46 / 92,
    # DeepSeek-V3's 61)
    target._keys_to_ignore_on_load_unexpected = [rf"model\.layers\.{LAYERS}\..*"]
    return target
