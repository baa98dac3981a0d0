"""One session run from many threads gives exactly the single-thread results.

Each thread runs its own feeds (different values and, for resnet and bert, different
shapes, so shape-keyed kernel caches are filled concurrently) and compares every result
bit for bit with the result computed before the threads start. `scripts/stress.py` runs
the same check for longer.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from onnxkiln import InferenceSession, zoo
from onnxkiln.testing import make_model, tensor_info

THREADS = 8
ITERATIONS = 50


def _loop_model() -> onnx.ModelProto:
    """Loop (trip count from an input) accumulating x * i, plus an If on the sum's sign."""
    body = helper.make_graph(
        [helper.make_node("Identity", ["c"], ["c_out"]),
         helper.make_node("Cast", ["i"], ["fi"], to=TensorProto.FLOAT),
         helper.make_node("Mul", ["x", "fi"], ["xi"]),
         helper.make_node("Add", ["acc", "xi"], ["acc_out"])], "body",
        [helper.make_tensor_value_info("i", TensorProto.INT64, []),
         helper.make_tensor_value_info("c", TensorProto.BOOL, []),
         helper.make_tensor_value_info("acc", TensorProto.FLOAT, ["n"])],
        [helper.make_tensor_value_info("c_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info("acc_out", TensorProto.FLOAT, ["n"])])
    then = helper.make_graph([helper.make_node("Neg", ["total"], ["t"])], "then", [],
                             [tensor_info("t", np.float32, ["n"])])
    other = helper.make_graph([helper.make_node("Abs", ["total"], ["e"])], "else", [],
                              [tensor_info("e", np.float32, ["n"])])
    nodes = [
        helper.make_node("Mul", ["x", "zero"], ["start"]),
        helper.make_node("Loop", ["trips", "", "start"], ["total"], body=body),
        helper.make_node("ReduceSum", ["total"], ["s"], keepdims=0),
        helper.make_node("Greater", ["s", "zero"], ["positive"]),
        helper.make_node("If", ["positive"], ["y"], then_branch=then, else_branch=other),
    ]
    return make_model(nodes, [tensor_info("x", np.float32, ["n"]),
                              tensor_info("trips", np.int64, [])],
                      [tensor_info("y", np.float32, ["n"])], {"zero": np.float32(0)})


def feeds_for(name: str, model: onnx.ModelProto, k: int) -> dict[str, np.ndarray]:
    """Thread k's feeds; shapes vary with k where the model allows it."""
    if name == "loop":
        rng = np.random.default_rng(k)
        return {"x": rng.standard_normal(3 + k % 4).astype(np.float32),
                "trips": np.array(5 + k, np.int64)}
    if name == "resnet":
        return zoo.random_inputs(model, seed=k, batch=1 + k % 3)
    if name == "bert":
        return zoo.random_inputs(model, seed=k, batch=1 + k % 2, seq=4 + 2 * (k % 3))
    return zoo.random_inputs(model, seed=k)


MODELS: dict[str, Callable[[], onnx.ModelProto]] = {
    "mlp": zoo.mlp,
    "resnet": zoo.resnet,
    "bert": lambda: zoo.bert_encoder(layers=1),
    "loop": _loop_model,
}


def _same(a: Any, b: Any) -> bool:
    return (a.dtype == b.dtype and a.shape == b.shape
            and np.array_equal(a, b, equal_nan=a.dtype.kind in "fc"))


def hammer(session: InferenceSession, feeds: list[dict[str, np.ndarray]],
           expected: list[list[np.ndarray]], iterations: int,
           run: Callable[[InferenceSession, dict], list[np.ndarray]]) -> tuple[int, list[str]]:
    """Run feeds[k] on thread k `iterations` times; (runs done, mismatch descriptions)."""
    mismatches: list[str] = []
    done = [0] * len(feeds)
    barrier = threading.Barrier(len(feeds))

    def work(k: int) -> None:
        barrier.wait()
        for it in range(iterations):
            try:
                got = run(session, feeds[k])
            except Exception as e:
                mismatches.append(f"thread {k} iteration {it}: {type(e).__name__}: {e}")
                return
            for j, (a, b) in enumerate(zip(got, expected[k])):
                if not _same(a, b):
                    mismatches.append(f"thread {k} iteration {it}: output {j} differs")
            done[k] += 1

    threads = [threading.Thread(target=work, args=(k,)) for k in range(len(feeds))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sum(done), mismatches


RUNS: dict[str, Callable[[InferenceSession, dict], list[np.ndarray]]] = {
    "plain": lambda s, f: s.run(f),
    "cancellable": lambda s, f: s.run(f, cancel=threading.Event()),
}


@pytest.mark.parametrize("variant", sorted(RUNS))
@pytest.mark.parametrize("name", sorted(MODELS))
def test_threads_give_the_single_thread_results(name, variant):
    model = MODELS[name]()
    session = InferenceSession.builder().device("cpu").from_graph(model)
    feeds = [feeds_for(name, model, k) for k in range(THREADS)]
    expected = [session.run(f) for f in feeds]
    done, mismatches = hammer(session, feeds, expected, ITERATIONS, RUNS[variant])
    assert mismatches == []
    assert done == THREADS * ITERATIONS


def test_threads_with_memory_limit_and_tracing():
    """The hooked paths (memory accounting, tracing) keep per-run state per thread."""
    from onnxkiln.trace import TraceContext

    model = zoo.bert_encoder(layers=1)
    ctx = TraceContext.in_memory()
    session = (InferenceSession.builder().device("cpu").memory_limit(1 << 30).trace(ctx)
               .from_graph(model))
    feeds = [feeds_for("bert", model, k) for k in range(THREADS)]
    plain = InferenceSession.builder().device("cpu").from_graph(model)
    expected = [plain.run(f) for f in feeds]
    done, mismatches = hammer(session, feeds, expected, 10, RUNS["plain"])
    assert mismatches == []
    assert done == THREADS * 10
    runs = [s for s in ctx.spans if s.category == "session"]
    assert len(runs) == THREADS * 10


def test_fresh_session_first_runs_race_safely():
    """Many threads making the first runs of new signatures (cache misses) at once."""
    model = zoo.resnet()
    feeds = [feeds_for("resnet", model, k) for k in range(THREADS)]
    expected = [InferenceSession.from_graph(model).run(f) for f in feeds]
    session = InferenceSession.builder().device("cpu").from_graph(model)
    done, mismatches = hammer(session, feeds, expected, 3, RUNS["plain"])
    assert done == THREADS * 3
    assert mismatches == []
    assert session.cache_stats().entries == 3  # batch sizes 1, 2, 3
