"""The CUDA-graph code path checked on CPU: cuda_graphs="static" runs the draft and verify steps
through StepGraph(capture=False), i.e. the exact graph code on the static buffers, eagerly,
with its checks (no rebinding, static arguments, same ops every call, no host reads). Here:
(i) its tokens equal the eager path's, token for token; (ii) no state tensor the steps touch is
rebound across iterations; (iii) what one step hands the next lives in static buffers."""
import pytest
import torch

import specdec_fast
import specdec_fast.api as api
from specdec_fast.drafters import ModelDrafter, PromptLookupDrafter
from specdec_fast.engine import SpeculativeDecoder
from specdec_fast.engine.graph_policy import graph_unsupported_reason
from specdec_fast.engine.graphs import GraphSafetyError, addresses
from specdec_fast.kernels.sampling_params import make_sampling_tensors
from specdec_fast.runners import HFRunner, PagedLlamaRunner

from ..conftest import on_device
from .conftest import model_pair
from ..fake_cuda import fake_cuda  # noqa: F401 (fixture)
from .models import left_padded_prompts, make_draft

MODES = {"greedy": dict(do_sample=False), "sampling": dict(do_sample=True, temperature=0.9, top_k=20, seed=7)}


def both(target, ids, mask, **kw):
    """(eager tokens, eager stats), (static tokens, static stats)."""
    return [api.generate(target, ids, mask, pad_token_id=0, return_stats=True, runner="paged", cuda_graphs=mode, **kw)
            for mode in (False, "static")]


def assert_static_twin_gives_eager_tokens(target, vocab: int, *, max_new_tokens: int = 10, backend: str = "cpp",
                                          modes=None, device="cpu") -> None:
    """A family's static twin: left-padded prompts of 3 and 7 tokens, a draft of the target (noise 0.05) at K = 3;
    in each of ``modes`` (default every MODES entry) the static path's tokens equal the eager path's and its
    stats say static. The target's engines are released after."""
    ids, mask = (t.to(device) for t in left_padded_prompts([3, 7], vocab=vocab, seed=1))
    draft = make_draft(target, noise=0.05).to(device)
    for mode in modes if modes is not None else MODES.values():
        (eager, _), (static, s_stats) = both(target, ids, mask, max_new_tokens=max_new_tokens, assistant_model=draft,
                                             num_assistant_tokens=3, backend=backend, **mode)
        assert torch.equal(static, eager) and s_stats.graph_mode == "static"
    specdec_fast.release_engines(target)


@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("lengths", [[6], [5, 9, 3]])
@pytest.mark.parametrize("drafter", ["model", "lookup", "plain"])
def test_static_graph_path_equals_eager(drafter, lengths, mode):
    target, draft = model_pair("llama")
    ids, mask = left_padded_prompts(lengths, seed=len(lengths))
    if drafter == "lookup":  # periodic prompts (period 3): the n-gram lookup finds matches
        width = ids.shape[1]
        for row, n in enumerate(lengths):
            ids[row, width - n :] = ids[row, width - n :][torch.arange(n) % 3]
    extra = {"model": dict(assistant_model=draft, num_assistant_tokens=3), "lookup": dict(prompt_lookup_num_tokens=3),
             "plain": {}}[drafter]
    new = 13
    (eager, e_stats), (static, s_stats) = both(target, ids, mask, max_new_tokens=new, **extra, **MODES[mode])
    assert torch.equal(static, eager)
    assert e_stats.accepted_hist == s_stats.accepted_hist
    assert static.shape[1] == ids.shape[1] + new and s_stats.tokens_per_row == [new] * len(lengths)  # max_new_tokens exact
    assert e_stats.graph_mode == "eager" and s_stats.graph_mode == "static"
    steps = ("draft", "verify") if drafter != "plain" else ("verify",)
    # Warm-up 1: every later iteration went through the graph code (capture call included).
    assert s_stats.graph_replays == {name: s_stats.iterations - 1 for name in steps}
    if drafter == "model":
        assert s_stats.alpha > 0.3  # the pair agrees often: multi-token blocks were really exercised


@pytest.mark.parametrize("drafter", ["model", "lookup"])
def test_eos_inside_a_block(drafter):
    target, draft = model_pair("llama")
    ids, mask = left_padded_prompts([5, 9, 3], seed=11)
    extra = dict(assistant_model=draft, num_assistant_tokens=4) if drafter == "model" else dict(prompt_lookup_num_tokens=4)
    free = api.generate(target, ids, mask, max_new_tokens=14, pad_token_id=0, do_sample=False, runner="paged", **extra)
    eos = int(free[1, ids.shape[1] + 6])  # row 1's 7th token (rows 0 and 2 may stop earlier or not at all)
    (eager, e_stats), (static, _) = both(target, ids, mask, max_new_tokens=14, do_sample=False, eos_token_id=eos, **extra)
    assert torch.equal(static, eager)
    assert e_stats.tokens_per_row[1] <= 7 and int(eager[1, ids.shape[1] + e_stats.tokens_per_row[1] - 1]) == eos


def _decoder(drafter_kind: str, batch: int, k: int = 3, new: int = 12, cuda_graphs="static", mode=None):
    """A decoder after its prefill; mode: force the graph mode (e.g. "cuda_graphs" under fake_cuda:
    on CUDA the device check is the only difference)."""
    target, draft = model_pair("llama")
    ids, mask = left_padded_prompts([5, 9, 3][:batch], seed=2)
    runner = PagedLlamaRunner(target, max_new_tokens=new, num_draft_tokens=k)
    drafter = {"model": lambda: ModelDrafter(PagedLlamaRunner(draft, max_new_tokens=new, num_draft_tokens=k)),
               "lookup": lambda: PromptLookupDrafter(2), "plain": lambda: None}[drafter_kind]()
    params = make_sampling_tensors(batch, "cpu", temperature=0.8, top_k=20, seed=3)
    decoder = SpeculativeDecoder(runner, drafter, k=k if drafter else 0, params=params, max_new_tokens=new,
                                 pad_token_id=0, cuda_graphs=cuda_graphs)
    if mode is not None:
        decoder.graph_mode = mode
    decoder._prefill(ids, mask)
    return decoder


@pytest.mark.parametrize("drafter", ["model", "lookup", "plain"])
def test_state_addresses_are_fixed_and_handoffs_are_static(drafter):
    decoder = _decoder(drafter, batch=3)
    decoder.step()  # warm-up: may build lazily cached tensors
    first = addresses(decoder.graph_state())
    assert {"target.cache.kv", "target.length", "target.cache.seq_lens", "decoder.state.seq", "decoder.state.status",
            "decoder.stats.hist", "decoder.state.params.seed"} <= set(first)
    if drafter == "model":
        assert {"drafter.pending", "drafter.num_pending", "drafter.runner.length", "drafter.runner.cache.kv"} <= set(first)
    handoff = None
    for _ in range(6):
        decoder.step()
        # (ii) every state tensor the steps read or write: same address, shape, dtype.
        assert addresses(decoder.graph_state()) == first
        if decoder.k:
            # (iii) the draft step's outputs, read by the verify step, are the static buffers.
            drafts = decoder.steps.draft.outputs[0]
            assert decoder.steps.verify._arg_addresses["arg0[0]"][0] == drafts.data_ptr()
            handoff = handoff or drafts.data_ptr()
            assert drafts.data_ptr() == handoff
    assert decoder.steps.verify.replays == 6


def test_rebinding_drafter_is_caught():
    """The pre-graph ModelDrafter.commit (self.pending = torch.stack(...)) would leave a captured
    draft graph reading stale pending tokens: the static path refuses it."""

    class RebindingDrafter(ModelDrafter):
        def commit(self, num_accepted, draft_tokens):
            super().commit(num_accepted, draft_tokens)
            self.pending = self.pending.clone()

    target, draft = model_pair("llama")
    ids, mask = left_padded_prompts([5, 9], seed=2)
    runner = PagedLlamaRunner(target, max_new_tokens=8, num_draft_tokens=2)
    drafter = RebindingDrafter(PagedLlamaRunner(draft, max_new_tokens=8, num_draft_tokens=2))
    decoder = SpeculativeDecoder(runner, drafter, k=2, params=make_sampling_tensors(2, "cpu", temperature=0.0),
                                 max_new_tokens=8, cuda_graphs="static")
    with pytest.raises(GraphSafetyError, match=r"drafter\.pending rebound"):
        decoder.generate(ids, mask)


@pytest.mark.parametrize("drafter", [pytest.param("model", marks=pytest.mark.slow), "lookup"])  # model: ~14 s interpreted
def test_triton_kernels_through_the_static_path(drafter, device):
    """backend='triton' on the test device (compiled on a GPU, TRITON_INTERPRET=1 here): the
    kernels a CUDA graph would capture, through the graph code path run eagerly."""
    from .test_paged_runner import tiny

    target = tiny("llama", layers=1)
    extra = (dict(assistant_model=on_device(device, make_draft(target, noise=0.1)), num_assistant_tokens=2)
             if drafter == "model" else dict(prompt_lookup_num_tokens=2))
    ids, mask = left_padded_prompts([4, 7], vocab=96, seed=5)
    target, ids, mask = on_device(device, target, ids, mask)
    (eager, _), (static, stats) = both(target, ids, mask, max_new_tokens=5, **extra,
                                      do_sample=True, seed=1, backend="triton")
    assert torch.equal(static, eager) and stats.graph_replays == {"draft": stats.iterations - 1,
                                                                   "verify": stats.iterations - 1}


def test_switch_and_fallbacks():
    target, draft = model_pair("llama")
    ids, mask = left_padded_prompts([5], seed=2)
    _, stats = api.generate(target, ids, mask, max_new_tokens=3, return_stats=True, assistant_model=draft)
    assert stats.graph_mode == "eager" and "CUDA" in stats.graph_note  # None on CPU: eager, says why
    assert "execution            eager" in stats.format()
    with pytest.raises(ValueError, match="cuda_graphs=True cannot run: CUDA graphs need a CUDA device"):
        api.generate(target, ids, mask, max_new_tokens=3, cuda_graphs=True)
    with pytest.raises(ValueError, match="cuda_graphs='static' cannot run: the target runner HFRunner"):
        api.generate(target, ids, mask, max_new_tokens=3, cuda_graphs="static", runner="hf")
    # The torch references read lengths on the host: refused before the call, not mid-way with a
    # GraphSafetyError in its first draft step (found by the sampling fuzzing round).
    for drafting in (dict(assistant_model=draft), dict(prompt_lookup_num_tokens=2), {}):
        with pytest.raises(ValueError, match="cuda_graphs='static' cannot run: the torch reference kernels read"):
            api.generate(target, ids, mask, max_new_tokens=3, cuda_graphs="static", backend="torch", **drafting)
    for bad in ("on", 1, 0):
        with pytest.raises(ValueError, match="cuda_graphs must be"):
            api.generate(target, ids, mask, max_new_tokens=3, cuda_graphs=bad)
    # The reasons, device by device.
    hf = HFRunner(target)
    paged = PagedLlamaRunner(target, max_new_tokens=3, num_draft_tokens=0)
    assert "HFRunner" in graph_unsupported_reason(hf, None, None, torch.device("cuda"))
    assert "ModelDrafter" in graph_unsupported_reason(paged, ModelDrafter(HFRunner(draft)), None, torch.device("cuda"))
    assert "torch" in graph_unsupported_reason(paged, None, "torch", torch.device("cuda"))


@pytest.mark.parametrize("drafter", ["model", "plain"])
def test_engine_capture_flow_with_fake_cuda(fake_cuda, drafter):
    """The graph mode's engine-side control flow on CPU (torch.cuda's graph API faked: the capture
    block runs the step once eagerly, replays only count): one warm-up iteration on the side
    stream, then both steps captured into ONE shared pool on ONE stream, draft first, and only
    replays after that; the capture iteration is timed apart."""
    decoder = _decoder(drafter, batch=2, cuda_graphs=False, mode="cuda_graphs")
    for _ in range(4):
        decoder.step()
    names = [entry[0] for entry in fake_cuda.log]
    steps = 2 if drafter == "model" else 1
    assert names[: 4 * steps] == ["wait", "enter stream", "exit stream", "wait"] * steps  # warm-up, side stream
    assert names[4 * steps :] == ["capture", "end capture", "replay"] * steps + ["replay"] * (2 * steps)
    pools, streams = {id(p) for p, _ in fake_cuda.captures}, {id(s) for _, s in fake_cuda.captures}
    assert len(fake_cuda.captures) == steps and len(pools) == 1 and len(streams) == 1
    report = decoder.graph_report()
    assert report["mode"] == "cuda_graphs" and set(report["replays"].values()) == {3}
    decoder.timer.finish()
    assert set(decoder.timer.totals) == {"prefill", "target", "capture"} | ({"draft"} if drafter == "model" else set())


def test_static_graph_path_gpt2_paged_runner():
    """The GPT-2 paged runner shares the base's in-place state: the graph code path holds for it too."""
    from .test_paged_gpt2 import tiny_gpt2

    target = tiny_gpt2()
    draft = tiny_gpt2(seed=1, layers=1)
    ids, mask = left_padded_prompts([5, 9, 3], vocab=96, seed=2)
    for mode in MODES.values():
        (eager, e_stats), (static, s_stats) = both(target, ids, mask, max_new_tokens=10, assistant_model=draft,
                                                   num_assistant_tokens=3, **mode)
        assert torch.equal(static, eager) and e_stats.accepted_hist == s_stats.accepted_hist
        assert s_stats.graph_mode == "static" and s_stats.graph_replays == {"draft": s_stats.iterations - 1,
                                                                             "verify": s_stats.iterations - 1}


@pytest.mark.parametrize("kind", ["phi3", "granite", "smollm3", "olmo3", "gemma3", "starcoder2", "gpt_neox", "opt",
                                  "cohere", "gpt_bigcode", "mistral", "gemma2", "cohere2"])
def test_static_graph_path_of_the_other_families(kind):
    """Phi-3's views, Granite's scalars, SmolLM3's NoPE tables, the OLMo / Gemma 3 runners' per-type
    RoPE, the StarCoder2 / GPT-NeoX / OPT / Cohere / GPT-BigCode runners, and Mistral / Gemma 2 /
    Cohere 2 past windows of 8 (a captured window per layer) hold the graph code path's checks too:
    the static twin gives the eager tokens, greedy and sampled."""
    from .models import make_model

    target = make_model(kind, seed=3)
    target.generation_config.eos_token_id = None
    ids, mask = left_padded_prompts([3, 7], seed=1)
    for mode in MODES.values():
        (eager, e_stats), (static, s_stats) = both(target, ids, mask, max_new_tokens=10,
                                                   assistant_model=make_draft(target, noise=0.05),
                                                   num_assistant_tokens=3, **mode)
        assert torch.equal(static, eager) and e_stats.accepted_hist == s_stats.accepted_hist
        assert s_stats.graph_mode == "static"
