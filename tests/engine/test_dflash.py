"""DFlash block drafters (heads/dflash.py, runners/paged_dflash.py, drafters/block.py): the paged
drafter equals the module's reference forward on every backend; every iteration's drafts are the
reference drafter's over the target's hidden states (context bookkeeping, not only exactness;
also with K changing every iteration); one engine serves mixed calls like fresh engines; the
published layout round-trips and generate(draft_head=DIR) takes it. Greedy = target greedy (K =
4, 8, 15, every backend, EOS, graphs, the adaptive schedule): test_block_drafters.py, for DFlash
and DFlash2 alike."""
import json
import random

import pytest
import torch
import torch.nn.functional as F

import specdec_fast
from specdec_fast import SpeculativeEngine, load_draft_head, save_draft_head
from specdec_fast.drafters import BlockDrafter
from specdec_fast.engine import SpeculativeDecoder
from specdec_fast.kernels import make_sampling_tensors
from specdec_fast.runners import PagedLlamaRunner
from specdec_fast.runners.paged_dflash import PagedDFlashRunner

from ..conftest import backend_device
from .heads import (check_paged_block_forward, proposals_per_iteration, random_dflash, reference_block, target_weights,
                    trained_dflash)
from .models import left_padded_prompts
from .test_paged_runner import VOCAB, tiny


@pytest.fixture(scope="module")
def target():
    return tiny("llama", layers=4, seed=2)


@pytest.fixture(scope="module")
def drafter(target):
    return trained_dflash(target, key="llama4-b16", block_size=16)


@pytest.mark.parametrize("backend", ["torch", "cpp", "triton"])
def test_paged_drafter_equals_reference_forward(target, backend, device):
    """prefill_context (left padding) + a draft call with pending entries (num_valid) and a block
    (one row fed nothing): the block's outputs equal DFlashHead.forward over each row's context."""
    runner = check_paged_block_forward(random_dflash(target, block_size=8, seed=4), PagedDFlashRunner, target, backend,
                                       fed=[8, 8, 0], device=backend_device(backend, device))
    assert runner.seq_lens.tolist() == [5, 11, 3]  # the context grew by the pending entries only


# (layer_types, sliding_window, is_causal) -> the layers' (causal, window): the reference's rules
LAYER_RULES = {
    "sliding_default_causal": (["sliding_attention"] * 2, 4, None, ((True, 4), (True, 4))),
    "sliding_is_causal_false": (["sliding_attention"] * 2, 9, False, ((False, 9), (False, 9))),
    "mixed_sliding_causal_full_not": (["sliding_attention", "full_attention"], 5, None, ((True, 5), (False, None))),
}


@pytest.mark.parametrize("backend", ["torch", "cpp", "triton"])
@pytest.mark.parametrize("rule", list(LAYER_RULES))
def test_paged_drafter_past_a_window_equals_reference_forward(target, rule, backend, device):
    """Sliding layers (causal or not) and per-layer causality on the paged drafter: rows of ~19
    positions past windows of 4-9 give the reference forward's block outputs."""
    kinds, window, is_causal, expected = LAYER_RULES[rule]
    extra = {} if is_causal is None else dict(is_causal=is_causal)
    head = random_dflash(target, block_size=8, seed=4, layer_types=kinds, use_sliding_window=True,
                         sliding_window=window, **extra)
    assert tuple(zip(head.layer_causal, head.layer_windows)) == expected
    check_paged_block_forward(head, PagedDFlashRunner, target, backend, fed=[8, 8, 0],
                              device=backend_device(backend, device))


@pytest.mark.parametrize("spoil", ["window", "causality"])
def test_controls_the_window_and_the_causality_change_the_block(target, spoil):
    """A runner that drops the window, or attends every layer both ways, no longer gives the
    reference's block; a non-causal window narrower than the block is refused by name."""
    head = random_dflash(target, block_size=8, seed=4, layer_types=["sliding_attention", "full_attention"],
                         use_sliding_window=True, sliding_window=5)
    class Spoiled(PagedDFlashRunner):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            if spoil == "window":
                self.layer_windows = (None, None)
            else:
                self.layer_causal = (False, False)

    with pytest.raises(AssertionError):
        check_paged_block_forward(head, Spoiled, target, "torch", fed=[8, 8, 0])
    narrow = random_dflash(target, block_size=8, layer_types=["sliding_attention"] * 2, use_sliding_window=True,
                           sliding_window=6, is_causal=False)
    with pytest.raises(ValueError, match=r"non-causal sliding layer's window \(6\) is below the block \(8\)"):
        PagedDFlashRunner(narrow, *target_weights(target), num_draft_tokens=4)


def _reference_drafts(head, target, context: list, k: int) -> list:
    """Greedy drafts after context x_0 .. x_c: the reference block through the target's lm_head."""
    h = reference_block(head, target, context)
    with torch.no_grad():
        return F.linear(h[0, 1:k + 1], target_weights(target)[1]).argmax(-1).tolist()


@pytest.mark.parametrize("ks", [None, (2, 4, 6, 1, 6, 3)])
def test_drafts_equal_the_reference_drafter(target, drafter, ks, chaos):
    """Every iteration's drafts = the reference drafter's over the target's hidden states of the
    accepted text; ks: K cycling through them per iteration (the adaptive schedule's choices, forced:
    a K smaller than the call's largest must still keep every accepted position's context entry)."""
    k, batch = 6, 2
    ids, mask = left_padded_prompts([4, 7], vocab=VOCAB, seed=8)
    runner = PagedLlamaRunner(target, max_new_tokens=20, num_draft_tokens=k)
    runner.capture_hidden_states(drafter.hidden_indices())
    block = BlockDrafter(PagedDFlashRunner(drafter, *target_weights(target), num_draft_tokens=k), runner)
    decoder = SpeculativeDecoder(runner, block, k=k, params=make_sampling_tensors(batch, "cpu", temperature=0.0, seed=0),
                                 max_new_tokens=20, ks=None if ks is None else sorted(set(ks)))
    if ks is not None:
        chaos(ks)
    seen = proposals_per_iteration(block, decoder, ids, mask)
    assert len(seen) >= 3 and sum(decoder.stats.result.accepted_hist[1:]) > 0
    assert ks is None or len({len(drafts) for iteration in seen for _, drafts in iteration}) >= 3
    for iteration in seen:
        for context, drafts in iteration:
            assert drafts == _reference_drafts(drafter, target, context, len(drafts))


def test_one_engine_serves_mixed_calls_like_fresh_engines(target, drafter):
    def engine():
        return SpeculativeEngine(target, draft_head=drafter, max_batch_size=4, max_seq_len=32, cuda_graphs="static")

    shared, rng = engine(), random.Random(5)
    assert shared.default_k == 15
    for i in range(8):
        batch = rng.randint(1, 4)
        ids, mask = left_padded_prompts([rng.randint(1, 9) for _ in range(batch)], vocab=VOCAB, seed=rng.randrange(99))
        options = dict(max_new_tokens=rng.randint(2, 9), pad_token_id=0, seed=rng.randrange(99),
                       num_assistant_tokens=rng.choice([4, 15]), do_sample=rng.random() < 0.5, top_k=0)
        out = shared.generate(ids, mask, **options)
        if i % 3 == 0:
            assert torch.equal(out, engine().generate(ids, mask, **options)), (i, options)
        for runner in (shared.target_runner, shared.draft_runner):
            assert runner.cache.num_free_blocks == runner.cache.num_blocks


def test_layout_round_trip_and_errors(target, drafter, tmp_path):
    from safetensors.torch import load_file

    save_draft_head(drafter, tmp_path / "d")
    config = json.loads((tmp_path / "d" / "config.json").read_text())
    assert config["architectures"] == ["DFlashDraftModel"] and config["block_size"] == 16
    assert config["dflash_config"] == {"mask_token_id": 3, "target_layer_ids": [0, 1, 2]}
    assert config["is_causal"] is False  # said outright: a reader may infer causality from the layer types
    names = set(load_file(str(tmp_path / "d" / "model.safetensors")))
    assert {"fc.weight", "hidden_norm.weight", "norm.weight", "layers.1.self_attn.q_norm.weight",
            "layers.0.self_attn.k_proj.weight", "layers.0.mlp.down_proj.weight"} <= names
    assert not any(n.startswith(("embed_tokens", "lm_head")) for n in names)  # the target's
    loaded = load_draft_head(tmp_path / "d")
    ids, mask = left_padded_prompts([4, 6], vocab=VOCAB, seed=1)
    common = dict(num_assistant_tokens=8, do_sample=False, max_new_tokens=10, pad_token_id=0)
    assert torch.equal(specdec_fast.generate(target, ids, mask, draft_head=str(tmp_path / "d"), **common),
                       specdec_fast.generate(target, ids, mask, draft_head=drafter, **common))
    assert loaded.block_size == 16 and loaded.mask_token_id == 3
    with pytest.raises(ValueError, match="at most 15 tokens per iteration, got num_assistant_tokens=16"):
        specdec_fast.generate(target, ids, mask, draft_head=drafter, num_assistant_tokens=16, max_new_tokens=4)
    with pytest.raises(ValueError, match="block drafts a chain"):
        specdec_fast.generate(target, ids, mask, draft_head=drafter, tree="static", max_new_tokens=4)
    # Sliding-window layers (the published DFlash2 drafters' kind, with is_causal false): rows past the
    # window decode the target's greedy tokens (until 2026-11-30 they were refused)
    (tmp_path / "d" / "config.json").write_text(json.dumps({**config, "layer_types": ["sliding_attention"] * 2,
                                                            "use_sliding_window": True, "sliding_window": 16,
                                                            "is_causal": False}))
    windowed = load_draft_head(tmp_path / "d")
    assert windowed.layer_windows == (16, 16) and windowed.layer_causal == (False, False)
    long = dict(common, max_new_tokens=60)
    assert torch.equal(specdec_fast.generate(target, ids, mask, draft_head=windowed, **long),
                       target.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=60, pad_token_id=0))
    (tmp_path / "d" / "config.json").write_text(json.dumps({**config, "layer_types": ["chunked_attention"] * 2}))
    with pytest.raises(ValueError, match="full_attention / sliding_attention"):
        load_draft_head(tmp_path / "d")


def test_output_multiplier_and_softcap_shape_the_drafts_q(target):
    """A config with output_multiplier / final_logit_softcapping: the drafts' q (the logits the
    drafter hands the verify when sampling) is softcap * tanh(multiplier * lm_head(norm h) / softcap)
    of the block's states, not the raw logits; greedy decoding still equals the target's."""
    from specdec_fast.heads.dflash import scale_logits

    config_head = random_dflash(target, block_size=8, seed=3)
    config_head.config.dflash_config = dict(config_head.config.dflash_config, output_multiplier=0.5,
                                            final_logit_softcapping=2.0)
    head = type(config_head)(config_head.config)
    head.load_state_dict(config_head.state_dict())
    assert (head.output_multiplier, head.final_logit_softcapping) == (0.5, 2.0)
    k, batch = 4, 2
    ids, mask = left_padded_prompts([4, 7], vocab=VOCAB, seed=8)
    runner = PagedLlamaRunner(target, max_new_tokens=12, num_draft_tokens=k)
    runner.capture_hidden_states(head.hidden_indices())
    block = BlockDrafter(PagedDFlashRunner(head, *target_weights(target), num_draft_tokens=k), runner)
    decoder = SpeculativeDecoder(runner, block, k=k, params=make_sampling_tensors(batch, "cpu", temperature=1.0, seed=0),
                                 max_new_tokens=12)
    seen, run_block, propose = [], block._run_block, block.propose

    def recording_block():
        h = run_block()
        seen.append([h])
        return h

    def recording_propose(k):
        drafts, logits = propose(k)
        seen[-1].append(logits)
        return drafts, logits

    block._run_block, block.propose = recording_block, recording_propose
    decoder.generate(ids, mask)
    assert seen
    lm_head = target.get_output_embeddings().weight
    for h, logits in seen:
        raw = F.linear(h[:, 1:k + 1], lm_head)
        assert torch.allclose(logits, scale_logits(raw, 0.5, 2.0), atol=1e-6)
        assert logits.abs().max() <= 2.0 and not torch.allclose(logits, raw)
    expected = target.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=20, pad_token_id=0)
    out = specdec_fast.generate(target, ids, mask, draft_head=head, num_assistant_tokens=k, do_sample=False,
                                max_new_tokens=20, pad_token_id=0)
    assert torch.equal(out, expected)


def _as_loaded_checkpoint(directory):
    """What transformers' AutoModel.from_pretrained(dir, trust_remote_code=True) hands a user of its
    DFlash assisted generation, as far as load_draft_head reads it: a torch module whose config
    is the checkpoint's config.json (a PretrainedConfig) and whose state_dict holds its weights
    under their file names (nested submodules, real Parameters)."""
    from safetensors.torch import load_file
    from transformers import PretrainedConfig

    root = torch.nn.Module()
    for name, tensor in load_file(str(directory / "model.safetensors")).items():
        *path, leaf = name.split(".")
        module = root
        for part in path:
            if not hasattr(module, part):
                module.add_module(part, torch.nn.Module())
            module = getattr(module, part)
        module.register_parameter(leaf, torch.nn.Parameter(tensor, requires_grad=False))
    root.config = PretrainedConfig.from_json_file(str(directory / "config.json"))
    return root


def test_transformers_dflash_call_drafts_with_the_loaded_checkpoint(target, drafter, tmp_path):
    """model.generate(assistant_model=<a loaded DFlash checkpoint>, speculation_type="dflash"), as
    transformers' DFlash assisted generation is called: it drafts as draft_head (the same tokens
    as the head loaded from the directory, the target's greedy ones), one head per module."""
    save_draft_head(drafter, tmp_path / "d")
    loaded = _as_loaded_checkpoint(tmp_path / "d")
    ids, mask = left_padded_prompts([4, 6], vocab=VOCAB, seed=2)
    common = dict(do_sample=False, max_new_tokens=10, pad_token_id=0)
    ours, stats = specdec_fast.generate(target, ids, mask, assistant_model=loaded, speculation_type="dflash",
                                        return_stats=True, **common)
    assert torch.equal(ours, specdec_fast.generate(target, ids, mask, draft_head=str(tmp_path / "d"), **common))
    assert torch.equal(ours, target.generate(ids, attention_mask=mask, **common))
    assert stats.k == drafter.block_size - 1 and stats.iterations < 10  # the block drafter ran
    assert load_draft_head(loaded) is load_draft_head(loaded)
    with pytest.raises(ValueError, match="speculation_type='dflash' drafts with assistant_model"):
        specdec_fast.generate(target, ids, mask, speculation_type="dflash", **common)
    with pytest.raises(ValueError, match="unsupported generate option speculation_type='eagle'"):
        specdec_fast.generate(target, ids, mask, assistant_model=loaded, speculation_type="eagle", **common)
