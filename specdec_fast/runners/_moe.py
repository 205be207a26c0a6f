"""Sparse mixture-of-experts MLPs on the paged runners: Mixtral, Qwen2-MoE (with its gated shared
expert), Qwen3-MoE, GPT-OSS and GLM-4.5 (grouped sigmoid routing, a shared MLP; as EXAONE MoE and
Solar Open route) decoder layers
(transformers 5.24's *SparseMoeBlock / GptOssMLP / Glm4MoeMoE: a top-k router over E experts
stored as 3-D tensors).

The math is transformers' (modeling_mixtral.py, modeling_qwen2_moe.py, modeling_qwen3_moe.py,
modeling_gpt_oss.py):
    routing, Mixtral / Qwen: logits = h @ router^T (model dtype); probs = softmax(logits) in
             float32; w, e = top-k(probs); w /= sum(w) (Mixtral always, Qwen where
             norm_topk_prob); Qwen casts w to the model dtype, Mixtral keeps it float32
    routing, GPT-OSS: logits = h @ router^T + bias; w, e = top-k(logits); w = softmax(w) in the
             model dtype
    experts, SwiGLU (Mixtral / Qwen): gate_up [E, 2I, H] (gate rows, then up rows), down [E, H, I]:
             y = down_e(act(gate_e(h)) * up_e(h))
    experts, GPT-OSS: gate_up [E, H, 2I] and down [E, I, H] (read here as transposed views), a bias
             each, gate / up interleaved (even / odd columns): gate = min(gate, limit),
             up = clamp(up, -limit, limit), y = down_e((up + 1) * gate * sigmoid(alpha * gate)) + b
    routing, DeepSeek-V2: s = softmax(h @ router^T) in float32; the top k (group-limited: among the
             top_groups groups by their best s); w = s of those times routed_scaling_factor
    routing, ERNIE 4.5: p = softmax(h @ router^T) in float32; the top k of p + correction bias; w = p of
             those over max(their sum, moe_norm_min), cast to the model dtype
    routing, MiniMax-M2: s = sigmoid(h @ router^T) (the product in the model dtype); the top k of s +
             correction bias; w = s of those over their sum (float32). AFMoE: over their sum + 1e-20, times
             route_scale; Laguna: the logits tanh-capped first, w cast to the model dtype, the experts' sum
             times moe_routed_scaling_factor; LFM2-MoE: in the model dtype, + 1e-6, times
             routed_scaling_factor, its bias optional (SIGMOID_TOPK_VARIANTS)
    routing, Llama 4: logits = h @ router^T (model dtype); w, e = top-1(logits); w = sigmoid(w) in
             float32, cast to the model dtype; the expert reads h * w and its output is not weighed
             (INPUT_SCALED: y = expert_e(h * w), not w * expert_e(h)); experts [E, H, 2I] / [E, I, H]
             (gate columns, then up columns), read as transposed views (layout "swiglu_t")
    routing, GLM-4.5 (DeepSeek-V3's; MiMo-V2-Flash's): s = sigmoid(h @ router^T) in float32; the k experts of the
             best s + correction bias among the top_groups best groups; w = s of those,
             renormalised where norm_topk_prob, times routed_scaling_factor (float32)
    out    = sum_j w_j * y_e_j;   Qwen2-MoE adds sigmoid(h @ shared_expert_gate^T) * shared_expert(h),
             GLM-4.5 shared_experts(h), Llama 4 shared_expert(h)

Which way a call takes (static per call shape: T the call's tokens, P = T k its pairs), by the
runner's kernels:
  - "triton" (kernels/moe moe_pairs; SiLU SwiGLU and GPT-OSS experts): two launches, the gate_up
    product with the activation fused, then the down product with the combine weight fused, each
    pair's output summed over its k experts. Few pairs (3 P <= E: decode and verify steps of a
    few rows) take the "pair" schedule (a GEMV per pair); more pairs (wide batches and prefills)
    the "expert" schedule (the pairs sorted by expert, each chosen expert's weights streamed once
    per tile of its pairs). No host sync, static shapes: graph safe.
  - "cpp" (CPU; csrc/moe_experts.cpp through moe_pairs): the same two calls; the pairs grouped by
    expert on the host (CPU values: no device to wait for) and each chosen expert's weight applied
    once, in place, to its pairs' rows: every call, whatever T.
  - "torch" (and the C++ backend where its op did not build, or for an activation it lacks): few
    pairs, each pair's chosen weights gathered ([P, 2I, H], [P, H, I]) and applied as batched
    products (read, written and read again); more pairs in a prefill (outside a capture), only the
    experts some token chose, as transformers does (a host sync for which they are:
    `chosen_only`); more pairs in a call of the loop, every expert over all T tokens as batched
    products weighted by the combine weights (0 for the tokens that did not choose an expert):
    every expert's weights read once, E / k times the FLOPs the tokens need, sync-free.
None has been timed on a GPU.
"""
import torch
import torch.nn.functional as F

from ..kernels._backend import cpp_op_available
from ..kernels.moe import activate, group_pairs, moe_pairs
from ._linear import linear

# model_type -> (routing: "softmax_topk" / "topk_softmax" / "sigmoid_groups", whether the top-k
# weights are renormalised: True, or the config field that says, whether they are cast to the
# model dtype before they weigh the experts, the experts' layout: "swiglu" / "swiglu_t" / "gpt_oss")
MOE_FAMILIES = {"mixtral": ("softmax_topk", True, False, "swiglu"),
                "minimax": ("softmax_topk", True, False, "swiglu"),  # MiniMax-Text-01 / M1: Mixtral's routing
                "qwen2_moe": ("softmax_topk", "norm_topk_prob", True, "swiglu"),
                "qwen3_moe": ("softmax_topk", "norm_topk_prob", True, "swiglu"),
                "gpt_oss": ("topk_softmax", False, True, "gpt_oss"),
                "glm4_moe": ("sigmoid_groups", "norm_topk_prob", False, "swiglu"),
                "exaone_moe": ("sigmoid_groups", "norm_topk_prob", False, "swiglu"),
                "solar_open": ("sigmoid_groups", "norm_topk_prob", False, "swiglu"),
                "olmoe": ("softmax_topk", "norm_topk_prob", True, "swiglu"),
                "flex_olmo": ("softmax_topk", "norm_topk_prob", True, "swiglu"),  # FlexOlmo: OLMoE's router
                # Cohere 2 MoE: the top k of the model-dtype logits, then softmax in float32 or (expert_selection_fn
                # "sigmoid": ROUTING_BY_FIELD) their sigmoids over their sum where norm_topk_prob, cast to the model
                # dtype; shared experts summed with the routed output or averaged (shared_expert_combination_strategy)
                "cohere2_moe": ("topk_softmax_f32", "norm_topk_prob", True, "swiglu"),
                # Phi-3.5-MoE: sparsemixer's eval path -- two experts, each the max of the model-dtype logits left
                # after masking those more than 2 router_jitter_noise (relative) below it, weighed by its softmax
                # over the survivors, the second with the first masked out (MoE._sparsemixer)
                "phimoe": ("sparsemixer", False, True, "swiglu"),
                "qwen3_next": ("softmax_topk", "norm_topk_prob", True, "swiglu"),  # Qwen2-MoE's gated shared expert
                "qwen3_5_moe_text": ("softmax_topk", True, True, "swiglu"),  # Qwen3.5's: always renormalised
                # MiniMax-M2: sigmoid scores of the model-dtype logits, the top k by score + correction bias (the
                # block's), the scores renormalised; no groups, no scaling factor
                "minimax_m2": ("sigmoid_topk", True, False, "swiglu"),
                # Hy3 (hy_v3: tencent/Hy3-preview): MiniMax-M2's choice on float32 logits of its float32 router, the
                # scores over their sum (+ 1e-20) times router_scaling_factor; an ungated shared MLP added in
                # float32 where enable_moe_fp32_combine (MoE.fp32_combine)
                "hy_v3": ("sigmoid_topk_scaled", True, False, "swiglu"),
                # ERNIE 4.5: softmax of float32 logits, the top k by probability + correction bias, the chosen
                # probabilities over their sum (at least moe_norm_min), cast to the model dtype; shared experts
                "ernie4_5_moe": ("softmax_biased", True, True, "swiglu"),
                # the MLA families (runners/paged_mla.py): DeepSeek-V3 routes as GLM-4.5 does (its source);
                # DeepSeek-V2 by softmax, greedy or group-limited (topk_method), never renormalised
                "deepseek_v2": ("softmax_groups", False, False, "swiglu"),
                "deepseek_v3": ("sigmoid_groups", "norm_topk_prob", False, "swiglu"),
                "kimi_linear": ("sigmoid_groups", "norm_topk_prob", False, "swiglu"),  # Kimi Linear: DeepSeek-V3's
                "glm4_moe_lite": ("sigmoid_groups", "norm_topk_prob", False, "swiglu"),
                "deepseek_v32": ("sigmoid_groups", "norm_topk_prob", False, "swiglu"),  # V3's MoE (its modeling code's)
                "glm_moe_dsa": ("sigmoid_groups", "norm_topk_prob", False, "swiglu"),  # GLM-5: V3.2's
                "axk1": ("sigmoid_groups", "norm_topk_prob", False, "swiglu"),  # A.X-K1: V3's (its block's output normed)
                # Llama 4 (Scout 16E, Maverick 128E): the top-1 logit's sigmoid scales the expert's input
                # (INPUT_SCALED); an ungated shared expert; experts stored [E, H, 2I] / [E, I, H]
                "llama4_text": ("topk_sigmoid", False, True, "swiglu_t"),
                # HunYuan-A13B: softmax of the router's logits (its weight's dtype) in float32, the top k renormalised,
                # cast to the router's dtype; an ungated shared MLP as wide as an expert
                "hunyuan_v1_moe": ("softmax_topk", True, True, "swiglu"),
                # dots.llm1: GLM-4.5's routing (its source), the router and correction bias in float32
                "dots1": ("sigmoid_groups", "norm_topk_prob", False, "swiglu"),
                # Nemotron-H's MoE blocks (Nemotron 3 Nano): GLM-4.5's routing (op for op), ungated experts
                # down(act(up x)) (act: mlp_hidden_act, relu^2) and shared MLP, an optional latent projection
                # around the experts (fc1_latent_proj / fc2_latent_proj)
                "nemotron_h": ("sigmoid_groups", "norm_topk_prob", False, "ungated"),
                # Granite 4.0-H Tiny / Small (granitemoehybrid): softmax over the top-k float32 logits of the
                # model-dtype router product, cast to the model dtype (GraniteMoeHybridTopKRouter)
                "granitemoehybrid": ("topk_softmax_f32", False, True, "swiglu"),
                "granitemoe": ("topk_softmax_f32", False, True, "swiglu"),  # Granite 3 MoE's router: the same ops
                "granitemoeshared": ("topk_softmax_f32", False, True, "swiglu"),  # the same (its shared MLP: paged_llama)
                "granitemoe_swa": ("topk_softmax_f32", False, True, "swiglu"),
                # AFMoE (Arcee Trinity): MiniMax-M2's choice (the block's expert_bias), the scores over their sum
                # + 1e-20 times route_scale (float32); shared experts
                "afmoe": ("sigmoid_topk", True, False, "swiglu"),
                # Laguna: MiniMax-M2's choice on tanh-capped logits where moe_router_logit_softcapping is set, the
                # scores over their sum cast to the model dtype; the experts' sum times moe_routed_scaling_factor;
                # shared experts
                "laguna": ("sigmoid_topk", True, True, "swiglu"),
                # MiMo-V2-Flash: DeepSeek-V3's MoE without shared experts (its router in float32)
                "mimo_v2_flash": ("sigmoid_groups", "norm_topk_prob", False, "swiglu"),
                # Jamba: softmax of the model-dtype logits in float32, the top k not renormalised, cast to the model
                # dtype (JambaTopKRouter)
                "jamba": ("softmax_topk", False, True, "swiglu"),
                # LFM2-MoE: MiniMax-M2's choice in the model dtype (the block's expert_bias where use_expert_bias),
                # over their sum + 1e-6 where norm_topk_prob, times routed_scaling_factor
                "lfm2_moe": ("sigmoid_topk", "norm_topk_prob", True, "swiglu"),
                # Kolibri-1: the top k by float32 logit + the block's correction bias (not by score), the chosen
                # logits' sigmoids over their sum where norm_topk_prob (float32); shared experts added in full
                "kolibri1": ("sigmoid_topk", "norm_topk_prob", False, "swiglu"),
                # Flint: the top k of the float32 logits' sigmoids with no correction bias, over their sum where
                # norm_topk_prob (float32); a shared expert added without a gate (SHARED_WITHOUT_GATE)
                "flint": ("sigmoid_topk", "norm_topk_prob", False, "swiglu")}
# The sigmoid_topk families' departures from MiniMax-M2's router (config fields, None: none): logit_cap a tanh
# soft-cap on the logits (0: none); sum_eps the epsilon added to the chosen scores' sum; weight_scale a factor on
# the weights; output_scale a factor on the experts' summed output, before the shared MLP's is added; model_dtype:
# the scores in the model dtype (not float32); bias_field: the config flag without which there is no correction
# bias (the top k of the scores alone); unbiased: never one; fp32_logits: the logits the float32 product of h and the
# router (a float32 router under a bf16 model: Flint's); choose_on_logits: the top k by logit + bias, not by score
SIGMOID_TOPK_VARIANTS = {"afmoe": dict(sum_eps=1e-20, weight_scale="route_scale"),
                         "laguna": dict(logit_cap="moe_router_logit_softcapping", output_scale="moe_routed_scaling_factor"),
                         "lfm2_moe": dict(sum_eps=1e-6, weight_scale="routed_scaling_factor", model_dtype=True,
                                          bias_field="use_expert_bias"),
                         "kolibri1": dict(fp32_logits=True, choose_on_logits=True),
                         "flint": dict(fp32_logits=True, unbiased=True)}
# The families whose shared_expert is added in full, without Qwen2-MoE's shared_expert_gate
SHARED_WITHOUT_GATE = ("flint",)
# The families whose config field chooses their routing: model_type -> (field, {value: routing kind})
ROUTING_BY_FIELD = {"cohere2_moe": ("expert_selection_fn", {"softmax": "topk_softmax_f32", "sigmoid": "topk_sigmoid_sum"})}
# The config field naming the experts' activation where it is not hidden_act
ACT_FIELD = {"nemotron_h": "mlp_hidden_act"}
# The families whose experts' activation is fixed by their code (their configs name none): LFM2-MoE's F.silu
FIXED_ACT = {"lfm2_moe": "silu"}
# The families whose chosen expert reads its token times the routing weight (and whose output is not
# weighed): transformers' Llama4TextMoe. With one expert per token that is the token's input scaled
# once, then the experts at weight 1; more than one would need an input per pair (refused: moe_reason).
INPUT_SCALED = ("llama4_text",)
SOFTMAX_GROUP_METHODS = ("greedy", "group_limited_greedy")  # DeepSeek-V2's topk_method values
BIASED_ROUTINGS = ("sigmoid_groups", "sigmoid_topk", "sigmoid_topk_scaled", "softmax_biased")  # the routings that choose with a correction bias
SHARED = ("shared_expert", "shared_experts", "shared_mlp")  # Qwen2-MoE's (gated), GLM-4.5's, HunYuan's; Nemotron-H's ungated
LATENT = ("fc1_latent_proj", "fc2_latent_proj")  # Nemotron-H's: into the experts' width and back
# The families whose one shared MLP is as wide as a routed expert (their configs give no width of its own)
SHARED_AS_WIDE = ("llama4_text", "hunyuan_v1_moe")
# The families whose experts are intermediate_size wide whatever moe_intermediate_size says (transformers' HunYuan)
EXPERTS_OF_INTERMEDIATE_SIZE = ("hunyuan_v1_moe",)


def moe_or_mlp(layer, h: torch.Tensor, prefilling: bool) -> torch.Tensor:
    """A decoder layer's feed-forward of h [T, H] -> [T, H] (a tensor-parallel rank's partial): its MoE block
    (layer.moe, not None) or its gated MLP down(act(gate h) * up h) (layer.gate / up / down: (weight, bias), layer.act)
    -- the hybrid runners' layers (Qwen3-Next, Jamba, Kimi Linear)."""
    if layer.moe is not None:
        return layer.moe(h, prefilling)
    return linear(layer.act(linear(h, *layer.gate)) * linear(h, *layer.up), *layer.down)


def moe_or_gated_mlp(mlp, config, kernels: str) -> tuple:
    """A decoder layer's feed-forward module -> (its MoE, None, None) for a sparse MoE block, else (None, its gated
    MLP's gate / up / down (weight, bias) pairs, its act_fn): what moe_or_mlp and the runners' loops read (a
    tensor-parallel rank's from its shards: sharding_moe.layer_mlp)."""
    from ._layer_math import linear_params

    if is_moe(mlp):
        return MoE(mlp, config, kernels), None, None
    return None, linear_params(mlp.gate_proj, mlp.up_proj, mlp.down_proj), mlp.act_fn


def is_moe(mlp) -> bool:
    """Whether a decoder layer's mlp is a sparse MoE block (a router and 3-D `experts`: gated gate_up_proj, or
    Nemotron-H's ungated up_proj)."""
    experts = getattr(mlp, "experts", None)
    return experts is not None and any(isinstance(getattr(experts, name, None), torch.nn.Parameter)
                                       for name in ("gate_up_proj", "up_proj"))


def _router(mlp):
    """The block's router module (`gate`; GPT-OSS: `router`; HunYuan's gate holds it as `wg`)."""
    router = getattr(mlp, "gate", None)
    router = router if router is not None else getattr(mlp, "router", None)
    if isinstance(getattr(router, "gate", None), torch.nn.Linear):  # AFMoE's router module holds it as `gate`
        return router.gate
    return getattr(router, "wg", router)


def _correction(mlp):
    """A router's correction bias ([E], ERNIE's [1, E]): on the router (GLM-4.5's and DeepSeek-V3's gate), in
    its moe_statics (ERNIE 4.5's), or on the block (MiniMax-M2's mlp.e_score_correction_bias, AFMoE's
    mlp.expert_bias); None where there is none."""
    router = _router(mlp)
    for owner in (router, getattr(router, "moe_statics", None), mlp):
        for name in ("e_score_correction_bias", "expert_bias"):
            bias = getattr(owner, name, None)
            if bias is not None:
                return bias
    return None


def top_k_of(config, layer: int | None = None) -> int:
    """Experts a token: num_experts_per_tok, or HunYuan's moe_topk -- an int, or one per layer (Hunyuan-A13B's
    config lists [8] * 32; transformers' HunYuanMoEV1Gate reads moe_topk[layer_idx]), of layer ``layer``."""
    top_k = getattr(config, "num_experts_per_tok", None)
    top_k = top_k if top_k is not None else config.moe_topk
    if isinstance(top_k, (list, tuple)):
        if layer is None:
            raise ValueError(f"moe_topk {top_k!r} lists one value per layer: the layer's index is needed")
        return int(top_k[layer])
    return int(top_k)


def input_scaling_reason(config) -> str | None:
    """Why a family whose experts read their input scaled (INPUT_SCALED) routes more than one expert a token
    (each pair would need its own input), or None."""
    if config.model_type in INPUT_SCALED and int(config.num_experts_per_tok) != 1:
        return (f"num_experts_per_tok {config.num_experts_per_tok}: {config.model_type}'s experts read their input "
                "scaled by the routing weight, which runners/_moe.py applies for one expert per token")
    return None


def moe_reason(mlp, config) -> str | None:
    """Why a MoE block is not one this module runs (a routing it does not know, tensors that are not
    the plain ones it reads), or None."""
    family = MOE_FAMILIES.get(getattr(config, "model_type", None))
    if family is None:
        return f"mixture-of-experts routing of model_type {config.model_type!r} is not one of {tuple(MOE_FAMILIES)}"
    experts, router = mlp.experts, _router(mlp)
    weight = getattr(router, "weight", None)
    if not isinstance(weight, torch.Tensor) or weight.dim() != 2:
        return f"the MoE router {type(router).__name__} has no [experts, hidden] weight"
    for name in ("up_proj" if family[3] == "ungated" else "gate_up_proj", "down_proj"):
        tensor = getattr(experts, name, None)
        if not isinstance(tensor, torch.Tensor) or tensor.dim() != 3 or not tensor.is_floating_point():
            return f"the MoE experts' {name} is not a float [experts, out, in] tensor"
    biased = getattr(experts, "gate_up_proj_bias", None) is not None
    if family[3].startswith("swiglu") and (biased or getattr(experts, "has_bias", False)):
        return "MoE experts with biases"
    reason = input_scaling_reason(config)
    if reason is not None:
        return reason
    if (getattr(mlp, "shared_expert", None) is not None and config.model_type not in INPUT_SCALED + SHARED_WITHOUT_GATE
            and not isinstance(getattr(mlp, "shared_expert_gate", None), torch.nn.Linear)):
        return "a shared expert without a shared_expert_gate"
    variant = SIGMOID_TOPK_VARIANTS.get(config.model_type, {})
    bias_field = variant.get("bias_field")
    if (family[0] in BIASED_ROUTINGS and not variant.get("unbiased") and not isinstance(_correction(mlp), torch.Tensor)
            and (bias_field is None or getattr(config, bias_field))):
        return f"a {family[0]} router without its e_score_correction_bias"
    if config.model_type in ROUTING_BY_FIELD:
        field, kinds = ROUTING_BY_FIELD[config.model_type]
        if getattr(config, field, None) not in kinds:
            return f"{field} {getattr(config, field, None)!r} is not one of {tuple(kinds)}"
    if family[0] == "sparsemixer" and getattr(config, "num_experts_per_tok", None) != 2:
        return f"sparsemixer routing takes 2 experts a token (its code's), the config asks {config.num_experts_per_tok}"
    if family[0] == "softmax_groups" and getattr(config, "topk_method", None) not in SOFTMAX_GROUP_METHODS:
        return f"topk_method {getattr(config, 'topk_method', None)!r} is not one of {SOFTMAX_GROUP_METHODS}"
    return None


def layers_moe_reason(mlps, config) -> str | None:
    """moe_reason of the first of the decoder layers' MLP blocks (``mlps``, in layer order) that is a MoE block and
    not one this module runs, named by its layer; None when every one is."""
    for i, mlp in enumerate(mlps):
        reason = moe_reason(mlp, config) if is_moe(mlp) else None
        if reason is not None:
            return f"layer {i}: {reason}"
    return None


def module_params(mlp) -> dict:
    """A transformers MoE block's tensors by their names under the block (its state_dict's: the
    names a tensor-parallel rank's shards use too): gate.weight (GPT-OSS: router.weight / .bias),
    experts.gate_up_proj / down_proj (GPT-OSS: also their _bias), Qwen2-MoE's
    shared_expert.{gate,up,down}_proj.weight and shared_expert_gate.weight; GLM-4.5's
    gate.e_score_correction_bias and shared_experts.{gate,up,down}_proj.weight."""
    name = "gate" if getattr(mlp, "gate", None) is not None else "router"
    router = _router(mlp)
    params = {f"{name}.weight": router.weight, f"{name}.bias": getattr(router, "bias", None),
              f"{name}.e_score_correction_bias": _correction(mlp)}
    for tensor in ("gate_up_proj", "up_proj", "down_proj", "gate_up_proj_bias", "down_proj_bias"):
        params[f"experts.{tensor}"] = getattr(mlp.experts, tensor, None)
    for prefix in SHARED:
        shared = getattr(mlp, prefix, None)
        for proj in ("gate_proj", "up_proj", "down_proj") if shared is not None else ():
            module = getattr(shared, proj, None)  # an ungated shared MLP (Nemotron-H's) has no gate_proj
            if module is not None:
                params[f"{prefix}.{proj}.weight"], params[f"{prefix}.{proj}.bias"] = module.weight, module.bias
    for latent in LATENT:  # Nemotron-H's latent projection around the experts (an nn.Identity where none)
        module = getattr(mlp, latent, None)
        if isinstance(module, torch.nn.Linear):
            params[f"{latent}.weight"], params[f"{latent}.bias"] = module.weight, module.bias
    gate = getattr(mlp, "shared_expert_gate", None)
    params["shared_expert_gate.weight"] = None if gate is None else gate.weight
    return {name: tensor for name, tensor in params.items() if tensor is not None}


class MoE:
    """One layer's router and experts (references to the model's tensors, or views of them: no
    copies). block: a transformers MoE block, or its tensors by name (module_params' names: a
    tensor-parallel rank's shards, the experts' widths this rank's slice of them). layer: the layer's
    index, for a config that lists top-k per layer (a block's router may carry it: HunYuan's)."""

    def __init__(self, block, config, kernels: str = "torch", layer: int | None = None):
        from transformers.activations import ACT2FN

        params = block if isinstance(block, dict) else module_params(block)
        if layer is None and not isinstance(block, dict):  # HunYuan's gate knows its layer (moe_topk per layer)
            layer = getattr(getattr(block, "gate", None), "layer_idx", None)
        self.routing_kind, renorm, self.cast, self.layout = MOE_FAMILIES[config.model_type]
        if config.model_type in ROUTING_BY_FIELD:
            field, kinds = ROUTING_BY_FIELD[config.model_type]
            self.routing_kind = kinds[getattr(config, field)]
        self.renorm = bool(getattr(config, renorm)) if isinstance(renorm, str) else renorm
        router = "gate" if "gate.weight" in params else "router"
        self.router, self.router_bias = params[f"{router}.weight"], params.get(f"{router}.bias")  # [E, H], [E] or None
        self.top_k = top_k_of(config, layer)
        self.scale_input = config.model_type in INPUT_SCALED
        variant = SIGMOID_TOPK_VARIANTS.get(config.model_type, {}) if self.routing_kind == "sigmoid_topk" else {}
        if self.routing_kind in BIASED_ROUTINGS:  # [E] (ERNIE's [1, E]); None: a family without it (bias_field, unbiased)
            correction = None if variant.get("unbiased") else params.get(f"{router}.e_score_correction_bias")
            if correction is None and not variant.get("unbiased") and not (
                    "bias_field" in variant and not getattr(config, variant["bias_field"])):
                raise KeyError(f"{router}.e_score_correction_bias")
            self.correction = None if correction is None else correction.float()
        if self.routing_kind == "softmax_biased":
            self.norm_min = float(config.moe_norm_min)
        if self.routing_kind == "sparsemixer":  # Phi-3.5-MoE
            self.jitter_eps = float(config.router_jitter_noise)
        if self.routing_kind == "sigmoid_topk_scaled":  # Hy3
            self.routed_scale = float(config.router_scaling_factor)
        # SIGMOID_TOPK_VARIANTS' departures (None: none)
        cap, weight_scale, output_scale = (variant.get(k) for k in ("logit_cap", "weight_scale", "output_scale"))
        self.logit_cap = (float(getattr(config, cap) or 0.0) or None) if cap else None  # 0: no cap
        self.sum_eps, self.model_dtype = variant.get("sum_eps"), variant.get("model_dtype", False)
        self.fp32_logits, self.choose_on_logits = variant.get("fp32_logits", False), variant.get("choose_on_logits", False)
        self.weight_scale = float(getattr(config, weight_scale)) if weight_scale else None
        self.output_scale = float(getattr(config, output_scale)) if output_scale else None
        # Hy3: the routed and shared outputs summed in float32, then cast (its enable_moe_fp32_combine)
        self.fp32_combine = bool(getattr(config, "enable_moe_fp32_combine", False))
        # Cohere 2 MoE's "average": (routed + shared) / 2
        self.shared_average = getattr(config, "shared_expert_combination_strategy", "sum") == "average"
        if self.routing_kind == "sigmoid_groups":  # GLM-4.5 (DeepSeek-V3's routing): float32 throughout
            self.groups, self.top_groups = int(config.n_group), int(config.topk_group)
            self.routed_scale = float(config.routed_scaling_factor)
        if self.routing_kind == "softmax_groups":  # DeepSeek-V2: float32 throughout
            self.group_limited = config.topk_method == "group_limited_greedy"
            self.groups, self.top_groups = (int(config.n_group), int(config.topk_group)) if self.group_limited else (1, 1)
            self.routed_scale = float(config.routed_scaling_factor)
        gate_up, down = params.get("experts.gate_up_proj", params.get("experts.up_proj")), params["experts.down_proj"]
        act_name = FIXED_ACT.get(config.model_type) or getattr(config, ACT_FIELD.get(config.model_type, "hidden_act"))
        act = ACT2FN[act_name]
        self.gate_up_bias, self.down_bias = params.get("experts.gate_up_proj_bias"), params.get("experts.down_proj_bias")
        if self.layout == "gpt_oss":  # [E, H, 2I] / [E, I, H] as the [E, out, in] views the products read
            self.gate_up, self.down = gate_up.transpose(1, 2), down.transpose(1, 2)
            self.alpha, self.limit = float(config.swiglu_alpha), float(config.swiglu_limit)
            self.act = None
        elif self.layout == "swiglu_t":  # Llama 4: the same storage, gate / up in halves (SwiGLU's)
            self.gate_up, self.down, self.act = gate_up.transpose(1, 2), down.transpose(1, 2), act
        else:  # "swiglu": gate_up [E, 2I, H]; "ungated": up [E, I, H] under the same name
            self.gate_up, self.down, self.act = gate_up, down, act
        # kernels/moe's activation for these experts; None: one it does not fuse (the torch products then): SwiGLU,
        # GPT-OSS's, and Nemotron-H's ungated relu^2 (relu2; an ungated expert of another activation stays torch)
        if self.layout == "ungated":
            fused = "relu2" if act_name == "relu2" else None
        else:
            fused = "gpt_oss" if self.layout == "gpt_oss" else "silu" if act_name == "silu" else None
        self._bind_experts(fused, kernels)
        prefix = next((p for p in SHARED if f"{p}.up_proj.weight" in params), None)
        projections = ("gate_proj", "up_proj", "down_proj")
        self.shared = None if prefix is None else (  # (gate or None (ungated), up, down), act, the gate's weight or None
            [(params[f"{prefix}.{p}.weight"], params.get(f"{prefix}.{p}.bias")) if f"{prefix}.{p}.weight" in params
             else None for p in projections], act, params.get("shared_expert_gate.weight"))
        self.latent = tuple((params[f"{name}.weight"], params.get(f"{name}.bias")) for name in LATENT) \
            if f"{LATENT[0]}.weight" in params else None  # ((in), (out)) (weight, bias) or None

    def _bind_experts(self, kernel_act: str | None, kernels: str) -> None:
        """The experts' sizes, kernels/moe's activation for them (None: one it does not fuse) and backend (the
        runner's kernels where they take the activation, else None: the torch products)."""
        self.num_experts = self.gate_up.shape[0]
        self.inter = self.gate_up.shape[1] // (1 if self.layout == "ungated" else 2)
        self.kernel_act = kernel_act
        compiled = kernels == "triton" or (kernels == "cpp" and cpp_op_available("moe_experts"))
        self.kernels = kernels if compiled and kernel_act is not None else None

    @classmethod
    def experts_only(cls, gate_up: torch.Tensor, down: torch.Tensor, top_k: int, act, hidden_act: str,
                     kernels: str = "torch") -> "MoE":
        """The experts of a block whose family routes them itself (Gemma 4's router reads the layer's input, its
        experts another norm of it): mix() only, no routing, no shared expert. gate_up [E, 2I, H] (each expert's
        gate rows, then its up rows), down [E, H, I]; act the activation module, hidden_act its config name
        ("silu": through kernels/moe)."""
        moe = cls.__new__(cls)
        moe.routing_kind, moe.layout, moe.scale_input, moe.shared, moe.latent = None, "swiglu", False, None, None
        moe.output_scale = None
        moe.gate_up, moe.down, moe.act, moe.gate_up_bias, moe.down_bias = gate_up, down, act, None, None
        moe.top_k = int(top_k)
        moe._bind_experts("silu" if hidden_act == "silu" else None, kernels)
        return moe

    def routing(self, h: torch.Tensor):
        """h [T, H] -> (weights [T, k] (float32, or the model dtype: MOE_FAMILIES), experts [T, k] int64)."""
        if self.routing_kind == "sigmoid_groups":
            return self._sigmoid_groups(h)
        if self.routing_kind == "softmax_groups":
            return self._softmax_groups(h)
        if self.routing_kind == "sigmoid_topk":
            return self._sigmoid_topk(h)
        if self.routing_kind == "sigmoid_topk_scaled":
            return self._sigmoid_topk_scaled(h)
        if self.routing_kind == "softmax_biased":
            return self._softmax_biased(h)
        if self.routing_kind == "sparsemixer":
            return self._sparsemixer(h)
        # the router's dtype (HunYuan's may stay float32 under a bf16 model: transformers casts h to it)
        logits = F.linear(h if h.dtype == self.router.dtype else h.to(self.router.dtype), self.router, self.router_bias)
        if self.routing_kind == "topk_sigmoid":  # Llama 4's Llama4Router, op for op
            top, chosen = torch.topk(logits, self.top_k, dim=1)
            return torch.sigmoid(top.float()).to(top.dtype), chosen
        if self.routing_kind == "topk_softmax":
            top, chosen = torch.topk(logits, self.top_k, dim=-1)
            return torch.softmax(top, dim=-1, dtype=top.dtype), chosen
        if self.routing_kind == "topk_softmax_f32":  # Granite 4.0's GraniteMoeHybridTopKRouter, op for op
            top, chosen = torch.topk(logits.float(), self.top_k, dim=-1)
            return torch.softmax(top, dim=-1).type_as(h), chosen
        if self.routing_kind == "topk_sigmoid_sum":  # Cohere 2 MoE's sigmoid router: the model dtype throughout
            top, chosen = torch.topk(logits, self.top_k, dim=-1)
            weights = torch.sigmoid(top)
            weights = weights / weights.sum(dim=-1, keepdim=True) if self.renorm else weights
            return weights.to(h.dtype), chosen
        top, chosen = torch.topk(torch.softmax(logits, dim=-1, dtype=torch.float32), self.top_k, dim=-1)
        if self.renorm:
            top = top / top.sum(dim=-1, keepdim=True)
        return (top.to(logits.dtype) if self.cast else top), chosen  # (HunYuan's: the router's dtype)

    def _sigmoid_groups(self, h: torch.Tensor):
        """GLM-4.5's router (transformers' Glm4MoeTopkRouter, op for op): sigmoid scores of float32
        logits; the choice adds the correction bias and keeps the top_groups groups (of E / groups
        experts) whose two best biased scores sum highest; the weights are the chosen experts'
        unbiased scores, renormalised where norm_topk_prob, times routed_scaling_factor (float32)."""
        scores = F.linear(h.float(), self.router.float()).sigmoid()  # [T, E]
        choice = scores + self.correction
        per_group = choice.view(-1, self.groups, self.num_experts // self.groups)
        group_idx = torch.topk(per_group.topk(2, dim=-1)[0].sum(dim=-1), k=self.top_groups, dim=-1, sorted=False)[1]
        keep = torch.zeros(choice.shape[0], self.groups, dtype=torch.bool, device=h.device).scatter_(1, group_idx, True)
        choice = choice.masked_fill(~keep[:, :, None].expand_as(per_group).reshape(choice.shape), float("-inf"))
        chosen = torch.topk(choice, k=self.top_k, dim=-1, sorted=False)[1]
        weights = scores.gather(1, chosen)
        if self.renorm:
            weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-20)
        return weights * self.routed_scale, chosen

    def _sigmoid_topk(self, h: torch.Tensor):
        """MiniMax-M2's router (transformers' MiniMaxM2TopKRouter, op for op): sigmoid of the logits (the model
        dtype's product, then float32); the top k by score + correction bias; the weights are the chosen
        scores over their sum (float32). SIGMOID_TOPK_VARIANTS' (AfmoeTokenChoiceRouter, LagunaTopKRouter): the
        logits tanh-capped first, an epsilon in the sum, the weights scaled, cast to the model dtype (cast); Kolibri-1's
        and Flint's float32 product (fp32_logits), Kolibri-1's choice by logit + bias (choose_on_logits)."""
        if self.fp32_logits:
            logits = F.linear(h.float(), self.router.float())  # [T, E]
        else:
            logits = F.linear(h, self.router)
            logits = logits if self.model_dtype else logits.float()
        if self.logit_cap is not None:
            logits = torch.tanh(logits / self.logit_cap) * self.logit_cap
        scores = logits.sigmoid()
        ranked = logits if self.choose_on_logits else scores
        choice = ranked if self.correction is None else ranked + self.correction
        chosen = torch.topk(choice, self.top_k, dim=-1, sorted=False)[1]
        weights = scores.gather(1, chosen)
        if self.renorm:
            total = weights.sum(dim=-1, keepdim=True)
            weights = weights / (total if self.sum_eps is None else total + self.sum_eps)
        if self.weight_scale is not None:
            weights = weights * self.weight_scale
        return (weights.to(h.dtype) if self.cast else weights), chosen

    def _sigmoid_topk_scaled(self, h: torch.Tensor):
        """Hy3's router (transformers' HYV3TopKRouter, op for op): sigmoid of the float32 logits of the float32
        router; the top k by score + correction bias; the chosen scores over their sum + 1e-20, times
        router_scaling_factor (float32)."""
        scores = F.linear(h.float(), self.router.float()).sigmoid()  # [T, E]
        chosen = torch.topk(scores + self.correction, self.top_k, dim=-1, sorted=False)[1]
        weights = scores.gather(1, chosen)
        return weights / (weights.sum(dim=-1, keepdim=True) + 1e-20) * self.routed_scale, chosen

    def _sparsemixer(self, h: torch.Tensor):
        """Phi-3.5-MoE's router (transformers' sparsemixer in eval mode, op for op): on the model-dtype logits s, the
        first expert is argmax s, weighed by the softmax of s with every logit j masked out where (max s - s_j) /
        max(|s_j|, max s) > 2 eps; the second is the argmax of s with the first masked, weighed the same way over
        those remaining (the relative gaps still measured against the unmasked |s_j|). -> ([T, 2], [T, 2])."""
        scores = F.linear(h, self.router)  # [T, E], the model dtype

        def pick(candidates):
            top, chosen = candidates.max(dim=-1, keepdim=True)
            masked = candidates.masked_fill((top - scores) / scores.abs().clamp(min=top) > 2 * self.jitter_eps,
                                            float("-inf"))
            return torch.softmax(masked, dim=-1).gather(-1, chosen), chosen

        first_weight, first = pick(scores)
        second_weight, second = pick(torch.scatter(scores, -1, first, float("-inf")))
        return torch.cat((first_weight, second_weight), dim=-1), torch.cat((first, second), dim=-1)

    def _softmax_biased(self, h: torch.Tensor):
        """ERNIE 4.5's router (transformers' Ernie4_5_MoeTopKRouter, op for op): softmax of float32 logits; the top k
        by probability + correction bias; the chosen probabilities over their sum (clamped to moe_norm_min),
        cast to the model dtype."""
        probs = F.softmax(F.linear(h.float(), self.router.float()), dim=1, dtype=torch.float)  # [T, E]
        chosen = torch.topk(probs + self.correction.squeeze(), self.top_k, dim=-1)[1]
        weights = torch.gather(probs, dim=-1, index=chosen)
        weights = weights / torch.clamp(weights.sum(dim=-1, keepdim=True), min=self.norm_min)
        return weights.to(h.dtype), chosen

    def _softmax_groups(self, h: torch.Tensor):
        """DeepSeek-V2's router (transformers' DeepseekV2TopkRouter, op for op): softmax scores of
        float32 logits; "greedy" takes the top k, "group_limited_greedy" first zeroes the experts
        outside the top_groups groups by their best score; the weights are the scores, times
        routed_scaling_factor, not renormalised (float32)."""
        scores = F.linear(h.float(), self.router.float()).softmax(dim=-1, dtype=torch.float32)  # [T, E]
        if self.group_limited:
            per_group = scores.view(-1, self.groups, self.num_experts // self.groups)
            group_idx = torch.topk(per_group.max(dim=-1).values, k=self.top_groups, dim=-1, sorted=False)[1]
            keep = torch.zeros(scores.shape[0], self.groups, dtype=torch.bool, device=h.device).scatter_(1, group_idx, True)
            scores = scores.masked_fill(~keep[:, :, None].expand_as(per_group).reshape(scores.shape), 0.0)
        weights, chosen = torch.topk(scores, k=self.top_k, dim=-1, sorted=False)
        return weights * self.routed_scale, chosen

    def _activate(self, gate_up: torch.Tensor) -> torch.Tensor:
        """[.., 2I] (biases added) -> the experts' activation [.., I]."""
        if self.layout == "gpt_oss":
            return activate(gate_up, "gpt_oss", self.alpha, self.limit)
        if self.layout == "ungated":  # Nemotron-H's: act(up x)
            return self.act(gate_up)
        gate, up = gate_up.chunk(2, dim=-1)
        return self.act(gate) * up

    def _expert(self, x: torch.Tensor, e) -> torch.Tensor:
        """Expert e (an int or a 0-d tensor) over the tokens x [n, H] -> [n, H]."""
        gate_up = F.linear(x, self.gate_up[e], None if self.gate_up_bias is None else self.gate_up_bias[e])
        return F.linear(self._activate(gate_up), self.down[e], None if self.down_bias is None else self.down_bias[e])

    def __call__(self, h: torch.Tensor, prefill: bool = False) -> torch.Tensor:
        """The block's output for h [T, H] (the post-attention norm's), in h's dtype. prefill: the
        runner's prefill forward, which may wait for the device (never under a CUDA graph capture)."""
        weights, chosen = self.routing(h)
        x = h
        if self.scale_input:  # Llama 4: expert_e(h * w) (one expert a token), its output weighed by 1
            x, weights = h * weights, torch.ones_like(weights)
        if self.latent is not None:  # Nemotron-H: the experts in a latent width, the router on h
            x = linear(x, *self.latent[0])
        out = self.mix(x, weights, chosen, prefill)
        if self.latent is not None:
            out = linear(out, *self.latent[1])
        if self.output_scale is not None:  # Laguna: the experts' sum scaled before the shared MLP's is added
            out = out * self.output_scale
        if self.shared is not None:
            (gate, up, down), act, gate_w = self.shared
            inner = act(linear(h, *up)) if gate is None else act(linear(h, *gate)) * linear(h, *up)
            shared = linear(inner, *down)
            shared = shared if gate_w is None else torch.sigmoid(F.linear(h, gate_w)) * shared
            out = (out.float() + shared.float()).to(h.dtype) if self.fp32_combine else out + shared
            out = out / 2 if self.shared_average else out
        return out

    def mix(self, x: torch.Tensor, weights: torch.Tensor, chosen: torch.Tensor, prefill: bool = False) -> torch.Tensor:
        """The chosen experts over x [T, H], each weighed by its routing weight and summed -> [T, H] in x's dtype:
        kernels/moe where it takes the activation; else a few pairs as batched gathered products, a prefill's
        each chosen expert over its tokens (a host sync: never under a CUDA graph capture), a decoding step's every
        expert over every token (no host sync)."""
        if self.kernels is not None:
            return self._kernels(x, weights, chosen)
        if 3 * x.shape[0] * self.top_k <= self.num_experts:
            return self._gathered(x, weights, chosen)
        if prefill and not (x.is_cuda and torch.cuda.is_current_stream_capturing()):
            return self._chosen_only(x, weights, chosen)
        return self._every_expert(x, weights, chosen)

    def _kernels(self, h, weights, chosen, schedule: str | None = None) -> torch.Tensor:
        """kernels/moe's two calls (Triton: schedule None picks by the pair count, the "expert"
        schedule's sort done once for both; C++: grouped on the host)."""
        tokens, hidden = h.shape
        flat = chosen.reshape(-1)
        kw = dict(backend=self.kernels)
        if self.kernels == "triton":
            schedule = schedule or ("pair" if 3 * flat.shape[0] <= self.num_experts else "expert")
            kw.update(schedule=schedule, groups=group_pairs(flat, self.num_experts) if schedule == "expert" else None)
        gated = dict(alpha=self.alpha, limit=self.limit) if self.layout == "gpt_oss" else {}
        act = moe_pairs(h, flat, self.gate_up, pairs_per_token=self.top_k, act=self.kernel_act,
                        bias=self.gate_up_bias, **gated, **kw)
        y = moe_pairs(act, flat, self.down, pairs_per_token=1, scale=weights.reshape(-1), bias=self.down_bias, **kw)
        return y.view(tokens, self.top_k, hidden).sum(1).to(h.dtype)

    def _gathered(self, h, weights, chosen) -> torch.Tensor:
        """Each (token, expert) pair's products: the T k chosen experts' weights gathered and applied
        as batched products."""
        tokens, hidden = h.shape
        flat = chosen.reshape(-1)
        x = h.repeat_interleave(self.top_k, 0)[:, :, None]  # [T k, H, 1]: pair p reads token p // k
        gate_up = torch.bmm(self.gate_up.index_select(0, flat), x)[..., 0]
        if self.gate_up_bias is not None:
            gate_up = gate_up + self.gate_up_bias.index_select(0, flat)
        y = torch.bmm(self.down.index_select(0, flat), self._activate(gate_up)[:, :, None])[..., 0]  # [T k, H]
        if self.down_bias is not None:
            y = y + self.down_bias.index_select(0, flat)
        y = y * weights.reshape(-1, 1)
        return y.view(tokens, self.top_k, hidden).sum(1).to(h.dtype)

    def _chosen_only(self, h, weights, chosen) -> torch.Tensor:
        """transformers' loop: each expert some token chose, over those tokens (a host sync to
        learn which), its output added in the model dtype in expert order."""
        out = torch.zeros_like(h)
        for e in torch.unique(chosen).tolist():
            token, slot = (chosen == e).nonzero(as_tuple=True)
            y = self._expert(h[token], e) * weights[token, slot, None]
            out.index_add_(0, token, y.to(out.dtype))
        return out

    def _every_expert(self, h, weights, chosen) -> torch.Tensor:
        """Each expert over every token as batched products ([E, T, 2I], [E, T, H]: 4 launches,
        not 3 E), weighted by its combine weight (0 where not chosen)."""
        combine = torch.zeros(h.shape[0], self.num_experts, dtype=weights.dtype, device=h.device)
        combine.scatter_add_(1, chosen, weights)  # [T, E]
        gate_up = torch.matmul(h, self.gate_up.transpose(1, 2))  # [E, T, 2I]
        if self.gate_up_bias is not None:
            gate_up = gate_up + self.gate_up_bias[:, None]
        y = torch.bmm(self._activate(gate_up), self.down.transpose(1, 2))  # [E, T, H]
        if self.down_bias is not None:
            y = y + self.down_bias[:, None]
        dtype = torch.promote_types(h.dtype, weights.dtype)
        return torch.einsum("eth,te->th", y.to(dtype), combine.to(dtype)).to(h.dtype)
