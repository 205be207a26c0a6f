"""The OPT runner's own checks (its shared ones: test_paged_families.py): rows must fit the
learned position table (else the hf runner), and OPT-350M's projected width refuses hidden-state
capture by name."""
import pytest

import specdec_fast.api as api
from specdec_fast.runners.paged_opt import PagedOPTRunner

from .family_models import tiny_family


def test_rows_past_the_position_table_go_to_the_hf_runner():
    model = tiny_family("opt")  # max_position_embeddings 256
    assert api.choose_runner(model, None, 256) == "paged"
    assert api.choose_runner(model, None, 257) == "hf"


def test_a_projected_width_refuses_hidden_capture():
    runner = PagedOPTRunner(tiny_family("opt_post_norm"), max_new_tokens=4, num_draft_tokens=1)
    with pytest.raises(ValueError, match="one width: this OPT projects its layers' 64 to the lm_head's 48"):
        runner.capture_hidden_states((0, 2))
    runner.capture_hidden_states(None)  # turning it off always works
