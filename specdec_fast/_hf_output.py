"""Quiet transformers inside our own calls (the demo and the CLI): no "Loading weights" progress
bars, no info/warning chatter, restored afterwards so the user's own settings stand."""
from contextlib import contextmanager


@contextmanager
def quiet_transformers():
    """Within the block: transformers' progress bars off and its logging at ERROR."""
    from transformers.utils import logging as hf_logging

    verbosity, bars = hf_logging.get_verbosity(), hf_logging.is_progress_bar_enabled()
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        hf_logging.set_verbosity(verbosity)
        if bars:
            hf_logging.enable_progress_bar()
