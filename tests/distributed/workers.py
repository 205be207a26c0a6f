"""What each rank runs in the tensor-parallel tests (spawned by harness.run_ranks; module-level
functions so that spawn can import them). Each battery returns a dict: scenario -> what this
rank saw (token lists, error lines, timings); the tests compare ranks and the single process."""
import os
import time

import torch
import torch.distributed as dist

from tests.engine.models import left_padded_prompts, make_draft, make_model

from .harness import TP_TIMEOUT

MAX_NEW = 12


def _tiny(kind: str, **kw):
    target = make_model(kind, **kw)
    target.generation_config.eos_token_id = None
    return target, make_draft(target, noise=0.1)


def _tokens(out) -> list:
    return out.tolist()


def _pair_cases(specdec_fast, target, draft, ids, mask, cases: dict, group) -> dict:
    """For each case (name -> generate kwargs): (single-process tokens, tensor-parallel tokens)."""
    out = {}
    for name, kw in cases.items():
        kw = dict(dict(assistant_model=draft, max_new_tokens=MAX_NEW, pad_token_id=0), **kw)
        single = specdec_fast.generate(target, ids, mask, **{k: v for k, v in kw.items() if k != "shard_draft"})
        parallel = specdec_fast.generate(target, ids, mask, process_group=group, **kw)
        out[name] = (_tokens(single), _tokens(parallel))
    return out


def _failure(fn) -> dict:
    """Runs fn(); the error line it raised (or None) and when."""
    try:
        fn()
    except Exception as exc:  # noqa: BLE001
        return {"error": f"{type(exc).__name__}: {exc}".splitlines()[0], "at": time.time()}
    return {"error": None, "at": time.time()}


# -- two ranks ----------------------------------------------------------------------------------------
def battery_two(rank: int, world: int, checkpoint: str) -> dict:
    import specdec_fast
    from specdec_fast.drafters.token_tree import TokenTree
    from specdec_fast.pair import load_demo_pair
    from specdec_fast.runners import ShardedCausalLM

    group, res = dist.group.WORLD, {}
    tokenizer, target, draft = load_demo_pair()
    target.generation_config.eos_token_id = None
    ids = torch.tensor([tokenizer.encode("def binary_search(a, x):\n")])
    mask = torch.ones_like(ids)
    res["demo"] = _pair_cases(specdec_fast, target, draft, ids, mask, {
        "greedy": dict(do_sample=False),
        "sampled": dict(do_sample=True, temperature=0.8, top_k=50, seed=11),
        "static greedy": dict(do_sample=False, cuda_graphs="static"),
        "static sampled": dict(do_sample=True, temperature=1.0, top_p=0.9, seed=5, cuda_graphs="static"),
        "sharded draft": dict(do_sample=True, seed=2, shard_draft=True),
        "prompt lookup": dict(assistant_model=None, prompt_lookup_num_tokens=3, do_sample=False),
        "plain": dict(assistant_model=None, do_sample=True, seed=4),
        "tree": dict(do_sample=False, tree=TokenTree.from_branching([2, 2])),
    }, group)
    for kind in ("llama", "qwen2"):  # MHA; GQA (4 heads, 2 KV heads) with q/k/v biases
        tgt, drf = _tiny(kind)
        pids, pmask = left_padded_prompts([5, 9], seed=1)
        res[kind] = _pair_cases(specdec_fast, tgt, drf, pids, pmask, {
            "greedy": dict(do_sample=False), "sampled": dict(do_sample=True, temperature=0.9, seed=8)}, group)
        engine = specdec_fast.SpeculativeEngine(tgt, drf, process_group=group, max_batch_size=2, max_seq_len=64,
                                                tp_timeout=TP_TIMEOUT)
        res[kind]["engine"] = (res[kind]["sampled"][0], _tokens(engine.generate(pids, pmask, do_sample=True,
                                                                                temperature=0.9, seed=8,
                                                                                max_new_tokens=MAX_NEW, pad_token_id=0)))
        res[kind]["engine note"] = engine.describe()
    # The checkpoint path: each rank reads its slices; the ShardedCausalLM is the model.
    sharded = ShardedCausalLM.from_pretrained(checkpoint, group, timeout=TP_TIMEOUT)
    full, drf = _tiny("qwen2")
    pids, pmask = left_padded_prompts([4, 7], seed=2)
    kw = dict(assistant_model=drf, max_new_tokens=MAX_NEW, pad_token_id=0, do_sample=True, seed=3)
    res["checkpoint"] = (_tokens(specdec_fast.generate(full, pids, pmask, **kw)),
                         _tokens(specdec_fast.generate(sharded, pids, pmask, **kw)))
    res["shard shapes"] = {name: tuple(t.shape) for name, t in sharded.shards.items() if "layers.0." in name}
    res["chi-square tokens"] = _chi_square_run(specdec_fast, group)
    res["dead rank"] = _dead_rank(specdec_fast, rank, target, draft, ids, group)
    return res


CHI_VOCAB, CHI_ROWS, CHI_PROMPT = 12, 3000, [[3, 7, 5, 9]]


def chi_square_pair():
    target = make_model("llama", vocab=CHI_VOCAB, init_std=0.5, seed=5)
    target.generation_config.eos_token_id = None
    return target, make_draft(target, noise=0.4, seed=6)


def _chi_square_run(specdec_fast, group) -> list:
    """CHI_ROWS independent rows (one seed, per-row streams) through the K = 2 speculative block."""
    target, draft = chi_square_pair()
    ids = torch.tensor(CHI_PROMPT).expand(CHI_ROWS, -1)
    out = specdec_fast.generate(target, ids, assistant_model=draft, num_assistant_tokens=2, do_sample=True,
                                temperature=0.7, max_new_tokens=3, seed=123, process_group=group)
    return _tokens(out[:, ids.shape[1]:])


def _dead_rank(specdec_fast, rank, target, draft, ids, group) -> dict:
    """Rank 1's process dies (as a crashed or killed rank does) while rank 0 builds an engine and
    starts a call."""
    start = time.time()

    def build_and_call():
        engine = specdec_fast.SpeculativeEngine(target, draft, process_group=group, max_batch_size=1, max_seq_len=64,
                                                tp_timeout=TP_TIMEOUT)
        if rank == 1:
            os._exit(1)  # no result file: the test reads rank 0's
        engine.generate(ids, max_new_tokens=MAX_NEW, do_sample=False)

    seen = _failure(build_and_call)
    return dict(seen, seconds=seen["at"] - start)


# -- four ranks ---------------------------------------------------------------------------------------
def battery_four(rank: int, world: int) -> dict:
    import specdec_fast
    from specdec_fast.pair import load_demo_pair
    from specdec_fast.runners import ShardedCausalLM

    group, res = dist.group.WORLD, {}
    tokenizer, target, draft = load_demo_pair()
    target.generation_config.eos_token_id = None
    ids = torch.tensor([tokenizer.encode("import os\n")])
    mask = torch.ones_like(ids)
    # 2 KV heads over 4 ranks: replicated.
    res["demo"] = _pair_cases(specdec_fast, target, draft, ids, mask, {
        "greedy": dict(do_sample=False), "sampled": dict(do_sample=True, temperature=0.8, seed=12)}, group)
    tgt, drf = _tiny("qwen2")
    pids, pmask = left_padded_prompts([6, 3], seed=4)
    res["qwen2"] = _pair_cases(specdec_fast, tgt, drf, pids, pmask, {"greedy": dict(do_sample=False)}, group)
    tgt, drf = _tiny("llama")
    res["llama"] = _pair_cases(specdec_fast, tgt, drf, pids, pmask, {"sampled": dict(do_sample=True, seed=6)}, group)

    # Errors every rank raises alike, before any collective.
    six_heads = make_model("llama")
    six_heads.config.num_attention_heads = 6  # hidden 48 = 6 x 8: 6 heads over 4 ranks
    res["indivisible"] = _failure(lambda: specdec_fast.generate(six_heads, ids % 128, process_group=group,
                                                                max_new_tokens=2))
    pairs = [dist.new_group([0, 1], use_local_synchronization=True) if rank < 2 else None,
             dist.new_group([2, 3], use_local_synchronization=True) if rank >= 2 else None]
    pair_group = pairs[0] if rank < 2 else pairs[1]
    half = ShardedCausalLM.from_model(target, pair_group, timeout=TP_TIMEOUT)
    res["world sizes"] = _failure(lambda: specdec_fast.SpeculativeEngine(half, draft, process_group=group))

    # Errors of one rank, caught by the call's agreement: every rank raises, the group stays usable.
    engine = specdec_fast.SpeculativeEngine(target, draft, process_group=group, max_batch_size=1, max_seq_len=64,
                                            tp_timeout=TP_TIMEOUT)
    other = ids.clone()
    other[0, -1] += rank == 2
    res["disagree"] = _failure(lambda: engine.generate(other, max_new_tokens=4, do_sample=False))
    bad = torch.zeros_like(mask) if rank == 3 else mask
    res["one rank refuses"] = _failure(lambda: engine.generate(ids, bad, max_new_tokens=4, do_sample=False))
    res["after"] = _tokens(engine.generate(ids, max_new_tokens=4, do_sample=False))

    # A failure mid-call on rank 1, whose process stays alive: every rank ends with its line.
    res["mid-call"] = _mid_call_failure(rank, world, engine, ids)
    return res


def _mid_call_failure(rank, world, engine, ids) -> dict:
    runner = engine.target_runner
    if rank == 1:
        calls = [0]
        score = runner.score

        def failing(*args, **kwargs):
            calls[0] += 1
            if calls[0] == 3:
                raise RuntimeError("injected failure in the third verify step")
            return score(*args, **kwargs)

        runner.score = failing
    seen = _failure(lambda: engine.generate(ids, max_new_tokens=MAX_NEW, do_sample=False))
    seen["later call"] = _failure(lambda: engine.generate(ids, max_new_tokens=2, do_sample=False))["error"]
    if rank == 1:
        time.sleep(3.0)  # alive while the others unblock (they must not need this process to exit)
    return seen
