"""One rule for whether a model's attention slides (specdec_fast/runners/sliding_window.py),
asked by the paged runners, the hf runner and the engine's size cap. The case the two rules it
replaced disagreed on: a config carrying a sliding_window that its model's code never reads
(Llama). The paged runner attended whole rows; the hf runner masked keys past the window (other
tokens: the control below runs the old rule) and its draft's cache evicted them (a shape error).

What is right there: Llama's forward attends every key. transformers' generate with its cache is
not that model: DynamicCache(config=) builds evicting sliding layers from any config holding a
sliding_window, so its decode steps see the last `window` keys while its prefill saw all, and
model.generate(use_cache=True) differs from model.generate(use_cache=False) (pinned below). We
decode the model its forward defines: the tokens are model.generate(use_cache=False)'s."""
import pytest
import torch
import transformers as tf

import specdec_fast
from specdec_fast.runners import hf as hf_runner
from specdec_fast.runners import sliding_window
from specdec_fast.runners.paged_llama import PagedLlamaRunner, llama_config_reason

from .models import left_padded_prompts, make_draft

COMMON = dict(vocab_size=128, hidden_size=48, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=256, bos_token_id=1, eos_token_id=2, pad_token_id=0)


class MyMistral(tf.MistralForCausalLM):
    """A user's subclass: the window is read by Mistral's code, not this module's."""


class MyLlama(tf.LlamaForCausalLM):
    """A user's subclass of a family whose code ignores a sliding_window."""


def _stray_llama():
    torch.manual_seed(0)
    model = tf.LlamaForCausalLM(tf.LlamaConfig(sliding_window=4, **COMMON)).eval()
    model.generation_config.eos_token_id = None
    return model


@pytest.mark.parametrize("config, model_class, expected", [
    (lambda: tf.MistralConfig(sliding_window=4, **COMMON), None, (4, False)),
    (lambda: tf.MistralConfig(sliding_window=4, **COMMON), MyMistral, (4, False)),
    (lambda: tf.MistralConfig(sliding_window=None, **COMMON), None, (None, False)),
    (lambda: tf.Qwen2Config(use_sliding_window=True, sliding_window=5, max_window_layers=1, **COMMON), None, (5, True)),
    (lambda: tf.Qwen2Config(sliding_window=5, **COMMON), None, (None, False)),  # use_sliding_window off
    (lambda: tf.Qwen3Config(use_sliding_window=True, sliding_window=6, max_window_layers=1, **COMMON), None, (6, True)),
    (lambda: tf.Phi3Config(sliding_window=7, **COMMON), None, (7, False)),  # read by Phi-3's code, no layer_types
    (lambda: tf.LlamaConfig(sliding_window=4, **COMMON), None, (None, False)),  # Llama's code never reads it
    (lambda: tf.LlamaConfig(sliding_window=4, **COMMON), MyLlama, (None, False)),
], ids=["mistral", "mistral-subclass", "mistral-none", "qwen2", "qwen2-off", "qwen3", "phi3", "llama-stray",
        "llama-subclass"])
def test_the_rule_on_each_family(config, model_class, expected):
    assert sliding_window.sliding_layout(config(), model_class) == expected
    window, per_layer_type = expected
    # the paged runners' windows per layer: Qwen's max_window_layers=1 keeps layer 0 full
    per_layer = (None, None) if window is None else (None, window) if per_layer_type else (window, window)
    assert sliding_window.windows_per_layer(config(), 2, model_class) == per_layer


@pytest.mark.parametrize("config", [
    lambda: tf.MistralConfig(sliding_window=4, **COMMON),
    lambda: tf.Qwen2Config(use_sliding_window=True, sliding_window=5, max_window_layers=1, **COMMON),
    lambda: tf.Qwen2Config(sliding_window=5, **COMMON),
    lambda: tf.LlamaConfig(sliding_window=4, **COMMON),
    lambda: tf.Phi3Config(sliding_window=7, **COMMON),  # Phi-3 runs paged (within the window) since 2026-11-30
    lambda: tf.MinistralConfig(sliding_window=6, head_dim=12, **COMMON),  # its window by layer_types, likewise
], ids=["mistral", "qwen2", "qwen2-off", "llama-stray", "phi3", "ministral"])
def test_the_paged_runner_and_the_hf_runner_agree(config):
    """The paged runner slides the layers the hf runner's mask slides, by the same window, and
    takes rows past it (the kernels slide: no refusal since 2026-11-30)."""
    assert llama_config_reason(config(), "default", 100) is None
    model = tf.AutoModelForCausalLM.from_config(config(), attn_implementation="sdpa")
    hf = hf_runner.HFRunner(model)
    kinds = model.config.layer_types if hf.window_per_layer_type else ["sliding_attention"] * 2
    expected = tuple(hf.window if kind == "sliding_attention" else None for kind in kinds)
    assert PagedLlamaRunner(model).layer_windows == expected


def test_code_without_a_readable_source_assumes_the_window():
    """A class whose module has no source (built in memory) keeps transformers' Mistral-style
    reading: the window applies."""
    in_memory = type("Model", (), {"__module__": "no_such_module_for_specdec_fast"})
    config = tf.MistralConfig(sliding_window=4, **COMMON)
    config.model_type = "no_such_model_type"
    assert sliding_window.sliding_layout(config, in_memory) == (4, False)


def test_transformers_cached_generate_is_not_the_forward_there():
    """Why the reference below is use_cache=False: transformers' cache evicts keys its Llama
    forward attends, so its own two generates disagree on a stray window."""
    model = _stray_llama()
    ids, mask = left_padded_prompts([6, 9, 4], seed=21)
    kw = dict(max_new_tokens=40, do_sample=False, pad_token_id=0)
    assert not torch.equal(model.generate(ids, attention_mask=mask, **kw),
                           model.generate(ids, attention_mask=mask, use_cache=False, **kw))


@pytest.mark.parametrize("runner", ["hf", "paged"])
@pytest.mark.parametrize("drafting", ["draft", "lookup"])
def test_a_stray_window_on_llama_is_not_masked(drafting, runner):
    """Both runners decode a Llama whose config carries sliding_window=4 as its forward does,
    40 tokens past that window."""
    model = _stray_llama()
    ids, mask = left_padded_prompts([6, 9, 4], seed=21)
    kw = dict(max_new_tokens=40, do_sample=False, pad_token_id=0)
    extra = dict(assistant_model=make_draft(model)) if drafting == "draft" else dict(prompt_lookup_num_tokens=3)
    out = specdec_fast.generate(model, ids, mask, runner=runner, **kw, **extra)
    specdec_fast.release_engines(model)
    assert torch.equal(out, model.generate(ids, attention_mask=mask, use_cache=False, **kw))


def test_control_the_old_rule_masks_the_stray_window(monkeypatch):
    """The rule this replaced (a window wherever a config has one) gives other tokens."""
    monkeypatch.setattr(sliding_window, "_code_reads_window", lambda *names: True)
    model = _stray_llama()
    assert sliding_window.sliding_layout(model.config, type(model)) == (4, False)
    ids, mask = left_padded_prompts([6, 9, 4], seed=21)
    kw = dict(max_new_tokens=40, do_sample=False, pad_token_id=0)
    out = specdec_fast.generate(model, ids, mask, runner="hf", prompt_lookup_num_tokens=3, **kw)
    specdec_fast.release_engines(model)
    assert not torch.equal(out, model.generate(ids, attention_mask=mask, use_cache=False, **kw))


def test_a_compiled_model_keeps_its_window():
    """torch.compile's wrapper has a class and a forward(*args, **kwargs) of its own: the rule
    reads the model inside (a compiled Mistral's window still applies, a compiled Llama's stray
    one still does not)."""
    mistral = tf.MistralForCausalLM(tf.MistralConfig(sliding_window=4, **COMMON))
    assert hf_runner.HFRunner(torch.compile(mistral)).window == 4
    assert hf_runner.HFRunner(torch.compile(_stray_llama())).window is None
