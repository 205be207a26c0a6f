"""Tiny random-weight causal LMs (no hub): targets and drafts aligned with them."""
import copy

import torch

VOCAB = 128


def _config(kind: str, vocab: int, layers: int):
    import transformers as tf

    common = dict(vocab_size=vocab, bos_token_id=1, eos_token_id=2, pad_token_id=0)
    if kind == "llama":
        return tf.LlamaConfig(hidden_size=48, intermediate_size=96, num_hidden_layers=layers, num_attention_heads=4,
                              num_key_value_heads=4, max_position_embeddings=256, **common)
    if kind == "qwen2":
        return tf.Qwen2Config(hidden_size=48, intermediate_size=96, num_hidden_layers=layers, num_attention_heads=4,
                              num_key_value_heads=2, max_position_embeddings=256, **common)
    if kind == "gpt2":
        return tf.GPT2Config(n_embd=48, n_layer=layers, n_head=4, n_positions=256, **common)
    raise ValueError(kind)


def make_model(kind: str = "llama", *, vocab: int = VOCAB, layers: int = 2, seed: int = 0, attn: str = "sdpa",
               init_std: float = 0.15):
    """A random model in fp32, eval mode. A larger init_std spreads the logits (fewer near-ties)."""
    import transformers as tf

    torch.manual_seed(seed)
    config = _config(kind, vocab, layers)
    config.initializer_range = init_std
    config._attn_implementation = attn
    model = tf.AutoModelForCausalLM.from_config(config, attn_implementation=attn).float().eval()
    return model


def make_draft(target, *, noise: float = 0.3, seed: int = 1):
    """The target with relative Gaussian noise on every weight: aligned, but not equal."""
    draft = copy.deepcopy(target)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in draft.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * p.std().nan_to_num(0.0) * noise)
    return draft


def left_padded_prompts(lengths, *, vocab: int = VOCAB, pad: int = 0, seed: int = 0):
    """input_ids, attention_mask [B, max(lengths)] with left padding; tokens in [3, vocab)."""
    gen = torch.Generator().manual_seed(seed)
    width = max(lengths)
    ids = torch.full((len(lengths), width), pad, dtype=torch.long)
    mask = torch.zeros((len(lengths), width), dtype=torch.long)
    for row, n in enumerate(lengths):
        ids[row, width - n :] = torch.randint(3, vocab, (n,), generator=gen)
        mask[row, width - n :] = 1
    return ids, mask
