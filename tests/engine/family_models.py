"""Tiny random models of the families with paged runners of their own (OLMo 2 / 3, Gemma 1 / 2 / 3,
StarCoder2, GPT-NeoX, OPT, Cohere, GPT-BigCode), each built to exercise what its runner must get
right; tests/engine/test_paged_families.py runs the checks every family shares, the family's test
file its controls."""
import torch

VOCAB = 96
COMMON = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_attention_heads=4, num_key_value_heads=2,
              max_position_embeddings=256, initializer_range=0.15, pad_token_id=0, bos_token_id=1, eos_token_id=2)


def _alternating(layers: int) -> list:
    return ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(layers)]


def _build(config, norm_range=None, attn="sdpa"):
    import transformers as tf

    model = tf.AutoModelForCausalLM.from_config(config, attn_implementation=attn).float().eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if norm_range is not None and "norm" in name and name.endswith("weight"):
                param.uniform_(*norm_range)  # norms that are not identities: their place and weights are tested
            elif name.endswith("bias"):
                param.normal_(0, 0.3)  # non-zero biases, so they are really tested
    model.generation_config.eos_token_id = None
    return model


def tiny_family(kind: str, seed: int = 0, layers: int = 2, **overrides):
    """A random fp32 model of ``kind``:
    olmo2       q / k norms over the whole projection, norms after each branch
    olmo        OLMo 1: weightless float32 LayerNorms, q/k/v biases, q / k / v clamped (clip_qkv 1.5)
    flex_olmo   FlexOlmo: olmo2's layer with OLMoE's experts as its MLP (8 of 24, top 2, renormalised)
    olmo3       the same, layers alternating sliding (window 200: the tests' rows stay inside) and
                full attention, each with its RoPE (default, theta 500 / linear x2, theta 900)
    gemma3      Gemma 3's text decoder, layers alternating as olmo3's (local theta 300, global 900 x2),
                query_pre_attn_scalar 20, final-logit soft-capping 5 (the cap bites), norm weights around 0
    gemma       Gemma 1: Llama's two norms as Gemma's (1 + w) RMSNorm, the scaled embedding, gelu-tanh GeGLU
    vaultgemma  VaultGemma: gemma2's layer (its caps, scale, windows) without the norms of each branch's output
    gemma2      Gemma 2: no q / k norms, one RoPE (theta 300), attention soft-capping 1.5 and final-logit
                soft-capping 5 (both bite), layers alternating as olmo3's
    cohere2     Cohere 2 (Command R7B): layers alternating sliding (RoPE) and full (NoPE), no q / k norms
    exaone4     EXAONE 4.0: olmo2's layer with per-head q / k norms and Llama's RMSNorm, layers alternating
                sliding (RoPE) and full (NoPE)
    (olmo3, exaone4, gemma2, gemma3, starcoder2 and cohere2 take sliding_window=W: rows past a small one slide)
    starcoder2  LayerNorms with biases, biases on every projection, a plain gelu MLP, window 200
    nemotron    Nemotron-4: LayerNorm1P (w + 1), biases, an ungated relu^2 MLP, half of each head rotated
    stablelm    StableLM 2: per-head q / k LayerNorms, q/k/v biases, a SwiGLU MLP, a quarter of each head rotated, the
                parallel residual from one norm; stablelm_sequential: the sequential one
    phimoe      Phi-3.5-MoE: LayerNorms with biases, biases on q/k/v/o and the LM head, sparsemixer's two experts of
                8; phimoe_longrope: its longrope scales (short 1.3, long 1.5 past 64 positions)
    gpt_neox    Pythia's layer: one query_key_value (each head's q | k | v), half of each head
                rotated (partial_rotary_factor 0.5), the parallel residual; gpt_neox_sequential:
                the sequential residual
    opt         learned positions (offset 2), pre-LN, biases everywhere; opt_post_norm: OPT-350M's
                post-LN layers with project_in / project_out (48 wide embeddings)
    cohere2_moe Cohere 2 MoE: a dense prefix layer rotated (force_rope), then experts on a sliding and a full layer;
                softmax routing, the shared expert averaged; cohere2_moe_sigmoid: sigmoid routing, summed, RMSNorm
    cohere      mean-centred LayerNorms, interleaved RoPE, parallel branches from one norm,
                logit_scale 0.3; cohere_qk_norm: Command R+'s per-head q / k LayerNorms
    gpt_bigcode StarCoder 1's blocks: multi-query attention from one c_attn, learned positions;
                gpt_bigcode_mha: multi-head (each head's q | k | v)."""
    import transformers as tf

    torch.manual_seed(seed)
    common = dict(COMMON, num_hidden_layers=layers)
    if kind == "olmo2":
        config = tf.Olmo2Config(rope_parameters={"rope_type": "default", "rope_theta": 700.0}, **common, **overrides)
        return _build(config, (0.5, 1.5))
    if kind == "olmo":  # OLMo 1: weightless LayerNorms, q/k/v biases (randomised), q / k / v clamped to 1.5 (some reach it)
        overrides.setdefault("clip_qkv", 1.5)
        config = tf.OlmoConfig(attention_bias=True, rope_parameters={"rope_type": "default", "rope_theta": 700.0},
                               **common, **overrides)
        return _build(config, None)
    if kind == "flex_olmo":
        config = tf.FlexOlmoConfig(num_experts=8, num_experts_per_tok=2, norm_topk_prob=True,
                                   rope_parameters={"rope_type": "default", "rope_theta": 700.0},
                                   **dict(common, intermediate_size=24), **overrides)
        return _build(config, (0.5, 1.5))
    if kind == "olmo3":
        overrides.setdefault("sliding_window", 200)
        config = tf.Olmo3Config(layer_types=_alternating(layers), rope_parameters={
            "sliding_attention": {"rope_type": "default", "rope_theta": 500.0},
            "full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 900.0}}, **common, **overrides)
        return _build(config, (0.5, 1.5))
    if kind == "exaone4":  # EXAONE 4.0: OLMo 2's layer with per-head q / k norms and Llama's RMSNorm; sliding layers
        # (window 200) rotate, full ones are NoPE
        overrides.setdefault("sliding_window", 200)
        config = tf.Exaone4Config(head_dim=16, layer_types=_alternating(layers),
                                  rope_parameters={"rope_type": "default", "rope_theta": 600.0}, **common, **overrides)
        return _build(config, (0.5, 1.5))
    if kind == "gemma3":
        overrides.setdefault("final_logit_softcapping", 5.0)
        overrides.setdefault("sliding_window", 200)
        config = tf.Gemma3TextConfig(head_dim=16, query_pre_attn_scalar=20,
                                     layer_types=_alternating(layers), rope_parameters={
                                         "sliding_attention": {"rope_type": "default", "rope_theta": 300.0},
                                         "full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 900.0}},
                                     **common, **overrides)
        return _build(config, (-0.5, 0.5))
    if kind == "gemma":  # Gemma 1: Llama's layer, Gemma's (1 + w) norms, the scaled embedding, a GeGLU MLP
        config = tf.GemmaConfig(head_dim=16, rope_parameters={"rope_type": "default", "rope_theta": 300.0}, **common,
                                **overrides)
        return _build(config, (-0.5, 0.5))
    if kind == "gemma2":  # eager: transformers' Gemma 2 has no sdpa path (it cannot soft-cap there)
        overrides.setdefault("final_logit_softcapping", 5.0)
        overrides.setdefault("attn_logit_softcapping", 1.5)
        overrides.setdefault("sliding_window", 200)
        config = tf.Gemma2Config(head_dim=16, query_pre_attn_scalar=20, layer_types=_alternating(layers),
                                 rope_parameters={"rope_type": "default", "rope_theta": 300.0}, **common, **overrides)
        return _build(config, (-0.5, 0.5), attn="eager")
    if kind == "vaultgemma":  # VaultGemma: Gemma 2's layer without the norms of each branch's output (eager: no sdpa)
        overrides.setdefault("final_logit_softcapping", 5.0)
        overrides.setdefault("attn_logit_softcapping", 1.5)
        overrides.setdefault("sliding_window", 200)
        config = tf.VaultGemmaConfig(head_dim=16, query_pre_attn_scalar=20, layer_types=_alternating(layers),
                                     rope_parameters={"rope_type": "default", "rope_theta": 300.0}, **common, **overrides)
        return _build(config, (-0.5, 0.5), attn="eager")
    if kind == "starcoder2":
        overrides.setdefault("sliding_window", 200)
        config = tf.Starcoder2Config(use_bias=True, rope_theta=600.0, **common, **overrides)
        return _build(config, (0.5, 1.5))
    if kind == "nemotron":  # LayerNorm1P (weights around 0 and biases randomised: the + 1 is tested), biases on every
        # projection, an ungated relu^2 MLP, half of each head rotated
        config = tf.NemotronConfig(head_dim=16, attention_bias=True, mlp_bias=True, rope_parameters={
            "rope_type": "default", "rope_theta": 500.0, "partial_rotary_factor": 0.5}, **common, **overrides)
        return _build(config, (-0.5, 0.5))
    if kind in ("stablelm", "stablelm_sequential"):  # per-head q / k LayerNorms (weights randomised), q/k/v biases, a
        # quarter of each head rotated; the parallel residual (stablelm) or the sequential one with its second norm
        config = tf.StableLmConfig(use_qkv_bias=True, qk_layernorm=True, use_parallel_residual=kind == "stablelm",
                                   rope_parameters={"rope_type": "default", "rope_theta": 500.0,
                                                    "partial_rotary_factor": 0.25}, **common, **overrides)
        return _build(config, (0.5, 1.5))
    if kind in ("phimoe", "phimoe_longrope"):  # Phi-3.5-MoE: LayerNorms (randomised) with biases, q/k/v/o and LM-head
        # biases, 8 experts of 24 routed by sparsemixer (router_jitter_noise 0.3: its masks keep some experts out, not
        # all), a window of 200; phimoe_longrope: longrope with short_mscale 1.3 != long_mscale 1.5 (its limit: 64)
        rope = {"rope_type": "default", "rope_theta": 500.0}
        if kind == "phimoe_longrope":
            rope = {"rope_type": "longrope", "rope_theta": 500.0, "short_factor": [1.0, 1.2, 1.5, 2.0, 2.5, 1.1, 1.3, 3.0],
                    "long_factor": [2.0] * 8, "short_mscale": 1.3, "long_mscale": 1.5,
                    "original_max_position_embeddings": 64}
        overrides.setdefault("sliding_window", 200)
        config = tf.PhimoeConfig(num_local_experts=8, num_experts_per_tok=2, router_jitter_noise=0.3, attention_bias=True,
                                 lm_head_bias=True, rope_parameters=rope, **dict(common, intermediate_size=24),
                                 **overrides)
        return _build(config, (0.5, 1.5))
    if kind in ("gpt_neox", "gpt_neox_sequential"):
        neox = {k: v for k, v in common.items() if k not in ("num_key_value_heads", "intermediate_size")}
        config = tf.GPTNeoXConfig(intermediate_size=128, use_parallel_residual=kind == "gpt_neox",
                                  rope_parameters={"rope_type": "default", "rope_theta": 400.0,
                                                   "partial_rotary_factor": 0.5}, **neox, **overrides)
        return _build(config, (0.5, 1.5))
    if kind in ("opt", "opt_post_norm"):  # opt_post_norm: OPT-350M's post-LN layers and projections
        config = tf.OPTConfig(vocab_size=VOCAB, hidden_size=64, ffn_dim=96, num_hidden_layers=layers,
                              num_attention_heads=4, max_position_embeddings=256, init_std=0.15, pad_token_id=0,
                              bos_token_id=1, eos_token_id=2, do_layer_norm_before=kind == "opt",
                              word_embed_proj_dim=64 if kind == "opt" else 48, **overrides)
        return _build(config, (0.5, 1.5))
    if kind == "cohere2":  # Command R7B's layers: sliding ones rotate, full ones are NoPE
        overrides.setdefault("sliding_window", 200)
        config = tf.Cohere2Config(logit_scale=0.3, layer_types=_alternating(layers), rope_theta=500.0, **common,
                                  **overrides)
        return _build(config, (0.5, 1.5))
    if kind in ("cohere2_moe", "cohere2_moe_sigmoid"):  # Cohere 2 MoE of 3 layers: a dense prefix layer (MLP of 80,
        # full attention rotated: force_rope), then sparse ones (8 experts of 24, top 2, a shared expert of 24) on a
        # sliding layer and a full NoPE one; softmax routing with the shared output averaged (cohere2_moe), or sigmoid
        # routing renormalised, summed, and Llama's RMSNorm (cohere2_moe_sigmoid)
        sigmoid = kind == "cohere2_moe_sigmoid"
        overrides.setdefault("sliding_window", 200)
        config = tf.Cohere2MoeConfig(logit_scale=0.3, num_experts=8, num_experts_per_tok=2, num_shared_experts=1,
                                     prefix_dense_intermediate_size=80, first_k_dense_replace=1, sliding_window_pattern=2,
                                     expert_selection_fn="sigmoid" if sigmoid else "softmax",
                                     shared_expert_combination_strategy="sum" if sigmoid else "average",
                                     rms_norm_eps=1e-5 if sigmoid else None, rope_theta=500.0,
                                     **dict(common, num_hidden_layers=3, intermediate_size=24), **overrides)
        return _build(config, (0.5, 1.5))
    if kind in ("cohere", "cohere_qk_norm"):
        config = tf.CohereConfig(logit_scale=0.3, use_qk_norm=kind == "cohere_qk_norm", rope_theta=500.0, **common,
                                 **overrides)
        return _build(config, (0.5, 1.5))
    if kind in ("gpt_bigcode", "gpt_bigcode_mha"):
        config = tf.GPTBigCodeConfig(vocab_size=VOCAB, n_embd=64, n_layer=layers, n_head=4, n_positions=256,
                                     multi_query=kind == "gpt_bigcode", initializer_range=0.15, bos_token_id=1,
                                     eos_token_id=2, pad_token_id=0, **overrides)
        return _build(config, (0.5, 1.5))
    raise ValueError(kind)
