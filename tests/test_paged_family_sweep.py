"""bench/paged_family_sweep.py: the verdicts it gives supported types (the Llama runner's CWM, a
family runner's OLMo 2), a type whose layer is the Llama layer but is not registered (Doge: its
dynamic-mask attention stays inert in a tiny random config), one whose math differs (DiffLlama) and
one without the layout (BART's decoder)."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import paged_family_sweep  # noqa: E402


def test_the_sweep_tells_the_four_verdicts(capsys):
    assert paged_family_sweep.main(["llama", "olmo2", "cwm", "doge", "diffllama", "bart"]) == 0
    lines = dict(line.split(": ", 1) for line in capsys.readouterr().out.splitlines() if not line.startswith("summary"))
    assert lines["llama"] == "SUPPORTED (PagedLlamaRunner)" and lines["olmo2"] == "SUPPORTED (PagedOlmo2Runner)"
    assert lines["cwm"] == "SUPPORTED (PagedLlamaRunner)"
    assert lines["doge"] == "MATCH"
    assert lines["diffllama"].startswith("FAIL")
    assert lines["bart"].startswith("LAYOUT")
