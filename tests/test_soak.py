"""The soak in CI: a reduced `scripts/measure/soak.py` run stays flat, and a leak would be caught.

The full run (``python scripts/measure/soak.py --steps 10000``) is quoted in docs/reference/reliability.md.
"""

from __future__ import annotations

import json
import runpy
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "measure" / "soak.py"


def _soak() -> dict:
    return runpy.run_path(str(SCRIPT), run_name="soak")


#: what CI runs (the script's docstring quotes it)
CI_ARGS = ["--steps", "2000", "--restart-every", "500", "--sample-every", "50"]


def test_the_script_quotes_what_ci_runs():
    doc = _soak()["__doc__"]
    assert f"python scripts/measure/soak.py {' '.join(CI_ARGS)} --json out" in doc, doc


@pytest.mark.slow
def test_reduced_soak_is_flat(tmp_path, capsys):
    out = tmp_path / "soak.json"
    figures = _soak()["main"]([*CI_ARGS, "--json", str(out)])
    assert figures["ok"], figures["problems"]
    assert figures["restarts"] == 3 and figures["samples"] == 41
    assert figures["rss_growth_mib"] <= figures["rss_bound_mib"]
    # every thread and descriptor the loaders started is gone after the last close()
    for key in ("python_threads", "os_threads", "fds"):
        before, after = figures[key]
        assert after <= before, (key, before, after)
    # ... while they did run: two read threads and a read-timeout watchdog, at least
    assert figures["python_threads_max_running"] >= figures["python_threads"][0] + 2
    assert json.loads(out.read_text()) == figures
    assert "| rss_growth_mib |" in capsys.readouterr().out


@pytest.mark.slow
def test_a_leaked_loader_fails_the_soak(tmp_path):
    """The soak's own check can fail: loaders that are never closed leave threads behind."""
    soak = _soak()
    leaked = []
    honest = soak["open_loader"]

    def leaky(*args, **kwargs):
        loader = honest(*args, **kwargs)
        extra = honest(*args, **kwargs)
        next(iter(extra))  # started, never closed
        leaked.append(extra)
        return loader

    soak["soak"].__globals__["open_loader"] = leaky
    try:
        figures = soak["main"](["--steps", "400", "--restart-every", "200"])
    finally:
        soak["soak"].__globals__["open_loader"] = honest
        for loader in leaked:
            loader.close()
    assert not figures["ok"]
    assert any(p.startswith("python_threads:") for p in figures["problems"]), figures["problems"]
