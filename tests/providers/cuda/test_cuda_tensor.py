"""CUDA-provider torch kernels vs the numpy CPU provider: shape, layout and index ops."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="the CUDA provider's kernels are torch ops")

from cuda_harness import check_node  # noqa: E402

R = np.random.default_rng(1)
I64 = np.int64


def rand(shape, dtype=np.float32):
    dt = np.dtype(dtype)
    if dt.kind in "iu":
        return R.integers(0, 50, size=shape).astype(dt)
    if dt.kind == "b":
        return R.random(shape) < 0.5
    return R.standard_normal(shape).astype(dt)


def i64(*v):
    return np.array(v, I64)


@pytest.mark.parametrize("shape,allowzero,opset", [
    ((0, -1), 0, 13), ((4, 6), 0, 13), ((-1,), 0, 13), ((2, 0, 4), 0, 13),
    ((24, 0), 1, 14), ((1, 1, 1, 24), 0, 5)])
@pytest.mark.parametrize("dtype", [np.float32, np.int64, bool])
def test_reshape(shape, allowzero, opset, dtype):
    x = rand((2, 3, 4), dtype) if 0 not in shape or not allowzero else rand((0, 24), dtype)
    attrs = {"allowzero": allowzero} if opset >= 14 else {}
    check_node("Reshape", {"x": x}, initializers={"s": np.array(shape, I64)}, opset=opset,
               **attrs)


def test_reshape_v1_attribute():
    check_node("Reshape", {"x": rand((2, 3, 4))}, opset=4, shape=[0, -1])


@pytest.mark.parametrize("axis", [0, 1, 2, -1])
def test_flatten(axis):
    check_node("Flatten", {"x": rand((2, 3, 4))}, axis=axis)


@pytest.mark.parametrize("opset", [11, 13])
def test_squeeze_unsqueeze(opset):
    x = rand((1, 3, 1, 2))
    if opset >= 13:
        check_node("Squeeze", {"x": x}, initializers={"a": i64(0, -2)}, opset=opset)
        check_node("Unsqueeze", {"x": x}, initializers={"a": i64(0, -1, 3)}, opset=opset)
    else:
        check_node("Squeeze", {"x": x}, axes=[0, 2], opset=opset)
        check_node("Unsqueeze", {"x": x}, axes=[0, 5], opset=opset)
    check_node("Squeeze", {"x": x}, opset=opset)


@pytest.mark.parametrize("perm", [None, [0, 2, 1], [2, 0, 1]])
def test_transpose(perm):
    attrs = {} if perm is None else {"perm": perm}
    check_node("Transpose", {"x": rand((2, 3, 4))}, **attrs)


def test_identity_and_dropout():
    x = rand((2, 3))
    check_node("Identity", {"x": x})
    check_node("Dropout", {"x": x}, n_outputs=2, opset=13)


@pytest.mark.parametrize("axis", [0, 1, -1])
@pytest.mark.parametrize("dtype", [np.float16, np.int32, bool])
def test_concat(axis, dtype):
    shapes = [(2, 3, 4), (2, 3, 4), (2, 3, 4)]
    feeds = {f"x{i}": rand(s, dtype) for i, s in enumerate(shapes)}
    check_node("Concat", feeds, axis=axis)


def test_concat_with_empty():
    check_node("Concat", {"a": rand((2, 0)), "b": rand((2, 3))}, axis=1)


@pytest.mark.parametrize("case", ["attr", "input", "even", "num_outputs", "uneven"])
def test_split(case):
    x = rand((2, 7, 3))
    if case == "attr":
        check_node("Split", {"x": x}, n_outputs=3, axis=1, split=[2, 2, 3], opset=11)
    elif case == "input":
        check_node("Split", {"x": x}, n_outputs=2, axis=1, initializers={"s": i64(3, 4)})
    elif case == "even":
        check_node("Split", {"x": rand((2, 6))}, n_outputs=3, axis=-1)
    elif case == "num_outputs":
        check_node("Split", {"x": x}, n_outputs=3, axis=1, num_outputs=3, opset=18)
    else:
        check_node("Split", {"x": rand((5, 2))}, n_outputs=2, num_outputs=2, opset=18)


SLICES = [
    (i64(0, 1), i64(2, 3), i64(0, 2), i64(1, 1)),
    (i64(-1), i64(-100), i64(1), i64(-1)),
    (i64(3), i64(0), i64(2), i64(-2)),
    (i64(0), i64(2**62), i64(-1), i64(3)),
    (i64(5), i64(1), i64(1), i64(1)),  # empty
    (i64(10), i64(-10), i64(2), i64(-1)),
]


@pytest.mark.parametrize("starts,ends,axes,steps", SLICES)
def test_slice(starts, ends, axes, steps):
    check_node("Slice", {"x": rand((3, 6, 5))}, initializers={
        "s": starts, "e": ends, "a": axes, "t": steps})


def test_slice_v1_and_defaults():
    x = rand((3, 6, 5))
    check_node("Slice", {"x": x}, opset=9, starts=[1, 0], ends=[3, -1], axes=[0, 2])
    check_node("Slice", {"x": x}, initializers={"s": i64(1), "e": i64(3)})


@pytest.mark.parametrize("xs,shape", [((3, 1), (2, 3, 4)), ((3, 1), (1,)), ((1,), (2, 2)),
                                      ((2, 3), (2, 1, 3))])
def test_expand(xs, shape):
    check_node("Expand", {"x": rand(xs)}, initializers={"s": np.array(shape, I64)})


def test_tile():
    check_node("Tile", {"x": rand((2, 3), np.int32)}, initializers={"r": i64(2, 3)})
    check_node("Tile", {"x": rand((2, 3))}, initializers={"r": i64(1, 0)})


@pytest.mark.parametrize("mode", ["constant", "reflect", "edge", "wrap"])
@pytest.mark.parametrize("pads", [(0, 1, 2, 1, 0, 2), (1, 0, 0, 0, 2, 0), (0, -1, 1, 1, 1, -2)])
def test_pad(mode, pads):
    inits = {"p": np.array(pads, I64)}
    if mode == "constant":
        inits["v"] = np.float32(1.5)
    check_node("Pad", {"x": rand((3, 4, 5))}, initializers=inits, mode=mode, opset=19)


def test_pad_axes_int_and_v2():
    check_node("Pad", {"x": rand((3, 4), np.int64)},
               initializers={"p": i64(1, 2), "v": np.array(7, I64), "a": i64(-1)},
               opset=18)
    check_node("Pad", {"x": rand((3, 4))}, opset=2, pads=[1, 0, 0, 2], value=2.0)
    check_node("Pad", {"x": rand((3, 4))}, opset=2, pads=[1, 0, 0, 2], mode="edge")


@pytest.mark.parametrize("attrs", [{}, {"start": 1}, {"end": -1}, {"start": -2, "end": 10}])
def test_shape_size(attrs):
    x = rand((2, 3, 4))
    (y,) = check_node("Shape", {"x": x}, opset=19, **attrs)
    assert isinstance(y, np.ndarray)
    check_node("Size", {"x": x})


def test_constant_of_shape_and_range_and_constant():
    from onnx import numpy_helper
    check_node("ConstantOfShape", {}, initializers={"s": i64(2, 3)})
    check_node("ConstantOfShape", {}, initializers={"s": i64(2, 0)},
               value=numpy_helper.from_array(np.array([7], np.int32)))
    check_node("Range", {}, initializers={"a": np.float32(1), "b": np.float32(3.3),
                                          "c": np.float32(0.4)})
    check_node("Range", {}, initializers={"a": i64(10)[0], "b": i64(1)[0], "c": i64(-3)[0]})
    check_node("Constant", {}, value=numpy_helper.from_array(np.ones((2, 2), np.float32)))


@pytest.mark.parametrize("axis", [0, 1, -1])
@pytest.mark.parametrize("idx_dtype", [np.int64, np.int32])
def test_gather(axis, idx_dtype):
    x = rand((3, 4, 5))
    n = x.shape[axis]
    idx = np.array([[0, n - 1], [-1, 1]], idx_dtype)
    check_node("Gather", {"x": x, "i": idx}, axis=axis)
    check_node("Gather", {"x": x, "i": np.array(-2, idx_dtype)}, axis=axis)


def test_gather_raises_on_out_of_range_indices_and_unchecked_clamps():
    import onnxkiln.providers.cuda.index as m
    from onnxkiln.providers.cuda import REGISTRY
    spec = REGISTRY.resolve("", "Gather", 13)
    from cuda_harness import node_info

    from onnxkiln.testing import node_model
    x = np.arange(4, dtype=np.float32)
    info, _, _ = node_info(node_model("Gather", {"x": x, "i": np.array([0], I64)}))
    run = spec.build(info)
    with pytest.raises(IndexError, match=r"Gather: index 5 is out of range .* size 4"):
        run(torch.from_numpy(x), torch.tensor([5, -9, 2]))
    assert run(torch.from_numpy(x), torch.tensor([-4, 3])).tolist() == [0.0, 3.0]
    y = run.unchecked(torch.from_numpy(x), torch.tensor([5, -9, 2]))  # the capture-safe path
    assert y.tolist() == [3.0, 0.0, 2.0]
    assert m._norm_index(torch.tensor([-1]), 4).tolist() == [3]


@pytest.mark.parametrize("op,feeds,attrs", [
    ("Gather", {"x": np.zeros((3, 4), np.float32), "i": np.array([[0, 3]], I64)}, {"axis": 0}),
    ("GatherElements", {"x": np.zeros((3, 4), np.float32), "i": np.array([[0, -5]], I64)},
     {"axis": 1}),
    ("GatherND", {"x": np.zeros((2, 3, 4), np.float32), "i": np.array([[1, 3]], I64)}, {}),
    ("ScatterND", {"x": np.zeros((2, 3), np.float32), "i": np.array([[2]], I64),
                   "u": np.ones((1, 3), np.float32)}, {}),
    ("ScatterElements", {"x": np.zeros((2, 3), np.float32), "i": np.array([[7]], I64),
                         "u": np.ones((1, 1), np.float32)}, {"axis": 1}),
])
def test_out_of_range_indices_raise_on_both_providers(op, feeds, attrs):
    import onnxkiln as ok
    from onnxkiln.testing import node_model
    model = node_model(op, feeds, **attrs)
    for b in (ok.InferenceSession.builder().providers(["cpu"]),
              ok.InferenceSession.builder().providers(["cuda", "cpu"])
              .option("testing.cuda_on_torch_cpu", "1")):
        s = b.from_graph(model)
        with pytest.raises(ok.KernelError) as e:
            s.run(feeds)
        assert isinstance(e.value.__cause__, IndexError)
        assert op in str(e.value.__cause__) and "out of range" in str(e.value.__cause__)


def test_gather_elements_and_nd():
    x = rand((3, 4))
    idx = np.array([[0, 2, -1, 1], [2, 0, 0, 1]], I64)
    check_node("GatherElements", {"x": x, "i": idx}, axis=0)
    check_node("GatherElements", {"x": x, "i": np.array([[3, 0], [1, -4], [2, 2]], I64)},
               axis=1)
    check_node("GatherND", {"x": rand((2, 3, 4)), "i": np.array([[0, 1], [1, 2]], I64)})
    check_node("GatherND", {"x": rand((2, 3, 4)), "i": np.array([[1], [0]], I64)},
               batch_dims=1)


@pytest.mark.parametrize("reduction", ["none", "add", "mul", "max", "min"])
def test_scatter_nd(reduction):
    data = rand((4, 3))
    idx = np.array([[1], [3]], I64)
    upd = rand((2, 3))
    check_node("ScatterND", {"d": data, "i": idx, "u": upd}, reduction=reduction, opset=18)
    check_node("ScatterND", {"d": rand((2, 3, 2)), "i": np.array([[0, 1], [1, 2]], I64),
                             "u": rand((2, 2))}, reduction=reduction, opset=18)


@pytest.mark.parametrize("reduction", ["none", "add", "mul", "max", "min"])
@pytest.mark.parametrize("axis", [0, 1])
def test_scatter_elements(reduction, axis):
    data = rand((3, 4))
    idx = np.array([[1, 0, 2], [0, 2, 1]], I64) if axis == 0 else \
        np.array([[1, 3], [0, 2], [-1, 1]], I64)
    upd = rand(idx.shape)
    check_node("ScatterElements", {"d": data, "i": idx, "u": upd}, axis=axis,
               reduction=reduction, opset=18)


@pytest.mark.parametrize("largest", [0, 1])
@pytest.mark.parametrize("axis", [0, -1])
def test_topk(largest, axis):
    x = np.array([[3, 1, 3, 2], [5, 5, 0, 5], [1, 2, 3, 4]], np.float32)
    check_node("TopK", {"x": x}, initializers={"k": i64(2)}, n_outputs=2, largest=largest,
               axis=axis)
    check_node("TopK", {"x": x.astype(np.int64)}, initializers={"k": i64(3)}, n_outputs=2,
               largest=largest, axis=axis)


def test_topk_v1():
    check_node("TopK", {"x": rand((3, 5))}, n_outputs=2, k=2, opset=9)


@pytest.mark.parametrize("exclusive", [0, 1])
@pytest.mark.parametrize("reverse", [0, 1])
@pytest.mark.parametrize("dtype", [np.float32, np.int64, np.int32])
def test_cumsum(exclusive, reverse, dtype):
    check_node("CumSum", {"x": rand((3, 4), dtype)}, initializers={"a": i64(1)[0]},
               exclusive=exclusive, reverse=reverse)


@pytest.mark.parametrize("upper", [0, 1])
@pytest.mark.parametrize("k", [None, -1, 2])
def test_trilu(upper, k):
    inits = {} if k is None else {"k": i64(k)[0]}
    check_node("Trilu", {"x": rand((2, 3, 4))}, initializers=inits, upper=upper)


@pytest.mark.parametrize("eq,shapes", [("ij,jk->ik", [(2, 3), (3, 4)]),
                                       ("bij->bji", [(2, 3, 4)]),
                                       ("i,i", [(5,), (5,)]), ("...ij,...jk", [(2, 2, 3),
                                                                                (2, 3, 2)])])
def test_einsum(eq, shapes):
    feeds = {f"x{i}": rand(s) for i, s in enumerate(shapes)}
    check_node("Einsum", feeds, equation=eq)


@pytest.mark.parametrize("axis", [-1, 0, 1])
def test_one_hot(axis):
    check_node("OneHot", {"i": np.array([[0, 2], [-1, 1]], I64)},
               initializers={"d": i64(3)[0], "v": np.array([0.5, 2.0], np.float32)}, axis=axis)


def test_gather_scalar_index_of_a_vector_gives_a_scalar():
    (y,) = check_node("Gather", {"x": np.array([1, 8], I64), "i": np.array(1, I64)})
    assert tuple(y.shape) == ()


def test_one_hot_float_indices():
    check_node("OneHot", {"i": np.array([0.0, 2.7, -1.0], np.float32)},
               initializers={"d": np.array(3.0, np.float32), "v": np.array([0, 5], I64)})


@pytest.mark.parametrize("exclusive", [0, 1])
@pytest.mark.parametrize("reverse", [0, 1])
def test_cumprod(exclusive, reverse):
    x = R.uniform(0.5, 1.5, size=(3, 4)).astype(np.float32)
    check_node("CumProd", {"x": x}, initializers={"a": i64(-1)[0]}, exclusive=exclusive,
               reverse=reverse, opset=26)


@pytest.mark.parametrize("x", [np.array([[1, 0], [0, 3]], np.int32), np.array(2.0, np.float32),
                               np.zeros((2, 3), bool)])
def test_nonzero(x):
    check_node("NonZero", {"x": x})


@pytest.mark.parametrize("axis", [None, 0, 1])
def test_compress(axis):
    attrs = {} if axis is None else {"axis": axis}
    check_node("Compress", {"x": rand((3, 4)), "c": np.array([True, False, True])}, **attrs)
