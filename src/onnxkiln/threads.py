"""Intra-op thread control for BLAS through threadpoolctl."""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator

__all__ = ["thread_limit"]


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
