"""The exported-model suite: real torch.onnx / skl2onnx exports (random seeded weights) and
a harness comparing onnxkiln with onnxruntime on them (`python -m bench --suite exported`)."""
