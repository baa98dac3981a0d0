#!/usr/bin/env bash
# Run on a machine with internet, before scripts/gpu_check.sh goes to a GPU machine without:
# downloads the pure-Python and binary wheels onnxkiln needs beyond torch/numpy/onnx (which
# the GPU machine has) into .gpu_wheels/ (git-ignored; carry it with the checkout).
# Usage: bash scripts/gpu_wheels.sh [python-version, default 3.12]
set -euo pipefail
cd "$(dirname "$0")/.."
PYV=${1:-3.12}
PIP=${PIP:-.venv/bin/pip}
"$PIP" download -q --only-binary=:all: --no-deps --python-version "$PYV" --implementation cp \
    --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux_2_28_x86_64 -d .gpu_wheels \
    onnx-ir ml_dtypes threadpoolctl rich markdown-it-py mdurl pygments scipy \
    pytest iniconfig pluggy packaging typing_extensions
du -sh .gpu_wheels
