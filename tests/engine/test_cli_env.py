"""`specdec-fast env` (specdec_fast/cli_env.py): the versions, the CPU's backend, and each CUDA device
with the backend a call takes there and why, the GPUs faked where this machine has none."""
import io

import torch

from specdec_fast import __version__
from specdec_fast.cli import main
from specdec_fast.cli_env import run_env
from specdec_fast.kernels import _backend
from specdec_fast.kernels.attention import triton as attention_triton


def test_env_on_this_machine(capsys):
    assert main(["env"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith(f"specdec-fast {__version__}, Python ") and f"torch {torch.__version__}" in out[0]
    assert "triton " in out[0] and "transformers " in out[0]
    cpu_backend, why = _backend.default_backend_reason(torch.device("cpu"))
    assert out[1].startswith("cpu (") and f"backend {cpu_backend}: {why}" in out[1]
    if not torch.cuda.is_available():
        assert out[2:] == ["no CUDA device"]


def test_env_names_each_gpus_backend_and_why(monkeypatch):
    """A T4 beside an H100: the T4 takes the torch backend (compute capability 7.5 < 8.0), the H100
    Triton; each line has the capability, the SMs and the shared memory a block."""
    gpus = {0: ("Tesla T4", (7, 5), 40, 65536), 1: ("NVIDIA H100 80GB HBM3", (9, 0), 132, 232448)}
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda index: gpus[index][0])
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda index: gpus[index][1])
    monkeypatch.setattr(attention_triton, "_num_sms_of", lambda index: gpus[index][2])
    monkeypatch.setattr(attention_triton, "_shared_limit_of", lambda index: gpus[index][3])
    _backend.cuda_capability.cache_clear()
    try:
        out = io.StringIO()
        assert run_env(out) == 0
    finally:
        _backend.cuda_capability.cache_clear()
    lines = out.getvalue().splitlines()
    t4, h100 = lines[2], lines[3]
    assert t4.startswith("cuda:0 Tesla T4: compute capability 7.5, 40 SMs, 65536 bytes of shared memory a block: "
                         "backend torch: Tesla T4 has compute capability 7.5; specdec_fast's Triton kernels need 8.0")
    assert h100.startswith("cuda:1 NVIDIA H100 80GB HBM3: compute capability 9.0, 132 SMs, 232448 bytes") and \
        h100.endswith(f"backend triton: triton {'.'.join(map(str, _backend.triton_version()))}")
    assert len(lines) == 4
