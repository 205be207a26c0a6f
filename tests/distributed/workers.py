"""What each rank runs in the tensor-parallel tests (spawned by harness.run_ranks; module-level
functions so that spawn can import them). One spawn of 4 processes serves both world sizes (a
spawned rank costs ~5 s of imports on the 2-core CI box): the 4-rank phases run on the default
group, the 2-rank phases on ranks 0 and 1 (a subgroup) while ranks 2 and 3 wait, and the
failures come last. ``battery`` returns a dict per rank: scenario -> what this rank saw (token
lists, error lines, times); the test compares the ranks and the single process."""
import os
import time

import torch
import torch.distributed as dist

from tests.engine.models import gemma3_multimodal, left_padded_prompts, make_draft, make_model

from .harness import TP_TIMEOUT

MAX_NEW = 10
# (AFMoE: its attention's output gate split as q, each branch's partials summed before its norm, mup's scale on the
# summed lookup, the router's expert_bias whole; Laguna: layers of 4 and 6 query heads each split by its own, a gate
# row a head; MiMo-V2-Flash: each layer by its own KV heads, values narrower than keys split by their width, the
# sliding layer's sinks by heads)
MOE_KINDS = ("mixtral", "qwen2_moe", "qwen3_moe", "gpt_oss", "glm4_moe", "exaone_moe", "solar_open", "hunyuan_v1_moe",
             "dots1", "hy_v3", "afmoe", "laguna", "mimo_v2_flash", "granitemoe", "kolibri1", "flint",
             "cohere2_moe")
# latent attention: heads split, the latent replicated (paged_mla_tp.py); GLM-5's sparse attention (index_topk 8,
# past which the battery's rows run) with its indexers whole on every rank
MLA_KINDS = ("deepseek_v3", "deepseek_v2", "glm_moe_dsa", "youtu",  # Youtu-LLM: latent attention in dense layers
             "axk1")  # A.X-K1: V3's layer, the MoE block's output normed after the ranks' partials are summed
# recurrent layers by heads, each rank its heads' states (OLMo Hybrid: the DeltaNet's projections apart, OLMo 3's
# attention with its whole-projection q/k norms)
# MiniMax: lightning layers by heads (each rank its heads' [H, D, D] states), their output norm's statistics over both
# ranks' heads
# Jamba: Mamba1 layers by channels (each rank its channels' states and windows), x_proj's dt / B / C summed over the
# ranks before their norms
# Kimi Linear: KDA layers by heads, its latent attention as MLA's (heads split, the latent whole)
HYBRID_KINDS = ("qwen3_next", "qwen3_5_text", "olmo_hybrid", "minimax", "jamba", "kimi_linear", "nemotron_h", "falcon_h1")
# q/k norms over the whole projection: their statistics over both ranks' slices (one more all-reduce each)
PROJECTION_NORM_KINDS = ("olmoe", "minimax_m2")
INTERLEAVED_KINDS = ("ernie4_5", "ernie4_5_moe", "helium")  # each rank reorders its heads' q / k columns; the LM head's bias by rows
# OLMo 2 / 3: whole-projection q/k norms (OLMo's op order), each branch's partials summed before its norm; OLMo 3's
# RoPE per layer type
# EXAONE 4.0: OLMo 2's layer, per-head q/k norms whole on each rank; FlexOlmo: OLMo 2's layer with OLMoE's experts
OLMO_KINDS = ("olmo2", "olmo3", "exaone4", "flex_olmo")
# Llama 4: chunked RoPE layers (chunks of 6, crossed), the weightless q/k norm on each rank's heads, interleaved pairs
# reordered per rank, top-1 experts whose input the router scales (every rank's slice alike) and a shared expert
LLAMA4_KINDS = ("llama4_text",)
CHI_VOCAB, CHI_ROWS, CHI_PROMPT, CHI_TEMPERATURE = 12, 2000, [[3, 7, 5, 9]], 0.7


def tiny(kind: str):
    """A random target of ``kind`` (make_model's, or "gemma3_multimodal": Gemma3ForConditionalGeneration, what
    AutoModelForCausalLM loads for Gemma 3 4B-27B) and a draft of it."""
    target = gemma3_multimodal() if kind == "gemma3_multimodal" else make_model(kind)
    target.generation_config.eos_token_id = None
    return target, make_draft(target, noise=0.1)


def chi_square_pair():
    target = make_model("llama", vocab=CHI_VOCAB, init_std=0.5, seed=5)
    target.generation_config.eos_token_id = None
    return target, make_draft(target, noise=0.4, seed=6)


def _cases(specdec_fast, target, draft, ids, mask, cases: dict, group) -> dict:
    """For each case (name -> generate kwargs): (single-process tokens, tensor-parallel tokens)."""
    out = {}
    for name, kw in cases.items():
        kw = dict(dict(assistant_model=draft, max_new_tokens=MAX_NEW, pad_token_id=0), **kw)
        single = specdec_fast.generate(target, ids, mask, **{k: v for k, v in kw.items() if k != "shard_draft"})
        parallel = specdec_fast.generate(target, ids, mask, process_group=group, **kw)
        out[name] = (single.tolist(), parallel.tolist())
    return out


def _failure(fn) -> dict:
    """Runs fn(): the line of the error it raised (None if none) and when it ended."""
    try:
        fn()
    except Exception as exc:  # noqa: BLE001
        return {"error": f"{type(exc).__name__}: {exc}".splitlines()[0], "at": time.time()}
    return {"error": None, "at": time.time()}


def battery(rank: int, world: int, checkpoint: str) -> dict:
    import specdec_fast
    from specdec_fast.pair import load_demo_pair

    assert world == 4
    tokenizer, target, draft = load_demo_pair()
    target.generation_config.eos_token_id = None
    ids = torch.tensor([tokenizer.encode("def binary_search(a, x):\n")])
    res, times, start = {}, {}, time.time()
    pair = dist.new_group([0, 1])  # every rank makes both, in order: a non-local new_group
    other_pair = dist.new_group([2, 3])
    # 4 ranks: the demo pair's 2 KV heads are replicated; Qwen2: 2 KV heads, q/k/v biases, 2 padded rows.
    res["4 ranks"] = _cases(specdec_fast, target, draft, ids, None, {
        "demo greedy": dict(do_sample=False), "demo sampled": dict(do_sample=True, temperature=0.8, seed=12)},
        dist.group.WORLD)
    qwen, qwen_draft = tiny("qwen2")
    pids, pmask = left_padded_prompts([6, 3], seed=4)
    res["4 ranks"].update(_cases(specdec_fast, qwen, qwen_draft, pids, pmask, {
        "qwen2 sampled": dict(do_sample=True, seed=6)}, dist.group.WORLD))
    times["4 ranks"] = time.time() - start
    if rank < 2:
        res["2 ranks"] = _two_ranks(specdec_fast, target, draft, ids, pair, checkpoint)
    times["2 ranks"] = time.time() - start - times["4 ranks"]
    dist.barrier()
    res.update(_errors(specdec_fast, rank, target, draft, ids, pair if rank < 2 else other_pair))
    res["mid-call"] = _mid_call_failure(specdec_fast, rank, target, draft, ids)
    if rank >= 2:
        res["dead rank"] = _dead_rank(specdec_fast, rank, target, draft, ids, other_pair)
    res["times"] = dict(times, total=time.time() - start)
    return res


def _two_ranks(specdec_fast, target, draft, ids, group, checkpoint) -> dict:
    from specdec_fast.drafters.token_tree import TokenTree
    from specdec_fast.runners import ShardedCausalLM

    out = _cases(specdec_fast, target, draft, ids, None, {
        "demo greedy": dict(do_sample=False),
        "demo sampled": dict(do_sample=True, temperature=0.8, top_k=50, seed=11),
        "static greedy": dict(do_sample=False, cuda_graphs="static"),
        "static sampled": dict(do_sample=True, temperature=1.0, top_p=0.9, seed=5, cuda_graphs="static"),
        "sharded draft": dict(do_sample=True, seed=2, shard_draft=True),
        "prompt lookup": dict(assistant_model=None, prompt_lookup_num_tokens=3, do_sample=False),
        "plain": dict(assistant_model=None, do_sample=True, seed=4),
        "tree": dict(do_sample=False, tree=TokenTree.from_branching([2, 2])),
    }, group)
    out.update(_adaptive_k(specdec_fast, target, draft, ids, group))
    out.update(_heads(specdec_fast, target, ids, group))
    pids, pmask = left_padded_prompts([5, 9], seed=1)
    # MHA (heads split); GQA (KV heads split) with q/k/v biases; Mistral's window of 8, which the rows pass;
    # CWM's sliding layers; Ministral 3's query temperature past its threshold (8) and window (12)
    # Cohere: one norm, parallel branches (one all-reduce a layer), Command R+'s per-head q / k norms split by heads;
    # Cohere 2's sliding layers (window 8, passed) and NoPE full ones
    # Ministral's window by layer_types; SmolLM3's NoPE layers (every second one here); Phi-3's fused projections;
    # Granite's four scalars (its residual multiplier scales the summed branch on every rank)
    # Seed-OSS's biases on q/k/v (split), o and the MLP's down (rank 0's partial carries them)
    # Gemma 1 (sqrt(H) on the summed lookup); Gemma 2 (each branch's partials summed before its norm, attention and
    # final-logit soft-caps, sliding layers of 8 that the rows pass); Gemma 3 (per-head q/k norms whole on each rank,
    # a RoPE per layer type), and its multimodal model's text decoder sharded from the whole model; Llama's model
    # under EXAONE 3.x's, InternLM3's and IQuest-Coder's model_types; GLM-4-0414 (interleaved half rotation reordered
    # per rank, fused gate_up_proj split, the post-branch norms after each branch's all-reduce); StarCoder2
    # (LayerNorms, biases split or added by rank 0, a plain MLP); Apertus (an ungated MLP with xIELU); Arcee AFM (an
    # ungated ReLU² MLP); Granite 4.0's dense transformer (shared_mlp's fused input_linear split as Phi-3's gate_up_proj);
    # Gemma 4 (each layer by its own head width, per-layer inputs whole; then KV-sharing layers, a full layer's value its
    # key over one KV head, replicated, double-wide MLPs; the unified decoder of that layout without per-layer inputs)
    for kind in ("llama", "qwen2", "mistral", "cwm", "ministral3", "ministral", "smollm3", "phi3", "granite", "seed_oss",
                 "cohere_qk", "cohere2", "gemma", "gemma2", "gemma3", "gemma3_multimodal", "exaone", "internlm3",
                 "iquestcoder", "glm4", "starcoder2", "apertus", "arcee", "granitemoehybrid", "gemma4_text",
                 "gemma4_shared", "gemma4_unified_text", "vaultgemma"):
        tgt, drf = tiny(kind)
        if kind == "apertus":  # xIELU's parameters away from their inits (each rank reads them whole)
            with torch.no_grad():
                for name, param in tgt.named_parameters():
                    if "act_fn.alpha" in name:
                        param.add_(0.5)
        if kind in ("seed_oss", "glm4", "starcoder2"):  # biases (and GLM-4-0414's post-branch norms) away from their inits
            with torch.no_grad():
                for name, param in tgt.named_parameters():
                    if name.endswith("bias") or "post_self_attn" in name or "post_mlp" in name:
                        param.normal_(1.0 if "layernorm" in name else 0.0, 0.3,
                                      generator=torch.Generator().manual_seed(len(name)))
        out.update({f"{kind} {name}": case for name, case in _cases(specdec_fast, tgt, drf, pids, pmask, {
            "greedy": dict(do_sample=False), "sampled": dict(do_sample=True, temperature=0.9, seed=8)}, group).items()})
        engine = specdec_fast.SpeculativeEngine(tgt, drf, process_group=group, max_batch_size=2, max_seq_len=64,
                                                tp_timeout=TP_TIMEOUT)
        tokens = engine.generate(pids, pmask, do_sample=True, temperature=0.9, seed=8, max_new_tokens=MAX_NEW,
                                 pad_token_id=0)
        out[f"{kind} engine"] = (out[f"{kind} sampled"][0], tokens.tolist())
        out[f"{kind} engine note"] = engine.describe()
    out.update(_rings(specdec_fast, pids, pmask, group))
    # Mixture of experts: every expert split by its width, the router on both ranks alike (Mixtral; Qwen2-MoE's
    # shared expert; Qwen3-MoE; GPT-OSS's biases, interleaved gate / up columns, sinks split by heads; GLM-4.5's
    # grouped sigmoid routing, shared MLP and partial rotary embedding; EXAONE MoE's NoPE full layer; Solar Open)
    # Latent attention (DeepSeek-V3: a query rank, interleaved RoPE, YaRN; V2: complex RoPE, softmax routing): each
    # rank its heads' rows of q_b / kv_b and columns of o_proj, the latent computed whole on both
    # (the hybrid recurrent families: hybrid_battery, a test of its own)
    for kind in MOE_KINDS + MLA_KINDS + PROJECTION_NORM_KINDS + INTERLEAVED_KINDS + OLMO_KINDS + LLAMA4_KINDS:
        tgt, drf = tiny(kind)
        if kind in INTERLEAVED_KINDS:  # ERNIE's biases (q/k/v split, o / down / shared down / LM head's by rank 0 or rows)
            with torch.no_grad():
                for name, param in tgt.named_parameters():
                    if name.endswith("bias"):
                        param.normal_(0, 0.3, generator=torch.Generator().manual_seed(len(name)))
        out.update({f"{kind} {name}": case for name, case in _cases(specdec_fast, tgt, drf, pids, pmask, {
            "greedy": dict(do_sample=False), "sampled": dict(do_sample=True, temperature=0.9, seed=8)}, group).items()})
    out["local norm statistics"] = _local_norm_statistics(specdec_fast, pids, pmask, group)
    # The checkpoints: each rank reads its slices, the ShardedCausalLM is the model (Mixtral's: per-expert tensors).
    pids, pmask = left_padded_prompts([4, 7], seed=2)
    # Phi-3: its fused rows read as this rank's rows of each part; Qwen3-Next: the DeltaNet's grouped rows and
    # convolution channels; Llama 4 in Meta's multimodal layout (its text decoder under language_model.); Gemma 3's
    # multimodal checkpoint as transformers saves it (model.language_model., a vision tower beside)
    for kind in ("qwen2", "mixtral", "phi3", "qwen3_next", "llama4_text", "gemma3_multimodal"):
        sharded = ShardedCausalLM.from_pretrained(os.path.join(checkpoint, kind), group, timeout=TP_TIMEOUT)
        full, drf = tiny(kind)
        kw = dict(assistant_model=drf, max_new_tokens=MAX_NEW, pad_token_id=0, do_sample=True, seed=3)
        out[f"{kind} checkpoint"] = (specdec_fast.generate(full, pids, pmask, **kw).tolist(),
                                     specdec_fast.generate(sharded, pids, pmask, **kw).tolist())
        out[f"{kind} shard shapes"] = {name: tuple(t.shape) for name, t in sharded.shards.items() if "layers.0." in name}
    out.update(_mtp(specdec_fast, os.path.join(checkpoint, "glm_mtp"), group, "mtp"))
    out.update(_mtp(specdec_fast, os.path.join(checkpoint, "deepseek_mtp"), group, "deepseek mtp"))
    out.update(_mtp(specdec_fast, os.path.join(checkpoint, "qwen_mtp"), group, "qwen mtp"))
    # CHI_ROWS independent rows (one seed, per-row streams): token 1 is the prefill's (y ~ q),
    # token 2 the first speculative block's (K = 2: an accepted draft, a residual or a bonus).
    chi, chi_draft = chi_square_pair()
    rows = torch.tensor(CHI_PROMPT).expand(CHI_ROWS, -1)
    tokens, stats = specdec_fast.generate(chi, rows, assistant_model=chi_draft, num_assistant_tokens=2, do_sample=True,
                                          temperature=CHI_TEMPERATURE, max_new_tokens=2, seed=123, process_group=group,
                                          return_stats=True)
    out["chi-square"] = (tokens[:, rows.shape[1]:].tolist(), stats.alpha)
    return out


def _local_norm_statistics(specdec_fast, ids, mask, group) -> dict:
    """The control of the whole-projection norms: each rank's statistics over its own slice only (not
    all-reduced) -> {kind: (single-process tokens, such tensor-parallel tokens)} of MiniMax-M2's q/k norms and MiniMax's
    lightning output norm, greedy: they differ."""
    from specdec_fast.kernels.llama_ops.reference import rms_norm_reference
    from specdec_fast.runners.paged_llama_tp import TensorParallelRunner

    real = TensorParallelRunner._projection_norm
    TensorParallelRunner._projection_norm = lambda self, x, weight, eps: rms_norm_reference(x, weight, eps)
    try:
        return {kind: _cases(specdec_fast, *tiny(kind), ids, mask, {"greedy": dict(do_sample=False)}, group)["greedy"]
                for kind in ("minimax_m2", "minimax")}
    finally:
        TensorParallelRunner._projection_norm = real


def _unsummed_mamba(specdec_fast, ids, mask, group) -> tuple:
    """The control of Jamba's Mamba1 layers by channels: each rank's dt / B / C from its own channels' x_proj product
    only (not summed over the ranks) -> (single-process tokens, such tensor-parallel tokens), greedy: they differ."""
    from specdec_fast.runners import paged_jamba_tp

    real = paged_jamba_tp._TPLayer.__init__

    def unsummed(self, *args, **kwargs):
        real(self, *args, **kwargs)
        if self.kind == "linear_attention":
            self.mixer.reduce = lambda t: t

    paged_jamba_tp._TPLayer.__init__ = unsummed
    try:
        return _cases(specdec_fast, *tiny("jamba"), ids, mask, {"greedy": dict(do_sample=False)}, group)["greedy"]
    finally:
        paged_jamba_tp._TPLayer.__init__ = real


def hybrid_battery(rank: int, world: int) -> dict:
    """The hybrid recurrent families on 2 ranks, each rank keeping and rolling back its own heads' (or channels')
    states: {case: (single-process tokens, tensor-parallel tokens)} greedy and sampled -- Qwen3-Next / Qwen3.5 (Gated
    DeltaNet layers by key / value heads, gated attention by heads, Qwen3-Next's MoE with a gated shared expert), OLMo
    Hybrid, MiniMax, Jamba, Kimi Linear, Nemotron-H, Falcon-H1 and the Mamba2 hybrids of _mamba2_hybrids -- and the
    controls (each a (single, spoiled tensor-parallel) pair that must differ): Jamba's unsummed dt / B / C, a shared
    Mamba2 group's per-rank norm statistics."""
    import specdec_fast

    assert world == 2
    group = dist.group.WORLD
    pids, pmask = left_padded_prompts([6, 3], seed=4)
    out = {}
    for kind in HYBRID_KINDS:
        tgt, drf = tiny(kind)
        out.update({f"{kind} {name}": case for name, case in _cases(specdec_fast, tgt, drf, pids, pmask, {
            "greedy": dict(do_sample=False), "sampled": dict(do_sample=True, temperature=0.9, seed=8)}, group).items()})
    out["one mamba2 group"], out["unshared mamba2 norm"] = _one_mamba2_group(specdec_fast, pids, pmask, group)
    out["unsummed mamba"] = _unsummed_mamba(specdec_fast, pids, pmask, group)
    out.update(_mamba2_hybrids(specdec_fast, group))
    return {"2 ranks": out}


def _one_mamba2_group(specdec_fast, ids, mask, group) -> tuple:
    """Nemotron-H with n_groups 1 on 2 ranks: both ranks' heads read the one group's B / C, and its gated norm takes its
    statistics over both ranks' channels -> ((single-process tokens, tensor-parallel tokens): equal; the control: each
    rank's norm over its own channels only -> (single, such tensor-parallel tokens): they differ), greedy."""
    import transformers as tf

    from specdec_fast.runners import mamba2_tp

    config = make_model("nemotron_h").config
    config.n_groups = 1
    torch.manual_seed(2)
    target = tf.AutoModelForCausalLM.from_config(config).float().eval()
    with torch.no_grad():  # the gated norms' weights away from 1 (their initialisation)
        for name, param in target.named_parameters():
            if name.endswith("mixer.norm.weight"):
                param.normal_(1.0, 0.5, generator=torch.Generator().manual_seed(len(name)))
    target.generation_config.eos_token_id = None
    draft = make_draft(target, noise=0.1)
    cases = {"greedy": dict(do_sample=False)}
    shared = _cases(specdec_fast, target, draft, ids, mask, cases, group)["greedy"]
    real = mamba2_tp.group_sum
    mamba2_tp.group_sum = lambda tp, plan: None  # the control: no statistics from the other rank
    try:
        specdec_fast.release_engines(target)
        unshared = _cases(specdec_fast, target, draft, ids, mask, cases, group)["greedy"]
    finally:
        mamba2_tp.group_sum = real
    return shared, unshared


def _mamba2_hybrids(specdec_fast, group) -> dict:
    """Granite 4.0-H Tiny's layers (Mamba2 layers of one group, so the two ranks share it; 8 experts beside its shared
    MLP, which is wider than its intermediate_size, the experts'), Bamba (RoPE on half of each head) and Nemotron 3's MoE blocks
    (ungated experts in a latent width, a shared MLP), greedy and sampled, and a dense Granite 4.0 of those widths,
    greedy: {case: (single-process tokens, tensor-parallel tokens)}."""
    from tests.engine.test_paged_granite_hybrid import VOCAB, tiny_granite_hybrid
    from tests.engine.test_paged_nemotron_h import tiny_nemotron_h

    ids, mask = left_padded_prompts([6, 3], vocab=VOCAB, seed=5)
    out = {}
    for name, target in (("granite 4.0-h", tiny_granite_hybrid("h_tiny", mamba_n_groups=1)),
                         ("bamba", tiny_granite_hybrid("bamba")), ("nemotron 3 moe", tiny_nemotron_h(kind="moe_latent"))):
        out.update({f"{name} {case}": tokens for case, tokens in _cases(
            specdec_fast, target, make_draft(target, noise=0.1), ids, mask,
            {"greedy": dict(do_sample=False), "sampled": dict(do_sample=True, temperature=0.9, seed=4)}, group).items()})
    # Granite 4.0's dense transformer (the Llama runner) with its MLP's width apart from intermediate_size: the plan
    # read intermediate_size for it before (other tokens then)
    dense = tiny_granite_hybrid("rope", num_local_experts=0, layer_types=["full_attention"] * 4)
    out["granite 4.0 dense greedy"] = _cases(specdec_fast, dense, make_draft(dense, noise=0.1), ids, mask,
                                             {"greedy": dict(do_sample=False)}, group)["greedy"]
    return out


def _rigged_choose(self, remaining=None):
    """Rank 1's schedule, rigged: always the smallest K (as a rank with other timings might choose), counted as
    AdaptiveK.choose counts its choice."""
    k = self.ks[0]
    self.chosen[k] += 1
    self.drafted_steps += k
    return k


def _adaptive_k(specdec_fast, target, draft, ids, group) -> dict:
    """The adaptive K schedule under tensor parallelism: every rank runs rank 0's choices
    (distributed/k_leader.py). Rank 1's schedule is rigged to choose K = 1 whenever asked (as a rank with
    other timings might) while rank 0's starts at 4: had rank 1 run its own choices, the ranks would part
    (different collectives). A greedy call without a K runs the constant K; a sampled call naming the
    schedule runs rank 0's Ks on both ranks (its tokens then follow the choices: compared between the
    ranks, not with a single process's constant K)."""
    from specdec_fast.engine.schedule import AdaptiveK

    rank, out, choose = dist.get_rank(), {}, AdaptiveK.choose
    kw = dict(assistant_model=draft, max_new_tokens=MAX_NEW, pad_token_id=0)
    single_greedy = specdec_fast.generate(target, ids, do_sample=False, **kw)
    single_adaptive = specdec_fast.generate(target, ids, do_sample=False, num_assistant_tokens_schedule="adaptive", **kw)
    if rank == 1:
        AdaptiveK.choose = _rigged_choose
    try:
        greedy, greedy_stats = specdec_fast.generate(target, ids, do_sample=False, process_group=group,
                                                     return_stats=True, **kw)
        adaptive, adaptive_stats = specdec_fast.generate(target, ids, do_sample=False, process_group=group,
                                                         num_assistant_tokens_schedule="adaptive", return_stats=True,
                                                         **kw)
        sampled, sampled_stats = specdec_fast.generate(target, ids, do_sample=True, seed=9, process_group=group,
                                                       num_assistant_tokens_schedule="adaptive", return_stats=True, **kw)
    finally:
        AdaptiveK.choose = choose
    out["adaptive greedy"] = (single_greedy.tolist(), greedy.tolist())
    out["adaptive schedule greedy"] = (single_adaptive.tolist(), adaptive.tolist())
    out["adaptive sampled tokens"] = sampled.tolist()
    out["adaptive K under TP"] = [(None if s.schedule is None else s.schedule["chosen"], s.mean_k,
                                   s.extra["tensor_parallel"]["k_schedule"])
                                  for s in (greedy_stats, adaptive_stats, sampled_stats)]
    return out


def _rings(specdec_fast, ids, mask, group) -> dict:
    """The windowed layers on a ring cache on every rank (ring_chunk lowered to 3 so that the rings,
    one block of 16, are smaller than these rows of up to 9 + 10 + 5 tokens: the prompt prefilled in
    chunks): Mistral's window of 8 on every layer, CWM's sliding layers beside a full one."""
    from specdec_fast.runners.paged_base import PagedRunnerBase

    out, chunk = {}, PagedRunnerBase.ring_chunk
    PagedRunnerBase.ring_chunk = 3
    try:
        for kind in ("mistral", "cwm"):
            tgt, drf = tiny(kind)
            out.update({f"{kind} ring {name}": case for name, case in _cases(specdec_fast, tgt, drf, ids, mask, {
                "greedy": dict(do_sample=False), "sampled": dict(do_sample=True, temperature=0.9, seed=8)},
                group).items()})
            engine = specdec_fast.SpeculativeEngine(tgt, drf, process_group=group, max_batch_size=2, max_seq_len=32,
                                                    tp_timeout=TP_TIMEOUT)
            out[f"{kind} ring layers"] = engine.target_runner._ring_layers
    finally:
        PagedRunnerBase.ring_chunk = chunk
    return out


def _mtp(specdec_fast, path, group, label: str) -> dict:
    """A target's own MTP layer (GLM-4.5's or DeepSeek-V3's model.layers.{L}, Qwen3-Next's mtp.*): each rank reads
    its slices of it from the checkpoint (heads split, every expert by its width) and drafts with them, on a model
    loaded whole (greedy; sampled at K = 2) and on a ShardedCausalLM read from the same checkpoint
    (DeepSeek-V3's: the target's latent attention split by heads, read as slices too)."""
    import transformers as tf

    from specdec_fast.heads.mtp import mtp_head
    from specdec_fast.runners import ShardedCausalLM
    from tests.engine.mtp_models import LAYERS

    model = tf.AutoModelForCausalLM.from_pretrained(path).eval()
    model._keys_to_ignore_on_load_unexpected = [rf"model\.layers\.{LAYERS}\..*"]  # the single process's MtpModel
    ids, mask = left_padded_prompts([4, 7], seed=3)
    sampled = dict(use_mtp=True, num_assistant_tokens=2, do_sample=True, seed=5)
    out = {f"{label} {name}": case for name, case in _cases(specdec_fast, model, None, ids, mask, {
        "greedy": dict(use_mtp=True, do_sample=False), "sampled": sampled}, group).items()}
    sharded = ShardedCausalLM.from_pretrained(path, group, timeout=TP_TIMEOUT)
    kw = dict(sampled, max_new_tokens=MAX_NEW, pad_token_id=0)
    tokens, stats = specdec_fast.generate(sharded, ids, mask, return_stats=True, **kw)
    out[f"{label} checkpoint"] = (specdec_fast.generate(model, ids, mask, **kw).tolist(), tokens.tolist())
    out[f"{label} alpha"] = stats.alpha
    engine = specdec_fast.SpeculativeEngine(sharded, draft_head=mtp_head(sharded, tensor_parallel=True),
                                            max_batch_size=2, max_seq_len=32)
    runner = engine.draft_runner  # this rank's slices: its query heads and its columns of every expert
    out[f"{label} runner"] = (type(runner).__name__, runner.num_heads, tuple(runner.layers[0].moe.gate_up.shape),
                              type(engine.target_runner).__name__)
    out[f"{label} shard shapes"] = {name: tuple(t.shape) for name, t in sharded.shards.items() if "layers.1.self_attn" in name}
    return out


def _heads(specdec_fast, target, ids, group) -> dict:
    """Draft heads over a sharded target: each rank runs the head whole on the hidden states its
    runner captures (the residual stream, whole on every rank after each all-reduce). The demo
    pair's EAGLE-3 head (greedy, seeded sampling, a tree) and a random DFlash block drafter (under the
    adaptive schedule both ranks run rank 0's Ks, either drafter: rank 1's rigged choice would part the ranks), on a target
    loaded whole on every rank and on a ShardedCausalLM (the head's embedding / LM head gathered
    from the ranks' vocabulary rows)."""
    from importlib.resources import files

    from specdec_fast.drafters.token_tree import TokenTree
    from specdec_fast.engine.schedule import AdaptiveK
    from specdec_fast.heads import load_draft_head
    from specdec_fast.runners import ShardedCausalLM
    from tests.engine.heads import random_dflash

    eagle3 = str(files("specdec_fast") / "assets" / "pair" / "eagle3")
    dflash = random_dflash(target, block_size=4)
    out = _cases(specdec_fast, target, None, ids, None, {
        "eagle3 greedy": dict(draft_head=eagle3, do_sample=False),
        "eagle3 sampled": dict(draft_head=eagle3, do_sample=True, temperature=0.8, seed=13),
        "eagle3 tree": dict(draft_head=eagle3, do_sample=False, tree=TokenTree.from_branching([2, 2])),
        "dflash sampled": dict(draft_head=dflash, do_sample=True, top_k=20, seed=14),
    }, group)
    choose = AdaptiveK.choose
    if dist.get_rank() == 1:
        AdaptiveK.choose = _rigged_choose
    try:
        for name, head in (("dflash", dflash), ("eagle3", eagle3)):
            kw = dict(draft_head=head, do_sample=False, max_new_tokens=MAX_NEW, pad_token_id=0)
            single = specdec_fast.generate(target, ids, **kw)
            parallel, stats = specdec_fast.generate(target, ids, process_group=group, return_stats=True,
                                                    num_assistant_tokens_schedule="adaptive", **kw)
            out[f"{name} adaptive"] = (single.tolist(), parallel.tolist())
            out[f"{name} K under TP"] = (None if stats.schedule is None else stats.schedule["chosen"], stats.mean_k,
                                         stats.extra["tensor_parallel"]["k_schedule"])
    finally:
        AdaptiveK.choose = choose
    out["shard a head"] = _failure(lambda: specdec_fast.SpeculativeEngine(target, draft_head=eagle3, process_group=group,
                                                                            shard_draft=True))
    # Heads that differ between ranks only in what they read (the same weights): refused at once
    # (found by the fuzzing round: they drafted different tokens and stalled until the timeout).
    for name, change in (("other aux layers", lambda h: setattr(h.config, "eagle_aux_hidden_state_layer_ids", [3, 2, 1])),
                         ("other draft vocabulary order", lambda h: h.d2t.copy_(h.d2t.flip(0)))):
        head = load_draft_head(eagle3)
        if dist.get_rank() == 1:
            change(head)
        start = time.time()
        out[f"heads differ: {name}"] = dict(_failure(lambda: specdec_fast.SpeculativeEngine(
            target, draft_head=head, process_group=group, tp_timeout=TP_TIMEOUT)), seconds=time.time() - start)
    sharded = ShardedCausalLM.from_model(target, group, timeout=TP_TIMEOUT)
    for name, head in (("eagle3", eagle3), ("dflash", dflash)):
        kw = dict(draft_head=head, do_sample=True, seed=15, max_new_tokens=MAX_NEW, pad_token_id=0)
        out[f"sharded {name}"] = (specdec_fast.generate(target, ids, **kw).tolist(),
                                  specdec_fast.generate(sharded, ids, **kw).tolist())
    # The gathered weights themselves (the random DFlash head's drafts are never accepted, so its
    # tokens would not show a wrong LM head): the whole target's, exactly.
    runner = specdec_fast.SpeculativeEngine(sharded, draft_head=dflash, tp_timeout=TP_TIMEOUT).draft_runner
    out["gathered weights equal"] = (torch.equal(runner.embed, target.get_input_embeddings().weight)
                                     and torch.equal(runner.lm_head, target.get_output_embeddings().weight))
    return out


def _errors(specdec_fast, rank, target, draft, ids, pair) -> dict:
    from specdec_fast.runners import ShardedCausalLM

    res, group = {}, dist.group.WORLD
    # Errors every rank raises alike, before any collective.
    six_heads = make_model("llama")
    six_heads.config.num_attention_heads = 6  # hidden 48 = 6 x 8: 6 heads over 4 ranks
    res["indivisible"] = _failure(lambda: specdec_fast.generate(six_heads, ids % 128, process_group=group,
                                                                max_new_tokens=2))
    half = ShardedCausalLM.from_model(target, pair, timeout=TP_TIMEOUT)  # sharded over 2 ranks
    res["world sizes"] = _failure(lambda: specdec_fast.SpeculativeEngine(half, draft, process_group=group))
    # Ranks building different engines (a sharded draft on rank 0 only) stop at the configuration's
    # agreement, before the draft's sharding runs collectives on one rank only (it hung the others).
    res["engines differ"] = _failure(lambda: specdec_fast.SpeculativeEngine(
        target, draft, process_group=group, shard_draft=rank == 0, max_batch_size=1, max_seq_len=64,
        tp_timeout=TP_TIMEOUT))
    # Errors of one rank, which the call's agreement turns into one line on every rank.
    engine = specdec_fast.SpeculativeEngine(target, draft, process_group=group, max_batch_size=1, max_seq_len=64,
                                            tp_timeout=TP_TIMEOUT)
    other = ids.clone()
    other[0, -1] += rank == 2
    res["disagree"] = _failure(lambda: engine.generate(other, max_new_tokens=4, do_sample=False))
    bad = torch.zeros_like(ids) if rank == 3 else torch.ones_like(ids)
    res["one rank refuses"] = _failure(lambda: engine.generate(ids, bad, max_new_tokens=4, do_sample=False))
    res["after"] = engine.generate(ids, max_new_tokens=4, do_sample=False).tolist()
    return res


def _mid_call_failure(specdec_fast, rank, target, draft, ids) -> dict:
    """Rank 1's second verify step raises; its process stays alive (the others must not need it
    to exit)."""
    engine = specdec_fast.SpeculativeEngine(target, draft, process_group=dist.group.WORLD, max_batch_size=1,
                                            max_seq_len=64, tp_timeout=TP_TIMEOUT)
    runner = engine.target_runner
    if rank == 1:
        calls, score = [0], runner.score

        def failing(*args, **kwargs):
            calls[0] += 1
            if calls[0] == 2:
                raise RuntimeError("injected failure in the second verify step")
            return score(*args, **kwargs)

        runner.score = failing
    # under the adaptive K schedule: rank 0 writes the call's Ks into a key of the group's store
    # (distributed/k_leader.py), which the failed call removes on its way out
    seen = _failure(lambda: engine.generate(ids, max_new_tokens=40, do_sample=False,
                                            num_assistant_tokens_schedule="adaptive"))
    seen["k key left"] = engine.tp.failures.store.check([f"{engine.tp.failures.prefix}/k/0"]) if rank == 0 else False
    seen["later call"] = _failure(lambda: engine.generate(ids, max_new_tokens=2, do_sample=False))["error"]
    return seen


def _dead_rank(specdec_fast, rank, target, draft, ids, pair) -> dict:
    """Ranks 2 and 3 build an engine; rank 3 then returns (the harness ends its process at once,
    as a crashed rank's ends) while rank 2 starts a call."""
    start = time.time()
    engine = specdec_fast.SpeculativeEngine(target, draft, process_group=pair, max_batch_size=1, max_seq_len=64,
                                            tp_timeout=TP_TIMEOUT)
    if rank == 3:
        return {"error": None, "seconds": 0.0}
    seen = _failure(lambda: engine.generate(ids, max_new_tokens=MAX_NEW, do_sample=False))
    return dict(seen, seconds=seen["at"] - start)


def battery_triton(rank: int, world: int) -> dict:
    """The runner's Triton path (the GPU's: fused q/k/v and gate/up, RoPE + KV append, add +
    RMSNorm kernels) under the interpreter, 2 ranks, Qwen2 (biases, GQA), sampled, the static twin."""
    import specdec_fast

    target, draft = tiny("qwen2")
    ids, mask = left_padded_prompts([5, 3], seed=1)
    kw = dict(assistant_model=draft, max_new_tokens=5, do_sample=True, seed=2, backend="triton", pad_token_id=0,
              cuda_graphs="static")
    single = specdec_fast.generate(target, ids, mask, **kw)
    parallel = specdec_fast.generate(target, ids, mask, process_group=dist.group.WORLD, **kw)
    engine = next(e for e in specdec_fast.engine.cached_engines(target) if e.tp is not None)
    return {"triton": (single.tolist(), parallel.tolist()),
            "path": (engine.target_runner.kernels, engine.target_runner.fuse_projections, engine.graph_mode)}
