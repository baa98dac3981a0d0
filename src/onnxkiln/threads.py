"""Intra-op thread control for BLAS through threadpoolctl."""

from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import Iterator
from pathlib import Path

__all__ = ["default_threads", "physical_cores", "thread_limit"]


@functools.cache
def _controller():
    from threadpoolctl import ThreadpoolController

    return ThreadpoolController()


@contextlib.contextmanager
def thread_limit(n: int | None) -> Iterator[None]:
    """Limit BLAS to n threads inside the block; None leaves BLAS alone."""
    if n is None:
        yield
        return
    with _controller().limit(limits=n, user_api="blas"):
        yield


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


@functools.cache
def default_threads() -> int | None:
    """The BLAS thread limit a session applies when intra_op_threads is not set: the
    physical cores, or None when BLAS already uses that many (no per-run limit needed)."""
    wanted = physical_cores()
    current = [p["num_threads"] for p in _controller().info() if p["user_api"] == "blas"]
    return None if all(n == wanted for n in current) else wanted
