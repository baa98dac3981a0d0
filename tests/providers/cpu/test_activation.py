"""Activation kernels and Clip against onnxruntime (numpy where onnxruntime has no kernel)."""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest
import scipy.special

from onnxkiln.testing import assert_matches_ort, node_model
from onnxkiln.testing import run_ours as ours

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")

F32, F16, F64 = np.float32, np.float16, np.float64
BF16 = ml_dtypes.bfloat16
TOL = {F32: (1e-5, 1e-6), F64: (1e-12, 1e-12), F16: (1e-3, 1e-3)}



def data(dtype, shape=(2, 3, 5), scale=4.0, seed=0):
    """Random values plus, for larger shapes, extremes that exercise overflow paths."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(shape) * scale
    if x.size >= 8:
        flat = x.reshape(-1)
        flat[:6] = [0.0, -0.0, 30.0, -30.0, 95.0, -95.0]
    return np.asarray(x, dtype)


def check(op, feeds, dtype=F32, opset=21, rtol=None, atol=None, initializers=None, **attrs):
    r, a = TOL.get(dtype, (0, 0))
    model = node_model(op, feeds, opset=opset, initializers=initializers, **attrs)
    return assert_matches_ort(model, feeds, rtol if rtol is not None else r, atol or a)


# name -> (attribute sets, float64 supported by onnxruntime, first opset)
ACTIVATIONS = {
    "Relu": ([{}], True, 6),
    "LeakyRelu": ([{}, {"alpha": 0.5}, {"alpha": 1.5}, {"alpha": -0.2}], False, 6),
    "Sigmoid": ([{}], True, 6),
    "HardSigmoid": ([{}, {"alpha": 0.3, "beta": 0.4}], False, 6),
    "HardSwish": ([{}], False, 14),
    "Tanh": ([{}], True, 6),
    "Elu": ([{}, {"alpha": 0.3}], False, 6),
    "Selu": ([{}, {"alpha": 1.2, "gamma": 0.8}], False, 6),
    "Celu": ([{}, {"alpha": 2.0}], False, 12),
    "Softplus": ([{}], False, 1),
    "Softsign": ([{}], False, 1),
    "Mish": ([{}], False, 18),
    "Gelu": ([{}, {"approximate": "tanh"}], False, 20),
    "ThresholdedRelu": ([{}, {"alpha": -0.5}], False, 10),
    "Shrink": ([{}, {"bias": 0.7, "lambd": 1.5}], False, 9),  # ort float64 rounds to float32
}
CASES = [(op, a) for op, (attr_sets, _, _) in ACTIVATIONS.items() for a in attr_sets]


@pytest.mark.parametrize(("op", "attrs"), CASES, ids=lambda v: str(v) if v else "default")
@pytest.mark.parametrize("dtype", [F32, F16, F64])
@pytest.mark.parametrize("shape", [(2, 3, 5), (), (0, 4)])
def test_activation(op, attrs, dtype, shape):
    if dtype is F64 and not ACTIVATIONS[op][1]:
        pytest.skip("onnxruntime has no float64 kernel")
    if dtype is F16 and op == "Celu":
        pytest.skip("onnxruntime Celu float16 needs opset 28 (tested below)")
    x = data(dtype, shape)
    (y,) = check(op, {"x": x}, dtype, **attrs)
    assert y.dtype == dtype and y.shape == x.shape


@pytest.mark.parametrize("op", sorted(ACTIVATIONS))
def test_activation_first_and_latest_opset(op):
    first = ACTIVATIONS[op][2]
    for opset in sorted({first, 22 if first < 22 else first}):
        check(op, {"x": data(F32)}, opset=opset)


def test_celu_float16_opset28():
    check("Celu", {"x": data(F16)}, F16, opset=28, alpha=1.5)


def test_relu_opsets_and_ints():
    for opset in (6, 13, 14):
        check("Relu", {"x": data(F32)}, opset=opset)
    x = data(F32)
    (y,) = ours(node_model("Relu", {"x": x}, opset=1), {"x": x})
    np.testing.assert_array_equal(y, np.maximum(x, 0))
    for dtype in (np.int8, np.int32):
        check("Relu", {"x": np.arange(-6, 6, dtype=dtype).reshape(3, 4)}, dtype, opset=14)
    x = np.arange(-6, 6, dtype=np.int64)
    (y,) = ours(node_model("Relu", {"x": x}, opset=14), {"x": x})
    np.testing.assert_array_equal(y, np.maximum(x, 0))
    assert y.dtype == np.int64


def test_extreme_values_are_finite_and_accurate():
    x = np.array([-1000, -100, -30, 0, 30, 100, 1000, np.inf, -np.inf], F32)
    feeds = {"x": x}
    (sig,) = ours(node_model("Sigmoid", feeds), feeds)
    np.testing.assert_allclose(sig, scipy.special.expit(x.astype(F64)), atol=1e-30, rtol=1e-6)
    (sp,) = ours(node_model("Softplus", feeds), feeds)
    ref = np.logaddexp(x.astype(F64), 0)
    np.testing.assert_allclose(sp, ref, rtol=1e-6, atol=1e-30)
    (mish,) = ours(node_model("Mish", feeds, opset=18), feeds)
    np.testing.assert_allclose(
        mish[[2, 3, 4, 5, 6, 7]], [-2.8e-12, 0, 30, 100, 1000, np.inf], rtol=1e-2, atol=1e-11
    )
    for approximate in ("none", "tanh"):
        (g,) = ours(node_model("Gelu", feeds, approximate=approximate), feeds)
        np.testing.assert_allclose(g[[0, 1, 3, 5, 6, 7]], [0, 0, 0, 100, 1000, np.inf], atol=1e-30)


@pytest.mark.parametrize("op", ["Sigmoid", "Gelu", "Mish", "Softplus", "Elu", "HardSwish"])
def test_bfloat16_via_float32(op):
    x = data(F32, (4, 6), scale=2.0).astype(BF16)
    opset = 18 if op == "Mish" else 21
    (y,) = ours(node_model(op, {"x": x}, opset=opset), {"x": x})
    (ref,) = ours(node_model(op, {"x": x.astype(F32)}, opset=opset), {"x": x.astype(F32)})
    assert y.dtype == BF16
    np.testing.assert_array_equal(y, ref.astype(BF16))


def test_gelu_matches_formula():
    x = np.linspace(-6, 6, 97).astype(F64)
    feeds = {"x": x}
    (exact,) = ours(node_model("Gelu", feeds), feeds)
    np.testing.assert_allclose(
        exact, 0.5 * x * (1 + scipy.special.erf(x / math.sqrt(2))), rtol=1e-12, atol=1e-15
    )
    (approx,) = ours(node_model("Gelu", feeds, approximate="tanh"), feeds)
    ref = 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))
    np.testing.assert_allclose(approx, ref, rtol=1e-12, atol=1e-15)


# ---------------------------------------------------------------------------- Shrink
@pytest.mark.parametrize("dtype", [np.int8, np.int32, np.int64, np.uint8])
def test_shrink_int(dtype):
    x = (
        np.arange(-6, 7).astype(dtype)
        if np.dtype(dtype).kind == "i"
        else np.arange(13, dtype=dtype)
    )
    check("Shrink", {"x": x}, dtype, bias=1.5, lambd=2.0)


def test_shrink_float64():
    x = data(F64)
    (y,) = ours(node_model("Shrink", {"x": x}, bias=0.7, lambd=1.5), {"x": x})
    b = float(np.float32(0.7))  # attributes are float32
    np.testing.assert_array_equal(y, np.where(x < -1.5, x + b, np.where(x > 1.5, x - b, 0)))


# ---------------------------------------------------------------------------- PRelu
PRELU_SHAPES = [
    ((2, 3, 4, 5), (3, 1, 1)),
    ((2, 3, 4, 5), (5,)),
    ((2, 3, 4, 5), (1,)),
    ((2, 3, 4, 5), ()),
    ((3, 4), (3, 4)),
    ((), ()),
    ((0, 3), (3,)),
]


@pytest.mark.parametrize("shapes", PRELU_SHAPES)
@pytest.mark.parametrize("dtype", [F32, F16])
@pytest.mark.parametrize("const", [False, True])
def test_prelu(shapes, dtype, const):
    x = data(dtype, shapes[0])
    slope = np.asarray(np.random.default_rng(1).uniform(-0.5, 1.5, shapes[1]), dtype)
    if const:
        check("PRelu", {"x": x}, dtype, initializers={"slope": slope})
        unit = np.asarray(np.abs(slope) % 1, dtype)  # all in [0, 1): the max() fast path
        check("PRelu", {"x": x}, dtype, initializers={"slope": unit})
    else:
        check("PRelu", {"x": x, "slope": slope}, dtype)


@pytest.mark.parametrize("opset", [7, 9, 16])
def test_prelu_opsets(opset):
    check("PRelu", {"x": data(F32), "slope": np.full((3, 1), 0.2, F32)}, opset=opset)


@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.uint32])
def test_prelu_int(dtype):
    x = np.arange(-6, 6).reshape(3, 4)
    if np.dtype(dtype).kind == "u":
        x = np.abs(x)
    x = x.astype(dtype)
    slope = np.array([1, 2, 3, 0], dtype)
    (y,) = ours(node_model("PRelu", {"x": x, "s": slope}, opset=16), {"x": x, "s": slope})
    np.testing.assert_array_equal(y, np.where(x < 0, x * slope, x))
    assert y.dtype == dtype


def test_prelu_legacy_per_channel():
    x = data(F32, (2, 3, 4))
    slope = np.array([0.1, 0.2, 0.3], F32)
    (y,) = ours(node_model("PRelu", {"x": x, "s": slope}, opset=6), {"x": x, "s": slope})
    np.testing.assert_allclose(y, np.where(x < 0, x * slope[:, None], x), rtol=1e-6)


# ---------------------------------------------------------------------------- Clip
@pytest.mark.parametrize("dtype", [F32, F16, F64, np.int8, np.int32, np.int64, np.uint8])
@pytest.mark.parametrize("bounds", [(-2, 3), (None, 3), (-2, None), (None, None), (3, -2)])
@pytest.mark.parametrize("const", [False, True])
def test_clip_inputs(dtype, bounds, const):
    x = (
        np.asarray(data(F32, (3, 7), scale=5.0), dtype)
        if np.dtype(dtype).kind != "u"
        else (np.arange(21, dtype=dtype).reshape(3, 7))
    )
    if np.dtype(dtype).kind == "u" and bounds[1] == -2:
        bounds = (7, 2)
    feeds, inits, names = {"x": x}, {}, ["x"]
    for name, b in zip(("lo", "hi"), bounds):
        if b is None:
            names.append("")
            continue
        names.append(name)
        (inits if const else feeds)[name] = np.asarray(abs(b) if x.dtype.kind == "u" else b, dtype)
    while names[-1] == "":
        names.pop()
    model = node_model("Clip", feeds, opset=13, initializers=inits, input_names=names)
    r, a = TOL.get(dtype, (0, 0))
    (y,) = assert_matches_ort(model, feeds, r, a)
    assert y.dtype == dtype


@pytest.mark.parametrize("opset", [11, 12])
def test_clip_opsets_11_12(opset):
    x = data(F32)
    lo, hi = np.asarray(-1.0, F32), np.asarray(2.0, F32)
    check("Clip", {"x": x, "lo": lo, "hi": hi}, opset=opset)


@pytest.mark.parametrize("dtype", [F32, F16])
@pytest.mark.parametrize("attrs", [{}, {"min": -1.0}, {"max": 2.5}, {"min": -1.0, "max": 2.5}])
def test_clip_attributes_opset6(dtype, attrs):
    x = data(dtype)
    check("Clip", {"x": x}, dtype, opset=6, **attrs)
    (y,) = ours(node_model("Clip", {"x": x}, opset=1, **attrs), {"x": x})
    ref = np.clip(x, attrs.get("min", -np.inf), attrs.get("max", np.inf))
    np.testing.assert_array_equal(y, ref.astype(dtype))


def test_clip_opset6_default_clamps_infinities_to_flt_max():
    x = np.array([-np.inf, 0.0, np.inf], F32)
    (y,) = check("Clip", {"x": x}, opset=6)
    assert np.isfinite(y).all()


def test_clip_no_bounds_is_a_copy_and_bfloat16():
    x = data(F32).astype(BF16)
    (y,) = ours(node_model("Clip", {"x": x}, opset=13), {"x": x})
    np.testing.assert_array_equal(y, x)
    lo, hi = np.asarray(-1, BF16), np.asarray(2, BF16)
    feeds = {"x": x, "lo": lo, "hi": hi}
    (y,) = ours(node_model("Clip", feeds, opset=13), feeds)
    assert y.dtype == BF16
    np.testing.assert_array_equal(y.astype(F32), np.clip(x.astype(F32), -1, 2))


@pytest.mark.parametrize("op", ["Sigmoid", "Gelu", "Elu", "Mish", "HardSigmoid"])
@pytest.mark.parametrize("dtype", [F16, BF16])
def test_low_precision_without_plan_time_dtypes(op, dtype):
    """Built without input dtypes, float16/bfloat16 still compute through float32."""
    from onnxkiln.providers.base import NodeInfo
    from onnxkiln.providers.cpu.registry import REGISTRY
    from onnxkiln.schema import schema_defaults as _schema_defaults

    opset = 18 if op == "Mish" else 21
    info = NodeInfo(
        name="n",
        op_type=op,
        domain="",
        opset=opset,
        attrs=_schema_defaults(op, "", opset),
        n_inputs=1,
        n_outputs=1,
        input_dtypes=(None,),
        const_inputs=(None,),
    )
    x = data(F32, (3, 4), scale=2.0).astype(dtype)
    y = REGISTRY.resolve("", op, opset).build(info)(x)
    (ref,) = ours(node_model(op, {"x": x.astype(F32)}, opset=opset), {"x": x.astype(F32)})
    assert y.dtype == dtype
    np.testing.assert_array_equal(y, ref.astype(dtype))
