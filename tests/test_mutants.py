"""scripts/mutation.py stays runnable: each mutant's text occurs exactly once in the source, so a
change to the code that a mutant names fails here, not months later when someone runs the script
(PK4-PK6 pointed at code a review had rewritten, and `--list` refused to start)."""

from __future__ import annotations

import runpy
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_every_mutant_names_text_that_occurs_once_in_its_file():
    script = runpy.run_path(str(ROOT / "scripts" / "mutation.py"), run_name="mutation")
    mutants = script["MUTANTS"]
    assert len(mutants) > 100
    script["check_mutants"](mutants)  # SystemExit naming the mutant otherwise
