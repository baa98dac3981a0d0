"""The specialisation cache: what a run needs for one input signature (dtypes and shapes)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable
from dataclasses import dataclass

from onnxkiln.types import CacheStats

__all__ = ["Specialization", "SpecializationCache"]


@dataclass(frozen=True)
class Specialization:
    """Shape-dependent state of one input signature.

    Every signature shares the compiled plan; kernels keep their own shape-keyed state
    (im2col plans) inside, filled by the first run. With a memory limit, building one
    runs shape inference and the lifetime simulation (`predicted_peak` bytes, a lower
    bound when some sizes depend on data) and refuses signatures that cannot fit.
    """

    signature: Hashable
    predicted_peak: int | None = None


class SpecializationCache:
    """Maps an input signature to its Specialization, counting hits, misses, evictions.

    A miss builds with `build(signature)`; when that raises (a memory limit), the miss
    is counted and nothing is stored. Eviction drops the oldest entry.
    """

    def __init__(self, build: Callable[[Hashable], Specialization],
                 max_entries: int = 256) -> None:
        self._build = build
        self._entries: dict[Hashable, Specialization] = {}
        self._max = max_entries
        self._hits = self._misses = self._evictions = 0
        self._lock = threading.Lock()
        self.last_signature: Hashable | None = None  # of the latest get(), for memory_stats

    def get(self, signature: Hashable) -> Specialization:
        """The specialisation for this signature, built on first sight."""
        self.last_signature = signature
        found = self._entries.get(signature)
        if found is not None:
            self._hits += 1
            return found
        with self._lock:
            found = self._entries.get(signature)
            if found is not None:  # another thread built it meanwhile
                self._hits += 1
                return found
            self._misses += 1
            built = self._build(signature)
            if len(self._entries) >= self._max:
                self._entries.pop(next(iter(self._entries)))
                self._evictions += 1
            self._entries[signature] = built
        return built

    def stats(self) -> CacheStats:
        """Entries, hits, misses and evictions so far."""
        return CacheStats(len(self._entries), self._hits, self._misses, self._evictions)
