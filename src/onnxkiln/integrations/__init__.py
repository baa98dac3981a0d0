"""Bridges from onnxkiln to other engines; each needs its own optional extra.

- `onnxkiln.integrations.ray` (extra `ray`): batch inference on Ray Data and model
  serving over HTTP on Ray Serve.
"""
