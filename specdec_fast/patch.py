"""patch_generate(): make an existing model.generate(...) speculate, from any caller.

Code that already calls ``model.generate`` (an evaluation harness, transformers' pipeline, a chat
loop) knows nothing of speculation. Changed by one line:

    specdec_fast.patch_generate(model, assistant_model=draft)      # or prompt_lookup_num_tokens=N
    ... model.generate(input_ids=..., max_length=..., stopping_criteria=..., use_cache=True, ...)

every later call runs on specdec_fast's engine (cached per model: a harness's thousand calls
capture their CUDA graphs once) with the bound drafting and ``defaults`` (any generate option,
e.g. num_assistant_tokens=3); the call's own options win. A call that asks for something
specdec_fast does not implement (beam search, say: options/rules.py's UnsupportedOptionError; or
a right-padded attention_mask: engine/inputs.py's UnsupportedInputError; or a model with linear or
chunked attention layers: runners/hf.py's UnsupportedModelError; a bound tree= with the call's logits
processors, or a tree or an assistant_early_exit on a model those cannot take, likewise) goes to the original
generate, with one warning naming the option (fallback="warn", the default) or
raises (fallback="raise"). The patch keeps the last call's stats (``patch.last_stats``, also
``model.specdec_last_stats``).

The drafter bound may also be ``draft_head=`` (an EAGLE-3 / DFlash head),
``assistant_early_exit=N`` or ``use_mtp=True`` (the target's own MTP layer). Without bound drafting
(``patch_generate(model)``), only the calls that carry one of those five (assistant_model,
prompt_lookup_num_tokens, draft_head, assistant_early_exit, use_mtp=True) are routed (they raise on an unsupported option); the others go to the
original generate unchanged.
"""
import inspect
import warnings
import weakref

from .api import DRAFTERS, check_one_drafter, drafter_given, generate
from .engine.inputs import UnsupportedInputError
from .options.rules import UnsupportedOptionError
from .runners.hf import UnsupportedModelError, cache_keyword

FALLBACKS = ("warn", "raise")


class patch_generate:
    """Patches ``model.generate`` on construction; a context manager (restores on exit) or undone
    with .restore(). See the module docstring for the bound drafter (assistant_model,
    prompt_lookup_num_tokens, draft_head, assistant_early_exit or use_mtp), fallback and defaults."""

    def __init__(self, model, assistant_model=None, *, prompt_lookup_num_tokens=None, fallback: str = "warn",
                 **defaults):
        if fallback not in FALLBACKS:
            raise ValueError(f"fallback must be one of {FALLBACKS}, got {fallback!r}")
        drafting = {name: defaults.pop(name, None) for name in DRAFTERS}
        drafting.update(assistant_model=assistant_model, prompt_lookup_num_tokens=prompt_lookup_num_tokens)
        check_one_drafter(drafting)
        self.model_ref = weakref.ref(model)  # the patched function must not keep the model alive
        self.had_attribute = "generate" in vars(model)
        # The original as a plain function (no bound method: it would hold the model from its own
        # __dict__ and keep it, and the engines cached for it, alive).
        self._function = vars(model)["generate"] if self.had_attribute else type(model).generate
        self.fallback = fallback
        self.bound = {name: value for name, value in drafting.items() if drafter_given(value)}
        self.defaults = dict(defaults)
        self.last_stats = None
        self._signature = inspect.signature(self.original)

        def patched(*args, **kwargs):
            return self(*args, **kwargs)

        patched.__doc__ = self._function.__doc__
        model.generate = patched

    @property
    def original(self):
        """The generate the patch replaced (bound to the model)."""
        model = self.model
        return self._function if self.had_attribute else self._function.__get__(model, type(model))

    @property
    def model(self):
        return self.model_ref()

    def __call__(self, *args, **kwargs):
        """What the patched model.generate does with a call (module docstring)."""
        call = self._keywords(args, kwargs)
        drafting = any(drafter_given(call.get(name)) for name in DRAFTERS)  # the call names its own
        if not self.bound and not drafting:
            return self.original(*args, **kwargs)
        options = {**self.bound, **self.defaults, **call} if not drafting else {**self.defaults, **call}
        return_stats = options.pop("return_stats", False)
        try:
            out, stats = generate(self.model, return_stats=True, **options)
        except (UnsupportedOptionError, UnsupportedInputError, UnsupportedModelError) as exc:
            if not self.bound or self.fallback == "raise":
                raise
            warnings.warn(f"specdec_fast: {exc}; this call runs on transformers' generate", stacklevel=3)
            return self.original(*args, **self._cache_named_for_transformers(kwargs))
        self.last_stats = stats
        self.model.specdec_last_stats = stats
        return (out, stats) if return_stats else out

    def _keywords(self, args, kwargs) -> dict:
        """The call's arguments by name, as transformers' generate binds them (inputs first)."""
        bound = self._signature.bind_partial(*args, **kwargs).arguments
        extra = bound.pop("kwargs", {})
        return {**{name: value for name, value in bound.items()}, **extra}

    def _cache_named_for_transformers(self, kwargs: dict) -> dict:
        """A routed call's keywords for the original generate. ``cache=`` is ours on every
        transformers (api.generate takes it and past_key_values=), but generate before 5.24 knows
        only past_key_values and raises on ``cache`` ("model_kwargs are not used"): a call we hand
        back passes its cache under the installed name (the forward's, runners/hf.py's
        cache_keyword), so it fails only where transformers fails on the call itself."""
        name = cache_keyword(self.model)
        if "cache" not in kwargs or name in kwargs:  # 5.24+, or both names given: transformers' own answer
            return kwargs
        rest = {key: value for key, value in kwargs.items() if key != "cache"}
        return {**rest, name: kwargs["cache"]}

    def restore(self) -> None:
        model = self.model
        if model is None:
            return
        if self.had_attribute:
            model.generate = self._function
        else:
            vars(model).pop("generate", None)

    def __enter__(self):
        return self.model

    def __exit__(self, *exc):
        self.restore()
        return False
