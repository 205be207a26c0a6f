"""patch_generate(): route an existing model.generate(...) call through specdec_fast.generate."""
from .api import generate


class patch_generate:
    """Route model.generate(..., assistant_model=... or prompt_lookup_num_tokens=...) through
    specdec_fast.generate; other calls go to the original. Patches on construction; usable as a
    context manager (restores on exit) or undone with .restore()."""

    def __init__(self, model):
        self.model = model
        self.original = model.generate
        self.had_attribute = "generate" in vars(model)

        def patched(*args, **kwargs):
            if kwargs.get("assistant_model") is not None or kwargs.get("prompt_lookup_num_tokens") is not None:
                return generate(model, *args, **kwargs)
            return self.original(*args, **kwargs)

        model.generate = patched

    def restore(self) -> None:
        if self.had_attribute:
            self.model.generate = self.original
        else:
            vars(self.model).pop("generate", None)

    def __enter__(self):
        return self.model

    def __exit__(self, *exc):
        self.restore()
        return False
