"""EAGLE-3 heads (heads/eagle3.py, runners/paged_eagle3.py, drafters/eagle3.py): the paged head
equals the module's reference forward on every backend; the drafts are the reference head's
drafts over the target's features (the bookkeeping of pending entries, not only exactness);
greedy decoding equals the target's greedy decoding token for token (chains, every backend,
left padding, EOS, the static graph twin); one engine serves mixed calls like fresh engines."""
import random

import pytest
import torch
import torch.nn.functional as F

import specdec_fast
from specdec_fast import SpeculativeEngine
from specdec_fast.drafters import Eagle3Drafter
from specdec_fast.engine import SpeculativeDecoder
from specdec_fast.kernels import make_sampling_tensors
from specdec_fast.runners import PagedLlamaRunner
from specdec_fast.runners.paged_eagle3 import PagedEagle3Runner

from ..conftest import backend_device, on_device
from .heads import greedy_under_the_schedule, proposals_per_iteration, random_head, trained_head
from .models import left_padded_prompts, make_model
from .test_paged_runner import VOCAB, tiny

DRAFT_VOCAB = 40


@pytest.fixture(scope="module")
def target():
    return tiny("llama", layers=4, seed=2)


@pytest.fixture(scope="module")
def head(target):
    return trained_head(target, DRAFT_VOCAB, key="llama4")


def _embed(target):
    return target.get_input_embeddings().weight


@pytest.mark.parametrize("backend", ["torch", "cpp", "triton"])
def test_paged_head_equals_reference_forward(target, backend, device):
    """prefill_pairs (left padding) + score_pairs with num_valid and a draft step (project=False):
    logits and g equal Eagle3Head.forward over each row's entries."""
    device = backend_device(backend, device)
    head, target = on_device(device, random_head(target, DRAFT_VOCAB, seed=3), target)
    gen = torch.Generator().manual_seed(5)
    lengths = [5, 1, 3]
    ids, mask = on_device(device, *left_padded_prompts(lengths, vocab=VOCAB, seed=6))
    feats = torch.randn(3, ids.shape[1], 3 * 64, generator=gen).to(device)
    runner = PagedEagle3Runner(head, _embed(target), num_draft_tokens=3, block_size=4, backend=backend)
    runner.prefill_pairs(ids, feats, mask, budgets=[16, 16, 16], num_draft_tokens=3)
    new_ids = torch.randint(0, VOCAB, (3, 4), generator=gen).to(device)
    new_feats = torch.randn(3, 4, 3 * 64, generator=gen).to(device)
    valid = torch.tensor([2, 4, 1], device=device)
    logits, g = runner.score_pairs(new_ids, new_feats, valid, project=True)
    runner.commit(torch.zeros_like(valid))  # dropped: scored again as the drafters do, logits of the last one only
    last, last_g = runner.score_pairs(new_ids, new_feats, valid, project=True, last_only=True)
    assert last.shape == (3, 1, logits.shape[-1])
    torch.testing.assert_close(last, logits[:, -1:], atol=1e-5, rtol=1e-5)
    for b, n in enumerate(valid.tolist()):  # the real (last n) positions: padding's g is unspecified
        torch.testing.assert_close(last_g[b, -n:], g[b, -n:])
    runner.commit(torch.zeros_like(valid))  # rows=: those entries' logits alone (a tree level's expanding nodes)
    rows = torch.tensor([3, 1], device=device)
    some, some_g = runner.score_pairs(new_ids, new_feats, valid, project=True, rows=rows)
    assert some.shape == (3, 2, logits.shape[-1]) and some_g.shape == g.shape
    for b, n in enumerate(valid.tolist()):  # real entries only (padding's logits are unspecified)
        for j, entry in enumerate(rows.tolist()):
            if entry >= 4 - n:
                torch.testing.assert_close(some[b, j], logits[b, entry], atol=1e-5, rtol=1e-5)
    runner.commit(valid)
    step_ids = torch.randint(0, VOCAB, (3, 1), generator=gen).to(device)
    step_logits, step_g = runner.score_pairs(step_ids, g[:, -1:], None, project=False)
    for b in range(3):
        real = mask[b].bool()
        n = int(valid[b])
        tokens = torch.cat([ids[b, real], new_ids[b, 4 - n:], step_ids[b]])
        with torch.no_grad():
            features = torch.cat([head.fc(torch.cat([feats[b, real], new_feats[b, 4 - n:]])), g[b, -1:]])
            ref_logits, ref_g = head(F.embedding(tokens, _embed(target))[None], features[None])
        torch.testing.assert_close(logits[b, 4 - n:], ref_logits[0, lengths[b]:lengths[b] + n], atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(g[b, 4 - n:], ref_g[0, lengths[b]:lengths[b] + n], atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(step_logits[b, 0], ref_logits[0, -1], atol=1e-4, rtol=1e-4)


def _reference_drafts(head, target, context: list, k: int) -> list:
    """The head's greedy drafts after ``context`` (x_0 .. x_c), by dense recomputation: entries
    (x_e+1, fc(target features at e)) for e < c, then each draft step appends (d_i, g)."""
    embed = _embed(target)
    indices = head.hidden_indices(target.config.num_hidden_layers)
    with torch.no_grad():
        states = target(input_ids=torch.tensor([context]), output_hidden_states=True).hidden_states
        features = head.fc(torch.cat([states[j][0, :-1] for j in indices], -1))  # entries 0 .. c-1
        tokens = list(context[1:])
        drafts = []
        for _ in range(k):
            logits, g = head(F.embedding(torch.tensor([tokens]), embed), features[None])
            drafts.append(int(head.draft_to_target[logits[0, -1].argmax()]))
            tokens.append(drafts[-1])
            features = torch.cat([features, g[0, -1:]])
    return drafts


@pytest.mark.parametrize("ks, cycle", [(None, None), ((1, 2, 3, 5), [5, 1, 3, 2, 2, 5])])
def test_drafts_equal_the_reference_head(target, head, ks, cycle, chaos):
    """Every iteration's K greedy drafts equal the reference head's over the context so far: the
    pending entries carry the right target features and tokens after every accept / reject. With
    ks, K changes every iteration (the adaptive schedule's choices, forced): the pending entries are
    sized for the largest K and an iteration of K uses the first K of them (a wrong slot would draft
    from the wrong context -- still exact, hence this test rather than the tokens)."""
    k, batch = 3, 2
    chosen = chaos(cycle) if cycle else []
    ids, mask = left_padded_prompts([4, 6], vocab=VOCAB, seed=8)
    k_max = max(ks or (k,))
    runner = PagedLlamaRunner(target, max_new_tokens=16, num_draft_tokens=k_max)
    runner.capture_hidden_states(head.hidden_indices(4))
    drafter = Eagle3Drafter(PagedEagle3Runner(head, _embed(target), num_draft_tokens=k_max), runner, head.draft_to_target)
    decoder = SpeculativeDecoder(runner, drafter, k=k, ks=ks, params=make_sampling_tensors(batch, "cpu", temperature=0.0,
                                                                                           seed=0), max_new_tokens=16)
    seen = proposals_per_iteration(drafter, decoder, ids, mask)
    accepted = sum(decoder.stats.result.accepted_hist[1:])
    assert len(seen) >= 4 and accepted > 0, "the test needs iterations that accept drafts"
    if cycle:
        assert len(set(chosen)) >= 3
    for iteration in seen:
        for context, drafts in iteration:
            assert drafts == _reference_drafts(head, target, context, len(drafts))


@pytest.mark.parametrize("backend, k", [("torch", 1), ("torch", 4), ("cpp", 1), ("cpp", 4), ("triton", 4)])
def test_greedy_equals_target_greedy(target, head, k, backend, device):
    device = backend_device(backend, device)
    target, head = on_device(device, target, head)
    ids, mask = on_device(device, *left_padded_prompts([5, 1, 8], vocab=VOCAB, seed=2))
    expected = target.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=14, pad_token_id=0)
    out, stats = specdec_fast.generate(target, ids, mask, draft_head=head, num_assistant_tokens=k, do_sample=False,
                                       max_new_tokens=14, pad_token_id=0, backend=backend, return_stats=True)
    assert torch.equal(out, expected)
    assert stats.alpha > 0


@pytest.mark.parametrize("graphs", [False, "static"])
def test_greedy_with_eos_and_graphs(target, head, graphs):
    """Rows that stop at different iterations (EOS; finished rows fed nothing) under the static twin."""
    ids, mask = left_padded_prompts([3, 7, 2, 5], vocab=VOCAB, seed=11)
    plain = target.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=18, pad_token_id=0)
    eos = int(plain[1, ids.shape[1] + 4])  # a token row 1 emits early: rows stop at different points
    expected = target.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=18, pad_token_id=0,
                               eos_token_id=eos)
    out = specdec_fast.generate(target, ids, mask, draft_head=head, num_assistant_tokens=3, do_sample=False,
                                max_new_tokens=18, pad_token_id=0, eos_token_id=eos, cuda_graphs=graphs)
    assert torch.equal(out, expected)


@pytest.mark.parametrize("graphs", [False, "static"])
def test_the_adaptive_schedule_runs_an_eagle3_head_exactly(target, head, graphs, chaos):
    """num_assistant_tokens_schedule="adaptive" with an EAGLE-3 head chooses among the draft model's
    Ks (engine ADAPTIVE_KS; it ran a constant K before, silently); greedy equals the target's greedy
    decoding under the schedule's own choices and under K forced to change every iteration (per-K
    graphs on the twin, one set of pending buffers)."""
    ids, mask = left_padded_prompts([5, 1, 8], vocab=VOCAB, seed=2)
    own, forced, chosen = greedy_under_the_schedule(target, ids, mask, chaos, [8, 2, 5, 1, 4, 6], draft_head=head,
                                                    cuda_graphs=graphs)
    assert own.schedule["ks"] == [1, 2, 3, 4, 5, 6, 8]
    assert len(set(chosen)) >= 5 and forced.alpha > 0
    assert forced.schedule["chosen"] == dict(sorted({k: chosen.count(k) for k in set(chosen)}.items()))


def _request(rng: random.Random):
    batch = rng.randint(1, 4)
    ids, mask = left_padded_prompts([rng.randint(1, 9) for _ in range(batch)], vocab=VOCAB, seed=rng.randrange(10**6))
    options = dict(max_new_tokens=rng.randint(2, 9), pad_token_id=0, seed=rng.randrange(2**31),
                   num_assistant_tokens=rng.choice([2, 3]))
    if rng.random() < 0.5:
        options.update(do_sample=True, temperature=rng.choice([0.7, 1.0]), top_k=rng.choice([0, 20]))
    else:
        options.update(do_sample=False)
    return ids, mask, options


def test_one_engine_serves_mixed_calls_like_fresh_engines(target, head):
    """Mixed batch sizes, K, greedy / sampling on one engine (static graph twin: addresses checked
    between calls) equal a fresh engine each; no new captures on a repeated call; blocks return."""
    def engine():
        return SpeculativeEngine(target, draft_head=head, max_batch_size=4, max_seq_len=32, max_draft_tokens=3,
                                 cuda_graphs="static")

    shared = engine()
    rng = random.Random(4)
    for i in range(10):
        ids, mask, options = _request(rng)
        out = shared.generate(ids, mask, **options)
        if i % 3 == 0:
            assert torch.equal(out, engine().generate(ids, mask, **options)), (i, options)
        for runner in (shared.target_runner, shared.draft_runner):
            assert runner.cache.num_free_blocks == runner.cache.num_blocks
    ids, mask, options = _request(random.Random(4))
    _, stats = shared.generate(ids, mask, return_stats=True, **options)
    assert stats.graphs_captured == 0


def test_a_call_must_name_the_engines_own_head(target, head):
    engine = SpeculativeEngine(target, draft_head=head, max_batch_size=1, max_seq_len=16)
    ids = torch.tensor([[5, 6]])
    engine.generate(ids, max_new_tokens=2, draft_head=head, pad_token_id=0)
    with pytest.raises(ValueError, match="another draft_head"):
        engine.generate(ids, max_new_tokens=2, draft_head=random_head(target, 8), pad_token_id=0)
    with pytest.raises(ValueError, match="one of assistant_model, draft_head"):
        SpeculativeEngine(target, target, draft_head=head)
    with pytest.raises(ValueError, match="paged target runner"):
        SpeculativeEngine(target, draft_head=head, runner="hf")
    other = make_model("llama", vocab=128, layers=4)  # another vocabulary
    with pytest.raises(ValueError, match="vocab mismatch"):
        SpeculativeEngine(target, draft_head=random_head(other, 8))
    narrow = make_model("llama", vocab=VOCAB, layers=4)  # hidden 48, the head reads 3 x 64
    with pytest.raises(ValueError, match="features"):
        SpeculativeEngine(narrow, draft_head=random_head(target, 8))


@pytest.mark.parametrize("drafting", ["eagle3", "eagle3_tree", "dflash"])
def test_heads_create_their_tensors_with_explicit_devices(target, head, drafting, device):
    """The decoding path with a draft head under the detector of device-less tensor factories
    (tests/implicit_device.py), as tests/engine/test_backends_e2e.py runs it for the other drafters."""
    from ..conftest import on_device
    from ..implicit_device import ImplicitDeviceFactories
    from .heads import random_dflash

    drafter = random_dflash(target, block_size=8) if drafting == "dflash" else head
    shape = dict(tree="dynamic") if drafting == "eagle3_tree" else dict(num_assistant_tokens=3)
    ids, mask = left_padded_prompts([4, 7], vocab=VOCAB, seed=5)
    model, drafter, ids, mask = on_device(device, target, drafter, ids, mask)
    with ImplicitDeviceFactories() as recorder:
        out = specdec_fast.generate(model, ids, mask, draft_head=drafter, max_new_tokens=4, pad_token_id=0,
                                    do_sample=True, seed=3, cuda_graphs="static", **shape)
    assert out.device == ids.device
    assert recorder.calls == [], recorder.calls
