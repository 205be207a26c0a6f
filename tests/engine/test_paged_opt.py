"""The OPT runner's own check (its shared ones, the position table's included:
test_paged_families.py): OPT-350M's projected width refuses hidden-state capture by name."""
import pytest

from specdec_fast.runners.paged_opt import PagedOPTRunner

from .family_models import tiny_family


def test_a_projected_width_refuses_hidden_capture():
    runner = PagedOPTRunner(tiny_family("opt_post_norm"), max_new_tokens=4, num_draft_tokens=1)
    with pytest.raises(ValueError, match="one width: this OPT projects its layers' 64 to the lm_head's 48"):
        runner.capture_hidden_states((0, 2))
    runner.capture_hidden_states(None)  # turning it off always works
