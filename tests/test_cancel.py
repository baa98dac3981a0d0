"""run(..., cancel=event): a set event stops a run at the next node or Loop iteration."""

from __future__ import annotations

import threading
import time

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from onnxkiln import (
    InferenceSession,
    InvalidInputError,
    InvalidOptionError,
    RunCancelledError,
    RunTimeoutError,
    SessionError,
)
from onnxkiln.testing import make_model, tensor_info
from onnxkiln.trace import TraceContext


def _endless_loop(with_body_nodes: bool = True) -> onnx.ModelProto:
    """A Loop with no trip count whose condition stays true: it only ends when cancelled."""
    body_nodes = [helper.make_node("Identity", ["c_in"], ["c_out"], name="keep_going")]
    if with_body_nodes:
        body_nodes.append(helper.make_node("Add", ["x_in", "one"], ["x_out"], name="inc"))
    else:
        body_nodes = []
    body = helper.make_graph(
        body_nodes, "body",
        [helper.make_tensor_value_info("i", TensorProto.INT64, []),
         helper.make_tensor_value_info("c_in", TensorProto.BOOL, []),
         helper.make_tensor_value_info("x_in", TensorProto.FLOAT, [4])],
        [helper.make_tensor_value_info("c_in" if not with_body_nodes else "c_out",
                                       TensorProto.BOOL, []),
         helper.make_tensor_value_info("x_in" if not with_body_nodes else "x_out",
                                       TensorProto.FLOAT, [4])],
    )
    loop = helper.make_node("Loop", ["", "cond", "x"], ["y"], name="forever", body=body)
    return make_model([loop], [tensor_info("x", np.float32, [4])],
                      [tensor_info("y", np.float32, [4])],
                      {"cond": np.array(True), "one": np.float32(1)})


def _chain(n: int = 100, size: int = 128) -> onnx.ModelProto:
    """n MatMul+Tanh nodes in a row: long enough that a run takes a while."""
    nodes, prev = [], "x"
    for i in range(n):
        nodes.append(helper.make_node("MatMul", [prev, "w"], [f"m{i}"], name=f"matmul_{i}"))
        nodes.append(helper.make_node("Tanh", [f"m{i}"], [f"t{i}"], name=f"tanh_{i}"))
        prev = f"t{i}"
    nodes.append(helper.make_node("Identity", [prev], ["y"], name="out"))
    w = np.random.default_rng(0).standard_normal((size, size)).astype(np.float32) / 16
    return make_model(nodes, [tensor_info("x", np.float32, [size, size])],
                      [tensor_info("y", np.float32, [size, size])], {"w": w})


X4 = np.zeros(4, np.float32)


def _cancel_after(seconds: float) -> threading.Event:
    event = threading.Event()
    timer = threading.Timer(seconds, event.set)
    timer.daemon = True
    timer.start()
    return event


@pytest.mark.parametrize("with_body_nodes", [True, False])
def test_cancel_stops_an_endless_loop_promptly(with_body_nodes):
    session = InferenceSession.from_graph(_endless_loop(with_body_nodes))
    event = _cancel_after(0.2)
    start = time.perf_counter()
    with pytest.raises(RunCancelledError, match="run cancelled .*cancel event was set") as info:
        session.run({"x": X4}, cancel=event)
    elapsed = time.perf_counter() - start
    assert elapsed < 5.0, f"took {elapsed:.2f}s to stop"
    assert isinstance(info.value, SessionError)
    assert info.value.graph == "forever.body"


def test_cancel_stops_a_long_straight_line_run_before_a_node():
    session = InferenceSession.from_graph(_chain())
    x = np.ones((128, 128), np.float32)
    session.run({"x": x})
    err = None
    for _ in range(10):  # a loaded machine may fire the timer after the run, or before it starts
        t0 = time.perf_counter()
        session.run({"x": x})
        full = time.perf_counter() - t0
        try:
            session.run({"x": x}, cancel=_cancel_after(full / 3))
        except RunCancelledError as e:
            if e.op_type:  # stopped between nodes, as this test wants
                err = e
                break
    assert err is not None
    assert err.graph == "main"
    assert err.op_type in ("MatMul", "Tanh")
    assert err.node_name in str(err) and err.node_name.split("_")[0] in ("matmul", "tanh")


def test_already_set_event_runs_nothing():
    session = InferenceSession.from_graph(_chain(n=2, size=4))
    event = threading.Event()
    event.set()
    with pytest.raises(RunCancelledError, match="before running graph 'main'"):
        session.run({"x": np.ones((4, 4), np.float32)}, cancel=event)
    with pytest.raises(RunCancelledError):
        session.run_outputs({"x": np.ones((4, 4), np.float32)}, cancel=event)


def test_unset_event_gives_the_plain_result_and_the_session_stays_usable():
    session = InferenceSession.from_graph(_chain(n=3, size=8))
    x = np.random.default_rng(1).standard_normal((8, 8)).astype(np.float32)
    plain = session.run({"x": x})[0]
    np.testing.assert_array_equal(session.run({"x": x}, cancel=threading.Event())[0], plain)
    outs = session.run_outputs({"x": x}, cancel=threading.Event())
    np.testing.assert_array_equal(outs[0].as_tensor(), plain)
    stopped = threading.Event()
    stopped.set()
    with pytest.raises(RunCancelledError):
        session.run({"x": x}, cancel=stopped)
    np.testing.assert_array_equal(session.run({"x": x})[0], plain)


def test_finite_loop_with_cancel_event_matches_plain_run():
    body = helper.make_graph(
        [helper.make_node("Identity", ["c_in"], ["c_out"]),
         helper.make_node("Add", ["x_in", "one"], ["x_out"])], "body",
        [helper.make_tensor_value_info("i", TensorProto.INT64, []),
         helper.make_tensor_value_info("c_in", TensorProto.BOOL, []),
         helper.make_tensor_value_info("x_in", TensorProto.FLOAT, [4])],
        [helper.make_tensor_value_info("c_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info("x_out", TensorProto.FLOAT, [4])])
    model = make_model([helper.make_node("Loop", ["m", "cond", "x"], ["y"], body=body)],
                       [tensor_info("x", np.float32, [4])], [tensor_info("y", np.float32, [4])],
                       {"m": np.int64(50), "cond": np.array(True), "one": np.float32(1)})
    session = InferenceSession.from_graph(model)
    y = session.run({"x": X4}, cancel=threading.Event())[0]
    np.testing.assert_array_equal(y, np.full(4, 50, np.float32))
    assert session.control_flow_stats().subgraph_runs == 50


def test_cancel_works_with_tracing_and_memory_limit():
    ctx = TraceContext.in_memory()
    session = (InferenceSession.builder().trace(ctx).memory_limit(1 << 30)
               .from_graph(_endless_loop()))
    with pytest.raises(RunCancelledError):
        session.run({"x": X4}, cancel=_cancel_after(0.2))
    assert any(s.category == "node" for s in ctx.spans)
    np.testing.assert_array_equal(
        InferenceSession.builder().memory_limit(1 << 30).from_graph(_chain(n=2, size=4))
        .run({"x": np.zeros((4, 4), np.float32)}, cancel=threading.Event())[0],
        np.zeros((4, 4), np.float32))


def test_cancel_event_is_per_run_and_per_thread():
    """Cancelling one thread's run leaves a concurrent run of the same session alone."""
    session = InferenceSession.from_graph(_endless_loop())
    chain = InferenceSession.from_graph(_chain(n=20, size=32))
    x = np.ones((32, 32), np.float32)
    expected = chain.run({"x": x})[0]
    results: list[object] = []
    stop = threading.Event()

    def endless():
        try:
            session.run({"x": X4}, cancel=stop)
        except RunCancelledError as e:
            results.append(e)

    t = threading.Thread(target=endless)
    t.start()
    for _ in range(20):
        np.testing.assert_array_equal(chain.run({"x": x}, cancel=threading.Event())[0], expected)
    stop.set()
    t.join(10)
    assert not t.is_alive()
    assert len(results) == 1 and isinstance(results[0], RunCancelledError)


def test_cancel_must_be_an_event():
    session = InferenceSession.from_graph(_chain(n=1, size=4))
    with pytest.raises(InvalidInputError, match="threading.Event"):
        session.run({"x": np.ones((4, 4), np.float32)}, cancel=True)  # type: ignore[arg-type]


# timeout= ---------------------------------------------------------------------------


@pytest.mark.parametrize("with_body_nodes", [True, False])
def test_timeout_stops_an_endless_loop_with_a_timeout_error(with_body_nodes):
    session = InferenceSession.from_graph(_endless_loop(with_body_nodes))
    start = time.perf_counter()
    with pytest.raises(RunTimeoutError, match=r"run timed out .*forever\.body.* s elapsed, "
                                              r"over the timeout of 0\.2 s") as info:
        session.run({"x": X4}, timeout=0.2)
    elapsed = time.perf_counter() - start
    assert 0.2 <= elapsed < 2.0
    assert isinstance(info.value, RunCancelledError)
    assert info.value.timeout == 0.2 and 0.2 <= info.value.elapsed < 2.0
    assert info.value.graph == "forever.body"


def test_timeout_stops_a_loop_with_a_huge_trip_count_and_no_cond():
    body = helper.make_graph(
        [helper.make_node("Add", ["x_in", "one"], ["x_out"], name="inc")], "body",
        [helper.make_tensor_value_info("i", TensorProto.INT64, []),
         helper.make_tensor_value_info("c_in", TensorProto.BOOL, []),
         helper.make_tensor_value_info("x_in", TensorProto.FLOAT, [4])],
        [helper.make_tensor_value_info("c_in", TensorProto.BOOL, []),
         helper.make_tensor_value_info("x_out", TensorProto.FLOAT, [4])])
    loop = helper.make_node("Loop", ["m", "", "x"], ["y"], name="long", body=body)
    model = make_model([loop], [tensor_info("x", np.float32, [4])],
                       [tensor_info("y", np.float32, [4])],
                       {"m": np.array(1 << 62), "one": np.float32(1)})
    session = InferenceSession.from_graph(model)
    start = time.perf_counter()
    with pytest.raises(RunTimeoutError) as info:
        session.run({"x": X4}, timeout=0.3)
    assert time.perf_counter() - start < 2.0
    assert info.value.graph == "long.body" and info.value.node_name in ("", "inc")


def test_timeout_stops_a_long_scan():
    body = helper.make_graph(
        [helper.make_node("Add", ["s_in", "x_t"], ["s_out"], name="acc")], "body",
        [helper.make_tensor_value_info("s_in", TensorProto.FLOAT, [1]),
         helper.make_tensor_value_info("x_t", TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info("s_out", TensorProto.FLOAT, [1])])
    scan = helper.make_node("Scan", ["s", "xs"], ["y"], name="scan", body=body,
                            num_scan_inputs=1)
    model = make_model([scan], [tensor_info("s", np.float32, [1]),
                                tensor_info("xs", np.float32, ["t", 1])],
                       [tensor_info("y", np.float32, [1])])
    session = InferenceSession.from_graph(model)
    xs = np.ones((2_000_000, 1), np.float32)
    with pytest.raises(RunTimeoutError, match="scan.body"):
        session.run({"s": np.zeros(1, np.float32), "xs": xs}, timeout=0.2)


def test_timeout_stops_a_straight_line_run_before_a_node():
    session = InferenceSession.from_graph(_chain(400, 256))
    x = np.ones((256, 256), np.float32)
    with pytest.raises(RunTimeoutError) as info:
        session.run({"x": x}, timeout=0.005)
    assert info.value.node_name.startswith(("matmul_", "tanh_", "out"))


def test_run_within_its_timeout_matches_the_plain_run():
    session = InferenceSession.from_graph(_chain(4, 16))
    x = np.random.default_rng(0).standard_normal((16, 16)).astype(np.float32)
    (plain,) = session.run({"x": x})
    (timed,) = session.run({"x": x}, timeout=30)
    np.testing.assert_array_equal(timed, plain)
    (out,) = session.run_outputs({"x": x}, timeout=30.0, cancel=threading.Event())
    np.testing.assert_array_equal(out.value, plain)


def test_cancel_still_stops_a_run_that_has_a_timeout():
    session = InferenceSession.from_graph(_endless_loop())
    with pytest.raises(RunCancelledError, match="cancel event was set") as info:
        session.run({"x": X4}, cancel=_cancel_after(0.1), timeout=60)
    assert not isinstance(info.value, RunTimeoutError)


@pytest.mark.parametrize("bad", [0, -1, float("nan"), float("inf"), "1", True])
def test_timeout_must_be_a_positive_number_of_seconds(bad):
    session = InferenceSession.from_graph(_chain(2, 4))
    with pytest.raises(InvalidInputError, match="timeout takes a number of seconds > 0"):
        session.run({"x": np.ones((4, 4), np.float32)}, timeout=bad)


def test_compat_run_config_entry_sets_a_timeout(tmp_path):
    import onnxkiln.compat as ort

    path = tmp_path / "forever.onnx"
    onnx.save(_endless_loop(), path)
    sess = ort.InferenceSession(str(path))
    ro = ort.RunOptions()
    ro.add_run_config_entry("kiln.run.timeout_s", "0.2")
    start = time.perf_counter()
    with pytest.raises(RunTimeoutError, match="over the timeout of 0.2 s"):
        sess.run(None, {"x": X4}, ro)
    assert time.perf_counter() - start < 2.0
    ro.add_run_config_entry("kiln.run.timeout_s", "soon")
    with pytest.raises(InvalidOptionError, match="kiln.run.timeout_s takes a number"):
        sess.run(None, {"x": X4}, ro)
