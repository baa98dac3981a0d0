"""Sequence and optional kernels: against onnxruntime, plus edge cases it cannot show."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

from onnxkiln import InferenceSession
from onnxkiln.errors import KernelError, SequenceOutputError
from onnxkiln.testing import assert_same as _same
from onnxkiln.testing import check_outputs_against_ort as _check
from onnxkiln.testing import run_ort

F = np.float32


def _model(text: str, opset: int = 17, check: bool = True) -> onnx.ModelProto:
    header = f'<ir_version: {10 if opset >= 21 else 8}, opset_import: ["" : {opset}]>'
    model = onnx.parser.parse_model(header + text)
    if check:
        onnx.checker.check_model(model, full_check=True)
    return model



def _ours(model, feeds):
    return [o.value for o in InferenceSession.from_graph(model).run_outputs(feeds)]



A = np.arange(6, dtype=F).reshape(2, 3)
B = -np.arange(6, dtype=F).reshape(2, 3) / 4
C = np.ones((2, 3), F) * 7


# construct / at / length / insert / erase ---------------------------------------------

_BASICS = """
g (float[2, 3] a, float[2, 3] b, float[2, 3] c, int64 p) => (seq(float[2, 3]) s,
      float[2, 3] at, int64 n, seq(float[2, 3]) ins, seq(float[2, 3]) ers) {
   s = SequenceConstruct (a, b, c)
   at = SequenceAt (s, p)
   n = SequenceLength (s)
   ins = SequenceInsert (s, a, p)
   ers = SequenceErase (s, p)
}"""


@pytest.mark.parametrize("p", [0, 1, 2, -1, -3])
def test_construct_at_length_insert_erase_match_ort(p):
    ours = _check(_model(_BASICS, 11), {"a": A, "b": B, "c": C, "p": np.array(p)})
    assert ours[2].dtype == np.int64 and ours[2].shape == ()


def test_insert_and_erase_default_positions_and_int32_positions():
    model = _model("""
    g (float[2, 3] a, float[2, 3] b, int32 p) => (seq(float[2, 3]) i, seq(float[2, 3]) e,
                                                 float[2, 3] last) {
       s = SequenceConstruct (a, b)
       i = SequenceInsert (s, b)
       e = SequenceErase (s)
       last = SequenceAt (i, p)
    }""", 11)
    ins, ers, last = _check(model, {"a": A, "b": B, "p": np.array(-1, np.int32)})
    _same(ins, [A, B, B])
    _same(ers, [A])
    _same(last, B)


def test_insert_at_length_appends_and_out_of_range_positions_fail():
    model = _model(_BASICS, 11)
    s = InferenceSession.from_graph(model)
    outs = s.run_outputs({"a": A, "b": B, "c": C, "p": np.array(-3)})
    _same(outs[3].value, [A, A, B, C])
    for bad in (3, -4):
        with pytest.raises(KernelError, match="out of range") as info:
            s.run_outputs({"a": A, "b": B, "c": C, "p": np.array(bad)})
        assert isinstance(info.value.__cause__, IndexError)


def test_sequence_kernels_do_not_modify_or_alias_their_inputs():
    model = _model("""
    g (float[2, 3] a) => (seq(float[2, 3]) s, seq(float[2, 3]) t, float[2, 3] x) {
       s = SequenceConstruct (a)
       t = SequenceInsert (s, a)
       zero = Constant <value = int64 {0}> ()
       x = SequenceAt (t, zero)
    }""", 11)
    a = A.copy()
    s, t, x = _ours(model, {"a": a})
    assert len(s) == 1 and len(t) == 2
    for v in (*s, *t, x):
        np.testing.assert_array_equal(v, a)
        assert not np.shares_memory(v, a)


def test_empty_sequence_and_erasing_from_it():
    model = _model("""
    g (float[2] a) => (seq(float[]) e, int64 n, seq(float[]) one) {
       e = SequenceEmpty ()
       n = SequenceLength (e)
       one = SequenceInsert (e, a)
    }""", 11)
    e, n, one = _check(model, {"a": np.array([1, 2], F)})
    assert e == [] and int(n) == 0
    _same(one, [np.array([1, 2], F)])
    bad = _model("""
    g (float[2] a) => (seq(int64[]) e) {
       s = SequenceEmpty <dtype = 7> ()
       e = SequenceErase (s)
    }""", 11)
    with pytest.raises(KernelError, match="out of range"):
        _ours(bad, {"a": np.array([1, 2], F)})


def test_sequence_outputs_need_run_outputs():
    model = _model(_BASICS, 11)
    s = InferenceSession.from_graph(model)
    feeds = {"a": A, "b": B, "c": C, "p": np.array(0)}
    with pytest.raises(SequenceOutputError, match="run_outputs"):
        s.run(feeds)
    outs = s.run_outputs(feeds)
    assert [o.kind for o in outs] == ["sequence", "tensor", "tensor", "sequence", "sequence"]
    _same(outs[0].value, [A, B, C])


def test_sequence_graph_input():
    model = _model("""
    g (seq(float[N]) s, int64 p) => (float[N] x, int64 n) {
       x = SequenceAt (s, p)
       n = SequenceLength (s)
    }""", 11)
    seq = [np.array([1, 2], F), np.array([3, 4, 5], F)]
    x, n = _check(model, {"s": seq, "p": np.array(-1)})
    _same(x, seq[1])
    assert int(n) == 2


# SplitToSequence / ConcatFromSequence -------------------------------------------------

X = np.arange(24, dtype=F).reshape(2, 3, 4)


@pytest.mark.parametrize("opset", [11, 24])
@pytest.mark.parametrize(
    ("split", "axis", "keepdims"),
    [
        (None, 0, 1), (None, 1, 0), (None, -1, 1), (None, -1, 0),
        (np.array(2), 2, 1), (np.array(3), 2, 0),  # scalar split; the last chunk is smaller
        (np.array([1, 3]), -1, 1), (np.array([2, 0, 1], np.int32), 1, 0),
    ],
)
def test_split_to_sequence_matches_ort(opset, split, axis, keepdims):
    ort_opset = min(opset, 21)  # ORT's SplitToSequence kernel does not register opset 24
    ins = "float[2, 3, 4] x" + ("" if split is None else f", {_itype(split)} sp")
    args = "x" if split is None else "x, sp"
    text = f"""
    g ({ins}) => (seq(float[]) s) {{
       s = SplitToSequence <axis = {axis}, keepdims = {keepdims}> ({args})
    }}"""
    feeds = {"x": X} if split is None else {"x": X, "sp": split}
    if split is not None and not keepdims:
        # keepdims is ignored when split is given; onnxruntime squeezes anyway for a scalar
        # split (and fails unless it is 1), so compare with its keepdims=1 result
        ours = _ours(_model(text, opset), feeds)
        ref = run_ort(_model(text.replace("keepdims = 0", "keepdims = 1"), ort_opset), feeds)
        _same(ours, ref)
    elif opset == ort_opset:
        _check(_model(text, opset), feeds)
    else:
        _same(_ours(_model(text, opset), feeds), _ours(_model(text, ort_opset), feeds))


def _itype(a: np.ndarray) -> str:
    t = "int32" if a.dtype == np.int32 else "int64"
    return f"{t}[{','.join(map(str, a.shape))}]" if a.ndim else t


def test_split_to_sequence_pieces_are_copies_and_bad_splits_fail():
    model = _model("""
    g (float[2, 3, 4] x, int64[2] sp) => (seq(float[]) s) {
       s = SplitToSequence <axis = 2> (x, sp)
    }""")
    x = X.copy()
    (pieces,) = _ours(model, {"x": x, "sp": np.array([1, 3])})
    assert not any(np.shares_memory(p, x) for p in pieces)
    with pytest.raises(KernelError, match="sum to"):
        _ours(model, {"x": x, "sp": np.array([1, 2])})


def test_split_to_sequence_of_an_empty_axis_is_an_empty_sequence():
    model = _model("""
    g (float[N, 3] x) => (seq(float[]) s, int64 n) {
       s = SplitToSequence <axis = 0, keepdims = 0> (x)
       n = SequenceLength (s)
    }""")
    s, n = _ours(model, {"x": np.zeros((0, 3), F)})
    assert s == [] and int(n) == 0


@pytest.mark.parametrize(("axis", "new_axis"), [(0, 0), (1, 0), (-1, 0), (0, 1), (2, 1),
                                                (-1, 1), (-3, 1)])
def test_concat_from_sequence_matches_ort(axis, new_axis):
    model = _model(f"""
    g (float[2, 3] a, float[2, 3] b, float[2, 3] c) => (float[K, L] y) {{
       s = SequenceConstruct (a, b, c)
       y = ConcatFromSequence <axis = {axis}, new_axis = {new_axis}> (s)
    }}""".replace("float[K, L] y", "float[K, L, M] y" if new_axis else "float[K, L] y"), 11)
    (y,) = _check(model, {"a": A, "b": B, "c": C})
    ref = np.stack([A, B, C], axis) if new_axis else np.concatenate([A, B, C], axis)
    np.testing.assert_array_equal(y, ref)


def test_concat_from_sequence_errors():
    model = _model("""
    g (float[2, 3] a) => (float[K, L] y) {
       s = SequenceEmpty ()
       y = ConcatFromSequence <axis = 0> (s)
    }""", 11)
    with pytest.raises(KernelError, match="empty"):
        _ours(model, {"a": A})
    split_concat = _model("""
    g (float[2, 3, 4] x) => (float[2, 3, 4] y) {
       s = SplitToSequence <axis = 1> (x)
       y = ConcatFromSequence <axis = 1> (s)
    }""", 11)
    (y,) = _check(split_concat, {"x": X})
    np.testing.assert_array_equal(y, X)
    with pytest.raises(KernelError, match="out of range"):
        _ours(_model("""
        g (float[2, 3] a) => (float[K, L] y) {
           s = SequenceConstruct (a)
           y = ConcatFromSequence <axis = 2> (s)
        }""", 11, check=False), {"a": A})


# SequenceMap --------------------------------------------------------------------------

def test_sequence_map_two_sequences_and_a_broadcast_tensor_match_ort():
    model = _model("""
    g (seq(float[N]) x, seq(float[N]) y, float[N] t) => (seq(float[N]) s, seq(int64[1]) n) {
       s, n = SequenceMap (x, y, t) <body = b (float[N] xi, float[N] yi, float[N] ti)
             => (float[N] si, int64[1] ni) {
          p = Mul (xi, yi)
          si = Add (p, ti)
          ni = Shape (xi)
       }>
    }""")
    xs = [np.arange(3, dtype=F), np.ones(3, F) * 2]
    ys = [np.full(3, 3, F), np.arange(3, dtype=F)]
    s, n = _check(model, {"x": xs, "y": ys, "t": np.array([1, 2, 3], F)})
    t = np.array([1, 2, 3], F)
    _same(s, [xs[0] * ys[0] + t, xs[1] * ys[1] + t])
    _same(n, [np.array([3]), np.array([3])])


def test_sequence_map_over_an_empty_sequence_and_identity_bodies():
    model = _model("""
    g (seq(float[N]) x, float[2] t) => (seq(float[N]) s, seq(float[2]) u) {
       s, u = SequenceMap (x, t) <body = b (float[N] xi, float[2] ti)
             => (float[N] so, float[2] uo) {
          so = Identity (xi)
          uo = Identity (ti)
       }>
    }""")
    s, u = _ours(model, {"x": [], "t": np.array([1, 2], F)})
    assert s == [] and u == []
    xs = [np.arange(3, dtype=F), np.arange(2, dtype=F)]
    t = np.array([1, 2], F)
    s, u = _check(model, {"x": xs, "t": t})
    assert not any(np.shares_memory(a, b) for a, b in zip(s, xs))
    assert not any(np.shares_memory(a, t) for a in u)


def test_sequence_map_length_mismatch_is_a_clear_error():
    model = _model("""
    g (seq(float[N]) x, seq(float[N]) y) => (seq(float[N]) s) {
       s = SequenceMap (x, y) <body = b (float[N] xi, float[N] yi) => (float[N] si) {
          si = Add (xi, yi)
       }>
    }""")
    with pytest.raises(KernelError, match="has 1 elements"):
        _ours(model, {"x": [np.ones(2, F)] * 2, "y": [np.ones(2, F)]})


def test_sequence_map_reads_outer_scope_values():
    model = _model("""
    g (seq(float[N]) x, float w) => (seq(float[N]) s) {
       s = SequenceMap (x) <body = b (float[N] xi) => (float[N] si) { si = Mul (xi, w) }>
    }""")
    xs = [np.arange(3, dtype=F), np.arange(4, dtype=F)]
    (s,) = _check(model, {"x": xs, "w": np.array(2.5, F)})
    _same(s, [xs[0] * 2.5, xs[1] * 2.5])


# Optional -----------------------------------------------------------------------------

@pytest.mark.parametrize("opset", [15, 18, 21, 28])
def test_optional_construct_has_and_get(opset):
    model = _model("""
    g (float[2] x) => (bool full_has, bool empty_has, float[2] got, optional(float[2]) empty) {
       full = Optional (x)
       empty = Optional <type = float[2]> ()
       full_has = OptionalHasElement (full)
       empty_has = OptionalHasElement (empty)
       got = OptionalGetElement (full)
    }""", opset)
    x = np.array([1, 2], F)
    outs = InferenceSession.from_graph(model).run_outputs({"x": x})
    assert [o.kind for o in outs] == ["tensor", "tensor", "tensor", "optional"]
    assert outs[0].value.dtype == np.bool_ and bool(outs[0].value)
    assert outs[1].value.shape == () and not bool(outs[1].value)
    np.testing.assert_array_equal(outs[2].value, x)
    assert not np.shares_memory(outs[2].value, x)
    assert outs[3].value is None


def test_optional_of_sequence_and_plain_inputs_from_opset_18():
    model = _model("""
    g (seq(float[2]) s, float[2] x) => (bool hs, bool hx, seq(float[2]) gs, float[2] gx) {
       hs = OptionalHasElement (s)
       hx = OptionalHasElement (x)
       gs = OptionalGetElement (s)
       gx = OptionalGetElement (x)
    }""", 18)
    seq = [np.array([1, 2], F)]
    hs, hx, gs, gx = _check(model, {"s": seq, "x": np.array([3, 4], F)})
    assert bool(hs) and bool(hx)
    _same(gs, seq)
    _same(gx, np.array([3, 4], F))


def test_optional_graph_input_given_or_empty():
    model = _model("""
    g (optional(float[2]) o) => (bool h) {
       h = OptionalHasElement (o)
    }""", 18)
    s = InferenceSession.from_graph(model)
    assert bool(s.run({"o": np.array([1, 2], F)})[0])
    assert not bool(s.run({"o": None})[0])
    assert not bool(s.run({})[0])


def test_optional_get_element_of_an_empty_optional_fails():
    model = _model("""
    g (float[2] x) => (float[2] y) {
       e = Optional <type = float[2]> ()
       y = OptionalGetElement (e)
    }""", 18)
    with pytest.raises(KernelError, match="empty") as info:
        _ours(model, {"x": np.array([1, 2], F)})
    assert isinstance(info.value.__cause__, ValueError)
