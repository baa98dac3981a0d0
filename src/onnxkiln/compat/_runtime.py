"""onnxruntime's module-level functions that describe or configure the runtime."""

from __future__ import annotations

import warnings

from onnxkiln import __version__ as kiln_version
from onnxkiln.errors import InvalidOptionError

__all__ = [
    "ORT_API_VERSION",
    "create_and_register_allocator",
    "create_and_register_allocator_v2",
    "disable_telemetry_events",
    "enable_telemetry_events",
    "get_build_info",
    "get_version_string",
    "has_collective_ops",
    "preload_dlls",
    "set_global_thread_pool_sizes",
    "set_seed",
]

# the onnxruntime release whose Python API onnxkiln.compat follows; programs compare
# `onnxruntime.__version__` against release numbers, so it is reported as that
ORT_API_VERSION = "1.32.0"


def get_version_string() -> str:
    """The onnxruntime version whose API this is (`__version__`)."""
    return ORT_API_VERSION


def get_build_info() -> str:
    """A line naming onnxkiln and its version, in onnxruntime's "Build Info" form."""
    return (f"onnxkiln {kiln_version} Build Info: onnxruntime API {ORT_API_VERSION}, "
            "build type=Python")


def set_seed(seed: int) -> None:
    """Seed the random ops (RandomNormal, RandomUniform, Bernoulli, Multinomial...) that have
    no `seed` attribute, in sessions built afterwards: the same seed gives the same draws."""
    from onnxkiln.ops import random

    if isinstance(seed, bool) or not isinstance(seed, int):
        raise InvalidOptionError(f"set_seed takes an int, got {seed!r}")
    random.set_default_seed(seed)


def enable_telemetry_events() -> None:
    """Accepted for compatibility: onnxkiln sends no telemetry."""


def disable_telemetry_events() -> None:
    """Accepted for compatibility: onnxkiln sends no telemetry."""


def preload_dlls(cuda: bool = True, cudnn: bool = True, msvc: bool = True,
                 directory: str | None = None) -> None:
    """Does nothing: onnxkiln loads no CUDA or MSVC libraries of its own (its CUDA provider
    runs on torch, which loads them). A `directory` is ignored with a warning."""
    if directory:
        warnings.warn(f"preload_dlls(directory={directory!r}): onnxkiln loads no DLLs; ignored",
                      stacklevel=2)


def set_global_thread_pool_sizes(intra_op_num_threads: int = 0,
                                 inter_op_num_threads: int = 0) -> None:
    """Accepted and ignored: onnxkiln sessions have their own threads
    (SessionOptions.intra_op_num_threads)."""


def create_and_register_allocator(*args: object, **kwargs: object) -> None:
    """Accepted and ignored: onnxkiln has no shared arena allocators."""


def create_and_register_allocator_v2(*args: object, **kwargs: object) -> None:
    """Accepted and ignored: onnxkiln has no shared arena allocators."""


def has_collective_ops() -> bool:
    """False: onnxkiln has no collective (multi-device) ops."""
    return False
