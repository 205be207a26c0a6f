"""One intra-op thread here too (as tests/engine/conftest.py: tiny tensors on 2 shared cores)."""
import pytest
import torch


@pytest.fixture(autouse=True, scope="session")
def _one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
