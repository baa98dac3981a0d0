"""onnxkiln's benchmark suite: `python -m bench` (or `onnxkiln bench --suite`).

Kept free of heavy imports: `python -m bench` must drop the OpenBLAS pins from its
environment (bench._env) before numpy is first imported.
"""
