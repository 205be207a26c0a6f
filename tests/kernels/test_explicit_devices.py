"""Every kernel entry point, on every backend this machine has, creates its tensors with an explicit
device (tests/implicit_device.py): the class of the H100 bug where philox built CPU tensors next
to CUDA seeds, which no CPU-only run can see as a failure. Inputs live on the ``device`` fixture
(CPU here, CUDA on a GPU machine); each call's results are also checked to stay there."""
import pytest
import torch

from specdec_fast.runners.paged_cache import PagedKVCache
from specdec_fast.kernels import sampling_params
from specdec_fast.kernels._backend import canonical_device
from specdec_fast.kernels.attention import paged_attention
from specdec_fast.kernels.cache_ops import append_kv, compact_kv
from specdec_fast.kernels.linear import skinny_linear, skinny_linear_n
from specdec_fast.kernels.penalties import add_tokens, make_penalty_tensors
from specdec_fast.kernels.llama_ops import rms_norm, rope_cos_sin, rope_qk_, silu_mul
from specdec_fast.kernels.rng import derive_row_seeds, philox, random_bits
from specdec_fast.kernels.rng.reference import check_offset_range
from specdec_fast.kernels.sampling_params import make_sampling_tensors
from specdec_fast.kernels.verify import chain_verify, prepared_impls, sample, standardise

from ..implicit_device import ImplicitDeviceFactories
from .attention_cases import make_case
from .backends import TEST_DEVICE, kernel_backends

# The interpreted Triton column takes 7-11 s here (every launch interpreted, every op traced).
BACKENDS = [pytest.param(b, marks=pytest.mark.slow) if b == "triton" and TEST_DEVICE == "cpu" else b
            for b in kernel_backends()]


def _outputs(value) -> list:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (tuple, list)):
        return [t for v in value for t in _outputs(v)]
    if hasattr(value, "__dataclass_fields__"):
        return [t for name in value.__dataclass_fields__ for t in _outputs(getattr(value, name))]
    return []


def _verify_calls(backend, device):
    g = torch.Generator().manual_seed(0)
    target = torch.randn(2, 3, 40, generator=g).to(device)
    draft = torch.randn(2, 2, 40, generator=g).to(device)
    drafts = torch.tensor([[3, 7], [5, -1]], device=device)
    per_row = dict(temperature=torch.tensor([0.0, 0.8], device=device), top_k=torch.tensor([0, 5], device=device),
                   seed=torch.tensor([3, 4], device=device), offset=torch.tensor([0, 9], device=device))
    params = make_sampling_tensors(2, device, temperature=0.7, top_p=0.9, seed=11)
    pen = make_penalty_tensors(torch.tensor([[0, 3], [7, 7]], device=device), 40, repetition_penalty=1.2,
                               frequency_penalty=0.5, presence_penalty=torch.tensor([0.0, 0.4], device=device))
    verify_impl, sample_impl = prepared_impls(backend, device)
    return {
        "chain_verify int seed": lambda: chain_verify(target, draft, drafts, seed=12345, top_k=9, backend=backend),
        "chain_verify unchecked": lambda: chain_verify(target, None, drafts, seed=-7, min_p=0.05, offset=3,
                                                       backend=backend, check=False),
        "chain_verify per-row": lambda: chain_verify(target, draft, drafts, backend=backend, **per_row),
        "chain_verify K=0": lambda: chain_verify(target[:, :1], None, drafts[:, :0], seed=2**40, backend=backend),
        "sample int position": lambda: sample(target[:, 0], seed=99, position=4, top_p=0.8, backend=backend),
        "sample tensor position": lambda: sample(target[:, 0], seed=per_row["seed"], position=torch.tensor([1, 2], device=device),
                                                 backend=backend, check=False),
        "prepared chain_verify": lambda: verify_impl(target, draft, drafts, params),
        "prepared sample": lambda: sample_impl(target[:, 0], params, torch.zeros(2, dtype=torch.long, device=device), 2),
        "chain_verify penalties": lambda: chain_verify(target, draft, drafts, seed=5, top_k=9, penalties=pen,
                                                       backend=backend, check=False),
        "sample penalties prefix": lambda: sample(target[:, 0], seed=5, penalties=pen, prefix_tokens=drafts,
                                                  backend=backend, check=False),
        "prepared penalties": lambda: verify_impl(target, draft, drafts, params, pen),
    }


def _sampling_and_rng_calls(device):
    seeds = torch.tensor([5, -6], device=device)
    return {
        "make_sampling_tensors scalars": lambda: make_sampling_tensors(3, device, temperature=0.3, top_k=4, top_p=0.5,
                                                                       min_p=0.2, seed=77, offset=8),
        "make_sampling_tensors tensors": lambda: make_sampling_tensors(2, device, temperature=torch.tensor([1.0, 0.0], device=device),
                                                                       seed=seeds, offset=torch.tensor([1, 2], device=device)),
        "standardise": lambda: standardise(torch.randn(2, 1, 30).to(device), make_sampling_tensors(2, device, top_k=3, seed=5)),
        "derive_row_seeds": lambda: derive_row_seeds(31337, 4, device),
        "philox ints and tensors": lambda: philox(torch.arange(4, device=device), 0, 7, 3, 11, 12),
        "random_bits int offset": lambda: random_bits(seeds, 5, 3, 1, torch.arange(6, device=device)[:, None]),
        "check_offset_range": lambda: check_offset_range(torch.tensor([0, 5], device=device)),
        "make_penalty_tensors": lambda: make_penalty_tensors(torch.tensor([[1, 2]], device=device), 9,
                                                             repetition_penalty=1.3, frequency_penalty=0.1),
        "add_tokens": lambda: add_tokens(torch.zeros(1, 9, dtype=torch.int32, device=device),
                                         torch.tensor([[3, -1, 8]], device=device)),
    }


def _triton_rng_calls(device):
    from specdec_fast.kernels.rng.triton import derive_row_seeds_triton

    return {"derive_row_seeds_triton": lambda: derive_row_seeds_triton(4242, 5, device)}


def _attention_and_cache_calls(backend, device):
    case = make_case([9, 5], [3, 2], 4, 2, 16, 4, torch.float32, seed=1, device=device)
    tree = make_case([9, 5], [3, 2], 4, 2, 16, 4, torch.float32, tree=True, seed=2, device=device)
    caches = torch.zeros(2, 2, 6, 4, 2, 16, device=device)
    table = torch.tensor([[0, 2, 4], [1, 3, 5]], dtype=torch.int32, device=device)
    seq = torch.tensor([3, 6], dtype=torch.int32, device=device)
    cu = torch.tensor([0, 2, 3], dtype=torch.int32, device=device)
    new = torch.randn(3, 2, 16).to(device)
    path = torch.tensor([[0, 2, -1], [1, -1, -1]], dtype=torch.int32, device=device)
    return {
        "paged_attention causal": lambda: paged_attention(*case.args(), max_query_len=3, backend=backend),
        "paged_attention tree unchecked": lambda: paged_attention(*tree.args(), max_query_len=3, tree_mask=tree.tree_mask,
                                                                  backend=backend, check=False),
        "append_kv": lambda: append_kv(new, new, caches[0, 0], caches[0, 1], table, seq, cu, backend=backend),
        "compact_kv": lambda: compact_kv(caches, table, seq, path, backend=backend),
    }


def _paged_cache_calls(backend, device):
    def lifecycle():
        cache = PagedKVCache(2, 2, 16, num_blocks=8, block_size=4, max_batch=2, max_blocks_per_row=3,
                             dtype=torch.float32, device=device)
        cache.admit_batch([0, 1], [9, 5])
        cache.append(1, torch.randn(3, 2, 16).to(device), torch.randn(3, 2, 16).to(device),
                     torch.tensor([0, 2, 3], dtype=torch.int32, device=device), backend=backend)
        cache.commit(torch.tensor([2, 1], dtype=torch.int32, device=device))
        cache.compact(torch.tensor([[0, -1], [0, -1]], dtype=torch.int32, device=device), backend=backend)
        gathered = cache.gather(1, 0)
        cache.free(1)
        cache.admit(1, 4)
        return gathered, cache.kv, cache.block_table, cache.seq_lens

    return {"PagedKVCache lifecycle": lifecycle}


def _layer_calls(backend, device):
    g = torch.Generator().manual_seed(3)
    x, w = torch.randn(3, 8, generator=g).to(device), torch.randn(5, 8, generator=g).to(device)
    q, k = torch.randn(3, 4, 8, generator=g).to(device), torch.randn(3, 2, 8, generator=g).to(device)
    inv_freq = torch.rand(4, generator=g).to(device)
    positions = torch.tensor([0, 5, 9], device=device)
    cos, sin = torch.randn(3, 8, generator=g).to(device), torch.randn(3, 8, generator=g).to(device)
    return {
        "skinny_linear": lambda: skinny_linear(x, w, torch.randn(5).to(device), backend=backend),
        "skinny_linear_n": lambda: skinny_linear_n(x, [w, w[:2]], backend=backend),
        "rms_norm": lambda: rms_norm(x, x[0], 1e-6, backend=backend),
        "rope_qk_": lambda: rope_qk_(q, k, cos, sin, backend=backend),
        "rope_cos_sin": lambda: rope_cos_sin(positions, inv_freq, 1.0, backend=backend),
        "silu_mul": lambda: silu_mul(x, x, backend=backend),
    }


def _calls(backend: str, device) -> dict:
    """name -> call for every entry point that takes ``backend`` (the ops without a Triton kernel
    run their automatic choice in the triton column)."""
    calls = {**_verify_calls(backend, device), **_attention_and_cache_calls(backend, device),
             **_paged_cache_calls(backend, device)}
    calls.update(_layer_calls(None if backend == "triton" else backend, device))
    if backend == "torch":
        calls.update(_sampling_and_rng_calls(device))
    if backend == "triton":
        calls.update(_triton_rng_calls(device))
    return calls


@pytest.mark.parametrize("backend", BACKENDS)
def test_every_entry_point_creates_its_tensors_on_the_inputs_device(backend, device):
    sampling_params._cache.clear()  # a cache hit would skip the factories under test
    calls = _calls(backend, device)
    found, wrong_device = {}, {}
    for name, call in calls.items():
        with ImplicitDeviceFactories() as recorder:
            out = call()
        if recorder.calls:
            found[name] = recorder.calls
        moved = [t.device for t in _outputs(out) if t.device != canonical_device(device)]
        if moved:
            wrong_device[name] = moved
    assert not found, f"tensors created without an explicit device (backend {backend}): {found}"
    assert not wrong_device, f"outputs not on {device}: {wrong_device}"
    assert len(calls) >= 16


def test_the_detector_flags_a_device_less_factory_in_package_code(device):
    """The philox bug, as it was: torch.as_tensor(int) next to a device tensor."""
    import specdec_fast.kernels.rng.reference as ref

    def old_philox_argument(v):  # what kernels/rng/reference.py did before the fix
        return torch.as_tensor(v, dtype=torch.int64)

    code = old_philox_argument.__code__.replace(co_filename=ref.__file__)
    buggy = type(old_philox_argument)(code, globals())
    with ImplicitDeviceFactories() as recorder:
        buggy(5)
        buggy(torch.ones(2, dtype=torch.int64, device=device))  # a tensor keeps its device: not flagged
        torch.full((2,), 1)  # outside the package (this test file): not ours
    assert [name for name, _ in recorder.calls] == ["as_tensor"]
    assert recorder.calls[0][1].startswith(ref.__file__)


def test_stored_devices_carry_their_index(device):
    """'cuda' and cuda:0 compare unequal as torch.device values: a stored device is normalised once
    (the H100 run: "n_emitted is on cuda:0 but the cache is on cuda")."""
    index = torch.cuda.current_device() if torch.cuda.is_available() else 0
    assert canonical_device("cuda") == torch.device("cuda", index)
    assert canonical_device(torch.device("cuda", 1)) == torch.device("cuda", 1)
    assert canonical_device("cpu") == torch.device("cpu")
    generic = torch.device(device).type  # "cuda" without an index on a GPU machine
    cache = PagedKVCache(1, 1, 16, num_blocks=2, block_size=4, max_batch=2, max_blocks_per_row=1, device=generic)
    assert cache.device == torch.zeros(1, device=generic).device
    cache.commit(torch.ones(2, dtype=torch.int32, device=generic))
    params = make_sampling_tensors(2, generic, seed=torch.tensor([1, 2], device=generic))
    assert params.seed.device == cache.device
