"""runner='hf' on the model families a sweep of transformers' causal LMs found it could not take
as it was (specdec_fast/runners/hf_support.py): refused with an UnsupportedModelError saying why
(patch_generate then hands the call to transformers), or, for ALiBi built from the 2-D mask
(Bloom, Falcon alibi=True), masked the way the model reads it and equal to model.generate.
Before: Bloom and Falcon-alibi raised "too many values to unpack"; BART-style causal heads, MPT and
RWKV decoded other tokens than model.generate, silently (the control below shows it for BART)."""
import pytest
import torch
import transformers as tf

import specdec_fast
from specdec_fast.runners import hf_support
from specdec_fast.runners.hf import UnsupportedModelError

from .models import left_padded_prompts, make_draft

V = 128
REFUSED = {
    "rwkv": (lambda: tf.RwkvConfig(vocab_size=V, hidden_size=32, num_hidden_layers=2, attention_hidden_size=32,
                                   intermediate_size=64, context_length=256), "recurrent state"),
    "openai-gpt": (lambda: tf.OpenAIGPTConfig(vocab_size=V, n_embd=32, n_layer=2, n_head=4, n_positions=256),
                   "takes no KV cache"),
    "xlm": (lambda: tf.XLMConfig(vocab_size=V, emb_dim=32, n_layers=2, n_heads=4, max_position_embeddings=256,
                                 causal=True), "padding mask of its own"),
    "bart": (lambda: tf.BartConfig(vocab_size=V, d_model=32, decoder_layers=2, decoder_attention_heads=4,
                                   decoder_ffn_dim=64, encoder_layers=2, encoder_attention_heads=4, encoder_ffn_dim=64,
                                   max_position_embeddings=256),
             "takes no position_ids"),
    "mpt": (lambda: tf.MptConfig(vocab_size=V, d_model=32, n_layers=2, n_heads=4, max_seq_len=256),
            "takes no position_ids"),
}
ALIBI = {
    "bloom": lambda: tf.BloomConfig(vocab_size=V, hidden_size=32, n_layer=2, n_head=4),
    "falcon-alibi": lambda: tf.FalconConfig(vocab_size=V, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                            alibi=True, new_decoder_architecture=False, multi_query=False),
    "falcon-alibi-new": lambda: tf.FalconConfig(vocab_size=V, hidden_size=32, num_hidden_layers=2,
                                                num_attention_heads=4, num_kv_heads=2, alibi=True,
                                                new_decoder_architecture=True),
}
# Taken though their *ForCausalLM.forward annotates the cache as a tuple / list: the base model
# builds and reads a transformers Cache (a check on the annotation refused nine such families).
TAKEN = {
    "roberta": lambda: tf.RobertaConfig(vocab_size=V, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                        intermediate_size=64, max_position_embeddings=258, is_decoder=True),
    "ernie": lambda: tf.ErnieConfig(vocab_size=V, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                    intermediate_size=64, max_position_embeddings=256, is_decoder=True),
}
LOOPING = torch.tensor([[5, 6, 7, 5, 6, 7, 5, 6, 7, 5, 6]])  # prompt lookup drafts (and misses) on it
_MODELS = {}


def _model(kind: str):
    if kind not in _MODELS:
        config = {**{k: v[0] for k, v in REFUSED.items()}, **ALIBI, **TAKEN}[kind]()
        # spread logits (few near-ties, drafts rejected often enough to leave holes)
        for name, value in dict(bos_token_id=1, eos_token_id=None, pad_token_id=0, initializer_range=0.15,
                                init_std=0.15).items():
            setattr(config, name, value)
        torch.manual_seed(0)
        model = tf.AutoModelForCausalLM.from_config(config).eval()
        model.generation_config.eos_token_id = None
        _MODELS[kind] = model
    return _MODELS[kind]


@pytest.mark.parametrize("kind", list(REFUSED))
def test_refused_families_say_why_and_a_patch_falls_back(kind):
    model, words = _model(kind), REFUSED[kind][1]
    kw = dict(max_new_tokens=12, do_sample=False, pad_token_id=0)
    with pytest.raises(UnsupportedModelError, match=words):
        specdec_fast.generate(model, LOOPING, prompt_lookup_num_tokens=3, **kw)
    expected = model.generate(LOOPING, **kw)
    with specdec_fast.patch_generate(model, prompt_lookup_num_tokens=3) as patched:
        with pytest.warns(UserWarning, match=words):
            out = patched.generate(LOOPING, **kw)
    assert torch.equal(out, expected)


def test_control_without_the_refusal_a_bart_head_decodes_other_tokens(monkeypatch):
    """Why the position_ids rule: BART's causal head takes its positions from the cache's length,
    so the masked slots of rejected drafts shift every later position."""
    monkeypatch.setattr("specdec_fast.runners.hf.hf_unsupported_reason", lambda model: None)
    model = _model("bart")
    kw = dict(max_new_tokens=24, do_sample=False, pad_token_id=0)
    out = specdec_fast.generate(model, LOOPING, prompt_lookup_num_tokens=3, **kw)
    specdec_fast.release_engines(model)
    assert not torch.equal(out, model.generate(LOOPING, **kw))


@pytest.mark.parametrize("kind", list(TAKEN))
def test_a_cache_annotated_as_a_tuple_is_taken(kind):
    model = _model(kind)
    assert hf_support.hf_unsupported_reason(model) is None
    ids, mask = left_padded_prompts([6, 9, 4], vocab=V, seed=24)
    kw = dict(max_new_tokens=24, do_sample=False, pad_token_id=0)
    out = specdec_fast.generate(model, ids, mask, prompt_lookup_num_tokens=3, **kw)
    specdec_fast.release_engines(model)
    assert torch.equal(out, model.generate(ids, attention_mask=mask, **kw))


@pytest.mark.parametrize("drafting", ["lookup", "draft"])
@pytest.mark.parametrize("kind", list(ALIBI))
def test_alibi_from_the_mask_equals_generate(kind, drafting):
    """Left-padded rows, rejected drafts (holes) and compaction at almost every poll (slack 2):
    the 2-D mask's running count of ones gives every slot its true ALiBi position."""
    model = _model(kind)
    assert hf_support.alibi_from_mask(model)
    extra = dict(prompt_lookup_num_tokens=3) if drafting == "lookup" else {}
    draft = make_draft(model, noise=0.6) if drafting == "draft" else None  # held: the engine holds its models weakly
    engine = specdec_fast.SpeculativeEngine(model, draft, runner="hf", **extra)
    for runner in (engine.target_runner, engine.draft_runner):
        if runner is not None:
            assert runner.mask_kind == "2d"
            runner.compact_slack = 2
    ids, mask = left_padded_prompts([6, 9, 4], vocab=V, seed=23)
    kw = dict(max_new_tokens=40, do_sample=False, pad_token_id=0)
    out, stats = engine.generate(ids, mask, return_stats=True, **kw)
    assert torch.equal(out, model.generate(ids, attention_mask=mask, **kw))
    assert sum(stats.accepted_hist[:-1]) > 0, "some drafts were rejected (holes in the runner's cache)"
    appended = ids.shape[1] + stats.iterations * (stats.k + 1)  # every score call appends K + 1 slots
    assert engine.target_runner.cache_len < appended - 8, "compaction ran"


class _PeftLike(torch.nn.Module):
    """A wrapper as PEFT's PeftModel is one: forward(*args, **kwargs), get_base_model()."""

    def __init__(self, model):
        super().__init__()
        self.inner = model

    def get_base_model(self):
        return self.inner

    def forward(self, *args, **kwargs):
        return self.inner(*args, **kwargs)


def test_wrappers_are_judged_by_the_model_they_wrap():
    """torch.compile and PEFT wrap the forward as forward(*args, **kwargs): judged by the model inside
    (a compiled or adapted Llama is taken, a compiled RWKV refused); a forward(**kwargs) wrapping
    nothing known is not judged (taken, as before these checks)."""
    from tests.engine.models import make_model

    llama = make_model("llama")
    assert hf_support.hf_unsupported_reason(torch.compile(llama)) is None
    assert hf_support.hf_unsupported_reason(_PeftLike(llama)) is None
    assert "recurrent state" in hf_support.hf_unsupported_reason(torch.compile(_model("rwkv")))
    assert "takes no position_ids" in hf_support.hf_unsupported_reason(_PeftLike(_model("mpt")))
    assert hf_support.alibi_from_mask(torch.compile(_model("bloom")))
    assert hf_support.hf_unsupported_reason(_PeftLike(_model("bloom"))) is None

    class Opaque(torch.nn.Module):
        def forward(self, *args, **kwargs):
            return None

    assert hf_support.hf_unsupported_reason(Opaque()) is None


def _gemma4_pair():
    """A Gemma 4 text decoder (windows of 4, per-layer inputs, its last two layers reusing the others' KV) and a
    Gemma 4 assistant for it (Gemma4AssistantForCausalLM: both its layers read the target's KV states)."""
    torch.manual_seed(0)
    layers = ["sliding_attention", "full_attention"] * 2
    target = tf.Gemma4ForCausalLM(tf.Gemma4TextConfig(
        vocab_size=V, hidden_size=48, intermediate_size=96, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=2, head_dim=12, global_head_dim=16, sliding_window=4, vocab_size_per_layer_input=V,
        hidden_size_per_layer_input=8, num_kv_shared_layers=2, layer_types=layers, max_position_embeddings=256,
        initializer_range=0.1, pad_token_id=0, bos_token_id=1, eos_token_id=None)).eval()
    target.generation_config.eos_token_id = None
    text = tf.Gemma4TextConfig(vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                               num_attention_heads=4, num_key_value_heads=2, head_dim=12, global_head_dim=16,
                               sliding_window=4, vocab_size_per_layer_input=0, hidden_size_per_layer_input=0,
                               num_kv_shared_layers=2, layer_types=layers[:2], max_position_embeddings=256)
    assistant = tf.Gemma4AssistantForCausalLM(tf.Gemma4AssistantConfig(text_config=text.to_dict(),
                                                                        backbone_hidden_size=48)).eval()
    assistant.generation_config.num_assistant_tokens = 3
    return target, assistant


def test_gemma4_on_the_hf_runner_and_its_assistant_refused_there():
    """Gemma 4 (its paged runner: test_paged_gemma4.py) speculates on runner='hf' too with the tokens of
    model.generate (prompt lookup past the window, its KV-sharing layers and per-layer inputs); its assistant, which
    drafts over the target's own K/V (test_gemma4_assistant.py), is refused there naming why -- before, the hf runner
    refused it as a model that "takes no KV cache" -- while transformers' own assisted generation runs it."""
    target, assistant = _gemma4_pair()
    kw = dict(max_new_tokens=20, do_sample=False, pad_token_id=0)
    expected = target.generate(LOOPING, **kw)
    assert len(set(expected[0, LOOPING.shape[1]:].tolist())) > 5  # not one token repeated
    out, stats = specdec_fast.generate(target, LOOPING, prompt_lookup_num_tokens=3, runner="hf", return_stats=True,
                                       **kw)
    assert torch.equal(out, expected) and 0 < stats.alpha < 1
    with pytest.raises(ValueError, match="draft_head needs a paged target runner .* got HFRunner"):
        specdec_fast.generate(target, LOOPING, assistant_model=assistant, runner="hf", **kw)
    assert torch.equal(target.generate(LOOPING, assistant_model=assistant, **kw), expected)
