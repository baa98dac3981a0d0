"""Peak memory of one engine on one model, measured in a fresh process (run by the suite).

    python -m bench.memprobe ENGINE MODEL.onnx FEEDS.npz --threads N --runs R [--cap S]

Method (Linux): after imports and reading the feeds, record the resident set (VmRSS) as the
baseline and reset the high-water mark (writing 5 to /proc/self/clear_refs resets VmHWM).
Create the session from the model file, record VmRSS and VmHWM ("load"), reset the mark
again, run R times, record VmHWM ("run"). Printed as one JSON line, in bytes:
  resident_after_load = VmRSS after load - baseline          (weights and plans kept)
  peak = max(load VmHWM, run VmHWM) - baseline                (what the engine needed at most)
  run_growth = run VmHWM - VmRSS after load                   (activations and workspaces)
Where clear_refs cannot be written, ru_maxrss (never reset) stands in for VmHWM, and
run_growth is then a lower bound.
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import time
from pathlib import Path

from bench._timing import Timeout, deadline

ENGINES = ("onnxkiln", "onnxruntime", "reference")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.memprobe")
    parser.add_argument("engine", choices=ENGINES)
    parser.add_argument("model")
    parser.add_argument("feeds")
    parser.add_argument("--threads", type=int, required=True)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--cap", type=float, default=0.0, help="seconds; 0 = no cap")
    args = parser.parse_args(argv)

    import numpy as np
    import onnxruntime  # noqa: F401  (every probe imports all engines: same baseline)
    from onnx.reference import ReferenceEvaluator  # noqa: F401
    from threadpoolctl import threadpool_limits

    from onnxkiln import InferenceSession  # noqa: F401

    with np.load(args.feeds) as data:
        feeds = {k: data[k] for k in data.files}
    _warm_imports(args.threads)
    resettable = _reset_peak()
    base = _status("VmRSS")
    start = time.perf_counter()
    run = _make(args.engine, args.model, args.threads)
    load_s = time.perf_counter() - start
    after_load, load_hwm = _status("VmRSS"), _peak()
    _reset_peak()
    timed_out = False
    with threadpool_limits(args.threads, user_api="blas"):
        try:
            with deadline(args.cap):
                for _ in range(args.runs):
                    run(feeds)
        except Timeout:
            timed_out = True
    run_hwm = _peak()
    result = {
        "engine": args.engine, "baseline": base, "resident_after_load": after_load - base,
        "peak": max(load_hwm, run_hwm) - base, "run_growth": max(0, run_hwm - after_load),
        "load_s": load_s, "runs": args.runs, "timed_out": timed_out, "hwm_reset": resettable,
    }
    print(json.dumps(result))
    return 0


def _warm_imports(threads: int) -> None:
    """Build and run a tiny Add -> Softmax model on every engine so lazy imports (numba's,
    which onnxkiln loads for its first compiled kernel) land in the baseline."""
    import numpy as np
    from onnx import TensorProto, helper

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])
    nodes = [helper.make_node("Add", ["x", "x"], ["s"]),
             helper.make_node("Softmax", ["s"], ["y"], axis=-1)]
    graph = helper.make_graph(nodes, "warm", [x], [y])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    data = model.SerializeToString()
    for engine in ENGINES:
        _make(engine, data, threads)({"x": np.ones((1, 4), np.float32)})


def _make(engine: str, path: str | bytes, threads: int):
    if engine == "onnxkiln":
        from onnxkiln import InferenceSession

        builder = InferenceSession.builder().optimization("all").intra_op_threads(threads)
        session = builder.load_bytes(path) if isinstance(path, bytes) else builder.load(path)
        return session.run
    if engine == "onnxruntime":
        import onnxruntime

        opts = onnxruntime.SessionOptions()
        opts.intra_op_num_threads = threads
        opts.log_severity_level = 3
        ort = onnxruntime.InferenceSession(path, opts, providers=["CPUExecutionProvider"])
        return lambda feeds: ort.run(None, feeds)
    import onnx
    from onnx.reference import ReferenceEvaluator

    ref = ReferenceEvaluator(onnx.load_from_string(path) if isinstance(path, bytes) else path)
    return lambda feeds: ref.run(None, feeds)


def _status(key: str) -> int:
    """A /proc/self/status field in bytes (VmRSS, VmHWM); ru_maxrss where there is no /proc."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _peak() -> int:
    return _status("VmHWM")


def _reset_peak() -> bool:
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


if __name__ == "__main__":
    sys.exit(main())
