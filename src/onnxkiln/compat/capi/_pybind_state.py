"""`onnxruntime.capi._pybind_state` over onnxkiln: the same names as
`onnxruntime_pybind11_state` (onnxruntime's module re-exports that one too)."""

from __future__ import annotations

from onnxkiln.compat.capi.onnxruntime_pybind11_state import *  # noqa: F403
from onnxkiln.compat.capi.onnxruntime_pybind11_state import __all__  # noqa: F401
