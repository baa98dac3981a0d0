"""BLAS threads and core counts.

onnxkiln splits work across its own pool (onnxkiln.pool), so every BLAS call inside a
run is single-threaded: a BLAS pool of its own would spin-wait for a descheduled partner
on every call when other processes share the cores. OpenBLAS's pthreads build has no
per-thread limit (`openblas_set_num_threads_local` changes the process-wide count), so
the limit is process-wide and reference-counted: the first run to start sets every
loaded BLAS library to one thread, the last to end restores what it had. That costs two
C calls per run (a few µs), never threadpoolctl's library scan: the scan runs once, and
again only when modules were imported since (a lazily imported scipy brings its own
OpenBLAS). Outside runs the caller's own numpy keeps its BLAS threads.
"""

from __future__ import annotations

import functools
import os
import sys
import threading
from pathlib import Path
from typing import Any

__all__ = ["blas_enter", "blas_leave", "blas_threads", "default_threads", "physical_cores"]


class _BlasLimit:
    """Reference-counted single-threaded BLAS across concurrent runs (about 1.5 us a run:
    one get and two sets through ctypes)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._active = 0
        self._libs: list[Any] = []  # OpenBLAS handles, or threadpoolctl LibControllers
        self._fns: list[tuple[Any, Any]] = []  # (get, set) of each library
        self._modules = -1  # len(sys.modules) when _libs was scanned
        self._saved: list[tuple[Any, int]] = []
        self.disabled = os.environ.get("ONNXKILN_BLAS_THREADS", "").strip() == "keep"

    def _scan(self) -> None:
        try:
            from threadpoolctl import ThreadpoolController

            self._libs = [_direct(c) for c in ThreadpoolController().lib_controllers
                          if c.user_api == "blas"]
        except Exception:  # no threadpoolctl, or a library it cannot drive: leave BLAS alone
            self._libs = []
        self._fns = [(lib.get_num_threads, lib.set_num_threads) for lib in self._libs]
        self._modules = len(sys.modules)

    def enter(self) -> None:
        if self.disabled:
            return
        lock = self._lock
        lock.acquire()
        try:
            self._active += 1
            if self._active == 1:
                if len(sys.modules) != self._modules:
                    self._scan()
                saved = []
                for get, set_ in self._fns:
                    n = get()
                    if n is not None and n != 1:
                        set_(1)
                        saved.append((set_, n))
                self._saved = saved
        finally:
            lock.release()

    def leave(self) -> None:
        if self.disabled:
            return
        lock = self._lock
        lock.acquire()
        try:
            self._active -= 1
            if not self._active and self._saved:
                for set_, n in self._saved:
                    set_(n)
                self._saved = []
        finally:
            lock.release()

    def threads(self) -> dict[str, int | None]:
        """Each BLAS library's current thread count, by file name."""
        with self._lock:
            if len(sys.modules) != self._modules:
                self._scan()
            return {Path(lib.filepath).name: lib.get_num_threads() for lib in self._libs}


class _OpenBlas:
    """An OpenBLAS library's thread-count functions called through ctypes directly (the
    controller's methods look the symbols up on every call)."""

    def __init__(self, filepath: str, get: Any, set_: Any) -> None:
        self.filepath = filepath
        self.get_num_threads = get
        self.set_num_threads = set_


def _direct(controller: Any) -> Any:
    """OpenBLAS through its own symbols when they are found, else threadpoolctl's controller."""
    if controller.internal_api != "openblas":
        return controller
    import ctypes

    lib = ctypes.CDLL(controller.filepath)  # already loaded: the same handle
    for prefix in ("scipy_", ""):
        for suffix in ("64_", ""):
            get = getattr(lib, f"{prefix}openblas_get_num_threads{suffix}", None)
            set_ = getattr(lib, f"{prefix}openblas_set_num_threads{suffix}", None)
            if get is not None and set_ is not None:
                get.restype, get.argtypes = ctypes.c_int, []
                set_.restype, set_.argtypes = None, [ctypes.c_int]
                return _OpenBlas(controller.filepath, get, set_)
    return controller


_limit = _BlasLimit()
blas_enter = _limit.enter
blas_leave = _limit.leave
blas_threads = _limit.threads


@functools.cache
def physical_cores() -> int:
    """Physical cores among the CPUs this process may run on (hyperthread siblings count
    once); the logical count where the topology cannot be read."""
    try:
        cpus = sorted(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1
    cores = set()
    for cpu in cpus:
        topo = Path(f"/sys/devices/system/cpu/cpu{cpu}/topology")
        try:
            cores.add((topo.joinpath("physical_package_id").read_text().strip(),
                       topo.joinpath("core_id").read_text().strip()))
        except OSError:
            return len(cpus) or 1
    return len(cores) or 1


def default_threads() -> int:
    """Intra-op threads of a session that does not set them: the physical cores."""
    return physical_cores()
