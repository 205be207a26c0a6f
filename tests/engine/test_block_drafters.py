"""What DFlash (drafters/block.py) and DFlash2 (drafters/block_selector.py) share, tested once for
both: greedy decoding equals the target's greedy decoding at K = 4, 8, 15 on every backend (left
padding), with EOS on the eager loop and the static graph twin, with K forced to change every
iteration under the adaptive schedule (the Ks are the first K of one block), and the static twin
draws the eager loop's samples. The drafters: the tests' trained DFlash and a random DFlash2
(tests/engine/heads.py), blocks of 16, on the same tiny target. Each kind's own tests (reference
forward, reference drafts, layouts, sampling statistics): test_dflash.py, test_dflash2.py."""
import pytest
import torch

import specdec_fast
from ..conftest import backend_device, on_device
from .heads import greedy_under_the_schedule, random_dflash2, trained_dflash
from .models import left_padded_prompts
from .test_paged_runner import VOCAB, tiny

KINDS = ("dflash", "dflash2")


@pytest.fixture(scope="module")
def target():
    return tiny("llama", layers=4, seed=2)


@pytest.fixture(scope="module", params=KINDS)
def drafter(request, target):
    if request.param == "dflash":
        return trained_dflash(target, key="llama4-b16", block_size=16)
    # random, chosen so that the selector moves most drafts off the block's argmax and some are accepted
    return random_dflash2(target, block_size=16, seed=5, std=0.1, selector_std=0.5, input_embedding_scale=1.5)


@pytest.mark.parametrize("backend, k", [("torch", 4), ("torch", 15), ("cpp", 4), ("cpp", 8), ("cpp", 15),
                                        pytest.param("triton", 8, marks=pytest.mark.slow)])
def test_greedy_equals_target_greedy(target, drafter, backend, k, device):
    device = backend_device(backend, device)
    target, drafter = on_device(device, target, drafter)
    ids, mask = on_device(device, *left_padded_prompts([5, 1, 8], vocab=VOCAB, seed=2))
    # interpreted on CPU, 20 tokens (19 iterations: these drafters' drafts are rarely accepted on this
    # prompt; DFlash2's first accepted one is among tokens 17-20)
    new = 20 if backend == "triton" else 30
    expected = target.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=new, pad_token_id=0)
    out, stats = specdec_fast.generate(target, ids, mask, draft_head=drafter, num_assistant_tokens=k, do_sample=False,
                                       max_new_tokens=new, pad_token_id=0, backend=backend, return_stats=True)
    assert torch.equal(out, expected)
    assert stats.k == k and stats.alpha > 0


@pytest.mark.parametrize("graphs", [False, "static"])
def test_greedy_with_eos_and_graphs(target, drafter, graphs):
    ids, mask = left_padded_prompts([3, 7, 2, 5], vocab=VOCAB, seed=11)
    plain = target.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=18, pad_token_id=0)
    eos = int(plain[1, ids.shape[1] + 4])
    expected = target.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=18, pad_token_id=0,
                               eos_token_id=eos)
    out = specdec_fast.generate(target, ids, mask, draft_head=drafter, do_sample=False, max_new_tokens=18,
                                pad_token_id=0, eos_token_id=eos, cuda_graphs=graphs)  # default K: the whole block
    assert torch.equal(out, expected)


@pytest.mark.parametrize("graphs", [False, "static"])
def test_the_adaptive_schedule_chooses_among_block_lengths_exactly(target, drafter, graphs, chaos):
    """num_assistant_tokens_schedule="adaptive": the Ks are the first K of the block (engine
    ADAPTIVE_BLOCK_KS and block_size - 1); greedy equals the target's greedy decoding under the
    schedule's own choices and under K forced to change every iteration (per-K graphs on the twin;
    the pending context must keep every accepted position whatever K ran)."""
    ids, mask = left_padded_prompts([5, 1, 8], vocab=VOCAB, seed=2)
    own, forced, chosen = greedy_under_the_schedule(target, ids, mask, chaos, [15, 2, 8, 1, 4, 12], draft_head=drafter,
                                                    cuda_graphs=graphs)
    assert own.schedule["ks"] == [1, 2, 3, 4, 6, 8, 12, 15]
    assert len(set(chosen)) >= 5 and forced.alpha > 0


def test_static_graph_twin_equals_eager_when_sampling(target, drafter):
    ids, mask = left_padded_prompts([5, 2, 7], vocab=VOCAB, seed=6)
    runs = [specdec_fast.generate(target, ids, mask, draft_head=drafter, num_assistant_tokens=8, do_sample=True,
                                  temperature=0.9, top_k=20, seed=3, max_new_tokens=14, pad_token_id=0, cuda_graphs=graphs,
                                  return_stats=True) for graphs in (False, "static")]
    (eager, e_stats), (static, s_stats) = runs
    assert torch.equal(static, eager) and e_stats.accepted_hist == s_stats.accepted_hist
    assert s_stats.graph_mode == "static" and s_stats.graph_replays["verify"] == s_stats.iterations - 1
