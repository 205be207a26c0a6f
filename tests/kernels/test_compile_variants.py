"""The layer kernels compile a bounded set of variants, whatever the prompt lengths and the
engine's row capacity: a call at a new length must not compile (on an H100 the first call at
max_new_tokens = 512 took 7.6 s, 6 s of it compiling the attention's split variants and length-
specialised kernels; bench/results/h100_2026-11-24/README.md).

Triton compiles one variant per specialisation key: every constexpr value, and each int
argument's class (1, a multiple of 16, other). The keys are computed here exactly as Triton 3.6
computes them (engine/triton_launches.py), on the test device's tensors (CUDA on a GPU machine,
the interpreter's CPU elsewhere), with the SM count of an H100 where the plan depends on it. A
failure names the argument that changed.
"""
import pytest
import torch

from specdec_fast.engine.triton_launches import TritonLaunches, explain_new_key
from specdec_fast.kernels.attention import triton as attention_triton
from specdec_fast.kernels.cache_ops.triton import append_kv_triton
from specdec_fast.kernels.cache_ops.triton_rope import rope_append_kv_triton
from specdec_fast.kernels.llama_ops.triton import add_rms_norm_triton, silu_mul_triton

from ..conftest import on_device

PROMPT_LENGTHS = (17, 32, 77, 300)  # prefill calls: every class of int (other, multiple of 16) and tile size


def _keys(calls) -> dict:
    """kernel -> {key: Launch} of the launches the calls make."""
    seen: dict = {}
    with TritonLaunches() as launches:
        for call in calls:
            call()
    for launch in launches.launches:
        seen.setdefault(launch.kernel, {})[launch.key] = launch
    return seen


def _assert_one_variant(seen: dict):
    for kernel, variants in seen.items():
        launches = list(variants.values())
        assert len(launches) == 1, f"{kernel}: {len(launches)} variants: " + "; ".join(
            explain_new_key(launch, launches[:1]) for launch in launches[1:])


def _attention_call(num_tokens_per_row: int, capacity_blocks: int, *, hq=8, hkv=2, head_dim=16, page=16):
    """One row whose last num_tokens_per_row tokens are new, in a block table of capacity_blocks."""
    context = num_tokens_per_row + 3
    blocks = -(-context // page)
    k_cache = torch.randn(blocks + 1, page, hkv, head_dim)
    v_cache = torch.randn_like(k_cache)
    table = torch.full((1, capacity_blocks), -1, dtype=torch.int32)
    table[0, :blocks] = torch.arange(1, blocks + 1, dtype=torch.int32)
    q = torch.randn(num_tokens_per_row, hq, head_dim)
    seq_lens = torch.tensor([context], dtype=torch.int32)
    cu = torch.tensor([0, num_tokens_per_row], dtype=torch.int32)
    return lambda: attention_triton.paged_attention_triton(q, k_cache, v_cache, table, seq_lens, cu,
                                                           max_query_len=num_tokens_per_row, scale=0.25)


@pytest.fixture
def on_test_device(device):
    """Every tensor a test makes is on the test device (torch's default device for the test)."""
    with torch.device(device):
        yield


@pytest.fixture
def h100_sms(monkeypatch):
    """The attention plan as on an H100 (132 SMs): block tables past 256 tokens split."""
    monkeypatch.setattr(attention_triton, "_num_sms", lambda device: 132)


def test_attention_one_variant_per_kind_of_call(h100_sms, on_test_device):
    # prefill at any prompt length past the decode range: one variant
    _assert_one_variant(_keys([_attention_call(n, 32) for n in PROMPT_LENGTHS]))
    # decode (K + 1 = 5 new tokens) in engines grown to 1k, 2k, 4k, 8k tokens per row (+ K + 1):
    # one split variant of the attention and one of the merge
    split = _keys([_attention_call(5, blocks) for blocks in (65, 129, 257, 513)])
    assert set(split) == {f"{attention_triton.__name__}._paged_attn_split", f"{attention_triton.__name__}._merge_splits"}
    _assert_one_variant(split)


def test_decode_widths_keep_their_own_tiles():
    """K + 1 up to 16 keeps a tile of its own power of two (what the decode step runs);
    longer calls (prefill) share the largest tile."""
    tiles = {n: attention_triton.choose_tiling(n, 1, 64)[0] for n in (1, 2, 3, 5, 9, 16, 17, 64, 4096)}
    assert tiles == {1: 1, 2: 2, 3: 4, 5: 8, 9: 16, 16: 16, 17: 128, 64: 128, 4096: 128}
    assert attention_triton.choose_tiling(40, 4, 64)[0] == 32  # a GQA group of 4: 128 rows


@pytest.mark.parametrize("hidden", [64, 4096])  # rows packed per program (small models) and one row each (8B)
def test_layer_ops_one_variant_over_prompt_lengths(hidden, on_test_device):
    weight = torch.randn(hidden)
    norms = [lambda n=n: add_rms_norm_triton(torch.randn(n, hidden), torch.randn(n, hidden), weight, 1e-5)
             for n in PROMPT_LENGTHS]
    silus = [lambda n=n: silu_mul_triton(torch.randn(n, hidden), torch.randn(n, hidden)) for n in PROMPT_LENGTHS]
    _assert_one_variant(_keys(norms + silus))


@pytest.mark.parametrize("hq,hkv,head_dim", [(4, 2, 16), (32, 8, 64)])  # a tiny model; 8B's heads
def test_cache_ops_one_variant_over_prompt_lengths(hq, hkv, head_dim, on_test_device):
    page, capacity = 16, 40

    def call(n, rope):
        k_cache = torch.zeros(capacity + 1, page, hkv, head_dim)
        v_cache = torch.zeros_like(k_cache)
        table = torch.arange(1, capacity + 1, dtype=torch.int32)[None]
        lens, cu = torch.tensor([0], dtype=torch.int32), torch.tensor([0, n], dtype=torch.int32)
        k, v = torch.randn(n, hkv, head_dim), torch.randn(n, hkv, head_dim)
        if rope:
            cos, sin = torch.randn(n, head_dim), torch.randn(n, head_dim)
            return lambda: rope_append_kv_triton(torch.randn(n, hq, head_dim), k, v, cos, sin, k_cache, v_cache, table,
                                                 lens, cu)
        return lambda: append_kv_triton(k, v, k_cache, v_cache, table, lens, cu)

    _assert_one_variant(_keys([call(n, rope) for n in PROMPT_LENGTHS for rope in (False, True)]))


def test_a_generate_call_at_a_new_prompt_length_compiles_nothing(device):
    """End to end on the Triton path: after one call, calls at other prompt lengths (another
    int class, another tile) launch only keys the first call launched."""
    import specdec_fast
    from tests.engine.models import make_draft, make_model

    target = make_model("llama", layers=1)
    target, draft = on_device(device, target, make_draft(target))
    seen = {}
    for length in (32, 77):
        with TritonLaunches() as launches:
            specdec_fast.generate(target, torch.randint(3, 100, (1, length), device=device), assistant_model=draft,
                                  max_new_tokens=6, do_sample=False, backend="triton")
        new = [launch for launch in launches.launches if (launch.kernel, launch.key) not in seen]
        if seen:
            assert not new, "; ".join(explain_new_key(launch, list(seen.values())) for launch in new)
        seen.update({(launch.kernel, launch.key): launch for launch in launches.launches})
