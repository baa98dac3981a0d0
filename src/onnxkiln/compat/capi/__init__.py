"""`onnxruntime.capi` after `onnxkiln.compat.install()`: the modules below, over onnxkiln.

`_pybind_state` and `onnxruntime_pybind11_state` hold the options, values, enums, device
descriptors, module functions and onnxruntime's exception classes;
`onnxruntime_inference_collection` holds `InferenceSession`, `IOBinding`, `OrtValue` and
`OrtDevice`.
"""
