"""Timing helpers shared by the suite and the memory probe: deadlines, interleaved runs."""

from __future__ import annotations

import random
import signal
import time
from collections.abc import Callable
from typing import Any

GAP_S = 0.2
"""Pause before each timed call: lets the previous engine's spinning worker threads go idle
(OpenBLAS's busy-wait for new work for up to ~0.1 s, onnxruntime's pool spins too), so they do
not steal cores from the next engine. With a 2 ms gap on 2 cores, MobileNetV2 measured 58 ms
(onnxkiln) and 22 ms (onnxruntime) interleaved; with 200 ms, 29 and 8 ms."""


class Timeout(Exception):
    """A run passed its deadline."""


class deadline:  # a context manager used like a function
    """Raise Timeout in the main thread after `seconds` (0 or less: never; needs SIGALRM).

    The signal is handled between Python bytecodes, so a run stops after the numpy call it
    is in; fine for the ReferenceEvaluator, whose loop over nodes is Python.
    """

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds if hasattr(signal, "setitimer") else 0.0
        self.old: Any = None

    def __enter__(self) -> deadline:
        if self.seconds > 0:
            self.old = signal.signal(signal.SIGALRM, _fire)
            signal.setitimer(signal.ITIMER_REAL, self.seconds)
        return self

    def __exit__(self, *exc: object) -> None:
        if self.seconds > 0:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, self.old)


def _fire(signum: int, frame: object) -> None:
    raise Timeout


def timed(fn: Callable[[], Any], gap_s: float | None = None) -> float:
    """Seconds one call of fn takes (after an idle gap, GAP_S unless given)."""
    time.sleep(GAP_S if gap_s is None else gap_s)
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def interleave(calls: dict[str, Callable[[], Any]], repeat: int, limits: dict[str, int],
               rng: random.Random, gap_s: float | None = None) -> dict[str, list[float]]:
    """Round-robin timing: each round runs every engine once, in a fresh random order, so
    drift and order effects hit all alike. An engine named in `limits` stops after that
    many samples."""
    times: dict[str, list[float]] = {k: [] for k in calls}
    for _ in range(repeat):
        order = [k for k in calls if len(times[k]) < limits.get(k, repeat)]
        rng.shuffle(order)
        for k in order:
            times[k].append(timed(calls[k], gap_s))
    return times


def interleave_runs(runs: dict[str, Callable[[Any], Any]], feeds: Any, repeat: int,
                    warmup: int = 2) -> dict[str, list[float]]:
    """`interleave` for runners taking the same feeds, after `warmup` untimed calls each
    and without idle gaps (single-engine comparisons: no other runtime's threads spin)."""
    for fn in runs.values():
        for _ in range(warmup):
            fn(feeds)
    calls = {k: (lambda fn=fn: fn(feeds)) for k, fn in runs.items()}
    return interleave(calls, repeat, {}, random.Random(0), gap_s=0.0)
