#!/usr/bin/env bash
# One command for a GPU machine (torch with CUDA preinstalled, no internet): the CUDA provider's
# tests on the GPU, then the decode benchmark (tokens/s with KV bindings, plain, torch eager)
# and the capture benchmark (eager, memo, captured replay vs torch eager and CUDA graph).
# Usage: bash scripts/gpu_check.sh [python]     (< 8 minutes on an H200)
set -uo pipefail
PY=${1:-python3}
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
"$PY" - <<'PYEOF'
import torch, numpy, onnx
print("torch", torch.__version__, "cuda", torch.version.cuda, "gpu",
      torch.cuda.get_device_name(0) if torch.cuda.is_available() else None)
print("numpy", numpy.__version__, "onnx", onnx.__version__)
raise SystemExit(0 if torch.cuda.is_available() else "no CUDA device visible to torch: nothing to check")
PYEOF
[ $? -eq 0 ] || exit 1
# what the GPU machine lacks comes from .gpu_wheels/ (bash scripts/gpu_wheels.sh, carried along)
missing=$("$PY" - <<'PYEOF'
import importlib.util
need = {"onnx_ir": "onnx-ir", "ml_dtypes": "ml_dtypes", "threadpoolctl": "threadpoolctl",
        "rich": "rich", "markdown_it": "markdown-it-py", "mdurl": "mdurl",
        "pygments": "pygments", "scipy": "scipy", "pytest": "pytest",
        "iniconfig": "iniconfig", "pluggy": "pluggy", "packaging": "packaging",
        "typing_extensions": "typing_extensions"}
print(" ".join(pkg for mod, pkg in need.items() if importlib.util.find_spec(mod) is None))
PYEOF
)
if [ -n "$missing" ]; then
    echo "installing from .gpu_wheels: $missing"
    "$PY" -m pip install -q --no-index --no-deps --find-links .gpu_wheels $missing || exit 1
fi
status=0
ONNXKILN_TORCH_TEST_DEVICE=cuda timeout 300 "$PY" -m pytest -q -p no:cacheprovider --maxfail=25 \
    -o addopts="" tests/test_cuda_gpu.py tests/test_bindings.py tests/test_placement.py \
    tests/test_capture.py tests/test_capture_safe.py tests/test_decode_memo.py \
    tests/test_bindings_attention.py tests/test_decode_growing.py tests/test_generate.py \
    tests/providers/cuda -rs || status=$?
ONNXKILN_TORCH_TEST_DEVICE=cuda timeout 120 "$PY" tests/providers/cuda/conformance_torch.py \
    || status=$?
timeout 150 "$PY" bench/decode.py --device cuda --past 16 64 256 1024 --tokens 20 || status=$?
timeout 60 "$PY" examples/decode_loop.py --device cuda --gpt2 --tokens 16 || status=$?
# device-graph capture: the small model as a smoke test, then GPT-2 small, 100 steps
timeout 60 "$PY" bench/capture.py --device cuda --small || status=$?
timeout 120 "$PY" bench/capture.py --device cuda --gpt2 --steps 100 || status=$?
# real exported decoders (the genai builder's graphs) when the machine can build them
if "$PY" -c "import onnxruntime_genai, transformers" 2>/dev/null; then
    timeout 240 "$PY" bench/decode_real.py --device cuda --models llama-fp32 gpt2-export \
        --modes ok-plain ok-bound ok-captured ok-generate --rounds 3 || status=$?
else
    echo "bench/decode_real.py skipped: onnxruntime-genai or transformers missing here"
fi
exit $status
