"""The scale benchmark's models (bench/bench_scale.py): a Llama-3-8B-shaped target with random bf16
weights built on the device (no checkpoint, no 8B randn on the CPU), a draft made of the target's
own modules, and the knob that sets their greedy agreement.

    target   LlamaForCausalLM from a LlamaConfig, constructed on the meta device, moved to the
             device uninitialised (to_empty) and filled there (normal(0, std), norms 1, RoPE
             frequencies recomputed on the device)
    draft    a second LlamaForCausalLM whose modules ARE the target's: embed_tokens, the first D
             decoder layers, the final norm, lm_head (weights shared: no copy, no extra memory)
    scale S  the target's residual writes (every layer's o_proj and down_proj) are drawn with std
             S * std. Small S: every layer adds little to the residual stream, so the draft's
             D layers + head already give nearly the target's logits; the greedy agreement
             (argmax equal, teacher forced on random tokens) falls as S grows. calibrate()
             searches log10 S for a wanted agreement. ACCEPTANCE IS SET THIS WAY: the models
             are speed stand-ins, not language models.
"""
import time

import torch

LLAMA3_8B = dict(vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                 num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=8192, rms_norm_eps=1e-5,
                 rope_theta=500000.0, tie_word_embeddings=False)
TINY = dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=512, rms_norm_eps=1e-5, rope_theta=10000.0,
            tie_word_embeddings=False)
INIT_STD = 0.02  # transformers' initializer_range for Llama


def _config(shape: dict, layers: int | None = None):
    from transformers import LlamaConfig

    shape = dict(shape)
    theta = shape.pop("rope_theta")
    if layers is not None:
        shape["num_hidden_layers"] = layers
    config = LlamaConfig(**shape, rope_parameters={"rope_type": "default", "rope_theta": theta}, bos_token_id=1,
                         eos_token_id=None, pad_token_id=0)
    config._attn_implementation = "sdpa"
    return config


def _on_meta(config, dtype):
    from transformers import LlamaForCausalLM

    with torch.device("meta"):
        model = LlamaForCausalLM(config)
    return model.to(dtype)


def _fresh_rotary(model, config, device) -> None:
    """RoPE frequencies are a computed (non-persistent) buffer: to_empty leaves it garbage."""
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    with torch.device(device):
        model.model.rotary_emb = LlamaRotaryEmbedding(config)


def build_target(shape: dict, device, *, dtype=torch.bfloat16, seed: int = 0, scale: float = 1.0):
    """A random-weight LlamaForCausalLM of ``shape`` (LLAMA3_8B / TINY) on ``device``, eval mode."""
    device = torch.device(device)
    config = _config(shape)
    model = _on_meta(config, dtype).to_empty(device=device)
    _fresh_rotary(model, config, device)
    gen = torch.Generator(device=device).manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):
                param.fill_(1.0)
            else:
                param.normal_(0.0, INIT_STD, generator=gen)
    set_residual_scale(model, scale, seed=seed)
    for name, buf in model.named_buffers():
        if not name.startswith("model.rotary_emb."):
            raise RuntimeError(f"buffer {name} was not initialised on {device}")
    model.generation_config.eos_token_id = None  # full length: every run makes max_new_tokens tokens
    model.generation_config.pad_token_id = 0
    return model.eval()


def draft_of(target, layers: int):
    """The target's embedding + first ``layers`` decoder layers + final norm + head, as its own
    LlamaForCausalLM; every module is the target's (no copy)."""
    config = _config({**_shape_of(target.config), "num_hidden_layers": layers})
    draft = _on_meta(config, target.dtype)
    draft.model.embed_tokens = target.model.embed_tokens
    draft.model.layers = torch.nn.ModuleList(list(target.model.layers[:layers]))
    draft.model.norm = target.model.norm
    draft.model.rotary_emb = target.model.rotary_emb
    draft.lm_head = target.lm_head
    meta = [name for name, p in draft.named_parameters() if p.is_meta]
    if meta:
        raise RuntimeError(f"draft parameters left on meta: {meta[:3]}")
    draft.generation_config.eos_token_id = None
    draft.generation_config.pad_token_id = 0
    return draft.eval()


def _shape_of(config) -> dict:
    keys = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
            "num_key_value_heads", "max_position_embeddings", "rms_norm_eps", "tie_word_embeddings")
    shape = {key: getattr(config, key) for key in keys}
    shape["rope_theta"] = config.rope_parameters["rope_theta"]
    return shape


def set_residual_scale(model, scale: float, *, seed: int = 0) -> None:
    """Redraw every layer's o_proj and down_proj with std scale * INIT_STD (seeded per layer:
    the same scale always gives the same weights; nothing accumulates across calls)."""
    device = model.model.embed_tokens.weight.device
    with torch.no_grad():
        for i, layer in enumerate(model.model.layers):
            gen = torch.Generator(device=device).manual_seed(10_000 + 97 * seed + i)
            for proj in (layer.self_attn.o_proj, layer.mlp.down_proj):
                proj.weight.normal_(0.0, INIT_STD * scale, generator=gen)
    model.residual_scale = scale


@torch.inference_mode()
def greedy_agreement(target, draft, tokens: torch.Tensor) -> float:
    """Fraction of positions of ``tokens`` [N, L] where the draft's argmax equals the target's."""
    agree = (target(tokens).logits.argmax(-1) == draft(tokens).logits.argmax(-1)).float().mean()
    return float(agree)


def calibrate(target, draft, goal: float, tokens: torch.Tensor, *, lo: float = -7.0, hi: float = 0.0,
              steps: int = 12, tol: float = 0.015) -> dict:
    """Bisection on log10 S for greedy agreement ~ goal (agreement falls as S grows). Leaves the
    target at the best S found. -> dict(scale, agreement, goal, trace [(S, agreement)])."""
    trace = []
    best = None
    for _ in range(steps):
        mid = (lo + hi) / 2
        set_residual_scale(target, 10**mid)
        agreement = greedy_agreement(target, draft, tokens)
        trace.append((10**mid, agreement))
        if best is None or abs(agreement - goal) < abs(best[1] - goal):
            best = (10**mid, agreement)
        if abs(agreement - goal) <= tol:
            break
        if agreement > goal:
            lo = mid
        else:
            hi = mid
    set_residual_scale(target, best[0])
    return dict(scale=best[0], agreement=best[1], goal=goal, trace=trace)


def weight_bytes_per_step(model, batch: int = 1) -> int:
    """Bytes of weights one decoding step reads: every parameter except the input embedding
    table, of which only ``batch`` rows are read (all of it when tied to the head)."""
    embed = model.get_input_embeddings().weight
    head = model.get_output_embeddings().weight
    total = sum(p.numel() * p.element_size() for p in model.parameters())
    if embed is not head:
        total -= embed.numel() * embed.element_size() - batch * embed.shape[1] * embed.element_size()
    return total


def ceiling_bandwidth(device) -> dict:
    """{"copy_Bps", "read_Bps", "ceiling_Bps", "basis"} of the plain-decoding ceiling: on CUDA
    bench/gpu_timing.hbm_ceiling_bandwidth (the larger of a copy's and a read's rate, as
    profile_step; an H200 copied at 2.71-4.23 TB/s depending on how it was timed and read at
    4.28); on the CPU a 64 MiB copy's read + written bytes per second (no read measurement)."""
    device = torch.device(device)
    if device.type == "cuda":
        from gpu_timing import hbm_ceiling_bandwidth

        return hbm_ceiling_bandwidth(device)
    src = torch.ones(32 * 2**20, dtype=torch.bfloat16, device=device)
    dst = torch.empty_like(src)
    dst.copy_(src)
    repeats = 10
    t0 = time.perf_counter()
    for _ in range(repeats):
        dst.copy_(src)
    copy = 2 * src.numel() * src.element_size() * repeats / (time.perf_counter() - t0)
    return {"copy_Bps": copy, "read_Bps": None, "ceiling_Bps": copy, "basis": "copy (read + written)"}


def describe(shape: dict, draft_layers: int) -> str:
    params = shape["vocab_size"] * shape["hidden_size"] * (1 if shape["tie_word_embeddings"] else 2)
    head_dim = shape["hidden_size"] // shape["num_attention_heads"]
    per_layer = (shape["hidden_size"] * head_dim * (2 * shape["num_attention_heads"] + 2 * shape["num_key_value_heads"])
                 + 3 * shape["hidden_size"] * shape["intermediate_size"])
    params += shape["num_hidden_layers"] * per_layer
    return (f"Llama-shaped target: vocab {shape['vocab_size']}, hidden {shape['hidden_size']}, {shape['num_hidden_layers']} "
            f"layers, GQA {shape['num_attention_heads']}/{shape['num_key_value_heads']}, {params / 1e9:.2f}B params, "
            f"random bf16 weights; draft = the target's embedding + first {draft_layers} layer(s) + final norm + head "
            f"(shared modules)")

