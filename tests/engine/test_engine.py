"""SpeculativeEngine (specdec_fast/engine/engine.py): runners, KV pools and graphs built once and
reused call after call. On CPU through the static graph twin (cuda_graphs="static"), which runs
the graph code path with every graph-safety check, including StepGraph.check_reuse: a state
tensor that moved between two calls would be read stale by a real CUDA graph."""
import gc
import random
import threading
import weakref

import pytest
import torch

import specdec_fast
from specdec_fast import SpeculativeEngine
from specdec_fast.engine.cached import cached_engines
from specdec_fast.engine.engine import bucket_for
from specdec_fast.engine.graphs import GraphSafetyError
from specdec_fast.kernels import sampling_params
from specdec_fast.runners.paged_cache import OutOfBlocksError

from .conftest import model_pair
from .models import left_padded_prompts, make_draft, make_model


def _engine(mode="draft", **kw):
    target, draft = model_pair("llama")
    drafting = {"draft": dict(assistant_model=draft), "lookup": dict(prompt_lookup_num_tokens=3), "plain": {}}[mode]
    return SpeculativeEngine(target, **drafting, **{"max_batch_size": 8, "max_seq_len": 64, "cuda_graphs": "static", **kw})


def _request(rng: random.Random, max_batch: int = 8):
    """One call's arguments: batch 1-8, prompt lengths 1-12, greedy or sampling, a seed."""
    batch = rng.randint(1, max_batch)
    ids, mask = left_padded_prompts([rng.randint(1, 12) for _ in range(batch)], seed=rng.randrange(10**6))
    options = dict(max_new_tokens=rng.randint(2, 10), pad_token_id=0, seed=rng.randrange(2**31))
    if rng.random() < 0.5:
        options.update(do_sample=True, temperature=rng.choice([0.7, 1.0, 1.3]), top_k=rng.choice([0, 20]))
    else:
        options.update(do_sample=False)
    return ids, mask, options


def test_buckets():
    assert [bucket_for(b, 64) for b in (1, 2, 3, 5, 8, 9, 33, 64)] == [1, 2, 4, 8, 8, 16, 64, 64]
    assert bucket_for(5, 6) == 6 and bucket_for(3, 3) == 3  # max_batch_size is a bucket of its own


def test_a_second_call_in_a_bucket_captures_nothing_and_allocates_no_blocks():
    engine = _engine(num_assistant_tokens=4)  # a constant K: one pair of graphs (the adaptive schedule's: test_adaptive_k.py)
    pool = engine.target_runner.cache
    kv, free = pool.kv.data_ptr(), pool.num_free_blocks
    ids, mask = left_padded_prompts([5, 9, 3], seed=1)
    first, s1 = engine.generate(ids, mask, max_new_tokens=8, do_sample=False, pad_token_id=0, return_stats=True)
    assert s1.graphs_captured == 2 and s1.extra["engine"]["bucket"] == 4
    ids2, mask2 = left_padded_prompts([7, 2, 11, 4], seed=2)  # another batch in the same bucket, other lengths
    second, s2 = engine.generate(ids2, mask2, max_new_tokens=5, do_sample=False, pad_token_id=0, return_stats=True)
    assert s2.graphs_captured == 0 and s2.capture_s == 0.0
    assert s2.graph_replays == {"draft": s2.iterations, "verify": s2.iterations}  # every iteration replayed
    assert pool.kv.data_ptr() == kv and pool.num_free_blocks == free  # the same pool, every block returned
    fresh = _engine(num_assistant_tokens=4).generate(ids2, mask2, max_new_tokens=5, do_sample=False, pad_token_id=0)
    assert torch.equal(second, fresh)


@pytest.mark.parametrize("mode", ["draft", "lookup", "plain"])
def test_many_mixed_calls_equal_fresh_engines(mode):
    """Calls of mixed batch sizes, prompt lengths, sampling parameters and seeds on one engine give
    the tokens a fresh engine gives for each; the pool's blocks all return after every call."""
    engine = _engine(mode)
    rng = random.Random({"draft": 0, "lookup": 1, "plain": 2}[mode])
    calls = {"draft": 80, "lookup": 60, "plain": 60}[mode]  # 200 in all
    for i in range(calls):
        ids, mask, options = _request(rng)
        out, stats = engine.generate(ids, mask, return_stats=True, **options)
        if i % 4 == 0:  # a fresh engine per checked call (each costs a build and a capture)
            assert torch.equal(out, _engine(mode).generate(ids, mask, **options)), (i, options)
        assert engine.target_runner.cache.num_free_blocks == engine.target_runner.cache.num_blocks
    assert engine.calls == calls
    assert len(engine._decoders) <= 4 * 2 * 2  # buckets 1-8 x (greedy, sampling) x top_k on/off


def test_every_call_equals_a_fresh_engine_token_for_token():
    """The same requests through one engine and through a fresh engine each (draft model): equal."""
    engine = _engine()
    rng = random.Random(7)
    for _ in range(12):
        ids, mask, options = _request(rng)
        assert torch.equal(engine.generate(ids, mask, **options), _engine().generate(ids, mask, **options))


def _warm_every_decoder(engine) -> None:
    """One call per batch bucket (1, 2, 4, 8) and sampling mode (greedy, T only, T with top-k):
    every decoder _request's calls reach exists after it."""
    for batch in (1, 2, 3, 5):
        for options in (dict(do_sample=False), dict(do_sample=True, temperature=0.7, top_k=0),
                        dict(do_sample=True, temperature=1.0, top_k=20)):
            ids, mask = left_padded_prompts([3 + i for i in range(batch)], seed=batch)
            engine.generate(ids, mask, max_new_tokens=5, pad_token_id=0, seed=1, **options)


def _live_tensors() -> int:
    """Tensor objects alive in this process, but for the per-row constants' bounded LRU cache
    (kernels/sampling_params.py: up to CACHE_ENTRIES, filled by the calls' seeds and temperatures)."""
    gc.collect()
    cached = {id(tensor) for tensor, _ in sampling_params._cache.values()}
    return sum(1 for obj in gc.get_objects() if isinstance(obj, torch.Tensor) and id(obj) not in cached)


def _grows_over_calls(engine, rng, calls: int) -> int:
    """Live tensors gained over ``calls`` random calls; the pools' blocks all back after each."""
    tensors = _live_tensors()
    for _ in range(calls):
        ids, mask, options = _request(rng)
        engine.generate(ids, mask, **options)
        assert engine.target_runner.cache.num_free_blocks == engine.target_runner.cache.num_blocks
        assert engine.draft_runner.cache.num_free_blocks == engine.draft_runner.cache.num_blocks
    del ids, mask
    return _live_tensors() - tensors


def _rss() -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS"))


# Tensors an engine may still create lazily after _warm_every_decoder (seen here: 7 in the first 40
# random calls, none in the 260 after: per-bucket buffers first reached by a later prompt)
LAZY_TENSORS = 16


def test_memory_is_flat_over_calls():
    """Pool blocks in use return to 0 after each call; after every decoder exists, 40 calls leave
    no more live tensors than a few built lazily (a reference kept per call, however small, would
    add 40) and the process RSS within 5%."""
    engine = _engine()
    _warm_every_decoder(engine)
    rng = random.Random(3)
    _grows_over_calls(engine, rng, 10)
    rss = _rss()
    tensors = _grows_over_calls(engine, rng, 40)
    assert tensors <= LAZY_TENSORS, f"{tensors} more live tensors after 40 calls"
    assert _rss() <= 1.05 * rss, (rss, _rss())


def test_control_a_tensor_kept_per_call_is_caught(monkeypatch):
    """The leak the test above looks for: each call keeps one small tensor alive."""
    engine = _engine()
    _warm_every_decoder(engine)
    kept, generate = [], engine.generate

    def keeping(*args, **kwargs):
        out = generate(*args, **kwargs)
        kept.append(out[:, -1:].clone())
        return out

    monkeypatch.setattr(engine, "generate", keeping)
    tensors = _grows_over_calls(engine, random.Random(3), LAZY_TENSORS + 4)
    assert tensors > LAZY_TENSORS


def test_a_moved_state_tensor_is_caught_between_calls():
    """The rule a real CUDA graph needs (its captured addresses): a state tensor rebound between
    two calls is refused at the next call, naming it."""
    engine = _engine()
    ids, mask = left_padded_prompts([4, 6], seed=5)
    engine.generate(ids, mask, max_new_tokens=6, do_sample=False, pad_token_id=0)
    decoder = next(iter(engine._decoders.values()))
    decoder._max_new = decoder._max_new.clone()  # what a per-call allocation would do
    with pytest.raises(GraphSafetyError, match="_max_new"):
        engine.generate(ids, mask, max_new_tokens=6, do_sample=False, pad_token_id=0)


def test_warmup_captures_every_bucket():
    engine = _engine(max_batch_size=4)
    times = engine.warmup()
    assert sorted(times) == [1, 2, 4]
    assert engine.graphs_captured == 3 * 2
    ids, mask = left_padded_prompts([3, 5, 2], seed=9)
    _, stats = engine.generate(ids, mask, max_new_tokens=6, do_sample=False, pad_token_id=0, return_stats=True)
    assert stats.graphs_captured == 0


def test_requests_that_do_not_fit_raise_one_clear_line():
    engine = _engine(max_batch_size=2, max_seq_len=20)
    ids, mask = left_padded_prompts([3, 3, 3], seed=1)
    with pytest.raises(ValueError, match="max_batch_size=2"):
        engine.generate(ids, mask, max_new_tokens=4)
    ids, mask = left_padded_prompts([10], seed=1)
    with pytest.raises(ValueError, match="max_seq_len=20"):
        engine.generate(ids, mask, max_new_tokens=11)
    with pytest.raises(ValueError, match="max_draft_tokens"):
        engine.generate(ids, mask, max_new_tokens=4, num_assistant_tokens=9)
    small = _engine(max_batch_size=2, max_seq_len=40, kv_cache_tokens=32)
    ids, mask = left_padded_prompts([10, 10], seed=1)
    with pytest.raises(OutOfBlocksError, match="kv_cache_tokens"):
        small.generate(ids, mask, max_new_tokens=20)
    target, draft = model_pair("llama")
    with pytest.raises(ValueError, match="another assistant_model"):
        engine.generate(ids, mask, max_new_tokens=4, assistant_model=make_draft(target))


def test_the_default_pool_holds_its_largest_rows_in_whole_blocks():
    """Rows of max_seq_len + K + 1 tokens that end past a block boundary: the default pool must hold
    max_batch_size of them in whole blocks (16 rows of 64 + 192 + 1 tokens need 272 blocks of 16;
    a pool of rows x tokens = 257 blocks refused them)."""
    engine = _engine("plain", max_batch_size=4, max_seq_len=32)  # rows of 33 tokens: 3 blocks each
    ids, mask = left_padded_prompts([16, 16, 16, 16], seed=2)
    out = engine.generate(ids, mask, max_new_tokens=16, do_sample=False)
    assert out.shape == (4, 32)
    assert engine.target_runner.cache.num_blocks >= 4 * 3


def test_threads_get_what_they_would_get_alone():
    """Three threads, each making mixed greedy and seeded sampling calls on one engine: the same
    tokens as the same calls made one after another (the engine runs one call at a time)."""
    engine = _engine()
    requests = [[_request(random.Random(100 * t + i), max_batch=3) for i in range(5)] for t in range(3)]
    alone = [[engine.generate(ids, mask, **opts) for ids, mask, opts in thread] for thread in requests]
    together = [[None] * 5 for _ in range(3)]
    errors = []

    def work(t):
        try:
            for i, (ids, mask, opts) in enumerate(requests[t]):
                together[t][i] = engine.generate(ids, mask, **opts)
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(t,)) for t in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors
    for t in range(3):
        for i in range(5):
            assert torch.equal(together[t][i], alone[t][i]), (t, i)


def test_generate_reuses_a_cached_engine_and_frees_it_with_the_models():
    target = make_model("llama", seed=11)
    target.generation_config.eos_token_id = None
    draft = make_draft(target, noise=0.1)
    ids, mask = left_padded_prompts([4, 7], seed=3)
    kw = dict(assistant_model=draft, num_assistant_tokens=4, max_new_tokens=6, do_sample=False, pad_token_id=0,
              cuda_graphs="static", return_stats=True)
    out1, s1 = specdec_fast.generate(target, ids, mask, **kw)
    out2, s2 = specdec_fast.generate(target, ids, mask, **kw)
    assert torch.equal(out1, out2) and s1.graphs_captured == 2 and s2.graphs_captured == 0
    (engine,) = cached_engines(target)
    assert engine.max_batch_size == 2 and engine.max_seq_len == 256 - 4 - 1  # the call's bucket; rows within the positions
    # A bigger batch grows the engine (a new one replaces it); a smaller one reuses that.
    big_ids, big_mask = left_padded_prompts([3, 5, 4], seed=4)
    specdec_fast.generate(target, big_ids, big_mask, **kw)
    (grown,) = cached_engines(target)
    assert grown is not engine and grown.max_batch_size == 4
    _, s3 = specdec_fast.generate(target, ids, mask, **kw)
    assert cached_engines(target) == [grown] and s3.extra["engine"]["decoders"] >= 1
    refs = [weakref.ref(x) for x in (target, draft, grown, grown.target_runner.cache)]
    del target, draft, engine, grown, out1, out2, s1, s2, s3, kw
    gc.collect()
    assert [r() for r in refs] == [None] * 4, "the models, their engine and its KV pool are freed"


def test_deleting_the_draft_drops_its_engine():
    target = make_model("llama", seed=12)
    target.generation_config.eos_token_id = None
    draft = make_draft(target, noise=0.1)
    ids, mask = left_padded_prompts([4], seed=3)
    specdec_fast.generate(target, ids, mask, assistant_model=draft, max_new_tokens=4, do_sample=False, pad_token_id=0)
    specdec_fast.generate(target, ids, mask, max_new_tokens=4, do_sample=False, pad_token_id=0)
    assert len(cached_engines(target)) == 2
    del draft
    gc.collect()
    assert len(cached_engines(target)) == 1  # the plain-decoding engine stays with its target


def test_sampling_on_a_reused_engine_matches_the_first_call():
    """Seeds are per call: the same seeded request twice on one engine gives the same tokens; another seed differs."""
    engine = _engine()
    ids, mask = left_padded_prompts([5, 5], seed=8)
    kw = dict(max_new_tokens=10, do_sample=True, temperature=1.0, pad_token_id=0)
    a, b = engine.generate(ids, mask, seed=1, **kw), engine.generate(ids, mask, seed=1, **kw)
    assert torch.equal(a, b)
    assert not torch.equal(a, engine.generate(ids, mask, seed=2, **kw))


def test_the_engine_keeps_a_bounded_number_of_decoders(monkeypatch):
    """Decoders are kept least-recently-used first up to MAX_DECODERS: calls whose option values
    change every time (each a decoder key) do not grow the engine without end, and a key that
    was dropped is rebuilt with the same tokens."""
    from specdec_fast.engine import engine as engine_module

    monkeypatch.setattr(engine_module, "MAX_DECODERS", 3)
    target, draft = model_pair("llama")
    engine = SpeculativeEngine(target, draft)
    ids, mask = left_padded_prompts([5, 8], seed=9)
    first = None
    for penalty in (1.1, 1.2, 1.3, 1.4, 1.5, 1.1):
        out = engine.generate(ids, mask, max_new_tokens=6, do_sample=False, repetition_penalty=penalty, pad_token_id=0)
        assert len(engine._decoders) <= 3
        if penalty == 1.1:
            first = out if first is None else first
    assert torch.equal(out, first)  # 1.1's decoder was dropped, rebuilt, and gives the same tokens
