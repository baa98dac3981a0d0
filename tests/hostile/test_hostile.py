"""The hostile-input suite: every case of `cases_*.py`, each in its own subprocess with a
time and a memory bound, must end the way it is registered to ("ok" with the right
values, or "refused" with a clear error); see `harness.py` for the outcomes."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness

CASES = {k: v for k, v in harness.load_cases().items() if v.kind != "runner"}


@pytest.mark.parametrize("name", sorted(CASES))
def test_hostile_case(name):
    spec = CASES[name]
    result = harness.run_isolated(name)
    assert result.outcome == spec.expect, (
        f"{name} ({spec.doc}): expected {spec.expect}, got {result.outcome}: {result.detail}")


def test_classification_is_not_vacuous():
    """The runner tells a refusal from a wrong answer, a crash and a hang."""
    from onnxkiln import ModelLoadError

    assert harness.classify(None, "onnxkiln")[0] == "ok"
    assert harness.classify(AssertionError("x"), "onnxkiln")[0] == "wrong"
    assert harness.classify(ModelLoadError("bad"), "onnxkiln")[0] == "refused"
    assert harness.classify(ModelLoadError("a bug in onnxkiln"), "onnxkiln")[0] == "bug-text"
    assert harness.classify(KeyError("k"), "onnxkiln")[0] == "error:KeyError"
    assert harness.classify(MemoryError(), "onnxkiln")[0] == "oom"


@pytest.mark.parametrize(("name", "outcome"), [
    ("runner_segfault", "crash:SIGSEGV"), ("runner_hang", "hang"), ("runner_alloc", "oom")])
def test_runner_reports_how_a_case_ended(name, outcome):
    assert harness.run_isolated(name).outcome == outcome
