"""If, Loop and Scan kernels: against onnxruntime, plus edge cases it cannot show."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

from onnxkiln import ControlFlowStats, InferenceSession
from onnxkiln.errors import KernelError
from onnxkiln.testing import assert_same as _same
from onnxkiln.testing import check_outputs_against_ort as _check


def _model(text: str, check: bool = True) -> onnx.ModelProto:
    model = onnx.parser.parse_model(text)
    if check:
        onnx.checker.check_model(model, full_check=True)
    return model


def _header(opset: int) -> str:
    return f'<ir_version: {10 if opset >= 21 else 8}, opset_import: ["" : {opset}]>'



def _ours(model, feeds):
    return [o.value for o in InferenceSession.from_graph(model).run_outputs(feeds)]



F = np.float32
X2 = np.array([1.5, -2.0], F)


# If ----------------------------------------------------------------------------------

def _if_model(opset: int, cond_shape: str = "") -> onnx.ModelProto:
    return _model(_header(opset) + f"""
    g (bool{cond_shape} c, float[2] x) => (float[2] y, float[2] z) {{
       w = Constant <value = float[2] {{10.0, 20.0}}> ()
       y, z = If (c) <
          then_branch = t () => (float[2] a, float[2] b) {{ a = Add (x, w)  b = Neg (x) }},
          else_branch = e () => (float[2] a2, float[2] b2) {{ a2 = Mul (x, w)  b2 = Abs (x) }}>
    }}""")


@pytest.mark.parametrize("opset", [11, 13, 16, 19, 21, 25])
@pytest.mark.parametrize("cond", [True, False])
def test_if_reads_outer_values_and_matches_ort(opset, cond):
    model = _if_model(min(opset, 21))
    if opset > 21:
        model.opset_import[0].version = opset
        ours = _ours(model, {"c": np.array(cond), "x": X2})
        ref = _ours(_if_model(21), {"c": np.array(cond), "x": X2})
        for a, b in zip(ours, ref):
            _same(a, b)
        return
    _check(model, {"c": np.array(cond), "x": X2})


def test_if_accepts_one_element_cond_of_rank_one():
    s = InferenceSession.from_graph(_if_model(13, "[1]"))
    y, z = s.run({"c": np.array([False]), "x": X2})
    np.testing.assert_array_equal(y, X2 * [10, 20])
    np.testing.assert_array_equal(z, np.abs(X2))


def test_if_cond_with_two_elements_is_a_clear_error():
    s = InferenceSession.from_graph(_if_model(13, "[N]"))
    with pytest.raises(KernelError, match="exactly one element") as info:
        s.run({"c": np.array([True, False]), "x": X2})
    assert isinstance(info.value.__cause__, ValueError)


def test_if_output_never_shares_memory_with_outer_input():
    model = _model(_header(13) + """
    g (bool c, float[2] x) => (float[2] y) {
       y = If (c) <then_branch = t () => (float[2] a) { a = Identity (x) },
                   else_branch = e () => (float[2] b) { b = Neg (x) }>
    }""")
    x = X2.copy()
    (y,) = InferenceSession.from_graph(model).run({"c": np.array(True), "x": x})
    np.testing.assert_array_equal(y, x)
    assert not np.shares_memory(y, x)


def test_if_with_sequence_outputs():
    model = _model(_header(13) + """
    g (bool c, float[2] x) => (seq(float[2]) s) {
       s = If (c) <
          then_branch = t () => (seq(float[2]) a) { n = Neg (x)  a = SequenceConstruct (x, n) },
          else_branch = e () => (seq(float[2]) b) { b = SequenceEmpty <dtype = 1> () }>
    }""")
    for cond in (True, False):
        _check(model, {"c": np.array(cond), "x": X2})
    out = InferenceSession.from_graph(model).run_outputs({"c": np.array(False), "x": X2})
    assert out[0].kind == "sequence" and out[0].value == []


def test_if_with_optional_outputs():
    model = _model(_header(16) + """
    g (bool c, float[2] x) => (optional(float[2]) o) {
       o = If (c) <
          then_branch = t () => (optional(float[2]) a) { a = Optional <type = float[2]> () },
          else_branch = e () => (optional(float[2]) b) { b = Optional (x) }>
    }""")
    s = InferenceSession.from_graph(model)
    (empty,) = s.run_outputs({"c": np.array(True), "x": X2})
    assert empty.kind == "optional" and empty.value is None
    (full,) = s.run_outputs({"c": np.array(False), "x": X2})
    np.testing.assert_array_equal(full.value, X2)


# Loop --------------------------------------------------------------------------------

# zero-trip scan outputs take the body's declared element shape, which the subgraph runner
# does not expose yet (SubgraphRunner.output_shapes / output_dtypes: a core change)


def _counter_loop(opset: int, m: str = "M", cond: str = "cond", limit: float = 1e9) -> str:
    """v += 1 each trip; the body's cond is v_new < limit; scan output: v before the add."""
    inputs = ", ".join(p for p in ("int64 M" if m else "", "bool cond" if cond else "") if p)
    sep = ", " if inputs else ""
    return _header(opset) + f"""
    g ({inputs}{sep}float[2] v0) => (float[2] vf, float[N, 2] sc, int64[N] its) {{
       vf, sc, its = Loop ({m}, {cond}, v0) <body = b (int64 i, bool ci, float[2] v)
             => (bool co, float[2] v2, float[2] s, int64 it) {{
          one = Constant <value = float {{1.0}}> ()
          lim = Constant <value = float {{{limit}}}> ()
          v2 = Add (v, one)
          zero = Constant <value = int64 {{0}}> ()
          first = Gather <axis = 0> (v2, zero)
          co = Less (first, lim)
          s = Identity (v)
          it = Identity (i)
       }}>
    }}"""


@pytest.mark.parametrize("opset", [11, 13, 16, 19, 21])
@pytest.mark.parametrize(
    ("m", "cond", "trips", "go", "limit"),
    [
        ("M", "", 5, None, 1e9),          # for loop; the body's cond output still stops it
        ("", "cond", None, True, 4.0),    # while loop
        ("M", "cond", 6, True, 1e9),      # both, M binds
        ("M", "cond", 6, True, 3.0),      # both, cond binds
        pytest.param("M", "cond", 6, False, 1e9, marks=()),  # zero trips
        ("", "", None, None, 3.0),        # neither: only the body's cond stops it
        ("M", "", 1, None, -5.0),         # body cond false after the first trip
    ],
)
def test_loop_modes_match_ort(opset, m, cond, trips, go, limit):
    model = _model(_counter_loop(opset, m, cond, limit))
    feeds = {"v0": np.array([0.5, 2.0], F)}
    if m:
        feeds["M"] = np.array(trips, np.int64)
    if cond:
        feeds["cond"] = np.array(go)
    ours = _check(model, feeds)
    assert ours[2].dtype == np.int64


def test_loop_opset_1_runs_like_later_opsets():
    text = _counter_loop(11, "M", "cond").replace('"" : 11', '"" : 1')
    model = onnx.parser.parse_model(text)
    feeds = {"M": np.array(3), "cond": np.array(True), "v0": np.array([0.5, 2.0], F)}
    vf, sc, its = InferenceSession.from_graph(model).run(feeds)
    np.testing.assert_array_equal(vf, [3.5, 5.0])
    np.testing.assert_array_equal(sc, [[0.5, 2.0], [1.5, 3.0], [2.5, 4.0]])
    np.testing.assert_array_equal(its, [0, 1, 2])


@pytest.mark.parametrize("trips", [0, -3])
def test_zero_trip_loop_returns_initial_values_and_empty_scan_outputs(trips):
    model = _model(_counter_loop(13))
    v0 = np.array([0.5, 2.0], F)
    feeds = {"M": np.array(trips, np.int64), "cond": np.array(True), "v0": v0}
    vf, sc, its = InferenceSession.from_graph(model).run(feeds)
    np.testing.assert_array_equal(vf, v0)
    assert not np.shares_memory(vf, v0)
    assert sc.shape[0] == 0 and sc.dtype == np.float32 and sc.size == 0
    assert its.shape == (0,) and its.dtype == np.int64


def test_zero_trip_loop_scan_output_has_the_body_element_shape():
    model = _model(_counter_loop(13))
    feeds = {"M": np.array(0, np.int64), "cond": np.array(True), "v0": X2}
    _check(model, feeds)


def test_loop_of_100_iterations_builds_its_body_once():
    model = _model(_counter_loop(13))
    s = InferenceSession.from_graph(model)
    feeds = {"M": np.array(100), "cond": np.array(True), "v0": np.zeros(2, F)}
    vf, sc, its = s.run(feeds)
    np.testing.assert_array_equal(vf, [100, 100])
    np.testing.assert_array_equal(its, np.arange(100))
    assert sc.shape == (100, 2)
    assert s.control_flow_stats() == ControlFlowStats(subgraph_builds=1, subgraph_runs=100)


def test_loop_with_only_scan_outputs_and_outer_capture():
    model = _model(_header(13) + """
    g (int64 M, float[3] x) => (float[N, 3] sc) {
       sc = Loop (M, "") <body = b (int64 i, bool ci) => (bool co, float[3] s) {
          co = Identity (ci)
          f = Cast <to = 1> (i)
          s = Mul (x, f)
       }>
    }""")
    x = np.array([1, 2, 3], F)
    (sc,) = _check(model, {"M": np.array(4), "x": x})
    np.testing.assert_array_equal(sc, np.arange(4, dtype=F)[:, None] * x)


def test_loop_scan_output_changing_shape_is_a_clear_error():
    model = _model(_header(13) + """
    g (int64 M) => (float[N, M] sc) {
       sc = Loop (M, "") <body = b (int64 i, bool ci) => (bool co, float[K] s) {
          co = Identity (ci)
          one = Constant <value = int64 {1}> ()
          zero = Constant <value = int64[1] {0}> ()
          val = Constant <value = float {1.0}> ()
          n = Add (i, one)
          shape = Unsqueeze (n, zero)
          s = Expand (val, shape)
       }>
    }""")
    s = InferenceSession.from_graph(model)
    (one,) = s.run({"M": np.array(1)})
    np.testing.assert_array_equal(one, [[1.0]])
    with pytest.raises(KernelError, match="same shape") as info:
        s.run({"M": np.array(3)})
    assert isinstance(info.value.__cause__, ValueError)


def test_loop_carried_sequence_matches_ort():
    model = _model(_header(13) + """
    g (int64 M, bool cond) => (seq(float[K]) out) {
       empty = SequenceEmpty <dtype = 1> ()
       out = Loop (M, cond, empty) <body = b (int64 i, bool ci, seq(float[K]) s_in)
             => (bool co, seq(float[K]) s_out) {
          co = Identity (ci)
          x = Constant <value = float[5] {1.0, 2.0, 3.0, 4.0, 5.0}> ()
          one = Constant <value = int64 {1}> ()
          zero = Constant <value = int64[1] {0}> ()
          axes = Constant <value = int64[1] {0}> ()
          end = Add (i, one)
          ends = Unsqueeze (end, axes)
          piece = Slice (x, zero, ends)
          s_out = SequenceInsert (s_in, piece)
       }>
    }""")
    (seq,) = _check(model, {"M": np.array(4), "cond": np.array(True)})
    assert [len(t) for t in seq] == [1, 2, 3, 4]
    (none,) = _ours(model, {"M": np.array(0), "cond": np.array(True)})
    assert none == []


def test_loop_carried_optional_starts_empty():
    model = _model(_header(16) + """
    g (int64 M) => (seq(float) out) {
       init = Optional <type = seq(float)> ()
       out = Loop (M, "", init) <body = b (int64 i, bool ci, optional(seq(float)) o_in)
             => (bool co, seq(float) s_out) {
          co = Identity (ci)
          has = OptionalHasElement (o_in)
          none = Not (has)
          base = If (none) <
             then_branch = t () => (seq(float) a) {
                z = Constant <value = float {0.0}> ()
                a = SequenceConstruct (z) },
             else_branch = e () => (seq(float) b2) { b2 = OptionalGetElement (o_in) }>
          f = Cast <to = 1> (i)
          s_out = SequenceInsert (base, f)
       }>
    }""")
    # ORT cannot feed an optional back as a plain sequence here; check against numpy
    (seq,) = _ours(model, {"M": np.array(1)})
    _same(seq, [np.array(0, F), np.array(0, F)])


def test_nested_if_in_loop_reads_both_scopes():
    model = _model(_header(13) + """
    g (int64 M, float[2] x, float thr) => (float[2] acc, float[N, 2] trace) {
       zero2 = Constant <value = float[2] {0.0, 0.0}> ()
       acc, trace = Loop (M, "", zero2) <body = b (int64 i, bool ci, float[2] a)
             => (bool co, float[2] a2, float[2] t) {
          co = Identity (ci)
          f = Cast <to = 1> (i)
          big = Greater (f, thr)
          step = If (big) <
             then_branch = tt () => (float[2] p) { p = Mul (x, f) },
             else_branch = ee () => (float[2] q) { q = Sub (a, x) }>
          a2 = Add (a, step)
          t = Identity (step)
       }>
    }""")
    feeds = {"M": np.array(6), "x": X2, "thr": np.array(2.5, F)}
    acc, trace = _check(model, feeds)
    a, steps = np.zeros(2, F), []
    for i in range(6):
        steps.append(X2 * F(i) if i > 2.5 else a - X2)
        a = a + steps[-1]
    np.testing.assert_allclose(acc, a)
    np.testing.assert_allclose(trace, np.stack(steps))


def test_loop_final_value_passed_through_does_not_alias_initial():
    model = _model(_header(13) + """
    g (int64 M, float[2] v0) => (float[2] vf) {
       vf = Loop (M, "", v0) <body = b (int64 i, bool ci, float[2] v) => (bool co, float[2] w) {
          co = Identity (ci)
          w = Identity (v)
       }>
    }""")
    v0 = X2.copy()
    (vf,) = InferenceSession.from_graph(model).run({"M": np.array(3), "v0": v0})
    np.testing.assert_array_equal(vf, v0)
    assert not np.shares_memory(vf, v0)


# Scan --------------------------------------------------------------------------------

def _scan_model(opset: int, **attrs) -> onnx.ModelProto:
    attr_text = "".join(f", {k} = [{', '.join(map(str, v))}]" for k, v in attrs.items())
    return _model(_header(opset) + f"""
    g (float[3] s0, float[L, 3] x, float[P, Q] y) => (float[3] sf, float[A, B] o1, float[C] o2) {{
       sf, o1, o2 = Scan (s0, x, y) <num_scan_inputs = 2{attr_text},
          body = b (float[3] s, float[3] xi, float[3] yi) => (float[3] s2, float[3] e1, float e2) {{
             p = Mul (xi, yi)
             s2 = Add (s, p)
             e1 = Identity (s2)
             e2 = ReduceSum <keepdims = 0> (xi)
          }}>
    }}""")


SCAN_FEEDS = {
    "s0": np.array([0.5, 1, -1], F),
    "x": np.arange(12, dtype=F).reshape(4, 3) / 7,
    "y": np.arange(12, dtype=F).reshape(3, 4)[::-1].copy() - 5,
}


@pytest.mark.parametrize("opset", [9, 11, 16, 21])
@pytest.mark.parametrize(
    "attrs",
    [
        {"scan_input_axes": [0, 1]},
        {"scan_input_axes": [0, 1], "scan_input_directions": [1, 0]},
        {"scan_input_axes": [0, 1], "scan_input_directions": [0, 1],
         "scan_output_directions": [1, 1]},
        {"scan_input_axes": [0, 1], "scan_output_axes": [1, 0]},
        {"scan_input_axes": [0, -1], "scan_output_axes": [-1, -1]},
    ],
)
def test_scan_axes_and_directions_match_ort(opset, attrs):
    negative = any(a < 0 for v in attrs.values() for a in v)
    if negative and opset < 11:
        pytest.skip("negative axes arrive in Scan-11")
    _check(_scan_model(opset, **attrs), SCAN_FEEDS)


def test_scan_running_sum_against_numpy():
    model = _scan_model(16, scan_input_axes=[0, 1], scan_output_directions=[1, 0])
    sf, o1, o2 = _ours(model, SCAN_FEEDS)
    prods = SCAN_FEEDS["x"] * SCAN_FEEDS["y"].T
    running = SCAN_FEEDS["s0"] + np.cumsum(prods, axis=0)
    np.testing.assert_allclose(sf, running[-1], rtol=1e-6)
    np.testing.assert_allclose(o1, running[::-1], rtol=1e-6)
    np.testing.assert_allclose(o2, SCAN_FEEDS["x"].sum(axis=1), rtol=1e-6)


def test_scan_inputs_of_different_lengths_are_a_clear_error():
    model = _scan_model(16, scan_input_axes=[0, 1])
    feeds = dict(SCAN_FEEDS, y=np.ones((3, 3), F))
    with pytest.raises(KernelError, match="sequence length"):
        _ours(model, feeds)


def test_scan_over_empty_axis_returns_initial_state():
    model = _scan_model(16, scan_input_axes=[0, 1])
    feeds = {"s0": SCAN_FEEDS["s0"], "x": np.zeros((0, 3), F), "y": np.zeros((3, 0), F)}
    sf, o1, o2 = _ours(model, feeds)
    np.testing.assert_array_equal(sf, feeds["s0"])
    assert not np.shares_memory(sf, feeds["s0"])
    assert o1.shape[0] == 0 and o1.dtype == F and o2.shape[0] == 0


def _scan8_model(directions: list[int]) -> onnx.ModelProto:
    return _model(_header(8) + f"""
    g (int64[2] lens, float[2, 2] s0, float[2, 4, 2] x) => (float[2, 2] sf, float[2, 4, 2] o) {{
       sf, o = Scan (lens, s0, x) <num_scan_inputs = 1, directions = [{directions[0]}],
          body = b (float[2] s, float[2] xi) => (float[2] s2, float[2] e) {{
             s2 = Add (s, xi)
             e = Identity (s2)
          }}>
    }}""")


@pytest.mark.parametrize("direction", [0, 1])
@pytest.mark.parametrize("lens", [[4, 2], [4, 4], [1, 3]])
def test_scan8_batches_and_sequence_lens_match_ort(direction, lens):
    feeds = {"lens": np.array(lens, np.int64), "s0": np.ones((2, 2), F),
             "x": np.arange(16, dtype=F).reshape(2, 4, 2)}
    _check(_scan8_model([direction]), feeds)


def test_scan8_without_sequence_lens():
    model = _model(_header(8) + """
    g (float[1, 2] s0, float[1, 3, 2] x) => (float[1, 2] sf, float[1, 3, 2] o) {
       sf, o = Scan (, s0, x) <num_scan_inputs = 1,
          body = b (float[2] s, float[2] xi) => (float[2] s2, float[2] e) {
             s2 = Add (s, xi)
             e = Identity (s2)
          }>
    }""")
    feeds = {"s0": np.zeros((1, 2), F), "x": np.arange(6, dtype=F).reshape(1, 3, 2)}
    sf, o = _check(model, feeds)
    np.testing.assert_array_equal(o[0], np.cumsum(feeds["x"][0], axis=0))
    np.testing.assert_array_equal(sf[0], feeds["x"][0].sum(axis=0))


def test_scan8_zero_sequence_length_keeps_the_state_and_pads_with_zeros():
    # onnxruntime rejects a length of 0; the spec allows it
    feeds = {"lens": np.array([0, 3], np.int64), "s0": np.ones((2, 2), F),
             "x": np.arange(16, dtype=F).reshape(2, 4, 2)}
    sf, o = _ours(_scan8_model([1]), feeds)
    np.testing.assert_array_equal(sf, [[1, 1], [1 + 8 + 10 + 12, 1 + 9 + 11 + 13]])
    np.testing.assert_array_equal(o[0], np.zeros((4, 2)))
    np.testing.assert_array_equal(o[1], [[13, 14], [23, 25], [31, 34], [0, 0]])


# empty scan outputs from the body's declared types (runner attributes, faked here) -------

class _FakeBody:
    """A Subgraph exposing declared output dtypes/shapes, as the runner should."""

    def __init__(self, n_inputs: int, dtypes, shapes):
        self.input_names = tuple(f"i{k}" for k in range(n_inputs))
        self.output_names = tuple(f"o{k}" for k in range(len(dtypes)))
        self.output_dtypes = dtypes
        self.output_shapes = shapes

    def __call__(self, inputs, captured):
        raise AssertionError("a zero-trip loop must not run its body")


def _info(op: str, opset: int, n_inputs: int, n_outputs: int, body, **attrs):
    from onnxkiln.providers.base import NodeInfo

    return NodeInfo(name="n", op_type=op, domain="", opset=opset, attrs=attrs,
                    n_inputs=n_inputs, n_outputs=n_outputs,
                    output_present=(True,) * n_outputs, subgraphs={"body": body})


def test_zero_trip_loop_uses_declared_body_output_types():
    from onnxkiln.dtypes import DataType
    from onnxkiln.providers.cpu.control import loop

    body = _FakeBody(3, (DataType.BOOL, DataType.FLOAT, DataType.FLOAT16, DataType.INT64),
                     ((), (2,), (3, "K"), (3, 4)))
    run = loop(_info("Loop", 13, 3, 3, body))
    v0 = np.zeros(2, F)
    vf, unknown, known = run(np.array(0), None, v0)
    np.testing.assert_array_equal(vf, v0)
    assert unknown.shape == (0,) and unknown.dtype == np.float16  # symbolic dim: rank unknown
    assert known.shape == (0, 3, 4) and known.dtype == np.int64


def test_empty_scan_output_goes_on_its_output_axis():
    from onnxkiln.dtypes import DataType
    from onnxkiln.providers.cpu.control import scan

    body = _FakeBody(2, (DataType.FLOAT, DataType.DOUBLE), ((2,), (3, 4)))
    run = scan(_info("Scan", 16, 2, 2, body, num_scan_inputs=1, scan_output_axes=[-2]))
    sf, out = run(np.ones(2, F), np.zeros((0, 5), F))
    np.testing.assert_array_equal(sf, [1, 1])
    assert out.shape == (3, 0, 4) and out.dtype == np.float64


def test_unknown_op_in_a_body_is_reported_as_unsupported():
    from onnxkiln.errors import UnsupportedOpError

    model = onnx.parser.parse_model(_header(13) + """
    g (int64 M, float[2] v0, bool c) => (float[2] vf, float[2] y) {
       vf = Loop (M, "", v0) <body = b (int64 i, bool ci, float[2] v) => (bool co, float[2] w) {
          co = Identity (ci)
          w = NoSuchOp (v)
       }>
       y = If (c) <then_branch = t () => (float[2] a) { a = Identity (v0) },
                   else_branch = e () => (float[2] b) { b = Neg (v0) }>
    }""")
    with pytest.raises(UnsupportedOpError, match="NoSuchOp"):
        InferenceSession.from_graph(model)


def test_loop_with_unused_scan_outputs_left_off():
    # onnx's checker (and onnxruntime) want every body output bound; we just drop the extras
    model = _model(_header(13) + """
    g (int64 M, float[2] v0) => (float[2] vf) {
       vf = Loop (M, "", v0) <body = b (int64 i, bool ci, float[2] v)
             => (bool co, float[2] w, float[2] s) {
          co = Identity (ci)
          one = Constant <value = float {1.0}> ()
          w = Add (v, one)
          s = Identity (w)
       }>
    }""", check=False)
    (vf,) = _ours(model, {"M": np.array(3), "v0": X2})
    np.testing.assert_array_equal(vf, X2 + 3)
