"""The engine with the fused Triton verify kernels (TRITON_INTERPRET=1 on CPU), and the GPU
no-host-sync property."""
import importlib.util

import pytest
import torch

import specdec_fast.api as api

from ..conftest import on_device
from ..implicit_device import ImplicitDeviceFactories
from .runner_checks import steps_without_sync
from .models import left_padded_prompts, make_draft, make_model

HAS_TRITON_VERIFY = importlib.util.find_spec("specdec_fast.kernels.verify.triton") is not None


@pytest.mark.skipif(not HAS_TRITON_VERIFY, reason="triton verify kernel not present")
def test_triton_backend_end_to_end(device):
    """backend='triton' on the test device (compiled on a GPU, interpreted here); head_dim 12: the
    runner is the HF one wherever the Triton attention kernel cannot take it."""
    target = make_model("llama", vocab=64, seed=3)
    target.generation_config.eos_token_id = None
    draft = make_draft(target, noise=0.1)
    ids, mask = left_padded_prompts([3, 5], vocab=64, seed=4)
    target, draft, ids, mask = on_device(device, target, draft, ids, mask)
    expected = target.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=6, pad_token_id=0)
    out = api.generate(target, ids, mask, assistant_model=draft, num_assistant_tokens=3, do_sample=False,
                       max_new_tokens=6, pad_token_id=0, backend="triton")
    assert torch.equal(out, expected)
    sampled = {b: api.generate(target, ids, mask, assistant_model=draft, num_assistant_tokens=3, do_sample=True,
                               top_k=10, max_new_tokens=6, seed=9, backend=b) for b in ("triton", "torch")}
    assert torch.equal(sampled["triton"], sampled["torch"]), "same counter-based randomness, same tokens"


@pytest.mark.parametrize("cuda_graphs", [False, "static"])
@pytest.mark.parametrize("runner", ["paged", "hf"])
def test_generate_creates_its_tensors_with_explicit_devices(runner, cuda_graphs, device):
    """The whole decoding path (api, engine, runners, drafters, cache, kernels) under the detector of
    device-less tensor factories (tests/implicit_device.py), with both drafters."""
    if runner == "hf" and cuda_graphs:
        pytest.skip("the static graph path needs the paged runner")
    from .test_paged_runner import tiny

    target = tiny("llama", layers=1)
    draft = make_draft(target, noise=0.1)
    ids, mask = left_padded_prompts([4, 7], vocab=96, seed=5)
    target, draft, ids, mask = on_device(device, target, draft, ids, mask)
    for extra in (dict(assistant_model=draft, num_assistant_tokens=2), dict(prompt_lookup_num_tokens=2)):
        with ImplicitDeviceFactories() as recorder:
            out = api.generate(target, ids, mask, max_new_tokens=4, pad_token_id=0, do_sample=True, seed=3, runner=runner,
                               cuda_graphs=cuda_graphs, **extra)
        assert out.device == ids.device
        assert recorder.calls == [], recorder.calls


@pytest.mark.gpu
@pytest.mark.parametrize("drafter", ["model", "lookup", "plain"])
def test_steady_state_loop_has_no_host_sync(drafter):
    from specdec_fast.drafters import ModelDrafter, PromptLookupDrafter
    from specdec_fast.engine import SpeculativeDecoder
    from specdec_fast.kernels.sampling_params import make_sampling_tensors
    from specdec_fast.runners import HFRunner

    target = make_model("llama").cuda()
    ids, mask = left_padded_prompts([5, 9, 3])
    ids, mask = ids.cuda(), mask.cuda()
    params = make_sampling_tensors(3, "cuda", temperature=0.8, top_k=20, seed=0)
    draft = make_draft(target.cpu(), noise=0.1).cuda()  # held here: an HFRunner holds its model weakly
    chosen = {"model": ModelDrafter(HFRunner(draft)),
              "lookup": PromptLookupDrafter(2), "plain": None}[drafter]
    target.cuda()
    decoder = SpeculativeDecoder(HFRunner(target), chosen, k=0 if chosen is None else 4, params=params, max_new_tokens=64)
    decoder._prefill(ids, mask)
    for _ in range(2):  # warm-up (allocator, lazy inits)
        decoder.step()
    steps_without_sync(decoder, 5)
