"""Cases of kind "runner" check the runner itself, not onnxkiln: a segfault, a hang and an
allocation past the bound are each reported as what they are. `test_hostile.py` runs them
in `test_runner_reports_*`; the suite and the table leave them out."""

from __future__ import annotations

import ctypes
import time

from harness import case


@case("runner", "ok", on_ort=False)
def case_runner_segfault(rt, tmp):
    """A segfault in the case's process."""
    ctypes.string_at(0)


@case("runner", "ok", on_ort=False, timeout=3)
def case_runner_hang(rt, tmp):
    """A case that never ends."""
    time.sleep(60)


@case("runner", "ok", on_ort=False, memory=256 << 20)
def case_runner_alloc(rt, tmp):
    """An allocation past the memory bound."""
    bytearray(1 << 30)
