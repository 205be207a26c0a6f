"""The Triton versions the package runs under (kernels/_backend.py MIN_TRITON, kernels/_triton_compat.py,
engine/triton_launches.py). What CI's Triton cannot show is simulated here: an older triton's
version string, no PDL, no compute_cache_key. The real versions were run by hand (tests/kernels
with triton 3.3.1 / 3.4.0 / 3.5.1 beside torch 2.13: see kernels/_backend.py)."""
import pytest
import torch
import triton
import triton.language as tl

from specdec_fast.engine import triton_launches
from specdec_fast.engine.triton_launches import TritonLaunches, launch_of
from specdec_fast.kernels import _backend, _triton_compat
from specdec_fast.kernels import llama_ops

CUDA = torch.device("cuda", 0)  # resolve_backend reads only the device's type: no GPU needed


@triton.jit
def _fill_kernel(x_ptr, n, BLOCK: tl.constexpr):
    i = tl.arange(0, BLOCK)
    tl.store(x_ptr + i, n + 0.0, mask=i < n)


@pytest.mark.parametrize("text, version", [("3.6.0", (3, 6)), ("3.4.0+git1a2b", (3, 4)), ("3.10.1rc2", (3, 10)),
                                           ("4.0", (4, 0))])
def test_triton_version_reads_major_and_minor(monkeypatch, text, version):
    monkeypatch.setattr(triton, "__version__", text)
    assert _backend.triton_version() == version


def test_an_older_triton_leaves_cuda_on_the_torch_backend(monkeypatch):
    monkeypatch.setattr(triton, "__version__", "3.3.1")
    _backend._warn_too_old.cache_clear()
    with pytest.warns(UserWarning, match=r"triton 3.3 is installed.*need triton >= 3.4.*torch backend"):
        assert _backend.resolve_backend(None, CUDA, "chain_verify") == "torch"
    with pytest.raises(ValueError, match=r"backend='triton': triton 3.3 is installed.*>= 3.4"):
        _backend.resolve_backend("triton", CUDA, "chain_verify")
    with pytest.raises(ValueError, match=r"triton 3.3 is installed"):
        llama_ops.rms_norm(torch.ones(2, 8), torch.ones(8), 1e-6, backend="triton")
    _backend._warn_too_old.cache_clear()


def test_the_floor_itself_is_accepted(monkeypatch):
    monkeypatch.setattr(triton, "__version__", ".".join(map(str, _backend.MIN_TRITON)) + ".0")
    assert _backend.triton_available()
    assert _backend.resolve_backend(None, CUDA, "chain_verify") == "triton"


@pytest.fixture
def fake_gpus(monkeypatch):
    """A machine whose GPUs the test fakes (it patches torch.cuda's device queries): CUDA available,
    TRITON_INTERPRET unset (read at each call, as on a GPU machine), and the backend's per-device
    capability cache and once-only warning emptied before and after, so neither leaks into other tests."""
    import torch

    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    _backend.cuda_capability.cache_clear()
    _backend._warn_old_gpu.cache_clear()
    yield
    _backend.cuda_capability.cache_clear()
    _backend._warn_old_gpu.cache_clear()


def test_pdl_is_asked_for_only_where_the_triton_and_the_gpu_take_it(monkeypatch, fake_gpus):
    """PDL's launch keywords only on CUDA, with a Triton that compiles it (3.5+), on a GPU of sm_90 or
    later (griddepcontrol: ptxas refuses it for sm_80 / sm_86 / sm_89, test_other_gpu_compiles.py)."""
    import torch

    cuda0, cuda1 = torch.device("cuda", 0), torch.device("cuda", 1)
    capability = {0: (9, 0), 1: (8, 6)}  # an H100 beside an RTX 3090
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda index: capability[index])
    monkeypatch.setattr(_triton_compat, "HAS_PDL", True)
    assert _triton_compat.pdl_options(True, torch.device("cpu")) == {}
    assert _triton_compat.pdl_options(False, cuda0) == {}
    assert _triton_compat.pdl_options(True, cuda0) == {"PDL": True, "launch_pdl": True}
    assert _triton_compat.pdl_options(True, cuda1) == {}
    monkeypatch.setattr(_triton_compat, "HAS_PDL", False)  # triton 3.4: gdc_wait does not compile
    assert _triton_compat.pdl_options(True, cuda0) == {}


@pytest.mark.cpu_only  # its launch runs the installed triton's JITFunction.run, which on a GPU machine (compiled,
# not interpreted) calls the compute_cache_key this test deletes: a NameError, not a Triton 3.4
def test_launch_keys_without_compute_cache_key(monkeypatch):
    """Triton 3.3 / 3.4 compute the key inline (str(specialization) + str(options)): the launch
    records still tell specialisations apart, and a launch under the same key matches."""
    import triton.runtime.jit as jit

    x = torch.zeros(32)
    with_function = {n: launch_of(_fill_kernel, (x, n), {"BLOCK": 16}, (1,)).key for n in (1, 5, 16)}
    monkeypatch.delattr(jit, "compute_cache_key", raising=False)  # absent already under triton 3.4
    triton_launches._key_function.cache_clear()
    try:
        launches = {n: launch_of(_fill_kernel, (x, n), {"BLOCK": 16}, (1,)) for n in (1, 5, 16)}
        assert len({launch.key for launch in launches.values()}) == 3 == len(set(with_function.values()))
        binder, _ = triton_launches._BINDERS(_fill_kernel)
        _, specialization, options = binder(x, 5, BLOCK=16)
        assert launches[5].key == str(specialization) + str(options)  # JITFunction.run's inline key (3.4)
        with TritonLaunches(expected={(launches[5].kernel, launches[5].key)}) as recorded:
            _fill_kernel[(1,)](x, 5, BLOCK=16)
        assert [launch.key for launch in recorded.launches] == [launches[5].key] and float(x[4]) == 5.0
    finally:
        triton_launches._key_function.cache_clear()


def test_a_gpu_before_sm80_runs_the_torch_backend(monkeypatch, fake_gpus):
    """A T4 (7.5): backend=None takes the torch backend with one warning naming the GPU and the floor
    (its prefill attention tile needs more shared memory than it has: test_other_gpu_compiles.py), and
    backend='triton' raises that reason; an A100 (8.0) and an H100 (9.0) take the Triton kernels."""
    capability = {0: (7, 5), 1: (8, 0), 2: (9, 0)}
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda index: capability[index])
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda index: {0: "Tesla T4"}.get(index, "GPU"))
    t4 = torch.device("cuda", 0)
    with pytest.warns(UserWarning, match=r"Tesla T4 has compute capability 7.5.*need 8.0 or later.*torch backend"):
        assert _backend.resolve_backend(None, t4, "chain_verify") == "torch"
    with pytest.raises(ValueError, match=r"backend='triton': Tesla T4 has compute capability 7.5"):
        _backend.resolve_backend("triton", t4, "chain_verify")
    for index in (1, 2):
        assert _backend.resolve_backend(None, torch.device("cuda", index), "chain_verify") == "triton"
        assert _backend.resolve_backend("triton", torch.device("cuda", index), "chain_verify") == "triton"


def test_an_amd_gpu_runs_the_torch_backend(monkeypatch, fake_gpus):
    """ROCm's torch reports AMD GPUs as "cuda" devices; the kernels hold NVIDIA PTX (inline fences):
    backend=None takes the torch backend with one warning, backend='triton' raises."""
    monkeypatch.setattr(torch.version, "hip", "6.2.0", raising=False)
    gpu = torch.device("cuda", 0)
    with pytest.warns(UserWarning, match=r"AMD GPU \(ROCm\).*torch backend"):
        assert _backend.resolve_backend(None, gpu, "chain_verify") == "torch"
    with pytest.raises(ValueError, match=r"backend='triton': this is an AMD GPU"):
        _backend.resolve_backend("triton", gpu, "chain_verify")
