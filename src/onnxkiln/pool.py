"""onnxkiln's intra-op thread pool: the calling thread plus `threads - 1` workers.

A parallel op is split into chunks that every participating thread claims one at a time
from a shared counter, so a worker the OS has descheduled delays nothing: the caller
claims the remaining chunks itself and waits only for chunks already running. Idle
workers sleep on a lock (a futex), never spin. Chunks run numpy/BLAS calls or `nogil`
numba kernels, which release the GIL, so the threads really run at once.

When a dispatch shows the workers are being preempted (a worker's chunks got less than
MIN_RUNNING of their wall time on a core, or no worker joined a dispatch that lasted
NO_HELP_MIN_S: the cores are busy with other work), the pool runs calls inline for a while
(BACKOFF_MIN_S, doubling up to BACKOFF_MAX_S while it keeps happening) and tries again, so
under contention a run costs what it costs on one thread instead of waiting on preempted
workers. A worker's late start does not count: an efficiency measure over the whole
dispatch read it as a stall on a quiet machine and turned good splits off. Waking a
sleeping worker is slow on a VM whose idle virtual CPU is halted: on the development VM
(BLAS single-threaded, nothing else keeping the other CPU busy) a worker joins a dispatch
about 0.1 ms after it starts when the previous one was just before, and 1.6-2.3 ms after
(p90 3-4.5 ms) when it slept 50-200 ms (`python bench/wake_latency.py`). Waking the
workers at the start of a run does not help: a run's first split usually comes within
that time.

One pool per thread count is shared by every session of the process. A run enters it
with `run_scope(threads)`; kernels call `parallel_for(n, fn)`, which runs `fn(i)` for
`i in range(n)` on the pool of the run in progress on this thread, or inline when there
is none, when it has one thread, or when another run is using it (two runs in two threads
at once each keep one core busy instead of fighting over the same workers). Chunks that
call `parallel_for` themselves run their inner loop inline.
"""

from __future__ import annotations

import itertools
import os
import threading
import time
from collections.abc import Callable

from onnxkiln.threads import blas_enter, blas_leave

__all__ = ["IntraOpPool", "active_threads", "parallel_for", "pool_for", "run_enter",
           "run_leave", "run_scope"]

_local = threading.local()  # .pool: the pool of the run in progress on this thread
BACKOFF_MIN_S = 0.005
BACKOFF_MAX_S = 1.0
MIN_RUNNING = 0.6
STALL_MIN_S = 300e-6
NO_HELP_MIN_S = 1e-3
"""A worker whose chunks of a dispatch of at least STALL_MIN_S ran at least STALL_MIN_S / 2
and got less than MIN_RUNNING of that time on a core (its CPU clock stands still while it
is descheduled; two busy processes on two cores leave it about half), or a dispatch of at
least NO_HELP_MIN_S that no worker joined, counts as stalled. On the quiet development VM
5-10% of workers' chunks fall under 0.9 (the GIL, cache misses), 1 in 500 under 0.6; one
dispatch in 60 of 0.3-1 ms ends before the worker wakes."""


class _Job:
    """One parallel_for call: chunks 0..n-1 claimed through `claim`, counted by `finish`."""

    __slots__ = ("claim", "done", "error", "finish", "fn", "n", "worker")

    def __init__(self, fn: Callable[[int], object], n: int) -> None:
        self.fn = fn
        self.n = n
        self.claim = itertools.count().__next__  # atomic under the GIL
        self.finish = itertools.count(1).__next__
        self.done = threading.Lock()
        self.done.acquire()  # released by whoever finishes the last chunk
        self.error: BaseException | None = None
        self.worker: list[tuple[float, float]] = []  # (CPU, wall) seconds of workers' chunks


def _work(job: _Job, worker: bool = False) -> None:
    claim, n, fn = job.claim, job.n, job.fn
    while True:
        i = claim()
        if i >= n:
            return
        if worker:
            c0, w0 = _cpu(), _now()
        try:
            fn(i)
        except BaseException as e:  # re-raised in the caller
            job.error = e
        if worker:  # before finish(): the caller reads it after the last chunk
            job.worker.append((_cpu() - c0, _now() - w0))
        if job.finish() == n:
            job.done.release()


class _Worker:
    """A daemon thread asleep on its own lock until the pool hands it a job."""

    def __init__(self, pool: IntraOpPool, index: int) -> None:
        self.wake = threading.Lock()
        self.wake.acquire()
        self.thread = threading.Thread(target=self._loop, args=(pool,), daemon=True,
                                       name=f"onnxkiln-intra-op-{pool.threads}-{index}")
        self.thread.start()

    def _loop(self, pool: IntraOpPool) -> None:
        wake = self.wake
        while True:
            wake.acquire()
            job = pool.job
            if job is None:  # the pool was shut down
                return
            _work(job, worker=True)


class IntraOpPool:
    """`threads - 1` workers plus the caller; workers start on first use."""

    def __init__(self, threads: int) -> None:
        if threads < 1:
            raise ValueError(f"a pool needs at least one thread, got {threads}")
        self.threads = threads
        self.job: _Job | None = None
        self._workers: list[_Worker] = []
        self._busy = threading.Lock()  # held by the one run dispatching on this pool
        self.dispatched = 0  # parallel_for calls that used the workers (for tests and traces)
        self.inline = 0  # calls run inline because the pool was busy or backing off
        self.stalls = 0  # dispatches where the workers did not keep up
        self._resume_at = 0.0  # perf_counter() before which calls run inline (backing off)
        self._backoff = BACKOFF_MIN_S

    def parallel_for(self, n: int, fn: Callable[[int], object]) -> None:
        """Run fn(i) for every i in range(n), split across the pool; re-raises a chunk's
        exception after every chunk has finished."""
        if (n <= 1 or self.threads == 1 or (self._resume_at and _now() < self._resume_at)
                or not self._busy.acquire(blocking=False)):
            if n > 1 and self.threads > 1:
                self.inline += 1
            for i in range(n):
                fn(i)
            return
        try:
            if not self._workers:
                self._workers = [_Worker(self, i) for i in range(self.threads - 1)]
            job = self.job = _Job(fn, n)
            start = _now()
            for worker in self._workers[: n - 1]:
                if worker.wake.locked():  # else a wake is still pending: it will see this job
                    worker.wake.release()
            _work(job)
            job.done.acquire()  # chunks other threads claimed
            self._observe(job.worker, _now() - start)
            self.dispatched += 1
        finally:
            self._busy.release()
        if job.error is not None:
            raise job.error

    def _observe(self, worker: list[tuple[float, float]], wall: float) -> None:
        """Back off (run inline for a while) after a dispatch whose workers were preempted
        (module doc); one whose workers ran resets it."""
        if wall < STALL_MIN_S or (not worker and wall < NO_HELP_MIN_S):
            return
        cpu, ran = sum(c for c, _ in worker), sum(w for _, w in worker)
        if worker and ran < STALL_MIN_S / 2:
            return  # the worker joined late for a short share: says nothing
        if worker and cpu >= MIN_RUNNING * ran:
            self._backoff = BACKOFF_MIN_S
            self._resume_at = 0.0
            return
        self.stalls += 1
        self._resume_at = _now() + self._backoff
        self._backoff = min(2 * self._backoff, BACKOFF_MAX_S)

    def shutdown(self) -> None:
        """Stop the workers (they are daemons; this is for forks and tests)."""
        with self._busy:
            self.job = None
            workers, self._workers = self._workers, []
            for worker in workers:
                if worker.wake.locked():
                    worker.wake.release()
            for worker in workers:
                worker.thread.join(timeout=5)


_now = time.perf_counter
_cpu = time.thread_time  # this thread's CPU time: a descheduled thread's clock stands still
_pools: dict[int, IntraOpPool] = {}
_pools_lock = threading.Lock()


def pool_for(threads: int) -> IntraOpPool:
    """The process-wide pool of this many threads."""
    pool = _pools.get(threads)
    if pool is None:
        with _pools_lock:
            pool = _pools.setdefault(threads, IntraOpPool(threads))
    return pool


def _after_fork() -> None:
    """Threads do not survive fork: the child starts with fresh, empty pools."""
    global _pools_lock
    _pools.clear()
    _pools_lock = threading.Lock()
    _local.__dict__.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork)


def parallel_for(n: int, fn: Callable[[int], object]) -> None:
    """fn(i) for i in range(n) on the pool of this thread's run (inline without one)."""
    pool = getattr(_local, "pool", None)
    if pool is None or n <= 1:
        for i in range(n):
            fn(i)
        return
    _local.pool = None  # chunks that split again run their inner loop inline
    try:
        pool.parallel_for(n, fn)
    finally:
        _local.pool = pool


def active_threads() -> int:
    """Threads the run in progress on this thread may use (1 outside a run)."""
    pool = getattr(_local, "pool", None)
    return 1 if pool is None else pool.threads


def run_enter(threads: int) -> IntraOpPool | None:
    """Start a run on this thread with `threads` intra-op threads: BLAS goes single-threaded
    (onnxkiln splits work itself) and parallel_for uses the shared pool. Returns the
    previous pool, for run_leave."""
    previous = getattr(_local, "pool", None)
    blas_enter()
    _local.pool = pool_for(threads) if threads > 1 else None
    return previous


def run_leave(previous: IntraOpPool | None) -> None:
    """End the run begun by the matching run_enter."""
    _local.pool = previous
    blas_leave()


class run_scope:
    """`with run_scope(threads):` around a run (run_enter / run_leave)."""

    __slots__ = ("_previous", "_threads")

    def __init__(self, threads: int) -> None:
        self._threads = threads

    def __enter__(self) -> None:
        self._previous = run_enter(self._threads)

    def __exit__(self, *exc: object) -> None:
        run_leave(self._previous)
