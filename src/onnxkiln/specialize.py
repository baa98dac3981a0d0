"""The specialisation cache: one runner per input signature (dtypes and shapes)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable
from typing import Any

from onnxkiln.types import CacheStats

__all__ = ["SpecializationCache"]


class SpecializationCache:
    """Maps an input signature to the runner built for it, counting hits and misses.

    Today every signature shares the compiled plan; kernels keep their own
    shape-keyed state (im2col plans) inside. The cache is the seam where buffer
    plans and per-shape variants attach.
    """

    def __init__(self, runner: Callable[..., Any], max_entries: int = 256) -> None:
        self._runner = runner
        self._entries: dict[Hashable, Callable[..., Any]] = {}
        self._max = max_entries
        self._hits = self._misses = self._evictions = 0
        self._lock = threading.Lock()

    def get(self, signature: Hashable) -> Callable[..., Any]:
        """The runner for this signature, built on first sight."""
        runner = self._entries.get(signature)
        if runner is not None:
            self._hits += 1
            return runner
        with self._lock:
            self._misses += 1
            if len(self._entries) >= self._max:
                self._entries.pop(next(iter(self._entries)))
                self._evictions += 1
            self._entries[signature] = self._runner
        return self._runner

    def stats(self) -> CacheStats:
        """Entries, hits, misses and evictions so far."""
        return CacheStats(len(self._entries), self._hits, self._misses, self._evictions)
