"""`onnxruntime.capi.onnxruntime_inference_collection` over onnxkiln: the Python classes
onnxruntime defines there (`Session` is `InferenceSession`, its only kind here), and its
provider-argument helper."""

from __future__ import annotations

from onnxkiln.compat import InferenceSession, IOBinding, OrtDevice, OrtDeviceVendorId, OrtValue
from onnxkiln.compat._providers import check_and_normalize_provider_args

Session = InferenceSession

__all__ = ["IOBinding", "InferenceSession", "OrtDevice", "OrtDeviceVendorId", "OrtValue",
           "Session", "check_and_normalize_provider_args"]
