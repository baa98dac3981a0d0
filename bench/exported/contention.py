"""Timing under contention: K CPU-bound busy processes run while each runtime is timed at
its default thread count and at 1 thread, against the same runs on a quiet machine.

The busy processes are pure-Python spin loops. They are started by `Busy` on entry and
killed on exit, also on an error or Ctrl-C; each one also ends by itself within
milliseconds when its parent (the harness) is gone, so none outlives a killed harness.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import numpy as np

from bench import _env
from bench.exported import harness

SPIN = """\
import os, sys
parent = int(sys.argv[1])
while os.getppid() == parent:  # reparented: the harness is gone, so stop
    for _ in range(100000):
        pass
"""


class Busy:
    """A context manager holding K busy processes (`pids` while inside)."""

    def __init__(self, k: int) -> None:
        self.k = k
        self.procs: list[subprocess.Popen] = []
        self._old_term: Any = None

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self.procs]

    def __enter__(self) -> Busy:
        if threading.current_thread() is threading.main_thread():
            # SIGTERM's default action skips `finally`; as SystemExit it runs __exit__
            self._old_term = signal.signal(signal.SIGTERM, _terminate)
        try:
            for _ in range(self.k):
                self.procs.append(subprocess.Popen(
                    [sys.executable, "-c", SPIN, str(os.getpid())], stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        for proc in self.procs:
            proc.kill()
        for proc in self.procs:
            proc.wait(timeout=10)
        self.procs = []
        if self._old_term is not None:
            signal.signal(signal.SIGTERM, self._old_term)
            self._old_term = None


def _terminate(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


def _key(runtime: str, threads: int | None) -> str:
    return f"{runtime}@{'default' if threads is None else threads}"


def measure(path: Path, feeds: dict[str, np.ndarray], k: int, repeat: int, budget_s: float,
            gap_s: float, rng: random.Random) -> dict[str, Any]:
    """Each runtime at its default threads and at 1 thread: quiet, then with k busy
    processes (interleaved rounds each time); slowdowns and their onnxkiln/onnxruntime
    ratio per thread setting, and whether default threads lose to 1 thread under load."""
    runners = {_key(r, t): harness.open_runner(r, path, t)
               for r in harness.RUNTIMES for t in (None, 1)}
    for runner in runners.values():
        runner.run(feeds)
    quiet = harness.time_runners(runners, feeds, repeat, budget_s, gap_s, rng)
    with Busy(k):
        busy = harness.time_runners(runners, feeds, repeat, budget_s, gap_s, rng)
    out: dict[str, Any] = {"busy_processes": k, "default_threads": _env.physical_cores(),
                           "quiet": quiet, "busy": busy, "slowdown": {},
                           "default_slower_than_1": {}}
    for key in runners:
        out["slowdown"][key] = busy["ms"][key] / quiet["ms"][key]
    for t in ("default", "1"):
        out[f"kiln_vs_ort_slowdown@{t}"] = (out["slowdown"][f"onnxkiln@{t}"]
                                            / out["slowdown"][f"onnxruntime@{t}"])
    for r in harness.RUNTIMES:
        out["default_slower_than_1"][r] = busy["ms"][_key(r, None)] > busy["ms"][_key(r, 1)]
    return out
