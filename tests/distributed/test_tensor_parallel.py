"""Tensor parallelism on CPU ranks (gloo), each rank a spawned process (harness.py; what each rank
runs: workers.py). One spawn of 4 ranks serves every check (a spawned rank costs ~5 s of imports
on the 2-core CI box); the failures are checked one by one and reported together.

4 ranks: the demo pair (its 2 KV heads replicated over 4 ranks) and Qwen2 (GQA, q/k/v biases, a
batch of two left-padded rows) equal the single process (greedy and seeded sampling, fp32);
errors every rank raises alike (heads not divisible, mismatched world sizes); errors of one rank
that the call's agreement turns into one line on every rank (another prompt, a bad mask), the
group usable after; a rank failing mid-call (its process alive, the adaptive K schedule on) ends
every rank with its line within seconds, rank 0 removes the call's K key from the group's store,
and the group refuses later calls.
2 ranks (ranks 0 and 1): the demo pair (greedy, seeded sampling with top-k / top-p, the static
graph twin, a sharded draft, prompt lookup, plain decoding, a token tree; the adaptive K schedule, every
rank running rank 0's Ks, with rank 1's own schedule rigged; draft heads: the
demo pair's EAGLE-3 head greedy, sampled and with a tree, a DFlash block drafter sampled and under the
adaptive schedule, both over a ShardedCausalLM too), tiny Llama (MHA) and
Qwen2 through generate(process_group=) and SpeculativeEngine(process_group=), a checkpoint read
slice by slice (ShardedCausalLM.from_pretrained): every rank's tokens equal the single process's
and every other rank's; a chi-square of 2000 sampled rows against the target's distribution.
Ranks 2 and 3: one's process ends (as a crashed rank's does): the other raises within seconds.
The hybrid recurrent families run in a 2-rank spawn of their own (workers.hybrid_battery), so that the two spawns
share the CI box's two pytest workers.
"""
import pytest
import torch

from tests.engine.models import llama4_multimodal_checkpoint
from tests.engine.mtp_models import glm_with_mtp
from tests.kernels.stats import P_VALUE_THRESHOLD, chi_square_pvalue

from . import workers
from .harness import run_ranks

SECONDS = 10.0  # "within seconds": measured ~0.03 s (failing rank alive), ~1 s (rank's process gone)


def _same_tokens(results, phase: str, ranks) -> list:
    """Each case: every rank's tensor-parallel tokens == its single-process tokens == rank 0's."""
    problems = []
    for name, case in results[ranks[0]][phase].items():
        if not (isinstance(case, tuple) and isinstance(case[0], list) and isinstance(case[1], list)):
            continue  # a note or another kind of result
        for rank in ranks:
            single, parallel = results[rank][phase][name]
            if parallel != single:
                problems.append(f"{phase} / {name}: rank {rank}'s tensor-parallel tokens differ from the single process's")
            if parallel != results[ranks[0]][phase][name][1]:
                problems.append(f"{phase} / {name}: rank {rank}'s tokens differ from rank {ranks[0]}'s")
    return problems


def _chi_square(new: torch.Tensor) -> float:
    """p-value of tokens 1 and 2 of CHI_ROWS rows against the target's joint distribution."""
    from specdec_fast.kernels import standardise
    from specdec_fast.kernels.sampling_params import make_sampling_tensors

    target, _ = workers.chi_square_pair()
    vocab, prompt = workers.CHI_VOCAB, torch.tensor(workers.CHI_PROMPT)

    def probs(prefixes):
        with torch.no_grad():
            logits = target(prefixes).logits[:, -1:, :].float()
        params = make_sampling_tensors(prefixes.shape[0], "cpu", temperature=workers.CHI_TEMPERATURE)
        return torch.softmax(standardise(logits, params)[:, 0], -1).double()

    p1 = probs(prompt)[0]
    p2 = probs(torch.cat([prompt.expand(vocab, -1), torch.arange(vocab)[:, None]], 1))
    return chi_square_pvalue(new[:, 0] * vocab + new[:, 1], (p1[:, None] * p2).reshape(-1))


def _check(problems: list, condition: bool, message: str) -> None:
    if not condition:
        problems.append(message)


def test_tensor_parallel_on_2_and_4_cpu_ranks(tmp_path):
    for kind in ("qwen2", "mixtral", "phi3", "qwen3_next", "gemma3_multimodal"):  # safetensors: every rank reads its
        # slices (Mixtral's: per expert; Gemma 3's multimodal one: its text decoder)
        workers.tiny(kind)[0].save_pretrained(tmp_path / kind)
    llama4_multimodal_checkpoint(workers.tiny("llama4_text")[0], tmp_path / "llama4_text")  # a Llama4Config around it
    glm_with_mtp(tmp_path / "glm_mtp")  # a GLM-4.5 checkpoint with its MTP layer: each rank reads that layer's slices
    glm_with_mtp(tmp_path / "deepseek_mtp", kind="deepseek_v3")  # DeepSeek-V3's: latent attention, read as slices
    glm_with_mtp(tmp_path / "qwen_mtp", kind="qwen3_next")  # Qwen3-Next's mtp.*: a gated attention layer, read as slices
    results = run_ranks(workers.battery, 4, str(tmp_path))
    errors = {rank: r["error"] for rank, r in enumerate(results) if "error" in r}
    assert not errors, f"ranks failed: {errors}"
    for rank in (0, 1):  # the control (not a tuple of lists: _same_tokens leaves it out): the tokens differ
        for kind, (single, parallel) in results[rank]["2 ranks"].pop("local norm statistics").items():
            assert single != parallel, f"rank {rank}: {kind}'s whole-projection norms with per-rank statistics gave one " \
                                       "process's tokens"
    problems = _same_tokens(results, "4 ranks", [0, 1, 2, 3]) + _same_tokens(results, "2 ranks", [0, 1])
    two = results[1]["2 ranks"]
    for kind in ("llama", "qwen2", "mistral", "cwm", "ministral3", "ministral", "smollm3", "phi3", "granite", "seed_oss",
                 "cohere_qk", "cohere2", "gemma", "gemma2", "gemma3", "gemma3_multimodal", "exaone", "internlm3",
                 "iquestcoder", "glm4", "starcoder2", "apertus", "arcee", "granitemoehybrid", "gemma4_text", "gemma4_shared",
                 "gemma4_unified_text", "vaultgemma"):
        _check(problems, "tensor parallel over 2 ranks" in two[f"{kind} engine note"], two[f"{kind} engine note"])
    # rank 1's slices. qwen2: 4 heads of 12, 2 KV heads, intermediate 96; mixtral: 8 experts of 96, gathered from
    # the checkpoint's per-expert w1 / w3 / w2 into the 3-D tensors, the router whole
    expected = {"qwen2": {"self_attn.q_proj.weight": (24, 48), "self_attn.q_proj.bias": (24,),
                          "self_attn.k_proj.weight": (12, 48), "self_attn.o_proj.weight": (48, 24),
                          "mlp.up_proj.weight": (48, 48), "mlp.down_proj.weight": (48, 48)},
                "mixtral": {"mlp.experts.gate_up_proj": (8, 96, 48), "mlp.experts.down_proj": (8, 48, 48),
                            "mlp.gate.weight": (8, 48)},
                # qwen3_next's Gated DeltaNet (2 key heads of 8, 4 value heads of 12): rank 1's key head's group of
                # [q 8 | k 8 | v 24 | z 24] rows, [b 2 | a 2], its [q | k | v] channels of the convolution, 2 value heads
                "qwen3_next": {"linear_attn.in_proj_qkvz.weight": (64, 48), "linear_attn.in_proj_ba.weight": (4, 48),
                               "linear_attn.conv1d.weight": (40, 1, 4), "linear_attn.A_log": (2,),
                               "linear_attn.dt_bias": (2,), "linear_attn.out_proj.weight": (48, 24),
                               "linear_attn.norm.weight": (12,)},
                # llama4_text's layer 0 (dense: 48 of intermediate_size_mlp 96 columns), read from Meta's layout
                "llama4_text": {"self_attn.q_proj.weight": (24, 48), "mlp.gate_proj.weight": (48, 48),
                                "mlp.down_proj.weight": (48, 48)},
                # Gemma 3's text decoder (4 heads of 16, 2 KV heads, intermediate 96): rank 1's, the per-head norms whole
                "gemma3_multimodal": {"self_attn.q_proj.weight": (32, 64), "self_attn.k_proj.weight": (16, 64),
                                      "self_attn.q_norm.weight": (16,), "mlp.up_proj.weight": (48, 64)}}
    for kind, shapes in expected.items():
        seen = two[f"{kind} shard shapes"]
        _check(problems, not any(".experts.0." in name or "block_sparse_moe" in name for name in seen),
               f"{kind}: per-expert checkpoint names left in the shards: {sorted(seen)}")
        for name, shape in shapes.items():
            _check(problems, seen.get(f"model.layers.0.{name}") == shape,
                   f"{kind} {name}: shard {seen.get(f'model.layers.0.{name}')}")
    # The adaptive K schedule: both ranks run rank 0's Ks (rank 1's own schedule rigged to K = 1 would part them):
    # the same Ks chosen as often on both ranks, and not rank 1's K = 1 alone; a call without the schedule: K = 4.
    two_ranks = [results[rank]["2 ranks"] for rank in (0, 1)]
    seen = [r["adaptive K under TP"] for r in two_ranks]
    _check(problems, seen[0] == seen[1] and seen[0][0] == (None, 4.0, "constant")
           and all(chosen and set(chosen) != {1} and how == "rank 0's adaptive" for chosen, _, how in seen[0][1:]),
           f"adaptive K under TP: {seen}")
    _check(problems, two_ranks[0]["adaptive sampled tokens"] == two_ranks[1]["adaptive sampled tokens"],
           "adaptive sampled: the ranks' tokens differ")
    for name in ("dflash", "eagle3"):  # a block drafter's and an EAGLE-3 head's adaptive schedules too
        seen = [r[f"{name} K under TP"] for r in two_ranks]
        _check(problems, seen[0] == seen[1] and seen[0][0] and set(seen[0][0]) != {1} and seen[0][2] == "rank 0's adaptive",
               f"{name} K under TP: {seen}")
    for rank in (0, 1):
        for name in ("other aux layers", "other draft vocabulary order"):
            seen = results[rank]["2 ranks"][f"heads differ: {name}"]
            _check(problems, str(seen["error"]).startswith("TensorParallelError: building the engine: the ranks disagree "
                                                           "on drafting") and seen["seconds"] < SECONDS,
                   f"rank {rank} heads differ ({name}): {seen}")
        _check(problems, results[rank]["2 ranks"]["gathered weights equal"] is True,
               f"rank {rank}: the head's gathered embedding / LM head differ from the whole target's")
        refused = results[rank]["2 ranks"]["shard a head"]["error"]
        _check(problems, refused == "ValueError: shard_draft=True shards a draft model; this engine drafts with a draft "
               "head (it runs whole on every rank)", f"rank {rank} shard_draft with a head: {refused}")
    _check(problems, two["mistral ring layers"] == (0, 1) and two["cwm ring layers"] == (1,),
           f"rings on 2 ranks: mistral {two['mistral ring layers']}, cwm {two['cwm ring layers']}")
    _check(problems, two["mtp alpha"] > 0, f"use_mtp over 2 ranks: alpha {two['mtp alpha']} (no draft accepted)")
    # rank 1's MTP runner: 2 of 4 query heads, 12 of each expert's 24 columns (gate and up: 24 rows of 48)
    _check(problems, two["mtp runner"] == ("TPPagedMtpRunner", 2, (8, 24, 48), "TPPagedLlamaRunner"),
           f"use_mtp runner: {two['mtp runner']}")
    # DeepSeek-V3: rank 1 holds 2 of 4 heads of q_b (20 rows each: 12 + 8), kv_b (24 each: 12 + 12) and o_proj (12
    # columns each); the latent's projections whole (kv_a: 24 + 8 rows); its MTP layer the same, on the MLA runners
    _check(problems, two["deepseek mtp alpha"] > 0, f"DeepSeek-V3 use_mtp over 2 ranks: alpha {two['deepseek mtp alpha']}")
    _check(problems, two["deepseek mtp runner"] == ("TPPagedMlaMtpRunner", 2, (8, 24, 48), "TPPagedMlaRunner"),
           f"DeepSeek-V3 use_mtp runner: {two['deepseek mtp runner']}")
    shapes = {name.split("self_attn.")[1]: shape for name, shape in two["deepseek mtp shard shapes"].items()}
    _check(problems, shapes == {"q_a_proj.weight": (16, 48), "q_a_layernorm.weight": (16,), "q_b_proj.weight": (40, 16),
                                "kv_a_proj_with_mqa.weight": (32, 48), "kv_a_layernorm.weight": (24,),
                                "kv_b_proj.weight": (48, 24), "o_proj.weight": (48, 24)}, f"DeepSeek-V3 shards: {shapes}")
    # Qwen3-Next: rank 1's 2 of 4 heads of its MTP layer's gated attention, 12 of each expert's 24 columns
    _check(problems, two["qwen mtp alpha"] > 0, f"Qwen3-Next use_mtp over 2 ranks: alpha {two['qwen mtp alpha']}")
    _check(problems, two["qwen mtp runner"] == ("TPPagedQwen3NextMtpRunner", 2, (8, 24, 48), "TPPagedQwen3NextRunner"),
           f"Qwen3-Next use_mtp runner: {two['qwen mtp runner']}")
    tokens, alpha = results[0]["2 ranks"]["chi-square"]
    _check(problems, tokens == two["chi-square"][0], "chi-square rows: the ranks' tokens differ")
    _check(problems, 0.2 < alpha < 0.95, f"chi-square alpha {alpha}: the test needs accepted and rejected drafts")
    p_value = _chi_square(torch.tensor(tokens))
    _check(problems, p_value > P_VALUE_THRESHOLD, f"chi-square p = {p_value:.2e}: sampled tokens do not follow the target")

    for rank, r in enumerate(results):
        _check(problems, r["indivisible"]["error"] == "ValueError: tensor parallelism over 4 ranks: num_attention_heads 6 "
               "is not divisible by 4", f"rank {rank} indivisible: {r['indivisible']['error']}")
        _check(problems, str(r["world sizes"]["error"]).startswith(
            "ValueError: mismatched world sizes: the target was sharded over 2 ranks, process_group has 4"),
            f"rank {rank} world sizes: {r['world sizes']['error']}")
        _check(problems, str(r["disagree"]["error"]).startswith(
            "TensorParallelError: generate: the ranks disagree on input_ids: rank 0 has"), f"rank {rank}: {r['disagree']}")
        refused = "ValueError: attention_mask has a row with no real token"
        want = refused if rank == 3 else f"TensorParallelError: generate: tensor-parallel rank 3 of 4 failed: {refused}"
        _check(problems, r["one rank refuses"]["error"] == want, f"rank {rank}: {r['one rank refuses']}")
        _check(problems, r["after"] == results[0]["after"], f"rank {rank}: the group must stay usable after an agreed error")
        _check(problems, str(r["engines differ"].get("error", "")).startswith(
            "TensorParallelError: building the engine: the ranks disagree on drafting: rank 0 has {'mode': 'draft'"),
            f"rank {rank}: {r['engines differ']}")
        seen = r["mid-call"]
        injected = "RuntimeError: injected failure in the second verify step"
        want = injected if rank == 1 else f"TensorParallelError: tensor-parallel rank 1 of 4 failed: {injected}"
        _check(problems, str(seen["error"]).startswith(want), f"rank {rank} mid-call: {seen['error']}")
        late = seen["at"] - results[1]["mid-call"]["at"]
        _check(problems, late < SECONDS, f"rank {rank} ended {late:.1f} s after rank 1 failed")
        _check(problems, not seen["k key left"], f"rank {rank}: the failed call's K key is still in the store")
        _check(problems, str(seen["later call"]).startswith("TensorParallelError: this tensor-parallel group was closed"),
               f"rank {rank} later call: {seen['later call']}")
    dead = results[2]["dead rank"]
    _check(problems, str(dead["error"]).startswith("TensorParallelError"), f"rank 2 after rank 3 ended: {dead}")
    _check(problems, dead["seconds"] < SECONDS, f"rank 2 took {dead['seconds']:.1f} s to notice that rank 3 ended")
    assert not problems, "\n".join(problems) + f"\ntimes (s): {[r['times'] for r in results]}"


def test_the_hybrid_recurrent_families_on_two_ranks():
    """workers.hybrid_battery: every hybrid recurrent family's greedy and sampled tokens on 2 ranks equal one process's
    (each rank its heads' or channels' states, rolled back), and each control differs: Jamba's dt / B / C from each
    rank's channels alone, a shared Mamba2 group normed over each rank's channels alone."""
    results = run_ranks(workers.hybrid_battery, 2)
    errors = {rank: r["error"] for rank, r in enumerate(results) if "error" in r}
    assert not errors, f"ranks failed: {errors}"
    for rank in (0, 1):
        single, parallel = results[rank]["2 ranks"].pop("unsummed mamba")
        assert single != parallel, f"rank {rank}: Jamba's dt / B / C from each rank's channels alone gave one process's tokens"
        single, parallel = results[rank]["2 ranks"].pop("unshared mamba2 norm")
        assert single != parallel, f"rank {rank}: a shared Mamba2 group normed over each rank's channels alone gave one " \
                                   "process's tokens"
    problems = _same_tokens(results, "2 ranks", [0, 1])
    assert len(results[0]["2 ranks"]) >= 2 * len(workers.HYBRID_KINDS) + 7  # every family's cases, the Mamba2 hybrids'
    assert not problems, "\n".join(problems)


@pytest.mark.slow  # ~35 s on the 2-core box: the Triton interpreter on two ranks
@pytest.mark.cpu_only  # gloo ranks on CPU tensors: Triton runs there only interpreted; one GPU holds no two ranks
def test_the_triton_path_on_two_ranks():
    results = run_ranks(workers.battery_triton, 2)
    errors = {rank: r["error"] for rank, r in enumerate(results) if "error" in r}
    assert not errors, f"ranks failed: {errors}"
    for r in results:
        assert r["path"] == ("triton", True, "static")
    for rank, r in enumerate(results):
        single, parallel = r["triton"]
        assert parallel == single, f"rank {rank}: the Triton path's tensor-parallel tokens differ from a single process's"
        assert parallel == results[0]["triton"][1]
