"""generate()'s options by one rule (specdec_fast/options/rules.py): every GenerationConfig field at
transformers' default is accepted, as a keyword and inside a GenerationConfig, and changes nothing;
non-neutral values of what we do not implement raise one line naming the option and the value;
generate()'s other keyword arguments are classified; the engine's `implemented` hook."""
import inspect

import pytest
import torch
from transformers import GenerationConfig, GenerationMixin, LogitsProcessorList, StoppingCriteriaList
from transformers.generation import MaxLengthCriteria, TemperatureLogitsWarper

import specdec_fast.api as api
from specdec_fast.options import resolve as generation_options, rules as option_rules
from specdec_fast.options.resolve import resolve_options

from .conftest import model_pair
from .models import left_padded_prompts

IDS, MASK = left_padded_prompts([4, 6], seed=11)
NEW = 4


def _transformers_defaults() -> dict:
    """Every GenerationConfig field at transformers' default, read from transformers here (not from
    option_rules): GenerationConfig()'s value, or where that is None the one generate() fills in."""
    fill = GenerationConfig._get_default_generation_params()
    return {name: fill.get(name) if value is None else value for name, value in GenerationConfig().to_dict().items()}


DEFAULTS = _transformers_defaults()
# The fields whose default is None but that transformers documents as `bool` (None reads as False).
FALSE_FOR_NONE = ["output_attentions", "output_hidden_states", "output_logits", "renormalize_logits", "token_healing",
                  "is_assistant", "disable_compile"]
CASES = sorted(DEFAULTS.items()) + [(name, False) for name in FALSE_FOR_NONE]


@pytest.fixture(scope="module")
def pair():
    return model_pair("llama")


@pytest.fixture(scope="module")
def baseline(pair):
    target, draft = pair
    return api.generate(target, IDS, MASK, assistant_model=draft, max_new_tokens=NEW, do_sample=False)


def test_the_table_covers_every_field():
    assert len(DEFAULTS) > 60 and {"num_beams", "output_attentions", "stop_strings", "max_length"} <= set(DEFAULTS)
    assert all(DEFAULTS[name] is None for name in FALSE_FOR_NONE)
    assert (DEFAULTS["num_beams"], DEFAULTS["repetition_penalty"], DEFAULTS["max_length"]) == (1, 1.0, 20)


@pytest.mark.parametrize("name, value", CASES, ids=[f"{n}={v!r}" for n, v in CASES])
def test_every_field_at_its_default_is_accepted_and_changes_nothing(pair, baseline, name, value):
    target, draft = pair
    base = dict(max_new_tokens=NEW, do_sample=False)
    kwargs = {**base, name: value} if value is not None or name not in base else base  # None: not given
    as_keyword = api.generate(target, IDS, MASK, assistant_model=draft, **kwargs)
    in_config = api.generate(target, IDS, MASK, assistant_model=draft, **base,
                             generation_config=GenerationConfig(**{name: value}))
    assert torch.equal(as_keyword, baseline) and torch.equal(in_config, baseline)


ACCEPTED_KWARGS = [  # generate() keyword arguments that are not GenerationConfig fields, or are at any value
    dict(use_cache=True), dict(use_cache=False), dict(synced_gpus=False), dict(synced_gpus=None),
    dict(stopping_criteria=StoppingCriteriaList()), dict(logits_processor=LogitsProcessorList()),
    dict(prefix_allowed_tokens_fn=None), dict(negative_prompt_ids=None), dict(trust_remote_code=True),
    dict(tokenizer=None), dict(assistant_tokenizer=None), dict(num_assistant_tokens_schedule="heuristic"),
    dict(cache_implementation="static"), dict(return_dict_in_generate=False), dict(num_beams=1, num_return_sequences=1),
]


@pytest.mark.parametrize("kwargs", ACCEPTED_KWARGS, ids=lambda kw: ",".join(f"{k}={v!r}" for k, v in kw.items()))
def test_generate_keywords_that_change_nothing_are_accepted(pair, baseline, kwargs):
    target, draft = pair
    out = api.generate(target, IDS, MASK, assistant_model=draft, max_new_tokens=NEW, do_sample=False, **kwargs)
    assert torch.equal(out, baseline)


NOT_NEUTRAL = [  # (option, value): each raises naming the option, from anywhere it is given
    ("num_beams", 2), ("num_beams", True),
    ("constraints", [object()]),
    ("token_healing", True),
    ("penalty_alpha", 0.6), ("dola_layers", "high"), ("use_mtp", 1),
    ("assistant_ensemble_weight", 0.5), ("speculation_type", "medusa"),
    ("num_beam_groups", 2), ("diversity_penalty", 0.5),
]
# Fields transformers' generate ignores in some calls (option_rules.IGNORED_IN_MODE): they raise in
# the calls where transformers would act on them -> (option, value, such a call's other options).
ACTING_IN_MODE = [("early_stopping", True, dict(num_beams=2)), ("length_penalty", 2.0, dict(num_beams=2))]
NOT_NEUTRAL_KWARGS = [  # generate()'s own keyword arguments (not GenerationConfig fields)
    ("synced_gpus", True),
    ("custom_generate", lambda *a, **k: None),
    ("inputs_embeds", torch.zeros(2, 6, 48)), ("position_ids", torch.zeros(2, 6)),
    ("no_such_option", 3),
]


@pytest.mark.parametrize("name, value", NOT_NEUTRAL + NOT_NEUTRAL_KWARGS,
                         ids=[f"{n}={option_rules.short_repr(v, 20)}" for n, v in NOT_NEUTRAL + NOT_NEUTRAL_KWARGS])
def test_a_value_that_changes_the_output_raises_naming_the_option(pair, name, value, mode=None):
    target, draft = pair
    with pytest.raises(ValueError, match=f"^unsupported generate option '?{name}") as info:
        api.generate(target, IDS, MASK, assistant_model=draft, max_new_tokens=NEW, **{name: value}, **(mode or {}))
    message = str(info.value)
    assert "\n" not in message and len(message) < 200
    # the names the rules know: the installed GenerationConfig's fields, generate()'s arguments, and
    # the values refused of an option we take on any transformers (speculation_type, a field from 5.15)
    if name in option_rules.field_defaults() or name in NAMED_KWARGS or name in option_rules.REFUSED_VALUES:
        assert option_rules.short_repr(value) in message and "supports only" in message
    else:  # no_such_option, and fields newer than the installed transformers (assistant_ensemble_weight: 5.14)
        assert "not a GenerationConfig field" in message


NAMED_KWARGS = {name for name, _ in NOT_NEUTRAL_KWARGS} - {"no_such_option"}


@pytest.mark.parametrize("name, value, mode", ACTING_IN_MODE, ids=[f"{n}={v!r}" for n, v, _ in ACTING_IN_MODE])
def test_a_field_raises_in_a_call_where_transformers_acts_on_it(pair, name, value, mode):
    test_a_value_that_changes_the_output_raises_naming_the_option(pair, name, value, mode)


IGNORED = [  # (option, value, a call's options in which transformers' generate ignores it)
    ("early_stopping", True, {}), ("early_stopping", "never", dict(num_beams=1)), ("length_penalty", 0.5, {}),
    ("length_penalty", 2.0, dict(num_beams=1)), ("top_h", 0.5, {}), ("top_h", 0.9, dict(do_sample=False)),
    ("output_attentions", True, {}), ("output_hidden_states", True, dict(return_dict_in_generate=False)),
]


@pytest.mark.parametrize("name, value, mode", IGNORED, ids=[f"{n}={v!r}-{m}" for n, v, m in IGNORED])
def test_a_field_transformers_ignores_in_the_call_is_accepted(pair, baseline, name, value, mode):
    """early_stopping / length_penalty without beam search, top_h without sampling (handled: the
    stage's warpers only sample), output_attentions / output_hidden_states without the output dict
    (handled: returned in the dict only): transformers decodes the same tokens (and warns),
    so we do too, from a keyword, a generation_config or the model's (a checkpoint that ships
    early_stopping=True with num_beams=1 speculates)."""
    target, draft = pair
    kw = {"max_new_tokens": NEW, "do_sample": False, **mode}
    ours = api.generate(target, IDS, MASK, assistant_model=draft, **kw, **{name: value})
    theirs = target.generate(IDS, attention_mask=MASK, **kw, **{name: value})
    in_config = api.generate(target, IDS, MASK, assistant_model=draft, **kw,
                             generation_config=GenerationConfig(**{name: value}))
    setattr(target.generation_config, name, value)
    try:
        from_model = api.generate(target, IDS, MASK, assistant_model=draft, **kw)
    finally:
        setattr(target.generation_config, name, None)
    assert torch.equal(ours, baseline) and torch.equal(ours, theirs)
    assert torch.equal(in_config, baseline) and torch.equal(from_model, baseline)


@pytest.mark.parametrize("name, value", [("num_beams", 2), ("diversity_penalty", 1.2), ("num_beam_groups", 2),
                                         ("token_healing", True)])
def test_a_non_neutral_field_in_a_config_names_where_it_came_from(pair, name, value):
    target, draft = pair
    with pytest.raises(ValueError, match=f"unsupported generate option {name}=.* \\(from generation_config\\)"):
        api.generate(target, IDS, MASK, assistant_model=draft, max_new_tokens=NEW,
                     generation_config=GenerationConfig(**{name: value}))
    target.generation_config.update(**{name: value})
    try:
        with pytest.raises(ValueError, match=f"{name}=.* \\(from model.generation_config\\)"):
            api.generate(target, IDS, MASK, assistant_model=draft, max_new_tokens=NEW)
    finally:
        setattr(target.generation_config, name, None)


def test_a_neutral_value_overrides_a_non_neutral_model_default(pair, baseline):
    """Checked after merging, as transformers merges: the value that counts is the one that decodes.
    A checkpoint's repetition_penalty (Qwen2.5 Instruct ships 1.05) applies as model.generate
    applies it; a neutral keyword or config value overrides it."""
    target, draft = pair
    target.generation_config.repetition_penalty = 20.0  # large: the few tokens of this test change
    try:
        as_keyword = api.generate(target, IDS, MASK, assistant_model=draft, max_new_tokens=NEW, do_sample=False,
                                  repetition_penalty=1.0)
        in_config = api.generate(target, IDS, MASK, assistant_model=draft, max_new_tokens=NEW, do_sample=False,
                                 generation_config=GenerationConfig(repetition_penalty=1.0))
        longer = dict(max_new_tokens=24, do_sample=False)  # long enough for the penalty to change a token
        from_model = api.generate(target, IDS, MASK, assistant_model=draft, **longer)
        expected = target.generate(IDS, attention_mask=MASK, **longer)
        neutral = api.generate(target, IDS, MASK, assistant_model=draft, repetition_penalty=1.0, **longer)
    finally:
        target.generation_config.repetition_penalty = None
    assert torch.equal(as_keyword, baseline) and torch.equal(in_config, baseline)
    assert torch.equal(from_model, expected) and not torch.equal(from_model, neutral)


def test_every_argument_of_transformers_generate_is_classified():
    """A keyword transformers' generate() names (or any GenerationConfig field) is handled, accepted or
    unsupported here, never "unknown" (a new transformers argument makes this fail, not pass silently)."""
    params = set(inspect.signature(GenerationMixin.generate).parameters) - {"self", "kwargs"}
    names = params | set(DEFAULTS) | {"tokenizer", "assistant_tokenizer", "use_cache", "trust_remote_code"}
    unknown = sorted(n for n in names if option_rules.option_class(n) == "unknown")
    assert not unknown
    table = option_rules.classification()
    assert {"max_length", "stopping_criteria", "use_cache"} <= set().union(*table.values())
    assert "use_cache" in table["accepted"] and "synced_gpus" in table["unsupported"]
    assert "max_length" in table["handled"] and "streamer" in table["handled"]


def test_implemented_options_reach_the_caller(pair):
    """The engine's hook: a name in `implemented` is handled; its non-neutral value arrives in
    Options.extra, its neutral values stay out; without the name it raises."""
    target, _ = pair
    criteria = StoppingCriteriaList([MaxLengthCriteria(8)])
    explicit = dict(max_new_tokens=NEW, repetition_penalty=1.2, stopping_criteria=criteria)
    implemented = {"repetition_penalty", "stopping_criteria"}
    opts = resolve_options(target, None, explicit, IDS.shape[1], implemented=implemented)
    assert opts.extra == {"repetition_penalty": 1.2, "stopping_criteria": criteria}
    neutral = dict(max_new_tokens=NEW, repetition_penalty=1.0, stopping_criteria=StoppingCriteriaList())
    assert resolve_options(target, None, neutral, IDS.shape[1], implemented=implemented).extra == {}
    config = GenerationConfig(repetition_penalty=1.5)
    assert resolve_options(target, config, dict(max_new_tokens=NEW), 6, implemented=implemented).extra == {
        "repetition_penalty": 1.5}
    with pytest.raises(ValueError, match="stopping_criteria=StoppingCriteriaList"):
        resolve_options(target, None, dict(max_new_tokens=NEW, stopping_criteria=criteria), IDS.shape[1],
                        implemented={"repetition_penalty"})
    # The engine implements the logits stage's options (engine/logits_stage.py), the stopping ones,
    # the outputs, the draft length's schedule (engine/schedule.py), the early-exit drafter and a
    # user's cache (engine/user_cache.py).
    assert generation_options.ENGINE_IMPLEMENTS == frozenset(
        option_rules.LOGITS_STAGE_OPTIONS + option_rules.STOPPING_OPTIONS + option_rules.SCHEDULE_OPTIONS
        + option_rules.OUTPUT_OPTIONS + option_rules.DRAFTER_OPTIONS + option_rules.CACHE_OPTIONS)


def test_the_readme_table_is_the_classification():
    """README's Options table names each class's options as option_rules.classification() does (every
    handled, accepted and unsupported name)."""
    import re
    from pathlib import Path

    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text(encoding="utf-8")
    section = readme[readme.index("\n### Options\n"):readme.index("\n### Token trees\n")]
    rows = {line.split("|")[1].strip().split(" ")[0]: set(re.findall(r"`(\w+)`", line.split("|")[2]))
            for line in section.splitlines() if line.startswith("| ") and not line.startswith("| class")}
    table = option_rules.classification()
    assert rows["handled"] == set(table["handled"]) and rows["accepted"] == set(table["accepted"])
    # The table names transformers 5.24's fields; one the installed transformers lacks is an unknown
    # name there, which raises too (assistant_ensemble_weight came in 5.14).
    newer = {"assistant_ensemble_weight"} - set(option_rules.field_defaults())
    assert rows["unsupported:"] - {"GenerationConfig"} - newer == set(table["unsupported"])
