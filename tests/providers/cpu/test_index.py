"""Indexing kernels (providers/cpu/index.py) against onnxruntime."""

from __future__ import annotations

import numpy as np
import pytest

from onnxkiln import InferenceSession
from onnxkiln.testing import check_node as check
from onnxkiln.testing import run_node as ours

RNG = np.random.default_rng(1)
I64 = np.int64
BIG = np.iinfo(np.int64).max



def arr(shape, dtype=np.float32):
    dt = np.dtype(dtype)
    if dt == np.bool_:
        return np.asarray(RNG.random(shape) > 0.5)
    if dt.kind in "iu":
        return np.asarray(RNG.integers(0, 50, shape).astype(dt))
    if dt.kind == "O":
        out = np.empty(shape, dtype=object)
        out.reshape(-1)[:] = [f"s{i}" for i in range(out.size)]
        return out
    return np.asarray(RNG.standard_normal(shape).astype(dt))


# Slice

SLICE_CASES = [
    # starts, ends, axes, steps
    ([0, 1], [2, 3], None, None),
    ([1], [BIG], [1], None),
    ([-1], [-BIG], [0], [-1]),
    ([-3, 10], [-1, 1], [0, 2], [1, -2]),
    ([5], [1], [-1], [-1]),
    ([-100], [100], [1], [3]),
    ([2], [2], [0], [1]),
    ([100], [-100], [2], [-1]),
    ([0, 0, 3], [-1, BIG, 0], [2, 0, 1], [2, 1, -1]),
    ([3], [-7], [1], [-2]),
]


@pytest.mark.parametrize(("starts", "ends", "axes", "steps"), SLICE_CASES)
@pytest.mark.parametrize("index_dtype", [np.int64, np.int32])
def test_slice_inputs(starts, ends, axes, steps, index_dtype):
    x = arr((4, 5, 6))
    lim = np.iinfo(index_dtype)
    vals = {k: np.array(np.clip(v, lim.min, lim.max), index_dtype)
            for k, v in (("s", starts), ("e", ends))}  # fmt: skip
    if axes is not None:
        vals["a"] = np.array(axes, index_dtype)
    if steps is not None:
        if axes is None:
            vals["a"] = np.arange(len(starts), dtype=index_dtype)
        vals["t"] = np.array(steps, index_dtype)
    check("Slice", {"x": x}, vals, opset=13)  # constant starts/ends/...
    check("Slice", {"x": x, **vals}, opset=10)  # runtime starts/ends/...


@pytest.mark.parametrize("opset", [1, 9])
@pytest.mark.parametrize(
    ("starts", "ends", "axes"),
    [([0, 1], [2, 3], None), ([1], [BIG], [1]), ([-3], [-1], [-1]), ([-10], [10], [0])],
)
def test_slice_attributes(opset, starts, ends, axes):
    if opset == 1 and axes == [-1]:
        axes = [2]
    attrs = {"starts": starts, "ends": ends}
    if axes is not None:
        attrs["axes"] = axes
    check("Slice", {"x": arr((4, 5, 6), np.int32)}, opset=opset, **attrs)


@pytest.mark.parametrize("dtype", [np.float16, np.bool_, object, np.uint8])
def test_slice_dtypes_and_empty(dtype):
    x = arr((3, 4), dtype)
    vals = {"s": np.array([1, -1], I64), "e": np.array([3, -5], I64),
            "a": np.array([0, 1], I64), "t": np.array([1, -1], I64)}  # fmt: skip
    check("Slice", {"x": x}, vals, opset=13)
    e = arr((0, 4), dtype)
    check("Slice", {"x": e}, vals, opset=13)
    vals["t"] = np.array([1, 2], I64)
    vals["e"] = np.array([3, 10], I64)
    check("Slice", {"x": e}, vals, opset=13)


def test_slice_zero_step_error():
    vals = {"s": np.array([0], I64), "e": np.array([1], I64), "a": np.array([0], I64),
            "t": np.array([0], I64)}  # fmt: skip
    with pytest.raises(Exception, match="steps must not be 0"):
        ours("Slice", {"x": arr((3,))}, vals, opset=13)


# Gather family


@pytest.mark.parametrize("opset", [1, 11, 13])
@pytest.mark.parametrize("axis", [0, 1, -1])
@pytest.mark.parametrize("idx_shape", [(), (3,), (2, 2), (0,)])
@pytest.mark.parametrize("index_dtype", [np.int64, np.int32])
def test_gather(opset, axis, idx_shape, index_dtype):
    if opset == 1 and axis < 0:
        axis = 2
    x = arr((3, 4, 5))
    size = x.shape[axis]
    lo = -size if opset >= 11 else 0
    idx = RNG.integers(lo, size, idx_shape).astype(index_dtype)
    check("Gather", {"x": x, "i": idx}, opset=opset, axis=axis)
    if opset >= 13:
        check("Gather", {"x": x}, {"i": idx}, opset=opset, axis=axis)


@pytest.mark.parametrize("dtype", [np.float16, np.int64, np.bool_])
def test_gather_dtypes(dtype):
    x = arr((5, 3), dtype)
    check("Gather", {"x": x, "i": np.array([[4, -5], [0, 2]], I64)}, axis=0)


def test_gather_strings_numpy():
    x = np.array(["a", "bb", "ccc", "d"], dtype=object)
    idx = np.array([[3, -4], [1, 1]], I64)
    (y,) = ours("Gather", {"x": x, "i": idx}, opset=13)
    np.testing.assert_array_equal(y, x[idx])
    assert y.dtype == object


@pytest.mark.parametrize("bad", [5, -6])
def test_gather_out_of_range_names_index_and_size(bad):
    x = arr((5, 2))
    with pytest.raises(Exception, match=rf"index {bad} is out of range for axis 0 of size 5"):
        ours("Gather", {"x": x, "i": np.array([0, bad], I64)}, opset=13)
    with pytest.raises(Exception, match=rf"index {bad} is out of range for axis 0 of size 5"):
        ours("Gather", {"x": x, "i": np.array(bad, I64)}, opset=13)


def test_gather_result_does_not_alias():
    x = arr((4, 3))
    (y,) = ours("Gather", {"x": x, "i": np.array(1, I64)}, opset=13)
    assert not np.shares_memory(x, y)


@pytest.mark.parametrize("axis", [0, 1, -1])
@pytest.mark.parametrize("index_dtype", [np.int64, np.int32])
@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.int64])
def test_gather_elements(axis, index_dtype, dtype):
    x = arr((3, 4), dtype)
    size = x.shape[axis]
    idx = RNG.integers(-size, size, (3, 4)).astype(index_dtype)
    check("GatherElements", {"x": x, "i": idx}, opset=13, axis=axis)
    small = idx[:2, :3]
    check("GatherElements", {"x": x, "i": small}, opset=11, axis=axis)


def test_gather_elements_out_of_range():
    with pytest.raises(Exception, match="index 4 is out of range for axis 1 of size 4"):
        ours("GatherElements", {"x": arr((2, 4)), "i": np.array([[0], [4]], I64)}, axis=1)


@pytest.mark.parametrize(
    ("data_shape", "idx", "batch_dims"),
    [
        ((2, 2), [[0, 0], [1, 1]], 0),
        ((2, 2), [[1], [0]], 0),
        ((2, 2, 2), [[0, 1], [1, 0]], 0),
        ((2, 2, 2), [[[0, 1]], [[1, 0]]], 0),
        ((2, 2, 2), [[1], [0]], 1),
        ((2, 3, 4), [[[1, -1], [0, 2]], [[2, 3], [-3, 0]]], 1),
        ((2, 2, 4), [[[1], [2]], [[0], [-1]]], 2),
        ((3, 4), np.zeros((2, 0), I64), 0),
        ((3, 4), np.zeros((0, 1), I64), 0),
    ],
)
@pytest.mark.parametrize("index_dtype", [np.int64])
def test_gather_nd(data_shape, idx, batch_dims, index_dtype):
    x = arr(data_shape)
    i = np.array(idx, index_dtype)
    check("GatherND", {"x": x, "i": i}, opset=13, batch_dims=batch_dims)
    if batch_dims == 0:
        check("GatherND", {"x": x, "i": i}, opset=11)


def test_gather_nd_strings_and_error():
    x = np.array([["a", "b"], ["c", "d"]], dtype=object)
    (y,) = ours("GatherND", {"x": x, "i": np.array([[1, 0], [0, -1]], I64)}, opset=13)
    np.testing.assert_array_equal(y, np.array(["c", "b"], object))
    with pytest.raises(Exception, match="out of range for a dimension of size 2"):
        ours("GatherND", {"x": x, "i": np.array([[2, 0]], I64)}, opset=13)


# Scatter family


@pytest.mark.parametrize(
    ("opset", "reduction"),
    [(11, None), (13, None), (16, "none"), (16, "add"), (16, "mul"), (18, "max"), (18, "min")],
)
def test_scatter_nd(opset, reduction):
    attrs = {} if reduction is None else {"reduction": reduction}
    x = arr((4, 4, 4))
    unique = reduction in (None, "none")
    idx = np.array([[0], [2]], I64) if unique else np.array([[0], [2], [0]], I64)
    upd = arr((idx.shape[0], 4, 4))
    check("ScatterND", {"x": x, "i": idx, "u": upd}, opset=opset, **attrs)
    idx2 = np.array([[1, 2], [-1, 0]], I64)
    check("ScatterND", {"x": x, "i": idx2, "u": arr((2, 4))}, opset=opset, **attrs)
    check("ScatterND", {"x": x, "i": np.zeros((0, 2), I64), "u": arr((0, 4))}, opset=opset)


@pytest.mark.parametrize("dtype", [np.int64, np.float16, np.bool_])
def test_scatter_nd_dtypes(dtype):
    x = arr((5,), dtype)
    check("ScatterND", {"x": x, "i": np.array([[4], [1]], I64), "u": arr((2,), dtype)}, opset=13)


@pytest.mark.parametrize(
    ("opset", "reduction"),
    [(11, None), (13, None), (16, "add"), (16, "mul"), (18, "max"), (18, "min")],
)
@pytest.mark.parametrize("axis", [0, 1, -1])
def test_scatter_elements(opset, reduction, axis):
    attrs = {} if reduction is None else {"reduction": reduction}
    x = arr((3, 4))
    size = x.shape[axis]
    if reduction is None:
        idx = np.array([np.roll(np.arange(-size, 0) if axis else np.arange(size), k)[:2]
                        for k in range(2)], I64)  # fmt: skip
        idx = idx if axis else idx.T
    else:
        idx = RNG.integers(-size, size, (2, 2)).astype(I64)
    upd = arr(idx.shape)
    check("ScatterElements", {"x": x, "i": idx, "u": upd}, opset=opset, axis=axis, **attrs)
    check("ScatterElements", {"x": x, "i": idx.astype(np.int32), "u": upd}, opset=opset, axis=axis)


def test_scatter_deprecated_alias():
    x = arr((3, 3))
    idx = np.array([[1, 0, 2], [0, 2, 1]], I64)
    check("Scatter", {"x": x, "i": idx, "u": arr((2, 3))}, opset=9, axis=0)
    ours_out = ours("Scatter", {"x": x, "i": idx, "u": arr((2, 3))}, opset=11, axis=1)[0]
    assert ours_out.shape == (3, 3)


def test_scatter_elements_out_of_range():
    with pytest.raises(Exception, match="index 3 is out of range for axis 0 of size 3"):
        ours("ScatterElements", {"x": arr((3,)), "i": np.array([3], I64), "u": arr((1,))})


# Pad


PAD_CASES = [
    [0, 1, 1, 0],
    [1, 2, 2, 1],
    [0, 0, 0, 0],
    [2, 0, 0, 2],
]


@pytest.mark.parametrize("mode", ["constant", "reflect", "edge", "wrap"])
@pytest.mark.parametrize("pads", PAD_CASES)
def test_pad_inputs(mode, pads):
    if mode == "wrap" and pads[1] + pads[3] > 4:
        pads = [1, 1, 1, 1]
    x = arr((3, 4))
    p = np.array(pads, I64)
    inits = {"p": p, "v": np.array(2.5, np.float32)} if mode == "constant" else {"p": p}
    opset = 19 if mode == "wrap" else 13
    (y,) = check("Pad", {"x": x}, inits, opset=opset, mode=mode)
    assert not np.shares_memory(x, y)
    check("Pad", {"x": x, "p": p}, opset=max(opset, 11), mode=mode)


def test_pad_reflect_beyond_axis_is_error():
    with pytest.raises(Exception, match="reflect"):
        ours("Pad", {"x": arr((3, 4))}, {"p": np.array([0, 0, 3, 0], I64)}, mode="reflect")


def test_pad_negative_crops():
    x = arr((4, 5))
    check("Pad", {"x": x}, {"p": np.array([-1, 2, 1, -2], I64)}, opset=13)


@pytest.mark.parametrize("mode", ["constant", "reflect", "edge"])
def test_pad_axes(mode):
    x = arr((2, 3, 4), np.int64)
    inits = {"p": np.array([1, 2, 2, 0], I64), "v": np.array(7, I64), "a": np.array([-1, 1], I64)}
    if mode != "constant":
        inits["v"] = np.array(0, I64)
    check("Pad", {"x": x}, inits, opset=18, mode=mode)
    check("Pad", {"x": x, "p": inits["p"], "v": inits["v"], "a": inits["a"]}, opset=21, mode=mode)


@pytest.mark.parametrize("dtype", [np.float16, np.int32, np.bool_, np.uint8])
def test_pad_dtypes(dtype):
    check("Pad", {"x": arr((2, 3), dtype)}, {"p": np.array([1, 0, 0, 1], I64)}, opset=13)


@pytest.mark.parametrize("opset", [2, 10])
@pytest.mark.parametrize("mode", ["constant", "reflect", "edge"])
def test_pad_attributes(opset, mode):
    check("Pad", {"x": arr((3, 4))}, opset=opset, mode=mode, pads=[1, 2, 2, 1], value=1.5)


def test_pad_opset1_paddings():
    x = arr((2, 2))
    (y,) = ours("Pad", {"x": x}, opset=1, paddings=[1, 0, 0, 1], value=3.0)
    np.testing.assert_array_equal(y, np.pad(x, [(1, 0), (0, 1)], constant_values=3.0))


def test_pad_empty_constant():
    check("Pad", {"x": arr((0, 3))}, {"p": np.array([1, 1, 0, 0], I64)}, opset=13)


# Where / Trilu / CumSum


@pytest.mark.parametrize(
    ("cs", "xs", "ys"),
    [((2, 3), (2, 3), (2, 3)), ((3,), (2, 3), ()), ((2, 1), (1, 3), (2, 3)), ((), (), ()),
     ((0, 3), (1, 3), (3,))],
)  # fmt: skip
@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.int64, np.bool_, np.uint8])
def test_where(cs, xs, ys, dtype):
    if dtype == np.bool_:  # onnxruntime has no bool Where
        c, x, y = arr(cs, np.bool_), arr(xs, dtype), arr(ys, dtype)
        np.testing.assert_array_equal(
            ours("Where", {"c": c, "x": x, "y": y}, opset=16)[0], np.where(c, x, y)
        )
        return
    check("Where", {"c": arr(cs, np.bool_), "x": arr(xs, dtype), "y": arr(ys, dtype)}, opset=16)


def test_where_strings_numpy():
    c = np.array([True, False])
    x = np.array(["a", "b"], dtype=object)
    y = np.array(["z"], dtype=object)
    (out,) = ours("Where", {"c": c, "x": x, "y": y}, opset=9)
    np.testing.assert_array_equal(out, np.array(["a", "z"], object))


@pytest.mark.parametrize("upper", [0, 1])
@pytest.mark.parametrize("k", [None, 0, 1, -1, 5, -5])
@pytest.mark.parametrize("shape", [(4, 4), (3, 5), (2, 3, 4), (0, 3)])
def test_trilu(upper, k, shape):
    x = arr(shape)
    if k is None:
        check("Trilu", {"x": x}, opset=14, upper=upper)
    else:
        check("Trilu", {"x": x}, {"k": np.array(k, I64)}, opset=14, upper=upper)
        check("Trilu", {"x": x, "k": np.array(k, I64)}, opset=14, upper=upper)


@pytest.mark.parametrize("dtype", [np.int64, np.int32, np.float64, np.bool_])
def test_trilu_dtypes(dtype):
    check("Trilu", {"x": arr((3, 3), dtype)}, opset=14, upper=0)


@pytest.mark.parametrize("exclusive", [0, 1])
@pytest.mark.parametrize("reverse", [0, 1])
@pytest.mark.parametrize("axis", [0, 1, -1])
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int32, np.int64])
def test_cumsum(exclusive, reverse, axis, dtype):
    x = arr((3, 4), dtype)
    for axis_dtype in (np.int64, np.int32):
        a = np.array(axis, axis_dtype)
        check("CumSum", {"x": x, "a": a}, opset=11, exclusive=exclusive, reverse=reverse)
    check("CumSum", {"x": x}, {"a": np.array([axis], I64)}, opset=14, exclusive=exclusive,
          reverse=reverse)  # fmt: skip


def test_cumsum_half_and_edge_sizes():
    x = arr((5, 1)).astype(np.float16)
    check("CumSum", {"x": x}, {"a": np.array(0, I64)}, opset=14, exclusive=1)
    check("CumSum", {"x": x}, {"a": np.array(1, I64)}, opset=14, exclusive=1, reverse=1)
    check("CumSum", {"x": arr((0, 3))}, {"a": np.array(0, I64)}, opset=14, exclusive=1)


# NonZero / Compress / ReverseSequence


@pytest.mark.parametrize("shape", [(), (5,), (3, 4), (2, 0), (2, 3, 2)])
@pytest.mark.parametrize("dtype", [np.float32, np.int64, np.bool_, np.uint8])
def test_nonzero(shape, dtype):
    x = arr(shape, dtype)
    if dtype != np.bool_:
        x = np.asarray((x * (arr(shape) > 0)).astype(dtype))
    check("NonZero", {"x": x}, opset=13)
    check("NonZero", {"x": np.zeros(shape, dtype)}, opset=9)


def test_nonzero_strings_numpy():
    x = np.array([["a", ""], ["", "b"]], dtype=object)
    (y,) = ours("NonZero", {"x": x}, opset=13)
    np.testing.assert_array_equal(y, np.array([[0, 1], [0, 1]], I64))


@pytest.mark.parametrize("axis", [None, 0, 1, -1])
@pytest.mark.parametrize("cond", [[True, False, True], [False, False, False], [True], []])
@pytest.mark.parametrize("opset", [9, 11])
def test_compress(axis, cond, opset):
    if opset == 9 and axis == -1:
        axis = 1
    x = arr((3, 3))
    attrs = {} if axis is None else {"axis": axis}
    check("Compress", {"x": x, "c": np.array(cond, bool)}, opset=opset, **attrs)


def test_compress_dtypes():
    c = np.array([True, False, True, True])
    check("Compress", {"x": arr((4, 2), np.int32), "c": c}, axis=0)
    check("Compress", {"x": arr((2, 4), np.float16), "c": c}, axis=1)


@pytest.mark.parametrize(("batch_axis", "time_axis"), [(1, 0), (0, 1)])
def test_reverse_sequence(batch_axis, time_axis):
    shape = [0, 0, 3]
    shape[batch_axis], shape[time_axis] = 4, 5
    x = arr(tuple(shape))
    lens = np.array([5, 0, 2, 1], I64)
    check("ReverseSequence", {"x": x, "l": lens}, opset=10, batch_axis=batch_axis,
          time_axis=time_axis)  # fmt: skip


# Memory contract: kernels not declared as views never return an input's memory


def _kernel(op, opset, n_inputs, n_outputs=1, **attrs):
    import onnx

    from onnxkiln.providers.base import NodeInfo
    from onnxkiln.providers.cpu import REGISTRY

    spec = REGISTRY.resolve("", op, opset)
    schema = onnx.defs.get_schema(op, opset)
    full = {}
    for name, a in schema.attributes.items():
        if a.default_value.type != onnx.AttributeProto.UNDEFINED:
            full[name] = onnx.helper.get_attribute_value(a.default_value)
    full.update(attrs)
    info = NodeInfo(name="n", op_type=op, domain="", opset=opset, attrs=full,
                    n_inputs=n_inputs, n_outputs=n_outputs,
                    input_present=(True,) * n_inputs, output_present=(True,) * n_outputs,
                    const_inputs=(None,) * n_inputs)  # fmt: skip
    return spec, spec.build(info)


X = np.arange(12, dtype=np.float32).reshape(3, 4)
NO_ALIAS = [
    ("Expand", 13, (X, np.array([3, 4], I64)), {}),
    ("Tile", 13, (X, np.array([1, 1], I64)), {}),
    ("Concat", 13, (X,), {"axis": 0}),
    ("Split", 18, (X,), {"axis": 0, "num_outputs": 1}),
    ("Pad", 19, (X, np.zeros(4, I64)), {}),
    ("Pad", 19, (X, np.zeros(4, I64)), {"mode": "edge"}),
    ("Where", 16, (np.ones((3, 4), bool), X, np.float32(0).reshape(())), {}),
    ("CumSum", 14, (X, np.array(0, I64)), {}),
    ("CumSum", 14, (X, np.array(0, I64)), {"reverse": 1}),
    ("Trilu", 14, (X,), {}),
    ("Compress", 11, (X, np.ones(3, bool)), {"axis": 0}),
    ("Gather", 13, (X, np.array(1, I64)), {}),
    ("Gather", 13, (X, np.array([0, 1, 2], I64)), {}),
    ("GatherElements", 13, (X, np.zeros((3, 4), I64)), {}),
    ("GatherND", 13, (X, np.zeros((1, 0), I64)), {}),
    ("ScatterND", 18, (X, np.zeros((0, 1), I64), np.zeros((0, 4), np.float32)), {}),
    ("ScatterElements", 18, (X, np.zeros((0, 4), I64), np.zeros((0, 4), np.float32)), {}),
    ("ReverseSequence", 10, (X, np.zeros(4, I64)), {}),
]


@pytest.mark.parametrize(("op", "opset", "inputs", "attrs"), NO_ALIAS)
def test_non_view_kernels_do_not_alias_inputs(op, opset, inputs, attrs):
    spec, fn = _kernel(op, opset, len(inputs), **attrs)
    assert not spec.view
    outs = fn(*inputs)
    outs = outs if spec.multi_output else (outs,)
    for out in outs:
        assert not any(np.shares_memory(out, x) for x in inputs if isinstance(x, np.ndarray))


def test_view_kernels_are_declared():
    from onnxkiln.providers.cpu import REGISTRY

    for op in ("Reshape", "Squeeze", "Unsqueeze", "Flatten", "Identity", "Transpose", "Slice"):
        assert all(s.view for s in REGISTRY if s.op_type == op and s.domain == ""), op


def test_split_skips_absent_outputs():
    from onnx import helper

    from onnxkiln.testing import make_model, tensor_info

    x = np.arange(12, dtype=np.float32).reshape(6, 2)
    node = helper.make_node("Split", ["x"], ["a", "", "c"], axis=0, num_outputs=3)
    model = make_model(
        [node], [tensor_info("x", np.float32, (6, 2))],
        [tensor_info("a", np.float32, (2, 2)), tensor_info("c", np.float32, (2, 2))], opset=18,
    )  # fmt: skip
    a, c = InferenceSession.builder().from_graph(model).run({"x": x})  # onnxruntime segfaults
    np.testing.assert_array_equal(a, x[:2])
    np.testing.assert_array_equal(c, x[4:])


def test_compress_condition_longer_than_axis():
    x = arr((2, 3))
    check("Compress", {"x": x, "c": np.array([True, False, True, True])}, axis=1)
    check("Compress", {"x": x, "c": np.array([True, False, False, True, False, False, True])})


def test_pad_wrap_more_than_axis():
    check("Pad", {"x": arr((2, 3))}, {"p": np.array([0, 4, 0, 5], I64)}, opset=19, mode="wrap")
