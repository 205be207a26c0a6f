"""Engine tests: tiny random models on CPU. One intra-op thread: these tensors are tiny and the
CI box has 2 shared cores; with the default thread count a 48-wide linear took ~6 ms instead
of ~50 us here (oversubscription)."""
import pytest
import torch

from .models import make_draft, make_model


@pytest.fixture(autouse=True, scope="session")
def _one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


_CACHE = {}


def model_pair(kind: str):
    """(target, draft) for a model family, built once per session; target has no default EOS."""
    if kind not in _CACHE:
        target = make_model(kind)
        target.generation_config.eos_token_id = None
        _CACHE[kind] = (target, make_draft(target, noise=0.1))
    return _CACHE[kind]
