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
    llama_like = dict(hidden_size=48, intermediate_size=96, num_hidden_layers=layers, num_attention_heads=4,
                      num_key_value_heads=2, max_position_embeddings=256, **common)
    if kind in ("glm", "glm4"):  # GLM-4 / GLM-4-0414: half of each head rotated in interleaved pairs, q/k/v biases (zero
        # here), fused gate_up_proj; GLM-4-0414 norms each branch's output
        return getattr(tf, "GlmConfig" if kind == "glm" else "Glm4Config")(head_dim=12, **llama_like)
    if kind == "helium":  # Helium: RoPE on interleaved pairs, q/k/v and MLP biases (zero at init)
        return tf.HeliumConfig(head_dim=12, attention_bias=True, mlp_bias=True, **llama_like)
    if kind == "olmo":  # OLMo 1: weightless LayerNorms, q / k / v clamped to 2 (some values reach it)
        return tf.OlmoConfig(clip_qkv=2.0, **llama_like)
    if kind == "flex_olmo":  # FlexOlmo: OLMo 2's layer with OLMoE's experts (8 of 24, top 2, renormalised)
        return tf.FlexOlmoConfig(num_experts=8, num_experts_per_tok=2, norm_topk_prob=True,
                                 **dict(llama_like, intermediate_size=24))
    if kind == "arcee":  # Arcee AFM: Llama's layer with an ungated ReLU² MLP
        return tf.ArceeConfig(head_dim=12, **llama_like)
    if kind == "apertus":  # Apertus: an ungated MLP with xIELU, Qwen3's q/k norms
        return tf.ApertusConfig(head_dim=12, **llama_like)
    if kind == "dots1":  # dots.llm1: a dense first layer, then GLM-4.5's routing (8 experts of 24 in 2 groups, 1 kept), a
        # shared expert; Qwen3's q/k norms
        return tf.Dots1Config(num_local_experts=8, num_experts_per_tok=2, moe_intermediate_size=24, n_group=2,
                              topk_group=1, routed_scaling_factor=2.0, n_shared_experts=1, first_k_dense_replace=1,
                              head_dim=12, **llama_like)
    if kind == "hunyuan_v1_dense":  # HunYuan: per-head q/k norms after the rotation (ones here: the tests that need
        # them randomise them)
        return tf.HunYuanDenseV1Config(head_dim=12, **llama_like)
    if kind == "hunyuan_v1_moe":  # HunYuan-A13B's layer: 8 experts of 24, top 2 then 1 (softmax, renormalised; a top-k
        # and an unread moe_intermediate_size per layer, as A13B's config lists them), a shared MLP
        return tf.HunYuanMoEV1Config(head_dim=12, num_experts=8, moe_topk=[2, 1] * (layers // 2) + [2] * (layers % 2),
                                     moe_intermediate_size=[96] * layers, **dict(llama_like, intermediate_size=24))
    if kind in ("exaone", "internlm3", "iquestcoder"):  # transformers' LlamaForCausalLM under its own model_type
        return tf.AutoConfig.for_model(kind, **llama_like)
    if kind == "phi3":  # fused qkv_proj / gate_up_proj
        return tf.Phi3Config(**llama_like)
    if kind == "granite":  # four scalars that are not identities
        return tf.GraniteConfig(embedding_multiplier=2.0, residual_multiplier=0.5, attention_multiplier=0.15,
                                logits_scaling=1.5, **llama_like)
    if kind == "granite_swa":  # Granite SWA: Granite's scalars, a NoPE full layer and a sliding one (window 8: passed),
        # attention sinks (zeros at init, as transformers makes them)
        return tf.GraniteSWAConfig(embedding_multiplier=2.0, residual_multiplier=0.5, attention_multiplier=0.15,
                                   logits_scaling=1.5, sliding_window=8,
                                   layer_types=(["full_attention", "sliding_attention"] * layers)[:layers],
                                   layer_rope_theta=([0.0, 10000.0] * layers)[:layers], **llama_like)
    if kind == "granitemoe_swa":  # Granite MoE SWA: Granite 3 MoE's layer (8 experts of 24, top 2) with a shared MLP of
        # 48 and Granite SWA's attention (a NoPE full layer, a sliding one of window 8: passed; sinks)
        return tf.GraniteMoeSWAConfig(num_local_experts=8, num_experts_per_tok=2, shared_intermediate_size=48,
                                      embedding_multiplier=2.0, residual_multiplier=0.5, attention_multiplier=0.15,
                                      logits_scaling=1.5, sliding_window=8,
                                      layer_types=(["full_attention", "sliding_attention"] * layers)[:layers],
                                      layer_rope_theta=([0.0, 10000.0] * layers)[:layers],
                                      **dict(llama_like, intermediate_size=24))
    if kind == "granitemoehybrid":  # Granite 4.0's dense transformer (granite-4.0-micro): attention layers only, no
        # experts, RoPE; Granite's four scalars; the MLP as shared_mlp's fused input_linear / output_linear
        return tf.GraniteMoeHybridConfig(layer_types=["attention"] * layers, num_local_experts=0,
                                         position_embedding_type="rope", shared_intermediate_size=96,
                                         embedding_multiplier=2.0, residual_multiplier=0.5, attention_multiplier=0.15,
                                         logits_scaling=1.5, mamba_n_heads=4, **llama_like)
    if kind == "granite_h":  # Granite 4.0-H: Mamba2 layers (6 heads of 16, 2 groups of state 8) around an attention
        # layer without RoPE, the shared MLP and 8 experts of 24 (top 2); Granite's four scalars
        return tf.GraniteMoeHybridConfig(layer_types=(["mamba", "attention"] * layers)[:max(layers, 2)],
                                         num_local_experts=8, num_experts_per_tok=2, intermediate_size=24,
                                         shared_intermediate_size=96, mamba_n_heads=6, mamba_n_groups=2, mamba_d_state=8,
                                         mamba_d_head=16, mamba_expand=2, embedding_multiplier=2.0,
                                         residual_multiplier=0.5, attention_multiplier=0.15, logits_scaling=1.5,
                                         **{k: v for k, v in llama_like.items() if k != "intermediate_size"})
    # Gemma 4: sliding layers of 12-wide heads, full ones of 16, per-layer inputs of 8, windows of 8, a final soft-cap
    gemma4_like = dict(head_dim=12, global_head_dim=16, sliding_window=8, hidden_size_per_layer_input=8,
                       vocab_size_per_layer_input=vocab, final_logit_softcapping=30.0)
    if kind == "gemma4_text":  # (its KV-sharing layers and MoE block: test_paged_gemma4.py, gemma4_shared)
        return tf.Gemma4TextConfig(layer_types=(["sliding_attention", "full_attention"] * layers)[:layers],
                                   **gemma4_like, **llama_like)
    if kind == "gemma4_shared":  # Gemma 4 of 4 layers, the last two reading the first two's K/V (their MLPs double-wide),
        # the full layers' value its key over one KV head of 16 (under TP: replicated)
        return tf.Gemma4TextConfig(num_kv_shared_layers=2, use_double_wide_mlp=True, attention_k_eq_v=True,
                                   num_global_key_value_heads=1, layer_types=["sliding_attention", "full_attention"] * 2,
                                   **gemma4_like, **dict(llama_like, num_hidden_layers=4))
    if kind == "gemma4_unified_text":  # the unified Gemma 4 decoder: gemma4_shared's layout without per-layer inputs,
        # use_bidirectional_attention "vision" (its default: causal over text)
        return tf.Gemma4UnifiedTextConfig(num_kv_shared_layers=2, use_double_wide_mlp=True, attention_k_eq_v=True,
                                          num_global_key_value_heads=1, layer_types=["sliding_attention", "full_attention"] * 2,
                                          head_dim=12, global_head_dim=16, sliding_window=8, final_logit_softcapping=30.0,
                                          **dict(llama_like, num_hidden_layers=4))
    if kind == "hy_v3":  # Hy3: Qwen3's attention, layer 0 dense, then 8 experts of 24 by sigmoid + the block's correction
        # bias (zero here), scaled by 2.5, an ungated shared MLP added in float32
        return tf.HYV3Config(num_experts=8, num_experts_per_tok=2, moe_intermediate_size=24, num_shared_experts=1,
                             router_scaling_factor=2.5, enable_moe_fp32_combine=True, head_dim=12,
                             mlp_layer_types=(["dense"] + ["sparse"] * layers)[:layers], **llama_like)
    if kind == "afmoe":  # AFMoE (Arcee Trinity): a sliding layer (window 8: passed) that rotates, a full NoPE one; q/k
        # norms, a sigmoid gate on the attention output, four norms a layer, the embedding times sqrt(H) (mup); layer 0
        # dense, then 8 experts of 24 by sigmoid + the block's expert_bias (zero here), scaled by 2.5, a shared expert
        return tf.AfmoeConfig(num_experts=8, num_experts_per_tok=2, moe_intermediate_size=24, num_shared_experts=1,
                              num_dense_layers=1, route_scale=2.5, global_attn_every_n_layers=2, sliding_window=8,
                              mup_enabled=True, head_dim=12, **llama_like)
    if kind == "laguna":  # Laguna: a sliding layer (window 8: passed) of 4 query heads, a full one of 6 rotating half
        # of each head; q/k norms, a softplus gate a head on the attention output; layer 0 dense, then 8 experts of 24
        # by sigmoid of tanh-capped logits + the router's correction bias (zero here), their sum scaled by 1.5, a
        # shared expert
        rope = {"full_attention": {"rope_type": "default", "rope_theta": 500000.0, "partial_rotary_factor": 0.5},
                "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}}
        return tf.LagunaConfig(num_experts=8, num_experts_per_tok=2, moe_intermediate_size=24,
                               shared_expert_intermediate_size=24, moe_router_logit_softcapping=2.0,
                               moe_routed_scaling_factor=1.5, sliding_window=8, head_dim=12, rope_parameters=rope,
                               layer_types=(["sliding_attention", "full_attention"] * layers)[:layers],
                               mlp_layer_types=(["dense"] + ["sparse"] * layers)[:layers],
                               num_attention_heads_per_layer=([4, 6] * layers)[:layers], **llama_like)
    if kind == "mimo_v2_flash":  # MiMo-V2-Flash: a full layer (2 KV heads), then two sliding ones (window 8: passed)
        # of 4 KV heads with attention sinks; q/k heads of 12 (a third rotated), value heads of 8 scaled by 0.707;
        # layer 0 dense, then 8 experts of 24 by DeepSeek-V3's grouped sigmoid routing (its correction bias zero here)
        rope = {"full_attention": {"rope_type": "default", "rope_theta": 5000000.0, "partial_rotary_factor": 0.334},
                "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.334}}
        return tf.MiMoV2FlashConfig(n_routed_experts=8, num_experts_per_tok=2, moe_intermediate_size=24, n_group=2,
                                    topk_group=1, routed_scaling_factor=1.5, head_dim=12, v_head_dim=8, sliding_window=8,
                                    rope_parameters=rope, **llama_like)
    if kind == "mamba2":  # a pure Mamba2 LM: 8 heads of 12, 2 groups of state 16, kernel 4, no attention
        return tf.Mamba2Config(vocab_size=vocab, hidden_size=48, num_hidden_layers=layers, num_heads=8, head_dim=12,
                               expand=2, n_groups=2, state_size=16, conv_kernel=4, chunk_size=8, bos_token_id=1,
                               eos_token_id=2, pad_token_id=0)
    if kind in ("mamba", "falcon_mamba"):  # a pure Mamba (Mamba1) LM: 96 channels of state 8, dt rank 6, kernel 4;
        # Falcon-Mamba's dt / B / C RMS-normed
        config_class = tf.FalconMambaConfig if kind == "falcon_mamba" else tf.MambaConfig
        return config_class(vocab_size=vocab, hidden_size=48, num_hidden_layers=layers, intermediate_size=96,
                            state_size=8, time_step_rank=6, conv_kernel=4, bos_token_id=1, eos_token_id=2, pad_token_id=0)
    if kind == "jamba":  # Jamba: Mamba1 layers (96 channels of state 8, dt rank 6, kernel 4; dt / B / C normed) with an
        # attention layer (no positions; 4 heads over 2 KV heads of 12) every 2nd from layer 1, experts (8 of 96, top 2,
        # softmax not renormalised) every 2nd from layer 1
        return tf.JambaConfig(vocab_size=vocab, hidden_size=48, intermediate_size=96, num_hidden_layers=layers,
                              num_attention_heads=4, num_key_value_heads=2, num_experts=8, num_experts_per_tok=2,
                              attn_layer_period=2, attn_layer_offset=1, expert_layer_period=2, expert_layer_offset=1,
                              mamba_d_state=8, mamba_d_conv=4, mamba_expand=2, mamba_dt_rank=6,
                              max_position_embeddings=256, bos_token_id=1, eos_token_id=2, pad_token_id=0)
    if kind == "kimi_linear":  # Kimi Linear's layer: KDA layers (4 heads of 12, kernel 4) with a latent attention layer
        # every 3rd (4 heads, a latent of 16, keys 12 + 8 unrotated, values 12), a dense first MLP (96), then 8 experts
        # of 24 in 2 groups (1 kept), top 2, a shared expert, scaled by 1.5
        kinds = (["linear_attention", "linear_attention", "full_attention"] * layers)[:layers]
        kinds[-1] = "full_attention" if "full_attention" not in kinds else kinds[-1]
        return tf.KimiLinearConfig(layer_types=kinds, mlp_layer_types=["dense"] + ["sparse"] * (layers - 1),
                                   moe_intermediate_size=24, num_local_experts=8, num_experts_per_tok=2, n_group=2,
                                   topk_group=1, n_shared_experts=1, routed_scaling_factor=1.5, kv_lora_rank=16,
                                   qk_rope_head_dim=8, qk_nope_head_dim=12, v_head_dim=12, linear_head_dim=12,
                                   linear_num_heads=4, linear_conv_kernel_dim=4,
                                   **dict(llama_like, num_key_value_heads=4))
    if kind == "minimax":  # MiniMax-Text-01's layer: lightning attention layers (4 heads of 12, blocks of 4 in
        # transformers' prefill) and a GQA attention layer every 3rd (2 KV heads), 8 experts of 24, top 2; residual
        # factors of their own (1 in the checkpoints' configs but DeepNorm's alpha)
        kinds = (["linear_attention", "linear_attention", "full_attention"] * layers)[:layers]
        kinds[-1] = "full_attention" if "full_attention" not in kinds else kinds[-1]
        return tf.MiniMaxConfig(layer_types=kinds, head_dim=12, num_local_experts=8, num_experts_per_tok=2,
                                block_size=4, full_attn_alpha_factor=1.3, full_attn_beta_factor=0.8,
                                linear_attn_alpha_factor=1.7, linear_attn_beta_factor=0.9, mlp_alpha_factor=1.2,
                                mlp_beta_factor=1.1, **dict(llama_like, intermediate_size=24))
    if kind == "lfm2":  # LFM2: gated short convolutions (kernel 3) with an attention layer (per-head q/k norms, RoPE)
        # every 3rd and last (4 heads of 12 over 2 KV heads); SwiGLU MLPs of 96
        kinds = (["conv", "conv", "full_attention"] * layers)[:layers]
        kinds[-1] = "full_attention" if "full_attention" not in kinds else kinds[-1]
        return tf.Lfm2Config(layer_types=kinds, norm_eps=1e-5, block_auto_adjust_ff_dim=False, **llama_like)
    if kind == "lfm3":  # LFM3: LFM2's convolutions (kernel 7) with a sliding layer (a window of 5) and a full one (half of
        # each head rotated, "proportional"), each head's output gated, sandwich norms; SwiGLU MLPs of 96
        kinds = (["conv", "sliding_attention", "full_attention"] * layers)[:layers]
        kinds[-1] = "full_attention" if "full_attention" not in kinds else kinds[-1]
        return tf.Lfm3Config(layer_types=kinds, sliding_window=5, head_dim=12, **llama_like)
    if kind == "lfm2_moe":  # LFM2-MoE: LFM2's layers, layer 0's MLP dense (96), then 8 experts of 24, top 2, by sigmoid
        # scores + the block's expert_bias (zero here), renormalised, scaled by 1.5
        kinds = (["conv", "conv", "full_attention"] * layers)[:layers]
        kinds[-1] = "full_attention" if "full_attention" not in kinds else kinds[-1]
        return tf.Lfm2MoeConfig(layer_types=kinds, num_dense_layers=1, num_experts=8, num_experts_per_tok=2,
                                moe_intermediate_size=24, routed_scaling_factor=1.5, **llama_like)
    if kind == "olmo_hybrid":  # OLMo Hybrid: Gated DeltaNet layers (2 key heads of 8, 4 value heads of 12, kernel 4,
        # beta up to 2) with an OLMo 3 attention layer (whole-projection q/k norms, RoPE, post-branch norms) every 3rd
        # and last (the config requires one of each kind)
        kinds = (["linear_attention", "linear_attention", "full_attention"] * layers)[:layers]
        kinds[-1] = "full_attention" if "full_attention" not in kinds else kinds[-1]
        return tf.OlmoHybridConfig(linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=8,
                                   linear_value_head_dim=12, linear_conv_kernel_dim=4, head_dim=12, layer_types=kinds,
                                   rope_parameters={"rope_type": "default", "rope_theta": 10000.0}, **llama_like)
    if kind == "seed_oss":  # biases on q/k/v, o and the MLP (zero from the initialiser: randomise them to test them)
        return tf.SeedOssConfig(attention_bias=True, attention_out_bias=True, mlp_bias=True, **llama_like)
    if kind == "ministral":  # Qwen2's layer without biases, its window (8: passed) by layer_types
        return tf.MinistralConfig(head_dim=12, sliding_window=8, **llama_like)
    if kind == "smollm3":  # a NoPE layer every second layer
        return tf.SmolLM3Config(no_rope_layer_interval=2, **llama_like)
    if kind == "olmo2":  # q/k norms over the whole projection, each branch's output normed before its add
        return tf.Olmo2Config(**llama_like)
    if kind == "olmo3":  # OLMo 2's layer; sliding (window 4096: never reached here) and full layers, a RoPE each
        return tf.Olmo3Config(layer_types=["sliding_attention", "full_attention"] * (layers // 2) +
                              ["sliding_attention"] * (layers % 2), **llama_like)
    if kind == "exaone4":  # EXAONE 4.0: post-branch norms only, per-head q/k norms; a sliding layer (window 8: passed)
        # that rotates, a full NoPE one
        return tf.Exaone4Config(head_dim=12, sliding_window=8, layer_types=["sliding_attention", "full_attention"] *
                                (layers // 2) + ["sliding_attention"] * (layers % 2), **llama_like)
    if kind == "gemma3":  # Gemma 3's text decoder: sliding (window 4096: never reached here) and full layers
        return tf.Gemma3TextConfig(head_dim=12, layer_types=["sliding_attention", "full_attention"] * (layers // 2) +
                                   ["sliding_attention"] * (layers % 2), final_logit_softcapping=30.0, **llama_like)
    if kind == "gemma":  # Gemma 1: Llama's layer with Gemma's norms, the scaled embedding, GeGLU
        return tf.GemmaConfig(head_dim=12, **llama_like)
    if kind == "ministral3":  # its query temperature past original_max_position_embeddings 8, a window of 12
        return tf.Ministral3Config(head_dim=12, sliding_window=12, rope_parameters={
            "rope_type": "default", "rope_theta": 10000.0, "llama_4_scaling_beta": 0.3,
            "original_max_position_embeddings": 8}, **llama_like)
    if kind == "cwm":  # a full layer, then sliding ones (window 8: passed)
        return tf.CwmConfig(head_dim=12, sliding_window=8, layer_types=(["full_attention", "sliding_attention"] * layers)[:layers],
                            rope_parameters={"rope_type": "default", "rope_theta": 10000.0}, **llama_like)
    if kind == "gpt_oss":  # top-k then softmax over 16 experts, biases, clamps (limit 1), sinks, windows of 8
        return tf.GptOssConfig(num_local_experts=16, num_experts_per_tok=2, head_dim=12, sliding_window=8,
                               swiglu_limit=1.0, rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
                               **dict(llama_like, intermediate_size=24))
    if kind == "mixtral":  # a sparse MoE MLP (8 experts, top 2), Mistral's attention and window (8: passed)
        return tf.MixtralConfig(num_local_experts=8, num_experts_per_tok=2, sliding_window=8, **llama_like)
    if kind == "qwen3_moe":  # 16 experts of 24, top 2, renormalised
        return tf.Qwen3MoeConfig(num_experts=16, num_experts_per_tok=2, moe_intermediate_size=24, norm_topk_prob=True,
                                 head_dim=12, **llama_like)
    if kind == "qwen2_moe":  # 16 experts of 24, top 2, not renormalised, a gated shared expert of 48, q/k/v biases
        return tf.Qwen2MoeConfig(num_experts=16, num_experts_per_tok=2, moe_intermediate_size=24,
                                 shared_expert_intermediate_size=48, norm_topk_prob=False, **llama_like)
    if kind == "glm4_moe":  # a dense first layer, then 8 experts of 24 in 2 groups (1 kept), a shared MLP, half of
        # each head rotated (6 of 12), q/k/v biases
        return tf.Glm4MoeConfig(n_routed_experts=8, num_experts_per_tok=2, moe_intermediate_size=24, n_group=2,
                                topk_group=1, routed_scaling_factor=2.0, n_shared_experts=1, first_k_dense_replace=1,
                                head_dim=12, attention_bias=True, **llama_like)
    if kind == "deepseek_v3":  # MLA (r 24, dn 12, dr 8, dv 12, a query rank of 16, interleaved RoPE, YaRN's mscale in
        # the scale), a dense first layer, then GLM-4.5's routing (8 experts of 24 in 2 groups, 1 kept), a shared MLP
        return tf.DeepseekV3Config(n_routed_experts=8, num_experts_per_tok=2, moe_intermediate_size=24, n_group=2,
                                   topk_group=1, routed_scaling_factor=2.0, n_shared_experts=1, first_k_dense_replace=1,
                                   q_lora_rank=16, kv_lora_rank=24, qk_rope_head_dim=8, qk_nope_head_dim=12, v_head_dim=12,
                                   rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
                                                    "original_max_position_embeddings": 64, "mscale": 1.0,
                                                    "mscale_all_dim": 1.0, "beta_fast": 32, "beta_slow": 1},
                                   **dict(llama_like, num_key_value_heads=4))
    if kind == "kolibri1":  # Kolibri-1: q/k norms, a sliding RoPE layer (window 8: passed) and a full NoPE one, the
        # post-branch norms, 8 experts of 24 chosen by logit + the correction bias (zero here), a shared expert
        return tf.Kolibri1Config(num_experts=8, moe_intermediate_size=24, shared_expert_intermediate_size=48,
                                 norm_topk_prob=True, head_dim=12, sliding_window=8,
                                 layer_types=(["sliding_attention", "full_attention"] * layers)[:layers], **llama_like)
    if kind == "flint":  # Flint: q/k norms, sinks, a sliding RoPE layer (window 8: passed), a full NoPE one; layer 0
        # dense, then 8 experts of 24 by the top sigmoids, a shared expert without a gate
        return tf.FlintConfig(num_experts=8, moe_intermediate_size=24, shared_expert_intermediate_size=48,
                              norm_topk_prob=True, head_dim=12, sliding_window=8, mlp_only_layers=[0],
                              layer_types=(["sliding_attention", "full_attention"] * layers)[:layers], **llama_like)
    if kind == "axk1":  # A.X-K1: deepseek_v3's layer above (its routing, MLA, YaRN), the MoE block's output normed
        return tf.AXK1Config(n_routed_experts=8, num_experts_per_tok=2, moe_intermediate_size=24, n_group=2,
                             topk_group=1, routed_scaling_factor=2.0, n_shared_experts=1, first_k_dense_replace=1,
                             q_lora_rank=16, kv_lora_rank=24, qk_rope_head_dim=8, qk_nope_head_dim=12, v_head_dim=12,
                             rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
                                              "original_max_position_embeddings": 64, "mscale": 1.0,
                                              "mscale_all_dim": 1.0, "beta_fast": 32, "beta_slow": 1},
                             **dict(llama_like, num_key_value_heads=4))
    if kind == "granitemoe":  # Granite 3 MoE: Granite's four scalars (none 1), 8 experts of 24, top 2, by softmax over
        # the top-k float32 logits
        return tf.GraniteMoeConfig(num_local_experts=8, num_experts_per_tok=2, embedding_multiplier=2.0,
                                   residual_multiplier=0.7, attention_multiplier=0.2, logits_scaling=3.0,
                                   **dict(llama_like, intermediate_size=24))
    if kind == "youtu":  # Youtu-LLM: DeepSeek-V3's latent attention (r 24, dn 12, dr 8, dv 12, a query rank of 16,
        # interleaved RoPE) in a dense Llama layer (SwiGLU MLPs of 96), the embedding tied
        return tf.YoutuConfig(q_lora_rank=16, kv_lora_rank=24, qk_rope_head_dim=8, qk_nope_head_dim=12, v_head_dim=12,
                              **dict(llama_like, num_key_value_heads=4))
    if kind == "glm_moe_dsa":  # GLM-5: DeepSeek-V3's layer (interleaved RoPE) with DeepSeek Sparse Attention's indexer
        # (index_topk 8: the battery's rows pass it, so its keys are chosen), layer 1 reusing layer 0's choice; GLM-4.5's
        # routing
        return tf.GlmMoeDsaConfig(n_routed_experts=8, num_experts_per_tok=2, moe_intermediate_size=24, n_group=2,
                                  topk_group=1, routed_scaling_factor=2.0, n_shared_experts=1, first_k_dense_replace=1,
                                  q_lora_rank=16, kv_lora_rank=24, qk_rope_head_dim=8, qk_nope_head_dim=12, v_head_dim=12,
                                  index_topk=8, index_head_dim=8, index_n_heads=16, indexer_types=["full", "shared"],
                                  **dict(llama_like, num_key_value_heads=4))
    if kind == "falcon_h1":  # Falcon-H1: a Mamba2 mixer (6 heads of 8, 2 groups of state 8, the gated norm before the
        # gate) and attention (4 heads over 2 KV heads of 12) in every layer; μP multipliers away from 1
        return tf.FalconH1Config(hidden_size=48, intermediate_size=96, num_hidden_layers=layers, num_attention_heads=4,
                                 num_key_value_heads=2, head_dim=12, mamba_d_ssm=48, mamba_n_heads=6, mamba_d_head=8,
                                 mamba_n_groups=2, mamba_d_state=8, mamba_rms_norm=True, lm_head_multiplier=0.5,
                                 embedding_multiplier=2.0, mlp_multipliers=[0.7, 1.3], key_multiplier=0.8,
                                 ssm_multipliers=[1.2, 0.8, 1.1, 0.9, 1.05], ssm_in_multiplier=0.75,
                                 max_position_embeddings=256, **common)
    if kind == "nemotron_h":  # Nemotron-H: blocks M * - M ... (Mamba2: 6 heads of 8, 2 groups of state 8, kernel 4;
        # attention without positions: 4 heads over 2 KV heads of 12; relu^2 MLPs), 2 blocks a layer asked for
        blocks = ["linear_attention", "full_attention", "mlp", "linear_attention"] * layers
        return tf.NemotronHConfig(hidden_size=48, layers_block_type=blocks[:2 * layers],
                                  num_attention_heads=4, num_key_value_heads=2, head_dim=12, intermediate_size=96,
                                  mamba_num_heads=6, mamba_head_dim=8, n_groups=2, ssm_state_size=8, conv_kernel=4,
                                  max_position_embeddings=256, **common)
    if kind == "deepseek_v2":  # MLA (r 24, dn 12, dr 8 on complex pairs, dv 12), a dense first layer, then softmax
        # routing limited to 1 of 2 groups of 4 experts of 24, top 2, times 1.5, a shared MLP
        return tf.DeepseekV2Config(n_routed_experts=8, num_experts_per_tok=2, moe_intermediate_size=24, n_group=2,
                                   topk_group=1, topk_method="group_limited_greedy", routed_scaling_factor=1.5,
                                   n_shared_experts=1, first_k_dense_replace=1, q_lora_rank=None, kv_lora_rank=24,
                                   qk_rope_head_dim=8, qk_nope_head_dim=12, v_head_dim=12,
                                   **dict(llama_like, num_key_value_heads=4))
    # Qwen3-Next / Qwen3.5: Gated DeltaNet layers (2 key heads of 8, 4 value heads of 12) between gated attention layers
    # (half of each head rotated); the MoE ones 8 experts of 24, top 2, a gated shared expert
    hybrid_like = dict(head_dim=12, linear_key_head_dim=8, linear_value_head_dim=12, linear_num_key_heads=2,
                       linear_num_value_heads=4, layer_types=(["linear_attention", "full_attention"] * layers)[:layers],
                       rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5})
    hybrid_moe = dict(moe_intermediate_size=24, shared_expert_intermediate_size=48, num_experts_per_tok=2, num_experts=8)
    if kind == "qwen3_next":
        return tf.Qwen3NextConfig(**hybrid_like, **hybrid_moe, **llama_like)
    if kind == "qwen3_5_text":  # Qwen3.5's dense text decoder: Qwen3-Next's layers, the DeltaNet's projections apart
        return tf.Qwen3_5TextConfig(**hybrid_like, **llama_like)
    if kind == "qwen3_5_moe_text":  # Qwen3.5's MoE text decoder: qwen3_5_text's layers, Qwen3-Next's experts
        return tf.Qwen3_5MoeTextConfig(**hybrid_like, **hybrid_moe, **llama_like)
    if kind == "minimax_m2":  # q/k norms over the whole projection, half of each head rotated; 8 experts of 24, top 2,
        # sigmoid scores with the block's correction bias (zero here: the tests that need it randomise it)
        return tf.MiniMaxM2Config(num_local_experts=8, num_experts_per_tok=2, head_dim=12, rope_parameters={
            "rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5},
            **dict(llama_like, intermediate_size=24))
    if kind == "ernie4_5":  # RoPE on interleaved pairs, biases on every projection (zero here: not randomised)
        return tf.Ernie4_5Config(head_dim=12, use_bias=True, **llama_like)
    if kind == "ernie4_5_moe":  # interleaved RoPE; 8 experts of 24 chosen by softmax + a correction bias, a shared
        # expert, layer 0 dense; biases (the LM head's too)
        return tf.Ernie4_5_MoeConfig(moe_num_experts=8, moe_k=2, moe_intermediate_size=24, moe_num_shared_experts=1,
                                     moe_layer_start_index=1, head_dim=12, use_bias=True, **llama_like)
    if kind == "llama4_text":  # Llama 4: chunked RoPE layers (chunks of 6: the calls' rows cross them) on interleaved
        # pairs with the weightless q/k norm, every second layer NoPE (its temperature 1 at the published floor_scale) and
        # MoE (8 experts of 24, top 1 scaling the input, a shared expert) beside a dense MLP of 96
        return tf.Llama4TextConfig(head_dim=12, num_local_experts=8, num_experts_per_tok=1, intermediate_size_mlp=96,
                                   interleave_moe_layer_step=2, no_rope_layer_interval=2, attention_chunk_size=6,
                                   **dict(llama_like, intermediate_size=24))
    if kind == "exaone_moe":  # GLM-4.5's routing; a sliding layer (window 8: RoPE, passed), a full NoPE one; q/k norms
        return tf.ExaoneMoeConfig(num_experts=8, num_experts_per_tok=2, moe_intermediate_size=24, n_group=2, topk_group=1,
                                  routed_scaling_factor=2.0, num_shared_experts=1, head_dim=12, sliding_window=8,
                                  layer_types=(["sliding_attention", "full_attention"] * layers)[:layers],
                                  mlp_layer_types=(["dense"] + ["sparse"] * layers)[:layers], **llama_like)
    if kind == "olmoe":  # 16 experts of 24, top 2, not renormalised; q/k norms over the whole projection; q/k/v
        # clamped to [-0.4, 0.4] (clip_qkv: some values of a random model reach it)
        return tf.OlmoeConfig(num_experts=16, num_experts_per_tok=2, norm_topk_prob=False, clip_qkv=0.4,
                              **dict(llama_like, intermediate_size=24))
    if kind == "solar_open":  # GLM-4.5's routing in every layer, Llama's attention
        return tf.SolarOpenConfig(n_routed_experts=8, num_experts_per_tok=2, moe_intermediate_size=24, n_group=2,
                                  topk_group=1, routed_scaling_factor=1.5, n_shared_experts=1, head_dim=12, **llama_like)
    if kind == "mistral":  # every layer slides by a window of 8: the calls' rows pass it
        return tf.MistralConfig(sliding_window=8, **llama_like)
    if kind == "gemma2":  # attention soft-capping 2 (it bites), sliding (window 8: passed) and full layers
        return tf.Gemma2Config(head_dim=12, sliding_window=8, attn_logit_softcapping=2.0, final_logit_softcapping=30.0,
                               **llama_like)
    if kind == "vaultgemma":  # Gemma 2's layer (soft-capping 2, windows of 8: passed) without the post-branch norms
        return tf.VaultGemmaConfig(head_dim=12, sliding_window=8, attn_logit_softcapping=2.0,
                                   final_logit_softcapping=30.0, **llama_like)
    if kind == "starcoder2":  # LayerNorms, biases, a plain MLP (window 4096: never reached here)
        return tf.Starcoder2Config(use_bias=True, **llama_like)
    if kind == "nemotron":  # Nemotron-4: LayerNorm1P, an ungated relu^2 MLP, half of each head rotated, biases (zero)
        return tf.NemotronConfig(head_dim=12, attention_bias=True, mlp_bias=True, rope_parameters={
            "rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5}, **llama_like)
    if kind == "stablelm":  # StableLM 2: per-head q / k LayerNorms, the parallel residual, a quarter of each head rotated
        # (head_dim 12: 3 dims would be odd; 16 with 3 heads of the 48)
        return tf.StableLmConfig(use_qkv_bias=True, qk_layernorm=True, use_parallel_residual=True,
                                 rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25},
                                 **dict(llama_like, num_attention_heads=3, num_key_value_heads=3))
    if kind == "gpt_neox":  # Pythia's layer: fused per-head q | k | v, half of each head rotated, parallel residual
        rope = {"rope_type": "default", "rope_theta": 400.0, "partial_rotary_factor": 0.5}
        return tf.GPTNeoXConfig(hidden_size=48, intermediate_size=96, num_hidden_layers=layers, num_attention_heads=4,
                                max_position_embeddings=256, rope_parameters=rope, **common)
    if kind == "opt":  # learned positions (offset 2), pre-LN, biases
        return tf.OPTConfig(hidden_size=48, ffn_dim=96, num_hidden_layers=layers, num_attention_heads=4,
                            max_position_embeddings=256, word_embed_proj_dim=48, **common)
    if kind == "cohere2":  # Command R7B's layers: sliding (window 8: passed) ones rotate, full ones are NoPE
        return tf.Cohere2Config(hidden_size=48, intermediate_size=96, num_hidden_layers=layers, num_attention_heads=4,
                                num_key_value_heads=2, max_position_embeddings=256, logit_scale=0.5, sliding_window=8,
                                layer_types=["sliding_attention", "full_attention"] * (layers // 2) +
                                ["sliding_attention"] * (layers % 2), **common)
    if kind in ("cohere", "cohere_qk"):  # mean-centred LayerNorms, interleaved RoPE, parallel branches, logit_scale;
        # cohere_qk: Command R+'s per-head q / k LayerNorms
        return tf.CohereConfig(hidden_size=48, intermediate_size=96, num_hidden_layers=layers, num_attention_heads=4,
                               num_key_value_heads=2, max_position_embeddings=256, logit_scale=0.5,
                               use_qk_norm=kind == "cohere_qk", **common)
    if kind == "cohere2_moe":  # Cohere 2 MoE: a dense prefix layer (full, rotated), then 8 experts of 24 (top 2, softmax)
        # with a shared expert averaged in, on a sliding layer (window 8: passed) and a full NoPE one
        return tf.Cohere2MoeConfig(hidden_size=48, intermediate_size=24, num_hidden_layers=max(layers, 3),
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                                   logit_scale=0.5, num_experts=8, num_experts_per_tok=2, num_shared_experts=1,
                                   prefix_dense_intermediate_size=96, first_k_dense_replace=1, sliding_window_pattern=2,
                                   sliding_window=8, **common)
    if kind == "phimoe":  # Phi-3.5-MoE: LayerNorms, biases, 8 experts of 24 by sparsemixer (jitter 0.3: its masks bite)
        return tf.PhimoeConfig(num_local_experts=8, num_experts_per_tok=2, router_jitter_noise=0.3, attention_bias=True,
                               lm_head_bias=True, **dict(llama_like, intermediate_size=24))
    if kind == "gpt_bigcode":  # StarCoder 1's blocks: multi-query attention, learned positions
        return tf.GPTBigCodeConfig(n_embd=48, n_layer=layers, n_head=4, n_positions=256, multi_query=True, **common)
    raise ValueError(kind)


def make_model(kind: str = "llama", *, vocab: int = VOCAB, layers: int = 2, seed: int = 0, attn: str = "sdpa",
               init_std: float = 0.15):
    """A random model in fp32, eval mode. A larger init_std spreads the logits (fewer near-ties)."""
    import transformers as tf

    torch.manual_seed(seed)
    if kind in ("gemma2", "vaultgemma", "gpt_oss", "mimo_v2_flash", "granite_swa", "granitemoe_swa", "flint", "mamba2", "mamba", "falcon_mamba"):
        attn = "eager"  # transformers' Gemma 2 / GPT-OSS / MiMo-V2-Flash / Granite SWA / Flint have no sdpa path (soft-capping, sinks);
        # the Mamba LMs no attention at all
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
            p.add_(torch.randn(p.shape, generator=gen).to(p.device) * p.std().nan_to_num(0.0) * noise)
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


def eos_inside_a_block(plain: torch.Tensor, width: int, block: int, row: int = 1, pad: int = 0) -> tuple[int, int]:
    """(end, eos) for the EOS tests where the draft is the target (every draft accepted): plain
    [B, width + T] is greedy generate's output; eos is the token ``row`` first says at new position
    ``end``, a draft's place (new token 0 comes from the prefill, then blocks of block - 1 drafts and
    a bonus: end % block != 0), said first by no row (so every row enters the loop), not the pad
    token (a row that ends is padded with it: the end must show). Read from the
    output, not a fixed position: a random model's tokens change with transformers' init (5.4 to
    5.14 gave GPT-2 rows of one token), and a fixed 5th token can be one the row said before."""
    new = plain[:, width:].tolist()
    firsts = [r[0] for r in new]
    for end in range(2, len(new[row])):
        if end % block and new[row][end] != pad and new[row][end] not in new[row][:end] + firsts:
            return end, new[row][end]
    raise AssertionError(f"row {row} says no new token at a draft's place: {new[row]}")


def llama4_multimodal_checkpoint(model, path) -> None:
    """``model`` (a Llama4ForCausalLM) written as Meta's Llama 4 checkpoints are: a Llama4Config (model_type
    "llama4") around its text config, the decoder's tensors under language_model., a vision tower and a
    projector beside them."""
    import transformers as tf
    from safetensors.torch import save_file

    path.mkdir(parents=True, exist_ok=True)
    tf.Llama4Config(text_config=model.config.to_dict()).to_json_file(path / "config.json")
    state = {f"language_model.{name}": tensor.contiguous() for name, tensor in model.state_dict().items()}
    state.update({"vision_model.patch_embedding.linear.weight": torch.ones(8, 12),
                  "multi_modal_projector.linear_1.weight": torch.ones(48, 8)})
    save_file(state, path / "model.safetensors", metadata={"format": "pt"})


def gemma3_multimodal(*, vocab: int = VOCAB, seed: int = 0):
    """A tiny Gemma3ForConditionalGeneration (what AutoModelForCausalLM loads for Gemma 3 4B / 12B / 27B): a text
    decoder of 3 layers (2 sliding of 4, 1 full; q / k norms randomised) behind a one-layer vision tower."""
    import transformers as tf

    torch.manual_seed(seed)
    config = tf.Gemma3Config(
        text_config=dict(vocab_size=vocab, hidden_size=64, intermediate_size=96, num_hidden_layers=3, num_attention_heads=4,
                         num_key_value_heads=2, head_dim=16, sliding_window=4, max_position_embeddings=256,
                         layer_types=["sliding_attention", "sliding_attention", "full_attention"]),
        vision_config=dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32, image_size=32,
                           patch_size=16),
        mm_tokens_per_image=4, image_token_index=vocab - 1, boi_token_index=vocab - 3, eoi_token_index=vocab - 2)
    model = tf.AutoModelForCausalLM.from_config(config).float().eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" in name and "language_model" in name:
                param.normal_(0, 0.2)
    model.generation_config.eos_token_id = None
    return model


# EXAONE 3.x's published tensor names for transformers' (sharding.CHECKPOINT_RENAMES read them back)
EXAONE_NAMES = (("model.embed_tokens.", "transformer.wte."), ("model.layers.", "transformer.h."), ("model.norm.", "transformer.ln_f."),
                (".self_attn.o_proj.", ".attn.attention.out_proj."), (".self_attn.", ".attn.attention."),
                (".input_layernorm.", ".ln_1."), (".post_attention_layernorm.", ".ln_2."), (".mlp.gate_proj.", ".mlp.c_fc_0."),
                (".mlp.up_proj.", ".mlp.c_fc_1."), (".mlp.down_proj.", ".mlp.c_proj."))


def exaone_original_checkpoint(model, path) -> None:
    """An EXAONE 3.x model (LlamaForCausalLM, model_type exaone) saved under the names LG's checkpoints carry
    (transformer.h.N.attn.attention.q_proj, ...), which transformers renames on loading."""
    from safetensors.torch import save_file

    model.save_pretrained(path)
    state = {}
    for name, tensor in model.state_dict().items():
        for ours, theirs in EXAONE_NAMES:
            name = name.replace(ours, theirs, 1) if ours in name else name
        state[name] = tensor.contiguous()
    save_file(state, path / "model.safetensors", metadata={"format": "pt"})
