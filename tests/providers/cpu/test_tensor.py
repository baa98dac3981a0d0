"""Shape-manipulation and generator kernels (providers/cpu/tensor.py) against onnxruntime."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from onnxkiln.testing import check_node as check
from onnxkiln.testing import run_node as ours

RNG = np.random.default_rng(0)



def arr(shape, dtype=np.float32):
    dt = np.dtype(dtype)
    if dt == np.bool_:
        return np.asarray(RNG.random(shape) > 0.5)
    if dt.kind in "iu":
        return RNG.integers(0, 50, shape).astype(dt)
    if dt.kind == "O":
        out = np.empty(shape, dtype=object)
        out.reshape(-1)[:] = [f"s{i}" for i in range(out.size)]
        return out
    return RNG.standard_normal(shape).astype(dt)


# Reshape


@pytest.mark.parametrize("opset", [5, 13, 14, 21])
@pytest.mark.parametrize(
    ("in_shape", "target"),
    [
        ((2, 3, 4), [0, -1]),
        ((2, 3, 4), [-1]),
        ((2, 3, 4), [4, 0, 2]),
        ((2, 3, 4), [2, 0, 2, -1]),
        ((24,), [2, 3, 4]),
        ((1,), []),
        ((0, 3), [-1, 0]),
        ((0, 3), [3, -1]),
    ],
)
def test_reshape_shape_input(opset, in_shape, target):
    x = arr(in_shape)
    s = np.array(target, np.int64)
    check("Reshape", {"x": x}, {"s": s}, opset=opset)  # constant shape
    check("Reshape", {"x": x, "s": s}, opset=opset)  # runtime shape


@pytest.mark.parametrize("dtype", [np.float16, np.bool_, np.int64, object])
def test_reshape_dtypes(dtype):
    x = arr((2, 6), dtype)
    check("Reshape", {"x": x}, {"s": np.array([3, -1], np.int64)}, opset=14)


def test_reshape_allowzero():
    x = arr((0, 3))
    (y,) = check("Reshape", {"x": x}, {"s": np.array([3, 0], np.int64)}, opset=14, allowzero=1)
    assert y.shape == (3, 0)
    x = arr((2, 3))
    (y,) = check("Reshape", {"x": x}, {"s": np.array([0, 3], np.int64)}, opset=14, allowzero=0)
    assert y.shape == (2, 3)


@pytest.mark.parametrize("opset", [1, 4])
def test_reshape_shape_attribute(opset):
    x = arr((2, 3, 4))
    (y,) = check("Reshape", {"x": x}, opset=opset, shape=[0, -1])
    np.testing.assert_array_equal(y, x.reshape(2, 12))


def test_reshape_bad_size_is_clear_error():
    x = arr((2, 3))
    with pytest.raises(Exception, match=r"cannot reshape a tensor of shape \[2, 3\]"):
        ours("Reshape", {"x": x, "s": np.array([4, -1], np.int64)}, opset=14)


# Transpose


@pytest.mark.parametrize("opset", [1, 13, 21])
@pytest.mark.parametrize("perm", [None, [0, 2, 1], [2, 0, 1]])
@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.int64, np.bool_, object])
def test_transpose(opset, perm, dtype):
    x = arr((2, 3, 4), dtype)
    attrs = {} if perm is None else {"perm": perm}
    check("Transpose", {"x": x}, opset=opset, **attrs)


def test_transpose_scalar_and_empty():
    check("Transpose", {"x": arr(())})
    check("Transpose", {"x": arr((0, 3))}, perm=[1, 0])


# Squeeze / Unsqueeze


@pytest.mark.parametrize("opset", [1, 11])
@pytest.mark.parametrize("axes", [None, [0], [-1], [0, 2]])
def test_squeeze_attr(opset, axes):
    if opset == 1 and axes == [-1]:
        axes = [3]
    x = arr((1, 3, 1, 1))
    attrs = {} if axes is None else {"axes": axes}
    check("Squeeze", {"x": x}, opset=opset, **attrs)


@pytest.mark.parametrize("opset", [13, 21])
@pytest.mark.parametrize("axes", [None, [0], [-1], [2, 0]])
def test_squeeze_input(opset, axes):
    x = arr((1, 3, 1, 1), np.int64)
    if axes is None:
        check("Squeeze", {"x": x}, opset=opset)
        return
    a = np.array(axes, np.int64)
    check("Squeeze", {"x": x}, {"a": a}, opset=opset)
    check("Squeeze", {"x": x, "a": a}, opset=opset)


def test_squeeze_non_unit_axis_is_error():
    with pytest.raises(Exception, match="has size 3, expected 1"):
        ours("Squeeze", {"x": arr((1, 3)), "a": np.array([1], np.int64)}, opset=13)


@pytest.mark.parametrize("opset", [1, 11])
@pytest.mark.parametrize("axes", [[0], [1, 0], [4], [0, 3]])
def test_unsqueeze_attr(opset, axes):
    x = arr((3, 4))
    if len(axes) == 1 and axes[0] == 4:
        axes = [2] if opset == 1 else [-1]
    check("Unsqueeze", {"x": x}, opset=opset, axes=axes)


@pytest.mark.parametrize("axes", [[0], [-1], [-1, 0], [1, 3]])
@pytest.mark.parametrize("dtype", [np.float16, object])
def test_unsqueeze_input(axes, dtype):
    x = arr((3, 4), dtype)
    a = np.array(axes, np.int64)
    check("Unsqueeze", {"x": x}, {"a": a}, opset=13)
    check("Unsqueeze", {"x": x, "a": a}, opset=21)


def test_unsqueeze_scalar():
    check("Unsqueeze", {"x": arr(())}, {"a": np.array([0, 1], np.int64)}, opset=13)


# Flatten / Identity


@pytest.mark.parametrize("opset", [1, 11, 13, 21])
@pytest.mark.parametrize("axis", [0, 1, 2, 3, -1, -3])
def test_flatten(opset, axis):
    if opset < 11 and axis < 0:
        axis += 3
    check("Flatten", {"x": arr((2, 3, 4))}, opset=opset, axis=axis)
    check("Flatten", {"x": arr((2, 0, 4))}, opset=opset, axis=axis)


@pytest.mark.parametrize("dtype", [np.float32, np.bool_, object, np.int8])
def test_identity(dtype):
    check("Identity", {"x": arr((2, 3), dtype)})
    check("Identity", {"x": arr((), dtype)}, opset=13)


# Concat / Split


@pytest.mark.parametrize("opset", [4, 11, 13])
@pytest.mark.parametrize("axis", [0, 1, -1])
def test_concat(opset, axis):
    if opset < 11 and axis < 0:
        axis = 2
    a, b, c = arr((2, 3, 4)), arr((2, 3, 4)), arr((2, 3, 4))
    check("Concat", {"a": a, "b": b, "c": c}, opset=opset, axis=axis)


@pytest.mark.parametrize("dtype", [np.float16, np.int32, np.bool_, object])
def test_concat_dtypes_and_empty(dtype):
    a, b, e = arr((2, 3), dtype), arr((2, 1), dtype), arr((2, 0), dtype)
    check("Concat", {"a": a, "e": e, "b": b}, axis=-1)
    check("Concat", {"a": a}, axis=0)


def test_concat_opset1_default_axis():
    a, b = arr((2, 3)), arr((2, 2))
    (y,) = ours("Concat", {"a": a, "b": b}, opset=1)
    np.testing.assert_array_equal(y, np.concatenate([a, b], 1))


@pytest.mark.parametrize("opset", [2, 11])
def test_split_attr(opset):
    x = arr((2, 7), np.int64)
    check("Split", {"x": x}, opset=opset, n=3, axis=1, split=[2, 4, 1])
    check("Split", {"x": arr((6, 2))}, opset=opset, n=3)
    if opset >= 11:
        check("Split", {"x": x}, opset=opset, n=2, axis=-1, split=[3, 4])


@pytest.mark.parametrize("opset", [13, 18, 21])
def test_split_input(opset):
    x = arr((2, 7))
    s = np.array([2, 0, 5], np.int64)
    check("Split", {"x": x}, {"s": s}, opset=opset, n=3, axis=1)
    check("Split", {"x": x, "s": s}, opset=opset, n=3, axis=-1)


@pytest.mark.parametrize(("dim", "parts"), [(10, 4), (7, 4), (9, 3), (3, 3), (2, 1)])
def test_split_num_outputs(dim, parts):
    x = arr((dim, 2), object)
    outs = check("Split", {"x": x}, opset=18, n=parts, num_outputs=parts)
    assert sum(o.shape[0] for o in outs) == dim


def test_split_equal_and_uneven_error():
    check("Split", {"x": arr((2, 6), np.bool_)}, opset=13, n=3, axis=1)
    with pytest.raises(Exception, match="not evenly splittable"):
        ours("Split", {"x": arr((2, 7))}, opset=11, n=3, axis=1)


def test_split_opset1_forms():
    x = arr((6, 2))
    outs = ours("Split", {"x": x}, opset=1, n=2, split=[2, 4])
    for got, want in zip(outs, np.split(x, [2])):
        np.testing.assert_array_equal(got, want)
    outs = ours("Split", {"x": x}, {"s": np.array([1, 5], np.int64)}, opset=1, n=2)
    for got, want in zip(outs, np.split(x, [1])):
        np.testing.assert_array_equal(got, want)


def test_split_outputs_do_not_alias_input():
    x = arr((4, 2))
    outs = ours("Split", {"x": x}, opset=13, n=2)
    assert not any(np.shares_memory(o, x) for o in outs)


# Expand / Tile


@pytest.mark.parametrize(
    ("in_shape", "shape"),
    [
        ((3, 1), (2, 1, 6)),
        ((3, 1), (3, 4)),
        ((2, 3), (1,)),
        ((), (2, 2)),
        ((1, 3), (0, 3)),
        ((4,), ()),
        ((2, 1, 1), (2, 3, 1)),
    ],
)
@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.int64, np.bool_])
def test_expand(in_shape, shape, dtype):
    x = arr(in_shape, dtype)
    s = np.array(shape, np.int64)
    (y,) = check("Expand", {"x": x}, {"s": s}, opset=13)
    assert y.flags.c_contiguous and y.flags.writeable
    check("Expand", {"x": x, "s": s}, opset=8)


def test_expand_mismatch_error():
    with pytest.raises(Exception, match="cannot be broadcast"):
        ours("Expand", {"x": arr((3,)), "s": np.array([4], np.int64)}, opset=13)


@pytest.mark.parametrize("reps", [[1, 1], [2, 3], [0, 2], [3, 1]])
@pytest.mark.parametrize("dtype", [np.float32, np.int32, np.bool_, object])
def test_tile(reps, dtype):
    x = arr((2, 3), dtype)
    r = np.array(reps, np.int64)
    check("Tile", {"x": x}, {"r": r}, opset=13)
    check("Tile", {"x": x, "r": r}, opset=6)


def test_tile_opset1():
    x = arr((2, 3))
    (y,) = ours("Tile", {"x": x}, {"t": np.array(3, np.int64), "a": np.array(1, np.int64)}, opset=1)
    np.testing.assert_array_equal(y, np.tile(x, (1, 3)))


# Shape / Size


@pytest.mark.parametrize("opset", [1, 13])
@pytest.mark.parametrize("shape", [(), (0,), (2, 3, 4)])
def test_shape_size(opset, shape):
    x = arr(shape)
    check("Shape", {"x": x}, opset=opset)
    check("Size", {"x": x}, opset=opset)


@pytest.mark.parametrize(
    ("start", "end"), [(0, None), (1, None), (-1, None), (-10, 2), (1, -1), (2, 10), (3, 1)]
)
def test_shape_start_end(start, end):
    attrs = {"start": start} if end is None else {"start": start, "end": end}
    (y,) = check("Shape", {"x": arr((2, 3, 4, 5), np.bool_)}, opset=15, **attrs)
    np.testing.assert_array_equal(y, np.array((2, 3, 4, 5)[start:end], np.int64))


# Constant / ConstantOfShape


def _const(opset=13, **attrs):
    return check("Constant", {}, opset=opset, **attrs)[0]


@pytest.mark.parametrize(
    "value",
    [
        np.arange(6, dtype=np.float32).reshape(2, 3),
        np.array(5, np.int64),
        np.array([True, False]),
        np.array([1.5, 2], np.float16),
        np.zeros((0, 2), np.int32),
    ],
)
def test_constant_value(value):
    from onnx import numpy_helper

    y = _const(opset=11, value=numpy_helper.from_array(value))
    np.testing.assert_array_equal(y, value)


def test_constant_string_tensor():
    from onnx import TensorProto, helper

    t = helper.make_tensor("t", TensorProto.STRING, [2], [b"ab", b"c"])
    np.testing.assert_array_equal(_const(opset=13, value=t), np.array(["ab", "c"], object))


def test_constant_scalar_and_list_forms():
    assert _const(value_float=1.5).dtype == np.float32
    np.testing.assert_array_equal(_const(value_floats=[1.0, 2.5]), np.array([1.0, 2.5], "f4"))
    assert _const(value_int=-3).shape == ()
    np.testing.assert_array_equal(_const(value_ints=[1, 2, 3]), np.array([1, 2, 3]))
    assert _const(value_string="hey").item() == "hey"
    np.testing.assert_array_equal(_const(value_strings=["a", "bc"]), np.array(["a", "bc"], "O"))


@pytest.mark.parametrize(
    "value",
    [
        None,
        np.array([7], np.int64),
        np.array([2.5], np.float16),
        np.array([True]),
        np.array([0], np.int32),
    ],
)
@pytest.mark.parametrize("shape", [[2, 3], [], [0, 4]])
def test_constant_of_shape(value, shape):
    from onnx import numpy_helper

    attrs = {} if value is None else {"value": numpy_helper.from_array(value)}
    s = np.array(shape, np.int64)
    check("ConstantOfShape", {"s": s}, opset=9, **attrs)
    check("ConstantOfShape", {}, {"s": s}, opset=21, **attrs)


def test_constant_of_shape_refuses_a_value_of_several_elements():
    """onnxruntime refuses it; taking the first element would run another model."""
    from onnx import numpy_helper

    from onnxkiln import SessionError

    with pytest.raises((ValueError, SessionError), match="must hold one element, got shape"):
        ours("ConstantOfShape", {"s": np.array([2], np.int64)}, opset=21,
             value=numpy_helper.from_array(np.array([1.0, 2.0], np.float32)))


def test_constant_of_shape_bfloat16():
    from onnx import TensorProto, helper

    value = helper.make_tensor("v", TensorProto.BFLOAT16, [1], [1.5])
    (y,) = ours("ConstantOfShape", {"s": np.array([2, 2], np.int64)}, opset=21, value=value)
    assert y.dtype == ml_dtypes.bfloat16
    np.testing.assert_array_equal(y.astype(np.float32), np.full((2, 2), 1.5, np.float32))


# Range / EyeLike / OneHot


@pytest.mark.parametrize(
    ("start", "limit", "delta"),
    [
        (0, 10, 1),
        (3, 9, 3),
        (10, 4, -2),
        (5, 5, 1),
        (5, 1, 1),
        (-3, 7, 4),
        (0.1, 100.0, 0.1),
        (1.0, -2.5, -0.3),
    ],
)
@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.int16, np.float32, np.float64])
def test_range(start, limit, delta, dtype):
    if np.dtype(dtype).kind == "i" and any(isinstance(v, float) for v in (start, limit, delta)):
        pytest.skip("float bounds")
    vals = {k: np.array(v, dtype) for k, v in zip("sld", (start, limit, delta))}
    check("Range", {}, vals, opset=11)


@pytest.mark.parametrize("dtype", [np.float16, ml_dtypes.bfloat16])
@pytest.mark.parametrize("stash_type", [0, 1])
def test_range_half_stash(dtype, stash_type):
    vals = {k: np.array(v, dtype) for k, v in zip("sld", (0.5, 30.0, 0.25))}
    (y,) = ours("Range", {}, vals, opset=27, stash_type=stash_type)
    assert y.dtype == dtype and y.shape == (118,)
    np.testing.assert_allclose(y.astype(np.float32), 0.5 + 0.25 * np.arange(118), rtol=1e-2)
    if dtype == np.float16 and stash_type == 1:
        check("Range", {}, vals, opset=27, stash_type=1)


def test_range_zero_delta_error():
    vals = {k: np.array(v, np.int64) for k, v in zip("sld", (0, 4, 0))}
    with pytest.raises(Exception, match="delta must not be zero"):
        ours("Range", vals, opset=11)


@pytest.mark.parametrize("k", [0, 1, -1, 5])
@pytest.mark.parametrize("shape", [(3, 3), (2, 4), (4, 2), (0, 3)])
@pytest.mark.parametrize(
    ("dtype", "to"),
    [(np.float32, None), (np.int64, None), (np.float32, 7), (np.int32, 11), (np.float16, 10)],
)
def test_eye_like(k, shape, dtype, to):
    attrs = {"k": k} if to is None else {"k": k, "dtype": to}
    check("EyeLike", {"x": arr(shape, dtype)}, opset=9, **attrs)


@pytest.mark.parametrize("axis", [-1, 0, 1, -2])
@pytest.mark.parametrize("opset", [9, 11])
def test_one_hot(axis, opset):
    idx = np.array([[0, 2, -1], [5, 1, -4]], np.int64)
    inits = {"d": np.array(4, np.int64), "v": np.array([-1, 3], np.float32)}
    check("OneHot", {"i": idx}, inits, opset=opset, axis=axis)


@pytest.mark.parametrize(
    ("idx_dtype", "depth_dtype", "val_dtype"),
    [
        (np.int32, np.int32, np.float32),
        (np.float32, np.float32, np.float32),
        (np.int64, np.int64, np.int64),
        (np.int64, np.float32, np.int32),
        (np.float32, np.int64, np.int64),
    ],
)
def test_one_hot_types(idx_dtype, depth_dtype, val_dtype):
    idx = np.array([0.5, 2.9, -1.2, 3], idx_dtype)
    inits = {"d": np.array([3], depth_dtype), "v": np.array([0, 1], val_dtype)}
    check("OneHot", {"i": idx}, inits, opset=11)


def test_one_hot_strings_numpy():
    idx = np.array([1, 0, 7], np.int64)
    vals = np.array(["off", "on"], dtype=object)
    (y,) = ours("OneHot", {"i": idx, "d": np.array(2, np.int64), "v": vals}, opset=11)
    np.testing.assert_array_equal(
        y, np.array([["off", "on"], ["on", "off"], ["off", "off"]], dtype=object)
    )


@pytest.mark.parametrize("indices, shape", [([0, 4, 5], [3]), ([0, 0, 1, 1, 1, 2], [3, 2])])
def test_constant_sparse_value_is_made_dense_as_onnxruntime_does(indices, shape):
    """Linear and coordinate indices; onnxruntime runs it when an op reads the constant."""
    import onnxruntime
    from onnx import TensorProto, helper

    from onnxkiln import InferenceSession

    values = helper.make_tensor("v", TensorProto.FLOAT, [3], [1.5, -2.0, 7.0])
    sparse = helper.make_sparse_tensor(
        values, helper.make_tensor("i", TensorProto.INT64, shape, indices), [2, 3])
    graph = helper.make_graph(
        [helper.make_node("Constant", [], ["c"], sparse_value=sparse),
         helper.make_node("Add", ["x", "c"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    x = arr((2, 3))
    (y,) = InferenceSession.from_graph(model).run({"x": x})
    ort = onnxruntime.InferenceSession(model.SerializeToString(),
                                       providers=["CPUExecutionProvider"])
    np.testing.assert_array_equal(y, ort.run(None, {"x": x})[0])
    np.testing.assert_array_equal(y, x + np.array([[1.5, 0, 0], [0, -2, 7]], np.float32))


def test_reshape_zero_past_input_rank_is_error():
    with pytest.raises(Exception, match="has a 0 beyond the input's 2 dims"):
        ours("Reshape", {"x": arr((2, 3)), "s": np.array([6, 1, 0], np.int64)}, opset=14)


def _kernel(op: str, opset: int, n_inputs: int, consts: dict | None = None, **attrs):
    """The CPU kernel of a one-node model, built as a plan builds it (constants as given)."""
    from onnx import TensorProto, helper

    from onnxkiln import loader
    from onnxkiln.plan import _node_info
    from onnxkiln.providers.cpu import REGISTRY

    names = [f"i{k}" for k in range(n_inputs)]
    graph = helper.make_graph(
        [helper.make_node(op, names, ["y"], **attrs)], "g",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in names],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    model = loader.from_graph(helper.make_model(graph, opset_imports=[
        helper.make_opsetid("", opset)]))
    (node,) = list(model.graph)
    info = _node_info(node, "", opset, list(range(n_inputs)), [100], consts or {}, {})
    return REGISTRY.resolve("", op, opset).build(info)


def test_reshape_and_unsqueeze_follow_each_call_after_the_last_calls_shape():
    """The kernels keep the last call's output shape: another input shape, another shape
    value of the same size, or a call that fails must not reuse it."""
    reshape = _kernel("Reshape", 17, 2)
    x = np.arange(12, dtype=np.float32)
    assert reshape(x.reshape(2, 6), np.array([3, -1])).shape == (3, 4)
    assert reshape(x.reshape(2, 6), np.array([4, -1])).shape == (4, 3)
    assert reshape(np.arange(24, dtype=np.float32), np.array([4, -1])).shape == (4, 6)
    with pytest.raises(ValueError, match="cannot reshape"):
        reshape(np.arange(10, dtype=np.float32), np.array([4, -1]))
    np.testing.assert_array_equal(reshape(x.reshape(2, 6), np.array([4, -1])),
                                  x.reshape(4, 3))
    unsqueeze = _kernel("Unsqueeze", 17, 2, {1: np.array([0, -1])})
    assert unsqueeze(x, None).shape == (1, 12, 1)
    assert unsqueeze(x.reshape(3, 4), None).shape == (1, 3, 4, 1)
    assert unsqueeze(np.float32(2.0).reshape(()), None).shape == (1, 1)
