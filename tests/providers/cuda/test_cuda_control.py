"""If, Loop and Scan on the torch provider (torch's CPU device): bodies on the device, the
decisions read on the host, and no copies between iterations but the declared ones."""

from __future__ import annotations

import collections

import numpy as np
import onnx
import onnx.parser
import pytest

torch = pytest.importorskip("torch", reason="the CUDA provider's kernels are torch ops")
ort = pytest.importorskip("onnxruntime", reason="outputs are compared with onnxruntime")

from cuda_harness import DEVICE  # noqa: E402

import onnxkiln as ok  # noqa: E402
from onnxkiln import SeamKind  # noqa: E402
from onnxkiln.errors import ExecutionProviderUnavailableError  # noqa: E402

ON_TORCH = {"testing.cuda_on_torch_cpu": "1"} if DEVICE == "cpu" else {}  # a real GPU
COPIES = ("MemcpyToHost", "MemcpyFromHost")
HEADER = '<ir_version: 8, opset_import: ["" : 17]>\n'

# v <- v @ w until sum(v) >= 1000 or M trips; y collects relu(v) per iteration
LOOP = HEADER + """
g (int64 M, float[2,3] x, float[3,3] w) => (float[2,3] vf, float[N,2,3] ys) {
   c = Constant <value = bool {1}> ()
   vf, ys = Loop (M, c, x) <body = b (int64 i, bool ci, float[2,3] v)
                                => (bool co, float[2,3] v2, float[2,3] y) {
       v2 = MatMul(v, w)
       y = Relu(v2)
       s = ReduceSum(v2)
       lim = Constant <value = float {1000}> ()
       co = Less(s, lim)
   }>
}
"""

# the branch is chosen by a value computed on the device; each branch reads outer values
IF = HEADER + """
g (float[2,3] x, float[2,3] w) => (float[2,3] y) {
   s = ReduceSum(x)
   zero = Constant <value = float {0}> ()
   c = Greater(s, zero)
   y = If (c) <then_branch = t () => (float[2,3] a) { a = Add(x, w) },
               else_branch = e () => (float[2,3] b) { b = Mul(x, w) }>
}
"""

# running sum over rows, then the rows reversed; the state is a device value throughout
SCAN = HEADER + """
g (float[2] s0, float[4,2] xs) => (float[2] sf, float[4,2] partial) {
   sf, partial = Scan <num_scan_inputs = 1, scan_input_directions = [1],
                       body = b (float[2] s, float[2] row) => (float[2] s2, float[2] out) {
           s2 = Add(s, row)
           out = Identity(s2)
       }> (s0, xs)
}
"""

# the body reshapes with a shape computed on the host outside the loop (captured)
CAPTURED_SHAPE = HEADER + """
g (int64 M, float[2,3] x) => (float[2,3] vf) {
   shp = Shape(x)
   vf = Loop (M, "", x) <body = b (int64 i, bool ci, float[2,3] v) => (bool co, float[2,3] v2) {
       flat = Flatten <axis = 0> (v)
       scaled = Add(flat, flat)
       v2 = Reshape(scaled, shp)
       co = Identity(ci)
   }>
}
"""

# a greedy decoder: the carried token ids grow by one per iteration until eos
GREEDY = HEADER + """
g (int64 M, int64[1] start, float[16,8] emb, float[8,16] head, int64 eos)
    => (int64[K] ids, float[K,8] hidden) {
   c = Constant <value = bool {1}> ()
   ids, hidden = Loop (M, c, start) <body = b (int64 i, bool ci, int64[L] seq)
                                          => (bool co, int64[L1] seq2, float[8] h) {
       minus = Constant <value = int64[1] {-1}> ()
       zero = Constant <value = int64[1] {0}> ()
       last = Gather <axis = 0> (seq, minus)
       x = Gather <axis = 0> (emb, last)
       t = Tanh(x)
       h = Squeeze(t, zero)
       logits = MatMul(t, head)
       nxt = ArgMax <axis = 1, keepdims = 0> (logits)
       seq2 = Concat <axis = 0> (seq, nxt)
       nxt0 = Squeeze(nxt, zero)
       stop = Equal(nxt0, eos)
       co = Not(stop)
   }>
}
"""

# a Loop whose carried value is a sequence stays on the host
SEQUENCE = HEADER + """
g (int64 M, float[2] x) => (float[N,2] out) {
   empty = SequenceEmpty <dtype = 1> ()
   c = Constant <value = bool {1}> ()
   seq = Loop (M, c, empty) <body = b (int64 i, bool ci, seq(float[2]) acc)
                                  => (bool co, seq(float[2]) acc2) {
       acc2 = SequenceInsert(acc, x)
       co = Identity(ci)
   }>
   out = ConcatFromSequence <axis = 0, new_axis = 1> (seq)
}
"""

# an If inside a Loop body: nested control flow on the device
NESTED = HEADER + """
g (int64 M, float[3] x) => (float[3] vf) {
   c = Constant <value = bool {1}> ()
   vf = Loop (M, c, x) <body = b (int64 i, bool ci, float[3] v) => (bool co, float[3] v2) {
       two = Constant <value = int64 {2}> ()
       r = Mod(i, two)
       zero = Constant <value = int64 {0}> ()
       even = Equal(r, zero)
       v2 = If (even) <then_branch = t () => (float[3] a) { a = Add(v, v) },
                       else_branch = e () => (float[3] d) { d = Neg(v) }>
       co = Identity(ci)
   }>
}
"""


def _model(text: str) -> bytes:
    model = onnx.parser.parse_model(text)
    onnx.checker.check_model(model)
    return model.SerializeToString()


def _traced(text: str, feeds: dict, runs: int = 1, **kwargs):
    """(outputs, spans of the last run) on the torch provider; outputs also from ORT."""
    ctx = ok.TraceContext.in_memory()
    session = ok.InferenceSession(_model(text), device="cuda", options=ON_TORCH, **kwargs)
    for _ in range(runs):
        ctx.spans.clear()
        session.set_trace_context(ctx)
        outputs = session.run(None, feeds)
    return session, outputs, [s for s in ctx.spans if s.category == "node"]


def _copies(spans, graph_prefix: str | None = None) -> collections.Counter:
    return collections.Counter(
        s.name for s in spans if s.name in COPIES
        and (graph_prefix is None or s.attributes["graph"].startswith(graph_prefix)))


def _reference(text: str, feeds: dict) -> list[np.ndarray]:
    return ort.InferenceSession(_model(text), providers=["CPUExecutionProvider"]).run(
        None, feeds)


def _same(ours, theirs) -> None:
    assert len(ours) == len(theirs)
    for a, b in zip(ours, theirs):
        assert isinstance(a, np.ndarray) and a.dtype == b.dtype and a.shape == b.shape
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6)


def _loop_feeds(trips: int = 5):
    rng = np.random.default_rng(0)
    return {"M": np.array(trips, np.int64), "x": rng.random((2, 3), np.float32),
            "w": (rng.random((3, 3), np.float32) * 0.9 + 0.5).astype(np.float32)}


def test_loop_body_runs_on_the_device_with_one_host_read_per_iteration():
    feeds = _loop_feeds()
    session, ours, spans = _traced(LOOP, feeds, runs=3)
    _same(ours, _reference(LOOP, feeds))
    assert session.execution_provider_fallback_report() is None
    body = [s for s in spans if s.attributes["graph"] == "Loop.body"]
    trips = ours[1].shape[0]
    assert 1 < trips <= 5
    assert {s.attributes["provider"] for s in body} == {"cuda"}
    # per iteration: only the cond the driver reads comes back; nothing is uploaded
    assert _copies(body) == {"MemcpyToHost": trips}
    main = [s for s in spans if s.attributes["graph"] == "main"]
    loop = next(s for s in main if s.name == "Loop")
    assert loop.attributes["provider"] == "cuda"
    # x and w up, vf and ys down; M is read where the caller gave it (a host pass-through)
    assert _copies(main) == {"MemcpyFromHost": 2, "MemcpyToHost": 3}


def test_a_greedy_loop_decoder_keeps_its_tokens_on_the_device():
    rng = np.random.default_rng(3)
    feeds = {"M": np.array(12, np.int64), "start": np.array([2], np.int64),
             "emb": rng.standard_normal((16, 8)).astype(np.float32),
             "head": rng.standard_normal((8, 16)).astype(np.float32)}
    first = _reference(GREEDY, {**feeds, "eos": np.array(-1, np.int64)})[0]
    feeds["eos"] = np.array(first[6], np.int64)  # stop partway through
    _, ours, spans = _traced(GREEDY, feeds, runs=3)
    theirs = _reference(GREEDY, feeds)
    _same(ours, theirs)
    trips = ours[1].shape[0]
    assert 1 < trips < 12 and ours[0].shape == (trips + 1,)
    body = [s for s in spans if s.attributes["graph"] == "Loop.body"]
    assert {s.attributes["provider"] for s in body} == {"cuda"}
    assert _copies(body) == {"MemcpyToHost": trips}


def test_loop_stops_at_its_trip_count_and_its_condition():
    for trips in (0, 1, 2, 40):
        feeds = _loop_feeds(trips)
        _, ours, _ = _traced(LOOP, feeds)
        _same(ours, _reference(LOOP, feeds))


def test_if_reads_its_device_condition_once_and_runs_the_branch_on_the_device():
    rng = np.random.default_rng(1)
    for sign in (1.0, -1.0):
        feeds = {"x": (sign * rng.random((2, 3))).astype(np.float32),
                 "w": rng.random((2, 3), np.float32)}
        _, ours, spans = _traced(IF, feeds, runs=2)
        _same(ours, _reference(IF, feeds))
        branch = [s for s in spans if s.attributes["graph"].startswith("If.")]
        assert [s.name for s in branch] == (["Add"] if sign > 0 else ["Mul"])
        assert branch[0].attributes["provider"] == "cuda"
        assert _copies(branch) == {}
        main = [s for s in spans if s.attributes["graph"] == "main"]
        # x and w up, the condition and y down
        assert _copies(main) == {"MemcpyFromHost": 2, "MemcpyToHost": 2}


def test_scan_keeps_state_and_slices_on_the_device():
    feeds = {"s0": np.array([1, -1], np.float32),
             "xs": np.arange(8, dtype=np.float32).reshape(4, 2)}
    _, ours, spans = _traced(SCAN, feeds, runs=3)
    _same(ours, _reference(SCAN, feeds))
    body = [s for s in spans if s.attributes["graph"] == "Scan.body"]
    assert len(body) == 8 and {s.attributes["provider"] for s in body} == {"cuda"}
    assert _copies(body) == {}


def test_a_captured_host_shape_stays_on_the_host_inside_the_body():
    feeds = {"M": np.array(3, np.int64), "x": np.arange(6, dtype=np.float32).reshape(2, 3)}
    _, ours, spans = _traced(CAPTURED_SHAPE, feeds, runs=3)
    _same(ours, _reference(CAPTURED_SHAPE, feeds))
    body = [s for s in spans if s.attributes["graph"] == "Loop.body"]
    reshape = [s for s in body if s.name == "Reshape"]
    assert len(reshape) == 3 and {s.attributes["provider"] for s in reshape} == {"cuda"}
    assert _copies(body) == {"MemcpyToHost": 3}  # the cond only: the shape never moves


def test_nested_if_inside_a_loop_runs_on_the_device():
    feeds = {"M": np.array(5, np.int64), "x": np.array([1, -2, 3], np.float32)}
    _, ours, spans = _traced(NESTED, feeds, runs=3)
    _same(ours, _reference(NESTED, feeds))
    inner = [s for s in spans if s.attributes["graph"].startswith("If.")]
    assert sorted(s.name for s in inner) == ["Add"] * 3 + ["Neg"] * 2
    assert {s.attributes["provider"] for s in inner} == {"cuda"}


def test_a_loop_carrying_a_sequence_stays_on_the_host_with_its_reason():
    feeds = {"M": np.array(3, np.int64), "x": np.array([1, 2], np.float32)}
    session = ok.InferenceSession(_model(SEQUENCE), device="cuda", options=ON_TORCH)
    _same(session.run(None, feeds), _reference(SEQUENCE, feeds))
    report = session.execution_provider_fallback_report()
    loops = [d for d in report.declines if d.op_type == "Loop"]
    assert len(loops) == 1 and "sequence" in loops[0].reason


def test_the_torch_provider_alone_runs_control_flow():
    feeds = _loop_feeds()
    session = ok.InferenceSession(_model(LOOP), providers=["cuda"], options=ON_TORCH)
    _same(session.run(None, feeds), _reference(LOOP, feeds))
    with pytest.raises(ExecutionProviderUnavailableError, match="Loop: reads a sequence"):
        ok.InferenceSession(_model(SEQUENCE), providers=["cuda"], options=ON_TORCH)


def test_control_flow_on_the_device_is_a_host_control_flow_seam():
    session = ok.InferenceSession(_model(SCAN), device="cuda",
                                  options={**ON_TORCH, "capture.allow_seams": "0"})
    f32 = ok.DataType.FLOAT
    s0 = session.allocate_device_binding("s0", None, f32, (2,), (2,))
    xs = session.allocate_device_binding("xs", None, f32, (4, 2), (4, 2))
    sf = session.allocate_device_output_binding("sf", f32, (2,), (2,))
    partial = session.allocate_device_output_binding("partial", f32, (4, 2), (4, 2))
    s0.write(np.zeros(2, np.float32))
    xs.write(np.ones((4, 2), np.float32))
    result = session.try_capture_with_device_bindings({}, [s0, xs, sf, partial])
    assert not result.captured
    assert [(d.op_type, d.seam_kind) for d in result.declines] == [
        ("Scan", SeamKind.HOST_CONTROL_FLOW)]
    assert session.run_with_device_bindings({}, [s0, xs, sf, partial]) == [None, None]
    np.testing.assert_array_equal(partial.read(), [[1, 1], [2, 2], [3, 3], [4, 4]])
