"""Optional numba kernels (the `fast` extra): the switch, and loading on first use.

Kernels call `lazy(name, dtype)` in their factory (while a session is built): a `Lazy`
handle, or None when numba is off (the kernel then keeps its plain-numpy path). Nothing is
imported then; the handle compiles the kernel with explicit signatures on the first run
that needs it, and `cache=True` keeps the machine code on disk (next to the module, or
under NUMBA_CACHE_DIR, or numba's per-user cache when the package is read-only; without any
writable place it compiles in memory), so after the first process that first use is a
disk-cache read. `load(name, dtype)` compiles (or reads the cache) at once.

numba is off when it is not installed, when the environment sets ONNXKILN_NO_NUMBA=1, or
when `ENABLED` is False (tests run both paths). The switch is read at plan time: sessions
built before a change keep the kernels they were built with.
"""

from __future__ import annotations

import importlib.util
import os
import threading
import time
from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np

__all__ = ["ENABLED", "Lazy", "disabled_reason", "lazy", "load", "register", "stats"]

ENABLED = True
ENV = "ONNXKILN_NO_NUMBA"
_F32 = np.dtype(np.float32)
_F64 = np.dtype(np.float64)

_lock = threading.Lock()
_compiled: dict[tuple[str, np.dtype], Callable[..., Any]] = {}
_installed: bool | None = None
_no_scipy: bool | None = None
_import_error: str | None = None  # numba is installed but does not import (numpy too new...)
_stats = {"compiled": 0, "seconds": 0.0, "cache": None}


class _External(NamedTuple):
    """A kernel whose body lives in another jit module (imported only when compiled)."""

    module: str
    signature: Callable[[np.dtype], Any]
    dtypes: tuple[np.dtype, ...]
    fastmath: Any


_external: dict[str, _External] = {}


def register(name: str, module: str, signature: Callable[[np.dtype], Any],
             dtypes: tuple[Any, ...], fastmath: Any = False) -> None:
    """Declare kernel `name`: function `name` of jit module `module` (a dotted path, imported
    when the kernel is first loaded), compiled with `signature(dtype)` (a numba signature,
    built lazily) for each of `dtypes`. fastmath False keeps IEEE order (exact sums)."""
    _external[name] = _External(module, signature, tuple(np.dtype(d) for d in dtypes),
                                fastmath)


def _is_installed() -> bool:
    global _installed
    if _installed is None:
        _installed = importlib.util.find_spec("numba") is not None
    return _installed


def _scipy_missing() -> bool:
    """numba's np.dot (the recurrent and GEMV kernels) calls scipy's BLAS."""
    global _no_scipy
    if _no_scipy is None:
        _no_scipy = importlib.util.find_spec("scipy") is None
    return _no_scipy


def disabled_reason() -> str | None:
    """None when the numba kernels are in use, else why not (for trace variant reasons)."""
    if not ENABLED:
        return "numba kernels switched off (onnxkiln.providers.cpu._numba.ENABLED = False)"
    if os.environ.get(ENV, "").strip() not in ("", "0"):
        return f"numba kernels switched off by {ENV}=1"
    if not _is_installed():
        return "numba is not installed (pip install onnxkiln[fast])"
    if _scipy_missing():
        return "scipy is not installed, and numba's np.dot needs it (pip install onnxkiln[fast])"
    if _import_error is not None:
        return f"numba does not import: {_import_error}"
    return None


def stats() -> dict[str, Any]:
    """How many kernels were compiled or loaded from the disk cache, and the seconds spent."""
    return dict(_stats)


def _signature(name: str, dt: np.dtype):
    from numba import types

    f = types.float32 if dt == _F32 else types.float64

    def arr(nd: int, ro: bool = True):
        return types.Array(f, nd, "C", readonly=ro)

    i64 = types.int64
    if name == "softmax_rows":
        return (arr(2), arr(2, False), i64)
    if name == "gelu":
        return (arr(2), arr(1), i64, arr(2, False), i64)
    if name == "norm_rows":
        return (arr(2), arr(2), arr(1), arr(1), arr(1), types.UniTuple(i64, 5), types.float64,
                arr(2, False), arr(2, False), arr(1, False), arr(1, False))
    if name == "conv2d":
        return (arr(4), arr(4), arr(1), types.UniTuple(i64, 7), arr(4, False))
    raise KeyError(name)


# Which dtypes each kernel has: the float32-only ones use float32 polynomial exp/erf forms.
_DTYPES = {
    "softmax_rows": (_F32,),
    "gelu": (_F32,),
    "norm_rows": (_F32, _F64),
    "conv2d": (_F32, _F64),
}


def _compile(name: str, dt: np.dtype) -> Callable[..., Any] | None:
    global _import_error
    ext = _external.get(name)
    try:
        import importlib

        import numba

        from onnxkiln.providers.cpu import _numba_jit

        module = importlib.import_module(ext.module) if ext else _numba_jit
    except ImportError as e:  # e.g. a numba release older than the installed numpy
        _import_error = str(e)
        return None

    fn = getattr(module, name)
    sig = ext.signature(dt) if ext else _signature(name, dt)
    fastmath = ext.fastmath if ext else _numba_jit.FASTMATH
    opts = {"nogil": True, "fastmath": fastmath, "error_model": "numpy"}
    try:
        return numba.njit([sig], cache=True, **opts)(fn)
    except RuntimeError as e:  # "cannot cache function ...: no locator available"
        if "cache" not in str(e):
            raise
        _stats["cache"] = f"no writable cache location: compiled in memory ({e})"
        return numba.njit([sig], **opts)(fn)
    finally:
        if _numba_jit.NO_CACHE and _stats["cache"] is None:
            _stats["cache"] = f"no writable cache location: compiled in memory " \
                              f"({_numba_jit.NO_CACHE[0]})"


def _dtypes(name: str) -> tuple[np.dtype, ...]:
    ext = _external.get(name)
    return ext.dtypes if ext else _DTYPES[name]


def supports(name: str, dtype: Any) -> bool:
    """Whether kernel `name` has a numba version for `dtype`."""
    return np.dtype(dtype) in _dtypes(name)


def load(name: str, dtype: Any = _F32) -> Callable[..., Any] | None:
    """The compiled kernel `name` for dtype, compiled (or loaded from the disk cache) now;
    None when numba is off or the kernel has no version for dtype."""
    if disabled_reason() is not None:
        return None
    dt = np.dtype(dtype)
    if dt not in _dtypes(name):
        return None
    return _get(name, dt)


def lazy(name: str, dtype: Any = _F32) -> Lazy | None:
    """A handle on kernel `name` for dtype that loads it on first use (see Lazy); None when
    numba is off or the kernel has no version for dtype. Imports nothing: kernel factories
    call it while a session is built."""
    if disabled_reason() is not None:
        return None
    dt = np.dtype(dtype)
    if dt not in _dtypes(name):
        return None
    return Lazy(name, dt)


_UNLOADED: Any = object()


def direct(fn: Callable[..., Any]) -> Callable[..., Any]:
    """The compiled entry point of a kernel compiled for one signature, which skips numba's
    per-call argument type resolution (0.2-0.3 us a call); `fn` itself otherwise. Only for
    calls whose arguments are built to the signature: the entry point does not check them."""
    overloads = getattr(fn, "overloads", None)
    if overloads is not None and len(overloads) == 1:
        return getattr(next(iter(overloads.values())), "entry_point", fn)
    return fn


class Lazy:
    """A numba kernel loaded (compiled, or read from the disk cache) the first time a run
    needs it, so that building a session never imports numba.

    Kernels call `ready()` where they choose their path: it loads the kernel once and says
    whether `fn` (the compiled function) is usable; False when numba turned out not to
    import, `reason` then says why and the kernel keeps its numpy path.
    """

    __slots__ = ("dtype", "fn", "name")

    def __init__(self, name: str, dtype: np.dtype) -> None:
        self.name = name
        self.dtype = dtype
        self.fn: Callable[..., Any] | None = _UNLOADED

    def ready(self) -> bool:
        """Load the kernel if not yet done; whether it is usable."""
        if self.fn is _UNLOADED:
            self.fn = _get(self.name, self.dtype)
        return self.fn is not None

    @property
    def reason(self) -> str | None:
        """Why the kernel is not usable once loading failed, else None."""
        if self.fn is None:
            return f"numba does not import: {_import_error}"
        return None

    def __repr__(self) -> str:
        state = "unloaded" if self.fn is _UNLOADED else ("failed" if self.fn is None
                                                         else "loaded")
        return f"<numba kernel {self.name} {self.dtype} ({state})>"


def _get(name: str, dt: np.dtype) -> Callable[..., Any] | None:
    """The compiled kernel from this process's table, compiled (or loaded from the disk
    cache) on first request; None when numba does not import. Does not read the switch:
    handles made while it was on keep working after it is turned off."""
    key = (name, dt)
    fn = _compiled.get(key)
    if fn is None:
        with _lock:
            fn = _compiled.get(key)
            if fn is None:
                start = time.perf_counter()
                fn = _compile(name, dt)
                if fn is None:
                    return None
                _compiled[key] = fn
                _stats["compiled"] += 1
                _stats["seconds"] += time.perf_counter() - start
    return fn


# ------------------------------------------------------------------ calling conventions
# The kernels take C-contiguous arrays of one dtype; these wrappers make them so and
# allocate the outputs.


def softmax_rows(fn: Callable[..., Any], x2: np.ndarray, log: bool) -> np.ndarray:
    """Softmax (or log-softmax) of each row of a 2-D float32 array; a fresh result."""
    x2 = np.ascontiguousarray(x2)
    y = np.empty(x2.shape, x2.dtype)
    fn(x2, y, int(log))
    return y


def norm_rows(
    fn: Callable[..., Any], x2: np.ndarray, gamma: np.ndarray, beta: np.ndarray | None,
    eps: float, simplified: bool, skip: np.ndarray | None = None,
    bias: np.ndarray | None = None, want_total: bool = False,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray | None]:
    """(Skip)LayerNorm/RMSNorm over the rows of 2-D x2, all operands in x2's dtype:
    (y, mean, inv_std, x + skip + bias or None). skip is (k, n) and repeats every k rows."""
    dt = x2.dtype
    x2 = np.ascontiguousarray(x2)
    rows, n = x2.shape
    g = np.ascontiguousarray(gamma, dtype=dt).reshape(n)
    be = g if beta is None else np.ascontiguousarray(beta, dtype=dt).reshape(n)
    bi = g if bias is None else np.ascontiguousarray(bias, dtype=dt).reshape(n)
    sk = x2 if skip is None else np.ascontiguousarray(skip, dtype=dt).reshape(-1, n)
    y = np.empty((rows, n), dt)
    total = np.empty((rows, n), dt) if want_total else y
    mean = np.empty(rows, dt)
    inv = np.empty(rows, dt)
    flags = (int(skip is not None), int(bias is not None), int(beta is not None),
             int(simplified), int(want_total))
    fn(x2, sk, bi, g, be, flags, float(eps), y, total, mean, inv)
    return y, mean, inv, (total if want_total else None)
