"""generate(): bad input raises clearly; streamer protocol; patch_generate; stats consistency."""
import pytest
import torch
from transformers import GenerationConfig

import specdec_fast
import specdec_fast.api as api

from .conftest import model_pair
from .models import left_padded_prompts, make_model

IDS, MASK = left_padded_prompts([4, 6], seed=11)


@pytest.fixture(scope="module")
def pair():
    return model_pair("llama")


def test_vocab_mismatch(pair):
    target, _ = pair
    other = make_model("llama", vocab=130)
    with pytest.raises(ValueError, match="vocab mismatch"):
        api.generate(target, IDS, MASK, assistant_model=other, max_new_tokens=4)


def test_vocab_mismatch_names_both_tokenizers(pair):
    """A draft of another vocabulary drafts through both tokenizers (tests/engine/test_cross_tokenizer.py);
    with one of them missing, the one-line error says to pass both."""
    target, _ = pair
    other = make_model("llama", vocab=130)
    with pytest.raises(ValueError, match="vocab mismatch: .*pass both tokenizer= .* and assistant_tokenizer="):
        api.generate(target, IDS, MASK, assistant_model=other, max_new_tokens=4, tokenizer=object())


def test_devices_differ(pair):
    target, draft = pair
    meta = make_model("llama").to("meta")
    with pytest.raises(ValueError, match="assistant_model is on meta"):
        api.generate(target, IDS, MASK, assistant_model=meta, max_new_tokens=4)


def test_right_padding(pair):
    target, draft = pair
    mask = torch.tensor([[1, 1, 1, 0, 0, 0], [1, 1, 1, 1, 1, 1]])
    with pytest.raises(ValueError, match="right-padded"):
        api.generate(target, IDS, mask, assistant_model=draft, max_new_tokens=4)


@pytest.mark.parametrize("ids, says", [
    (IDS.float(), r"got float32 of shape \(2, 6\)"),
    (IDS.to(torch.int16), r"got int16 of shape \(2, 6\)"),
    (IDS[0], r"got int64 of shape \(6,\)"),
    (IDS.tolist(), "got list"),
], ids=["float", "int16", "1-D", "list"])
def test_input_ids_of_the_wrong_kind(pair, ids, says):
    """A tensor of the wrong dtype or rank, or no tensor: one line naming what came (the dtype too:
    a float tensor of the right shape was reported by its shape alone, which reads as correct)."""
    target, draft = pair
    with pytest.raises(ValueError, match=r"input_ids must be an int tensor \[batch, prompt_len\].*" + says):
        api.generate(target, ids, max_new_tokens=4, assistant_model=draft)


def test_attention_mask_not_a_tensor(pair):
    target, draft = pair
    with pytest.raises(ValueError, match="attention_mask must be a tensor .* got list"):
        api.generate(target, IDS, MASK.tolist(), assistant_model=draft, max_new_tokens=4)


@pytest.mark.parametrize("given", [("assistant_model", "prompt_lookup_num_tokens"), ("draft_head", "prompt_lookup_num_tokens"),
                                   ("assistant_model", "draft_head")], ids=lambda g: "+".join(g))
def test_two_drafters_in_one_call(pair, given):
    """generate() with two drafters: one line naming both. It said "this engine does not draft by prompt
    lookup; build a SpeculativeEngine ..." (or "... draft_head ...; ... or call specdec_fast.generate"),
    about an engine the caller never built. (transformers' generate silently drafts by prompt lookup.)"""
    target, draft = pair
    values = dict(assistant_model=draft, prompt_lookup_num_tokens=3, draft_head=object())
    kwargs = {name: values[name] for name in given}
    with pytest.raises(ValueError, match=rf"^give one drafter .*, got {given[0]} and {given[1]}$"):
        api.generate(target, IDS, MASK, max_new_tokens=4, **kwargs)


def test_engine_call_with_a_draft_and_prompt_lookup(pair):
    target, draft = pair
    engine = specdec_fast.SpeculativeEngine(target, draft, max_batch_size=2, max_seq_len=32)
    with pytest.raises(ValueError, match="^give either assistant_model or prompt_lookup_num_tokens, not both$"):
        engine.generate(IDS, attention_mask=MASK, assistant_model=draft, prompt_lookup_num_tokens=3, max_new_tokens=4)


def test_too_long(pair):
    target, draft = pair
    with pytest.raises(ValueError, match="max_position_embeddings"):
        api.generate(target, IDS, MASK, assistant_model=draft, max_new_tokens=251)


@pytest.mark.parametrize("k", [0, -1, 2.5])
def test_bad_k(pair, k):
    target, draft = pair
    with pytest.raises(ValueError, match="num_assistant_tokens"):
        api.generate(target, IDS, MASK, assistant_model=draft, num_assistant_tokens=k, max_new_tokens=4)
    with pytest.raises(ValueError, match="prompt_lookup_num_tokens"):
        api.generate(target, IDS, MASK, prompt_lookup_num_tokens=k, max_new_tokens=4)


@pytest.mark.parametrize("kwargs, name", [
    (dict(temperature=0.0), "temperature"), (dict(temperature=-1.0), "temperature"), (dict(top_k=-2), "top_k"),
    (dict(top_p=0.0), "top_p"), (dict(top_p=1.5), "top_p"), (dict(min_p=2.0), "min_p"), (dict(max_new_tokens=0), "max_new_tokens"),
])
def test_bad_sampling_values(pair, kwargs, name):
    target, draft = pair
    kwargs = {"max_new_tokens": 4, **kwargs}
    with pytest.raises(ValueError, match=name):
        api.generate(target, IDS, MASK, assistant_model=draft, do_sample=True, **kwargs)


@pytest.mark.parametrize("kwargs, name", [
    (dict(num_beams=2), "num_beams"), (dict(synced_gpus=True), "synced_gpus"),
    (dict(diversity_penalty=1.2), "diversity_penalty"),
    (dict(no_such_option=3), "no_such_option"),
])
def test_unsupported_kwargs(pair, kwargs, name):
    target, draft = pair
    with pytest.raises(ValueError, match=f"unsupported generate option.*{name}"):
        api.generate(target, IDS, MASK, assistant_model=draft, max_new_tokens=4, **kwargs)


def test_unsupported_in_generation_config(pair):
    target, draft = pair
    config = GenerationConfig(num_beams=3)
    with pytest.raises(ValueError, match="num_beams=3"):
        api.generate(target, IDS, MASK, assistant_model=draft, max_new_tokens=4, generation_config=config)
    neutral = GenerationConfig(num_beams=1, repetition_penalty=1.0, max_new_tokens=3, do_sample=False)
    out = api.generate(target, IDS, MASK, assistant_model=draft, generation_config=neutral)
    assert out.shape == (2, IDS.shape[1] + 3)


def test_generation_config_defaults_honoured(pair):
    """do_sample from the config with transformers' default top_k = 50; max_length when no max_new_tokens."""
    target, draft = pair
    config = GenerationConfig(max_length=IDS.shape[1] + 5)
    out = api.generate(target, IDS, MASK, assistant_model=draft, generation_config=config)
    assert out.shape == (2, IDS.shape[1] + 5)
    from specdec_fast.options.resolve import resolve_options

    opts = resolve_options(target, GenerationConfig(do_sample=True, temperature=0.5), {"max_new_tokens": 5}, 3)
    assert (opts.do_sample, opts.temperature, opts.top_k, opts.top_p) == (True, 0.5, 50, 1.0)


def test_streamer_protocol(pair):
    target, draft = pair

    class Recorder:
        def __init__(self):
            self.calls = []

        def put(self, value):
            self.calls.append(("put", value.clone()))

        def end(self):
            self.calls.append(("end", None))

    rec = Recorder()
    ids, mask = IDS[:1], MASK[:1]
    out = api.generate(target, ids, mask, assistant_model=draft, max_new_tokens=12, streamer=rec, do_sample=False)
    assert rec.calls[0][0] == "put" and torch.equal(rec.calls[0][1], ids)
    assert rec.calls[-1] == ("end", None) and [c[0] for c in rec.calls[1:-1]] == ["put"] * (len(rec.calls) - 2)
    streamed = torch.cat([c[1].reshape(-1) for c in rec.calls[1:-1]])
    assert torch.equal(streamed, out[0, ids.shape[1]:])


def test_patch_generate(pair):
    target, draft = pair
    expected = api.generate(target, IDS, MASK, assistant_model=draft, max_new_tokens=6, do_sample=False)
    with specdec_fast.patch_generate(target):
        out, stats = target.generate(IDS, attention_mask=MASK, assistant_model=draft, max_new_tokens=6, do_sample=False,
                                     return_stats=True)  # return_stats exists only on the specdec_fast path
        plain = target.generate(IDS, attention_mask=MASK, max_new_tokens=6, do_sample=False)
    assert torch.equal(out, expected)
    assert stats.schedule is None and stats.k == 4, "no K: the constant default K"
    assert torch.equal(plain, expected)
    assert "generate" not in vars(target), "restored"


def test_stats_consistency(pair):
    target, draft = pair
    ids, mask = left_padded_prompts([3, 8, 5], seed=2)
    out, st = api.generate(target, ids, mask, assistant_model=draft, num_assistant_tokens=3, max_new_tokens=30,
                           do_sample=True, temperature=0.9, seed=1, return_stats=True)
    assert st.new_tokens == 3 * 30 == st.first_tokens + st.loop_tokens
    assert st.tokens_per_row == [30, 30, 30]
    emitted_before_cuts = sum((j + 1) * c for j, c in enumerate(st.accepted_hist))
    assert st.loop_tokens <= emitted_before_cuts <= st.loop_tokens + 3 * 3  # only the last block may be cut
    assert st.iterations >= max(st.accepted_hist[0] // 3, 1)
    rates = st.acceptance_per_position
    assert len(rates) == 3 and all(0 <= r <= 1 for r in rates if r == r)
    a, c = st.alpha, st.cost_ratio
    assert c > 0 and st.draft_s > 0 and st.target_s > 0
    assert st.predicted_speedup == pytest.approx((1 - a**4) / (1 - a) / (3 * c + 1))
    st.plain_tokens_per_s = st.tokens_per_s / 2
    assert st.measured_speedup == pytest.approx(2.0)
    text = st.format()
    for word in ("tokens/s", "alpha", "cost ratio", "predicted speedup", "measured speedup"):
        assert word in text


def test_streamer_needs_batch_one(pair):
    target, draft = pair
    with pytest.raises(ValueError, match="streamer supports batch size 1"):
        api.generate(target, IDS, MASK, assistant_model=draft, max_new_tokens=4, streamer=object())


@pytest.mark.parametrize("row, col, value", [(0, 5, 128), (1, 0, 1000), (0, 3, -1), (0, 0, -7)],
                         ids=["vocab", "far", "negative", "in-the-padding"])
def test_input_ids_outside_the_vocabulary(pair, row, col, value):
    """An id >= the vocabulary size (128) or < 0 anywhere in input_ids (padding too): one ValueError
    naming input_ids, the id and the size, on every path (draft, prompt lookup, plain), never an
    IndexError from the embedding."""
    target, draft = pair
    ids = IDS.clone()
    ids[row, col] = value
    message = f"input_ids holds token id {value}, outside the target's vocabulary of size 128"
    for extra in (dict(assistant_model=draft), dict(prompt_lookup_num_tokens=3), dict()):
        with pytest.raises(ValueError, match=message.replace("(", r"\(")):
            api.generate(target, ids, MASK, max_new_tokens=4, **extra)


def test_input_ids_at_the_vocabulary_edges(pair):
    target, draft = pair
    ids = IDS.clone()
    ids[0, 0], ids[1, -1] = 0, 127
    assert api.generate(target, ids, MASK, assistant_model=draft, max_new_tokens=2).shape == (2, IDS.shape[1] + 2)


def test_positions_never_reached_read_as_a_dash():
    """acceptance by draft position: a position no iteration reached has no rate (nan in the
    property), printed as "-" (prompt lookup often rejects the first draft)."""
    from specdec_fast.engine.stats import GenerationStats

    st = GenerationStats(k=4, batch=1, new_tokens=5, tokens_per_row=[5], first_tokens=1, loop_tokens=4, iterations=4,
                         wall_s=1.0, accepted_hist=[3, 1, 0, 0, 0], draft_s=0.1, target_s=0.5)
    rates = st.acceptance_per_position
    assert rates[0] == 0.25 and rates[1] == 0.0 and rates[2] != rates[2]
    assert "acceptance by draft position  [0.25, 0.00, -, -]" in st.format()
