"""onnxkiln's intra-op pool (onnxkiln.pool) and the BLAS limit around runs (onnxkiln.threads)."""

from __future__ import annotations

import multiprocessing
import os
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from onnxkiln import pool, threads
from onnxkiln.pool import IntraOpPool, parallel_for, run_enter, run_leave


def test_every_chunk_runs_once_across_threads():
    p = IntraOpPool(2)
    ran: list[tuple[int, int]] = []
    p.parallel_for(16, lambda i: (time.sleep(0.005), ran.append((i, threading.get_ident()))))
    assert sorted(i for i, _ in ran) == list(range(16))
    assert len({t for _, t in ran}) == 2  # the caller and the worker both took chunks
    assert p.dispatched == 1
    p.shutdown()


def test_a_stalled_worker_delays_nothing_but_its_own_chunk():
    """The caller claims every chunk the worker does not: a descheduled worker (stalled
    here inside its first chunk) costs only the chunk it already holds."""
    p = IntraOpPool(2)
    caller = threading.get_ident()
    stall = threading.Event()
    done: list[tuple[int, bool, float]] = []

    def chunk(i: int) -> None:
        if threading.get_ident() != caller:
            stall.wait(5)
        else:
            time.sleep(0.002)
        done.append((i, threading.get_ident() == caller, time.perf_counter()))

    releaser = threading.Timer(0.3, stall.set)
    releaser.start()
    start = time.perf_counter()
    p.parallel_for(20, chunk)
    by_caller = [t for _, on_caller, t in done if on_caller]
    assert sorted(i for i, _, _ in done) == list(range(20))
    assert len(by_caller) == 19  # the worker held one chunk, the caller did the rest
    assert max(by_caller) - start < 0.25  # ... without waiting for the stalled worker
    releaser.join()
    p.shutdown()


def test_a_chunk_error_is_raised_after_all_chunks_and_the_pool_stays_usable():
    p = IntraOpPool(2)
    ran = []

    def chunk(i: int) -> None:
        ran.append(i)
        if i == 3:
            raise ValueError("chunk 3 failed")

    with pytest.raises(ValueError, match="chunk 3 failed"):
        p.parallel_for(8, chunk)
    assert sorted(ran) == list(range(8))
    out = []
    p.parallel_for(4, out.append)
    assert sorted(out) == [0, 1, 2, 3]
    p.shutdown()


def test_concurrent_callers_share_a_pool_and_the_second_runs_inline():
    p = IntraOpPool(2)
    results: dict[int, list[int]] = {}
    gate = threading.Barrier(2)

    def caller(k: int) -> None:
        got: list[int] = []
        gate.wait()
        for _ in range(20):
            p.parallel_for(6, lambda i: (got.append(i), time.sleep(0.0005)))
        results[k] = got

    ts = [threading.Thread(target=caller, args=(k,)) for k in range(2)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    for got in results.values():
        assert sorted(got) == sorted(list(range(6)) * 20)
    assert p.dispatched + p.inline == 40
    p.shutdown()


def test_parallel_for_runs_inline_outside_a_run_and_nests_inline():
    outside = []
    parallel_for(5, lambda i: outside.append(threading.get_ident()))
    assert set(outside) == {threading.get_ident()}
    previous = run_enter(2)
    try:
        assert pool.active_threads() == 2
        inner_threads: list[int] = []

        def outer(i: int) -> None:
            me = threading.get_ident()
            parallel_for(4, lambda j: inner_threads.append(me == threading.get_ident()))
            time.sleep(0.002)

        parallel_for(8, outer)
        assert len(inner_threads) == 32 and all(inner_threads)
    finally:
        run_leave(previous)
    assert pool.active_threads() == 1


def _utime_ticks(tid: int) -> int:
    fields = Path(f"/proc/self/task/{tid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])  # utime + stime


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc thread times")
def test_idle_workers_sleep_instead_of_spinning():
    p = IntraOpPool(3)
    p.parallel_for(4, lambda i: time.sleep(0.001))
    tids = [w.thread.native_id for w in p._workers]
    before = [_utime_ticks(t) for t in tids]
    time.sleep(0.5)
    after = [_utime_ticks(t) for t in tids]
    assert all(a - b <= 1 for a, b in zip(after, before))  # <= 10 ms of CPU in 500 ms idle
    p.shutdown()


def _child_runs_parallel_for(queue) -> None:
    previous = run_enter(2)
    try:
        got: list[int] = []
        parallel_for(6, lambda i: (got.append(i), time.sleep(0.001)))
        queue.put(sorted(got))
    finally:
        run_leave(previous)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_gets_fresh_pools():
    previous = run_enter(2)
    try:
        parallel_for(4, lambda i: time.sleep(0.001))  # the parent's workers exist now
    finally:
        run_leave(previous)
    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    child = ctx.Process(target=_child_runs_parallel_for, args=(queue,))
    child.start()
    got = queue.get(timeout=20)
    child.join(20)
    assert child.exitcode == 0 and got == list(range(6))


def test_blas_runs_single_threaded_inside_runs_and_is_restored_after():
    before = threads.blas_threads()
    assert before, "numpy's BLAS should be visible to threadpoolctl"
    threads.blas_enter()
    threads.blas_enter()  # a second, concurrent run
    assert all(n == 1 for n in threads.blas_threads().values())
    threads.blas_leave()
    assert all(n == 1 for n in threads.blas_threads().values())  # one run still going
    threads.blas_leave()
    assert threads.blas_threads() == before


def test_split_matmul_matches_the_single_call():
    """Column splits (what the GEMM kernels do) give one BLAS call's result: bit for bit on
    most BLAS builds, to rounding on some (OpenBLAS 0.3.31 on an AMD EPYC)."""
    rng = np.random.default_rng(0)
    a = rng.standard_normal((37, 129), dtype=np.float32)
    b = rng.standard_normal((129, 301), dtype=np.float32)
    y = np.empty((37, 301), np.float32)
    bounds = [0, 96, 192, 301]
    previous = run_enter(2)
    try:
        parallel_for(3, lambda i: np.matmul(a, b[:, bounds[i]:bounds[i + 1]],
                                            out=y[:, bounds[i]:bounds[i + 1]]))
    finally:
        run_leave(previous)
    np.testing.assert_allclose(y, a @ b, rtol=1e-5, atol=1e-5)


def test_a_pool_whose_workers_do_not_keep_up_runs_inline_for_a_while(monkeypatch):
    """A dispatch whose threads computed little for its wall time (simulated: the worker sits
    in its chunk, as a descheduled one would) makes the pool back off to the calling thread;
    once the backoff expires it splits again, and a dispatch that computes keeps it so."""
    monkeypatch.setattr(pool, "BACKOFF_MIN_S", 0.2)
    work = np.random.default_rng(0).standard_normal(400_000)
    p = IntraOpPool(2)
    caller = threading.get_ident()
    stall = threading.Event()

    def slow_worker(i: int) -> None:
        if threading.get_ident() != caller:
            stall.wait(5)
        else:
            time.sleep(0.002)  # the caller's chunks take long enough for the worker to join

    threading.Timer(0.1, stall.set).start()
    p.parallel_for(8, slow_worker)
    assert p.stalls == 1 and p.dispatched == 1
    where: list[int] = []
    p.parallel_for(8, lambda i: where.append(threading.get_ident()))
    assert set(where) == {caller} and p.inline == 1  # backing off: inline
    time.sleep(0.25)

    def compute(i: int) -> None:  # CPU work that releases the GIL
        for _ in range(3):
            np.exp(work)
        where.append(threading.get_ident())

    p.parallel_for(16, compute)
    assert p.dispatched == 2 and len(set(where)) == 2  # split again, and the worker helped
    assert p.stalls <= 2  # 1 from the stalled worker; a loaded machine may add one
    p.shutdown()
