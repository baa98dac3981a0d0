"""Per-op gap against onnxruntime: where a model's time goes, op by op.

    python bench/op_gap.py model.onnx [--dim batch=1 --dim seq=16] [--threads 1] [--top 25]

Runs the model once in onnxkiln (its specialised plan, after two runs) recording every
step's inputs, then times each step's kernel alone and the same node alone in
onnxruntime (a one-node model fed the recorded inputs; onnxruntime's fixed cost per
`run`, measured on an Identity model, is subtracted). Steps of onnxkiln's own fused ops
(domain "onnxkiln") have no onnxruntime counterpart and are reported without one.
Sums per op type, worst first by the time onnxkiln spends beyond onnxruntime. A
development tool: the whole-model numbers are `python -m bench`'s.
"""

from __future__ import annotations

import argparse
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnx_ir as ir
from onnx import helper

import onnxkiln as ok
from onnxkiln.pool import run_enter, run_leave


def feeds_for(session: ok.InferenceSession, dims: dict[str, int], rng) -> dict[str, Any]:
    """Random inputs: named dims from `dims` (default 1 for batch-like names, else 16)."""
    feeds = {}
    for meta in session.inputs():
        shape = [d if isinstance(d, int) else dims.get(str(d), 1 if "batch" in str(d) else 16)
                 for d in (meta.shape or ())]
        dt = ok.dtypes.to_numpy(meta.dtype)
        if dt.kind in "iu":
            feeds[meta.name] = rng.integers(0, 16, shape).astype(dt)
        elif dt.kind == "b":
            feeds[meta.name] = np.ones(shape, dt)
        else:
            feeds[meta.name] = rng.standard_normal(shape).astype(dt)
    return feeds


class _Recorder:
    def __init__(self, plan) -> None:
        self.plan, self.seen = plan, []

    def sizing(self, index: int, ins: tuple) -> None:
        pass

    def start(self, index: int) -> int:
        return index

    def finish(self, index: int, ins: tuple, outs: tuple) -> None:
        self.seen.append((index, tuple(v.copy() if isinstance(v, np.ndarray) else v
                                       for v in ins)))


def best_us(fn, budget_s: float = 0.05) -> float:
    fn()
    n, start = 0, time.perf_counter()
    best = float("inf")
    while time.perf_counter() - start < budget_s or n < 5:
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
        n += 1
    return best * 1e6


def _ort_node_time(ort, node, ins, opsets, threads: int, fixed_us: float) -> float | None:
    names = [f"in{i}" for i in range(len(ins))]
    inputs, feeds = [], {}
    for name, v in zip(names, ins):
        if v is None or not isinstance(v, np.ndarray):
            continue
        inputs.append(helper.make_tensor_value_info(
            name, helper.np_dtype_to_tensor_dtype(v.dtype), list(v.shape)))
        feeds[name] = v
    node_inputs = [n if isinstance(v, np.ndarray) else "" for n, v in zip(names, ins)]
    outs = [f"out{i}" if o else "" for i, o in enumerate(node.output)]
    one = helper.make_node(node.op_type, node_inputs, outs, domain=node.domain)
    one.attribute.extend(node.attribute)
    graph = helper.make_graph([one], "one", inputs, [helper.make_value_info(o, onnx.TypeProto())
                                                      for o in outs if o])
    model = helper.make_model(graph, opset_imports=opsets)
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    try:
        s = ort.InferenceSession(model.SerializeToString(), so,
                                 providers=["CPUExecutionProvider"])
        return max(best_us(lambda: s.run(None, feeds)) - fixed_us, 0.0)
    except Exception:
        return None


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("model", type=Path)
    p.add_argument("--dim", action="append", default=[], help="NAME=SIZE for a named dim")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--top", type=int, default=25)
    args = p.parse_args(argv)
    import onnxruntime as ort

    dims = {k: int(v) for k, v in (d.split("=") for d in args.dim)}
    session = ok.InferenceSession.builder().intra_op_threads(args.threads).load(args.model)
    feeds = feeds_for(session, dims, np.random.default_rng(0))
    for _ in range(3):
        session.run(feeds)
    values, signature = session._validator.bind(feeds)
    entry = session._cache.get(signature)
    compiled = entry.compiled or session._compiled
    recorder = _Recorder(compiled.plan)
    previous = run_enter(args.threads)
    try:
        compiled.hooked(values, recorder)
        graph = onnx.load(str(args.model), load_external_data=False)
        opsets = [*graph.opset_import, helper.make_opsetid("com.microsoft", 1)]
        ident = helper.make_model(helper.make_graph(
            [helper.make_node("Identity", ["x"], ["y"])], "id",
            [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1])],
            [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1])]))
        s_id = ort.InferenceSession(ident.SerializeToString(), providers=["CPUExecutionProvider"])
        fixed = best_us(lambda: s_id.run(None, {"x": np.ones(1, np.float32)}))
        nodes = session.graph()
        rows: dict[str, list[float]] = defaultdict(lambda: [0, 0.0, 0.0, 0])
        for index, ins in recorder.seen:
            step = compiled.plan.steps[index]
            kiln = best_us(lambda step=step, ins=ins: step.kernel(*ins))
            key = f"{step.domain + '::' if step.domain else ''}{step.op_type}"
            row = rows[key]
            row[0] += 1
            row[1] += kiln
            ir_node = nodes.node(step.node_id) if step.node_id >= 0 else None
            if ir_node is not None and step.domain != "onnxkiln":
                node = ir.serde.serialize_node(ir_node)
                t = _ort_node_time(ort, node, ins, opsets, args.threads, fixed)
                if t is not None:
                    row[2] += t
                    row[3] += 1
    finally:
        run_leave(previous)
    total_k = sum(r[1] for r in rows.values())
    print(f"{args.model.name}: {len(recorder.seen)} steps, kernels alone {total_k:.0f} us; "
          f"onnxruntime per-run fixed cost subtracted: {fixed:.1f} us")
    print(f"{'op':40s} {'n':>4s} {'kiln us':>9s} {'ort us':>9s} {'kiln-ort':>9s}")
    order = sorted(rows.items(), key=lambda kv: -(kv[1][1] - kv[1][2]))
    for key, (n, k, o, matched) in order[: args.top]:
        ort_s = f"{o:9.1f}" if matched else "        -"
        print(f"{key:40s} {n:4d} {k:9.1f} {ort_s} {k - o:9.1f}")


if __name__ == "__main__":
    main()
