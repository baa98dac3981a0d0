"""`onnxruntime.capi.onnxruntime_inference_collection` over onnxkiln: the Python classes
onnxruntime defines there (`Session` is `InferenceSession`, its only kind here)."""

from __future__ import annotations

from onnxkiln.compat import InferenceSession, IOBinding, OrtDevice, OrtValue

Session = InferenceSession

__all__ = ["IOBinding", "InferenceSession", "OrtDevice", "OrtValue", "Session"]
