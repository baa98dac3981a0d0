"""How session creation grows with the node count, onnxkiln beside onnxruntime.

    python bench/creation_scale.py                         # 1k, 10k, 100k nodes
    python bench/creation_scale.py --sizes 1000,10000 --shapes fanin --timeout 120
    python bench/creation_scale.py --profile 10000 --shapes chain   # cProfile of one creation

Two shapes: `chain` is x -> Add(c) -> Add(c) -> ... n deep; `fanin` is n nodes Add(x, c_i)
all feeding one Sum. Each creation (load, optimize, plan) runs in this process from the
serialized model, both engines at 1 intra-op thread and all optimizations on; one run
follows and its values are checked against numpy. `growth` is the exponent k of
time ~ nodes^k between neighbouring sizes (1: linear). A creation past `--timeout` seconds
is reported as such and the larger sizes of that engine and shape are skipped.
"""

from __future__ import annotations

import argparse
import cProfile
import math
import pstats
import sys
import time
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # `python bench/creation_scale.py`
from bench._timing import Timeout, deadline

SHAPES = ("chain", "fanin")


def chain_model(n: int) -> onnx.ModelProto:
    """x -> Add(c) repeated n times -> y; x is [4] float32 and c holds 1.0."""
    nodes = [helper.make_node("Add", [f"t{i}" if i else "x", "c"], [f"t{i + 1}" if i + 1 < n
                                                                      else "y"])
             for i in range(n)]
    return _model(nodes, [numpy_helper.from_array(np.ones(4, np.float32), "c")])


def fanin_model(n: int) -> onnx.ModelProto:
    """n nodes Add(x, c_i) with c_i = i % 3, all summed by one Sum into y."""
    inits = [numpy_helper.from_array(np.full(4, i % 3, np.float32), f"c{i}") for i in range(n)]
    nodes = [helper.make_node("Add", ["x", f"c{i}"], [f"t{i}"]) for i in range(n)]
    nodes.append(helper.make_node("Sum", [f"t{i}" for i in range(n)], ["y"]))
    return _model(nodes, inits)


def _model(nodes: list[onnx.NodeProto], inits: list[onnx.TensorProto]) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "scale",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])],
                              inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def expected(shape: str, n: int, x: np.ndarray) -> np.ndarray:
    return x + n if shape == "chain" else n * x + sum(i % 3 for i in range(n))


def create(engine: str, data: bytes):  # either engine's session
    if engine == "onnxkiln":
        import onnxkiln

        return onnxkiln.InferenceSession.builder().intra_op_threads(1).load_bytes(data)
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    so.log_severity_level = 3
    return ort.InferenceSession(data, so, providers=["CPUExecutionProvider"])


def run(engine: str, session, x: np.ndarray) -> np.ndarray:
    if engine == "onnxkiln":
        return session.run({"x": x})[0]
    return session.run(None, {"x": x})[0]


def measure(engine: str, shape: str, n: int, timeout: float) -> float | None:
    """Creation seconds of one session (None: past the timeout); the run is value-checked."""
    data = (chain_model if shape == "chain" else fanin_model)(n).SerializeToString()
    x = np.arange(4, dtype=np.float32)
    try:
        with deadline(timeout):
            start = time.perf_counter()
            session = create(engine, data)
            seconds = time.perf_counter() - start
    except Exception as e:  # the deadline's Timeout, or an error a layer wrapped it in
        while e is not None and not isinstance(e, Timeout):
            e = e.__cause__
        if e is None:
            raise
        return None
    np.testing.assert_allclose(run(engine, session, x), expected(shape, n, x), rtol=1e-5)
    return seconds


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", default="1000,10000,100000")
    ap.add_argument("--shapes", default=",".join(SHAPES))
    ap.add_argument("--engines", default="onnxkiln,onnxruntime")
    ap.add_argument("--timeout", type=float, default=600.0)
    ap.add_argument("--profile", type=int, default=0, help="profile one onnxkiln creation")
    ap.add_argument("--sort", default="cumulative", help="the profile's order (pstats key)")
    args = ap.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    shapes = args.shapes.split(",")
    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10_000))
    if args.profile:
        data = (chain_model if shapes[0] == "chain" else fanin_model)(args.profile)
        with cProfile.Profile() as prof:
            create("onnxkiln", data.SerializeToString())
        pstats.Stats(prof).sort_stats(args.sort).print_stats(40)
        return 0
    create("onnxkiln", chain_model(10).SerializeToString())  # imports and first-use costs
    create("onnxruntime", chain_model(10).SerializeToString())
    print(f"{'shape':6} {'engine':12} " + " ".join(f"{n:>10}" for n in sizes) + "   growth")
    for shape in shapes:
        for engine in args.engines.split(","):
            times: list[float | None] = []
            for n in sizes:
                times.append(measure(engine, shape, n, args.timeout)
                             if not times or times[-1] is not None else None)
            cells = " ".join(f"{t:>9.2f}s" if t is not None else f"{'>' + str(args.timeout):>10}"
                             for t in times)
            growth = [f"{math.log(b / a) / math.log(m / n):.2f}"
                      for (a, n), (b, m) in zip(zip(times, sizes), zip(times[1:], sizes[1:]))
                      if a and b]
            print(f"{shape:6} {engine:12} {cells}   {' '.join(growth)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
