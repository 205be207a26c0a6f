"""The KV pool is allocated uninitialised (runners/paged_cache.py: torch.empty, no page touched
until a token is written there): every reader follows only slots it wrote first (positions below
a row's seq_len). Here each runner's pool is filled with NaN before the calls, over every kind of
drafting and the CPU's backends: the tokens equal a zero-filled pool's, and the pool still holds
NaN afterwards (the unwritten slots were there to be read). Control: an attention that reads
one slot past a row's end is caught."""
import pytest
import torch

from specdec_fast import SpeculativeEngine
from specdec_fast.drafters.token_tree import TokenTree
from specdec_fast.runners import paged_base

from tests.kernels.backends import kernel_backends

from ..conftest import on_device
from .conftest import model_pair
from .heads import random_dflash, random_head
from .models import left_padded_prompts

CALLS = [(dict(do_sample=False), [5, 9, 3]), (dict(do_sample=True, temperature=0.9, top_k=0, seed=11), [2, 7])]


def _drafting(kind: str, target, draft) -> dict:
    return {"draft": dict(assistant_model=draft), "tree": dict(assistant_model=draft),
            "lookup": dict(prompt_lookup_num_tokens=3), "plain": {},
            "eagle3": dict(draft_head=random_head(target, 40, ids=(0, 1, 2))),
            "dflash": dict(draft_head=random_dflash(target, ids=(0, 1)))}[kind]


def _pools(engine) -> list:
    """Every cache of the engine's paged runners (a family with several: Gemma 4's widths, DSA's indexer keys)."""
    return [cache for r in (engine.target_runner, engine.draft_runner) for cache in (getattr(r, "caches", None) or ())]


def _run(kind: str, backend: str, fill: float, calls=CALLS, device: str = "cpu", cuda_graphs="static"):
    """Tokens of ``calls`` on a fresh engine (models on ``device``) whose pools were filled with
    ``fill`` first; the pools."""
    target, draft = on_device(device, *model_pair("llama"))
    graphs = None if backend == "torch" else cuda_graphs  # the torch kernels read lengths on the host: no twin
    engine = SpeculativeEngine(target, **_drafting(kind, target, draft), max_batch_size=4, max_seq_len=48,
                               backend=backend, cuda_graphs=graphs)
    pools = _pools(engine)
    assert pools, "the engine has no KV pool to poison"
    for pool in pools:
        pool.kv.fill_(fill)
    tree = TokenTree.from_branching([2, 2]) if kind == "tree" else None
    outs = []
    for options, lengths in calls:
        ids, mask = on_device(device, *left_padded_prompts(lengths, seed=len(lengths)))
        outs.append(engine.generate(ids, mask, max_new_tokens=9, pad_token_id=0, tree=tree, **options).cpu())
    return outs, pools


@pytest.mark.parametrize("kind", ["draft", "tree", "lookup", "plain", "eagle3", "dflash"])
@pytest.mark.parametrize("backend", [b for b in kernel_backends() if b != "triton"])
def test_a_pool_full_of_nan_gives_the_zeroed_pools_tokens(kind, backend):
    poisoned, pools = _run(kind, backend, float("nan"))
    clean, _ = _run(kind, backend, 0.0)
    for got, want in zip(poisoned, clean):
        assert torch.equal(got, want)
    assert all(pool.kv.isnan().any() for pool in pools), "no slot stayed unwritten: the test read no garbage"


def test_the_triton_kernels_read_no_unwritten_slot(device):
    """Triton's attention, appends and verify (interpreted here: one greedy call, eager, against
    the target's own greedy generate; compiled on a GPU, where an uninitialised pool is what a
    real allocation hands out)."""
    if "triton" not in kernel_backends():
        pytest.skip("no Triton here")
    (got,), pools = _run("draft", "triton", float("nan"), CALLS[:1], device, cuda_graphs=None)
    target, _ = model_pair("llama")
    ids, mask = left_padded_prompts(CALLS[0][1], seed=len(CALLS[0][1]))
    want = target.generate(ids, attention_mask=mask, max_new_tokens=9, do_sample=False, pad_token_id=0)
    assert torch.equal(got, want) and all(pool.kv.isnan().any() for pool in pools)


def test_control_an_attention_reading_one_slot_past_the_end_is_caught(monkeypatch):
    """The torch backend's attention with every row one token longer than it is: with the pool
    zeroed that extra key is a zero vector (a finite, small change); with NaN there it is caught."""
    real = paged_base.paged_attention

    def one_past(q, k_cache, v_cache, block_table, seq_lens, cu_query_lens, *args, **kwargs):
        return real(q, k_cache, v_cache, block_table, seq_lens + 1, cu_query_lens, *args, **kwargs)

    monkeypatch.setattr(paged_base, "paged_attention", one_past)
    poisoned, _ = _run("draft", "torch", float("nan"))
    clean, _ = _run("draft", "torch", 0.0)
    assert not all(torch.equal(got, want) for got, want in zip(poisoned, clean))
