"""ai.onnx.ml kernels (providers/cpu/ml*.py) against onnxruntime on hand-built models."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnxkiln import InferenceSession
from onnxkiln.dtypes import DataType
from onnxkiln.errors import KernelError, ModelLoadError
from onnxkiln.providers.base import NodeInfo
from onnxkiln.providers.cpu.registry import REGISTRY
from onnxkiln.schema import schema_defaults
from onnxkiln.testing import assert_matches_ort, run_ort

RNG = np.random.default_rng(7)
ML = "ai.onnx.ml"
POSTS = ["NONE", "SOFTMAX", "LOGISTIC", "SOFTMAX_ZERO", "PROBIT"]


def ml_model(op, feeds, n_out=1, ml=3, **attrs) -> onnx.ModelProto:
    """A one-node ai.onnx.ml model (ai.onnx.ml imported at version `ml`); outputs inferred."""
    names = list(feeds)
    outs = [f"y{i}" for i in range(n_out)]
    node = helper.make_node(op, names, outs, domain=ML, **attrs)
    inputs = []
    for k, v in feeds.items():
        elem = TensorProto.STRING if v.dtype == object else \
            helper.np_dtype_to_tensor_dtype(v.dtype)
        inputs.append(helper.make_tensor_value_info(k, elem, list(v.shape)))
    outputs = [helper.make_value_info(o, onnx.TypeProto()) for o in outs]
    graph = helper.make_graph([node], op.lower(), inputs, outputs)
    opsets = [helper.make_opsetid("", 21), helper.make_opsetid(ML, ml)]
    model = helper.make_model(graph, opset_imports=opsets, ir_version=10)
    inferred = onnx.shape_inference.infer_shapes(model)
    found = {vi.name: vi for vi in inferred.graph.value_info}
    del model.graph.output[:]
    for o in outs:
        model.graph.output.append(found.get(o) or helper.make_value_info(o, onnx.TypeProto()))
    return model


def check(op, feeds, n_out=1, ml=3, rtol=1e-5, atol=1e-6, **attrs):
    """Compare onnxkiln with onnxruntime; returns onnxkiln's outputs."""
    return assert_matches_ort(ml_model(op, feeds, n_out, ml, **attrs), feeds, rtol, atol)


def ours(op, feeds, n_out=1, ml=3, **attrs):
    """onnxkiln's outputs (forms onnxruntime does not implement)."""
    model = ml_model(op, feeds, n_out, ml, **attrs)
    return InferenceSession.builder().from_graph(model).run(dict(feeds))


def strings(*values) -> np.ndarray:
    out = np.empty(len(values), dtype=object)
    out[:] = list(values)
    return out


def kernel_for(op, attrs, opset=1, n_in=1, n_out=1, output_dtypes=()):
    """Build a kernel directly from a NodeInfo (map-typed ops the loader cannot read)."""
    spec = REGISTRY.resolve(ML, op, opset)
    full = dict(schema_defaults(op, ML, opset))
    full.update(attrs)
    info = NodeInfo(name=op, op_type=op, domain=ML, opset=opset, attrs=full, n_inputs=n_in,
                    n_outputs=n_out, output_dtypes=tuple(output_dtypes))
    return spec.build(info)


def test_every_ml_schema_version_is_covered():
    ops = {}
    for s in onnx.defs.get_all_schemas_with_history():
        if s.domain == ML and not s.deprecated:
            ops.setdefault(s.name, []).append(s.since_version)
    for op, versions in ops.items():
        for v in versions:
            assert REGISTRY.resolve(ML, op, v) is not None, (op, v)
    # TreeEnsembleClassifier/Regressor are deprecated (removed) from ai.onnx.ml 5 on
    assert REGISTRY.resolve(ML, "TreeEnsembleRegressor", 4) is not None
    assert REGISTRY.resolve(ML, "TreeEnsembleRegressor", 5) is None


# Binarizer, Imputer, Scaler, Normalizer


def test_binarizer_float():
    x = RNG.standard_normal((3, 4, 5)).astype(np.float32)
    (y,) = check("Binarizer", {"x": x}, threshold=0.25)
    np.testing.assert_array_equal(y, (x > 0.25).astype(np.float32))


@pytest.mark.parametrize("dtype", [np.float64, np.int64, np.int32])
def test_binarizer_other_types(dtype):
    x = np.array([[-2, 0, 1], [3, 1, 5]]).astype(dtype)
    (y,) = ours("Binarizer", {"x": x}, threshold=1.0)
    assert y.dtype == dtype
    np.testing.assert_array_equal(y, (x > 1).astype(dtype))


def test_binarizer_nan_is_an_error_like_onnxruntime():
    with pytest.raises(KernelError, match="NaN"):
        ours("Binarizer", {"x": np.array([1.0, np.nan], np.float32)})


def test_imputer_nan_per_feature():
    x = np.array([[1, np.nan, 3], [np.nan, 2, np.nan]], np.float32)
    (y,) = check("Imputer", {"x": x}, imputed_value_floats=[9.0, 8.0, 7.0],
                 replaced_value_float=float("nan"))
    np.testing.assert_array_equal(y, [[1, 8, 3], [9, 2, 7]])


def test_imputer_value_single_and_int():
    x = np.array([[1, 0, 3], [0, 2, 0]], np.float32)
    check("Imputer", {"x": x}, imputed_value_floats=[-1.0])
    xi = np.array([[1, 5, 3], [5, 2, 5]], np.int64)
    (y,) = check("Imputer", {"x": xi}, imputed_value_int64s=[9], replaced_value_int64=5)
    np.testing.assert_array_equal(y, [[1, 9, 3], [9, 2, 9]])
    (y32,) = ours("Imputer", {"x": xi.astype(np.int32)}, imputed_value_int64s=[9, 8, 7],
                  replaced_value_int64=5)
    assert y32.dtype == np.int32
    np.testing.assert_array_equal(y32, [[1, 8, 3], [9, 2, 7]])


def test_imputer_bad_length():
    with pytest.raises(KernelError, match="imputed values"):
        ours("Imputer", {"x": np.zeros((2, 3), np.float32)}, imputed_value_floats=[1.0, 2.0])


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int64, np.int32])
@pytest.mark.parametrize("per_feature", [True, False])
def test_scaler(dtype, per_feature):
    x = (RNG.standard_normal((4, 3)) * 5).astype(dtype)
    attrs = {"offset": [0.5, -1.0, 2.0], "scale": [2.0, 0.5, -3.0]} if per_feature else \
        {"offset": [1.5], "scale": [0.25]}
    (y,) = check("Scaler", {"x": x}, **attrs)
    assert y.dtype == np.float32


@pytest.mark.parametrize("norm", ["MAX", "L1", "L2"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int64, np.int32])
def test_normalizer(norm, dtype):
    x = np.array([[1, -2, 3], [0, 0, 0], [-5, -1, -2], [4, 0, -4]]).astype(dtype)
    check("Normalizer", {"x": x}, norm=norm)
    check("Normalizer", {"x": x[0]}, norm=norm)


# Encoders


@pytest.mark.parametrize("dtype", [np.int64, np.float32, np.float64])
def test_one_hot_encoder_numbers(dtype):
    x = np.array([[1, 3, 7], [-1.7, 3.9, 2]]).astype(dtype)
    (y,) = check("OneHotEncoder", {"x": x}, cats_int64s=[1, 3, 2, -1])
    assert y.shape == (2, 3, 4)


def test_one_hot_encoder_strings_and_zeros():
    x = strings("b", "a", "zz", "c").reshape(2, 2)
    check("OneHotEncoder", {"x": x}, cats_strings=["a", "b", "c"])
    with pytest.raises(KernelError, match="unknown category"):
        ours("OneHotEncoder", {"x": x}, cats_strings=["a", "b", "c"], zeros=0)
    (y,) = ours("OneHotEncoder", {"x": np.array([5, 3], np.int32)}, cats_int64s=[3, 5])
    np.testing.assert_array_equal(y, [[0, 1], [1, 0]])


def test_label_encoder_1():
    x = strings("b", "a", "q", "c")
    (y,) = check("LabelEncoder", {"x": x}, ml=1, classes_strings=["a", "b", "c"],
                 default_int64=-7)
    np.testing.assert_array_equal(y, [1, 0, -7, 2])
    (y,) = check("LabelEncoder", {"x": np.array([2, 0, 5, -1], np.int64)}, ml=1,
                 classes_strings=["a", "b", "c"], default_string="none")
    assert y.tolist() == ["c", "a", "none", "none"]


def test_label_encoder_2_lists():
    x = strings("Amy", "Dori", "Sally", "Amy")
    check("LabelEncoder", {"x": x}, ml=2, keys_strings=["Amy", "Sally"], values_int64s=[5, 6])
    check("LabelEncoder", {"x": x}, ml=2, keys_strings=["Amy", "Sally"],
          values_floats=[0.5, 1.5], default_float=-2.0)
    xi = np.array([[3, 1], [7, 3]], np.int64)
    check("LabelEncoder", {"x": xi}, ml=2, keys_int64s=[1, 3], values_strings=["one", "three"],
          default_string="?")
    xf = np.array([0.5, -0.0, 2.0, 7.0], np.float32)
    check("LabelEncoder", {"x": xf}, ml=2, keys_floats=[0.5, 0.0, 2.0], values_int64s=[1, 2, 3])


def _tensor(values, dtype):
    if dtype is object:
        return helper.make_tensor("t", TensorProto.STRING, [len(values)],
                                  [str(v).encode() for v in values])
    return numpy_helper.from_array(np.asarray(values).astype(dtype))


def _typed(values, dtype):
    return strings(*[str(v) for v in values]) if dtype is object else \
        np.asarray(values).astype(dtype)


# (key, value) types onnxruntime implements, then ones compared with a dict lookup
@pytest.mark.parametrize("kt,vt", [(np.int64, np.float64), (np.float64, np.int64),
                                   (object, np.int16), (np.int64, object), (np.float32, object),
                                   (np.int16, np.float64), (np.int32, np.int32),
                                   (object, np.int32)])
def test_label_encoder_4_tensors(kt, vt):
    keys, values = [3, 1, 4, 5], [10, 20, 30, 50]
    x = _typed([1, 2, 3, 4, 5, 1], kt).reshape(2, 3)
    attrs = {"keys_tensor": _tensor(keys, kt), "values_tensor": _tensor(values, vt),
             "default_tensor": _tensor([-9], vt)}
    native = (kt, vt) in {(np.int16, np.float64), (np.int32, np.int32), (object, np.int32)}
    if not native:
        (y,) = check("LabelEncoder", {"x": x}, ml=4, **attrs)
    else:
        (y,) = ours("LabelEncoder", {"x": x}, ml=4, **attrs)
    table = {str(k): v for k, v in zip(keys, values)}
    want = [table.get(str(k), -9) for k in [1, 2, 3, 4, 5, 1]]
    expected = _typed(want, vt).reshape(2, 3)
    assert y.dtype == expected.dtype
    assert y.tolist() == expected.tolist()


def test_label_encoder_repeated_key():
    # opset 4 says the last repeated key wins (onnxruntime keeps the first); opset 2 says
    # nothing and follows onnxruntime
    x = np.array([1, 3], np.int64)
    (y,) = ours("LabelEncoder", {"x": x}, ml=4, keys_int64s=[1, 3, 1], values_int64s=[5, 6, 7])
    np.testing.assert_array_equal(y, [7, 6])
    check("LabelEncoder", {"x": x}, ml=2, keys_int64s=[1, 3, 1], values_int64s=[5, 6, 7])


def test_label_encoder_4_nan_key_and_defaults():
    x = np.array([np.nan, 1.0, 2.0, -np.nan], np.float32)
    check("LabelEncoder", {"x": x}, ml=4, keys_floats=[1.0, float("nan")],
          values_strings=["one", "nan"])
    check("LabelEncoder", {"x": strings("a", "b")}, ml=4, keys_strings=["a"],
          values_floats=[1.5])


def test_category_mapper():
    check("CategoryMapper", {"x": strings("cat", "dog", "eel")}, cats_strings=["dog", "cat"],
          cats_int64s=[1, 2], default_int64=-5)
    (y,) = check("CategoryMapper", {"x": np.array([[2, 9], [1, 2]], np.int64)},
                 cats_strings=["dog", "cat"], cats_int64s=[1, 2], default_string="??")
    assert y.tolist() == [["cat", "??"], ["dog", "cat"]]


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int64, np.int32])
def test_feature_vectorizer(dtype):
    feeds = {
        "a": np.array([[1, 2], [3, 4]], dtype),
        "b": np.array([[5], [6]], dtype),
        "c": np.array([[7, 8, 9], [1, 2, 3]], dtype),
    }
    (y,) = check("FeatureVectorizer", feeds, ml=1, inputdimensions=[2, 1, 3])
    np.testing.assert_array_equal(y, [[1, 2, 5, 7, 8, 9], [3, 4, 6, 1, 2, 3]])
    # widths differ from inputdimensions: truncated / zero padded
    check("FeatureVectorizer", feeds, ml=1, inputdimensions=[1, 2, 2])


def test_feature_vectorizer_mixed_types():
    feeds = {"a": np.array([[1, 2], [3, 4]], np.int64),
             "b": np.array([[0.5, 1.5], [2.5, 3.5]], np.float64)}
    (y,) = ours("FeatureVectorizer", feeds, ml=1, inputdimensions=[1, 3])
    np.testing.assert_array_equal(y, [[1, 0.5, 1.5, 0], [3, 2.5, 3.5, 0]])
    assert y.dtype == np.float32


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int64, np.int32, object])
def test_array_feature_extractor(dtype):
    x = np.arange(24).reshape(2, 3, 4).astype(dtype) if dtype is not object else \
        strings(*[f"s{i}" for i in range(12)]).reshape(3, 4)
    idx = np.array([3, 0, 3], np.int64)
    check("ArrayFeatureExtractor", {"x": x, "i": idx}, ml=1)


def test_array_feature_extractor_1d_and_errors():
    (z,) = check("ArrayFeatureExtractor",
                 {"x": np.arange(5, dtype=np.float32), "i": np.array([[4], [1]], np.int64)}, ml=1)
    assert z.shape == (1, 2)
    with pytest.raises(KernelError, match="out of range"):
        ours("ArrayFeatureExtractor",
             {"x": np.zeros((2, 3), np.float32), "i": np.array([3], np.int64)}, ml=1)


# Map-typed ops: kernels called directly (the loader cannot read map values yet)


def test_map_typed_models_load_and_run():
    node = helper.make_node("DictVectorizer", ["x"], ["y"], domain=ML,
                            string_vocabulary=["a", "b"])
    mt = helper.make_map_type_proto(TensorProto.STRING,
                                    helper.make_tensor_type_proto(TensorProto.FLOAT, None))
    graph = helper.make_graph([node], "g", [helper.make_value_info("x", mt)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21),
                                                    helper.make_opsetid(ML, 1)])
    session = InferenceSession.builder().from_graph(model)
    assert [(m.name, m.kind) for m in session.inputs()] == [("x", "map")]
    y = session.run({"x": {"b": 2.0, "a": 1.0}})[0]
    np.testing.assert_array_equal(y, np.array([[1.0, 2.0]], np.float32))


def test_zip_map():
    x = RNG.random((3, 2)).astype(np.float32)
    run = kernel_for("ZipMap", {"classlabels_strings": ["a", "b"]})
    got = run(x)
    want = run_ort(ml_model("ZipMap", {"x": x}, ml=1, classlabels_strings=["a", "b"]),
                   {"x": x})[0]
    assert got == want
    run = kernel_for("ZipMap", {"classlabels_int64s": [5, 7]})
    assert run(np.array([1.0, 2.0], np.float32)) == [{5: 1.0, 7: 2.0}]
    with pytest.raises(ValueError, match="columns"):
        run(x[:, :1])


def test_zip_map_through_a_session():
    x = RNG.random((2, 3)).astype(np.float32)
    model = ml_model("ZipMap", {"x": x}, ml=1, classlabels_int64s=[1, 2, 3])
    (out,) = InferenceSession.builder().from_graph(model).run_outputs({"x": x})
    assert out.kind == "sequence"
    assert out.value == run_ort(model, {"x": x})[0]


def _ort_map_run(op, key, value, x, out_elem, **attrs):
    import onnxruntime as ort

    node = helper.make_node(op, ["x"], ["y"], domain=ML, **attrs)
    mt = helper.make_map_type_proto(key, helper.make_tensor_type_proto(value, None))
    graph = helper.make_graph([node], "g", [helper.make_value_info("x", mt)],
                              [helper.make_tensor_value_info("y", out_elem, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21),
                                                    helper.make_opsetid(ML, 1)])
    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    sess = ort.InferenceSession(model.SerializeToString(), opts,
                                providers=["CPUExecutionProvider"])
    return sess.run(None, {"x": x})[0]


def test_dict_vectorizer():
    run = kernel_for("DictVectorizer", {"string_vocabulary": ["a", "b", "c", "d"]},
                     output_dtypes=(DataType.FLOAT,))
    x = {"a": 1.5, "c": 2.0, "zz": 3.0}
    want = _ort_map_run("DictVectorizer", TensorProto.STRING, TensorProto.FLOAT,
                        {"a": 1.5, "c": 2.0}, TensorProto.FLOAT,
                        string_vocabulary=["a", "b", "c", "d"])
    got = run(x)
    assert got.dtype == want.dtype and got.shape == want.shape
    np.testing.assert_array_equal(got, want)
    run = kernel_for("DictVectorizer", {"int64_vocabulary": [5, 1]},
                     output_dtypes=(DataType.INT64,))
    np.testing.assert_array_equal(run([{1: 3}, {5: 4, 1: 2}]), [[0, 3], [4, 2]])


@pytest.mark.parametrize("cast_to,form", [("TO_FLOAT", "DENSE"), ("TO_INT64", "DENSE"),
                                          ("TO_STRING", "DENSE"), ("TO_FLOAT", "SPARSE"),
                                          ("TO_INT64", "SPARSE"), ("TO_STRING", "SPARSE")])
def test_cast_map(cast_to, form):
    x = {3: 1.5, 1: -2.75, 4: 2e10}
    elem = {"TO_FLOAT": TensorProto.FLOAT, "TO_INT64": TensorProto.INT64,
            "TO_STRING": TensorProto.STRING}[cast_to]
    attrs = {"cast_to": cast_to, "map_form": form, "max_map": 6}
    want = _ort_map_run("CastMap", TensorProto.INT64, TensorProto.FLOAT, x, elem, **attrs)
    got = kernel_for("CastMap", attrs)(x)
    assert got.shape == want.shape
    if cast_to == "TO_STRING":
        assert got.tolist() == want.tolist()
    else:
        assert got.dtype == want.dtype
        np.testing.assert_array_equal(got, want)


def test_cast_map_string_values():
    got = kernel_for("CastMap", {"cast_to": "TO_FLOAT"})({2: "1.5", 0: "-3"})
    np.testing.assert_array_equal(got, np.array([[-3.0, 1.5]], np.float32))


# Linear models


def _labels(n, kind):
    if kind == "int":
        return {"classlabels_ints": list(range(10, 10 + n))}
    return {"classlabels_strings": [f"class{i}" for i in range(n)]}


@pytest.mark.parametrize("post", POSTS)
@pytest.mark.parametrize("kind", ["int", "str"])
def test_linear_classifier_multiclass(post, kind):
    x = RNG.standard_normal((30, 4)).astype(np.float32)
    coef = RNG.standard_normal(12).round(2).tolist()
    check("LinearClassifier", {"x": x}, 2, ml=1, coefficients=coef,
          intercepts=[0.1, -0.2, 0.3], post_transform=post, rtol=1e-3, atol=1e-4,
          **_labels(3, kind))


@pytest.mark.parametrize("post", ["NONE", "LOGISTIC", "SOFTMAX", "SOFTMAX_ZERO"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int64, np.int32])
def test_linear_classifier_binary_one_row(post, dtype):
    x = (RNG.standard_normal((20, 3)) * 3).astype(dtype)
    (_, z) = check("LinearClassifier", {"x": x}, 2, ml=1, coefficients=[0.5, -1.0, 0.25],
                   intercepts=[0.1], post_transform=post, rtol=1e-5, atol=1e-6,
                   **_labels(2, "str"))
    assert z.shape == (20, 2)


def test_linear_classifier_binary_one_row_probit_leading_half():
    # onnxruntime probits the first N values of the [N, 2] buffer in place; the rest of
    # its buffer is not initialised, so only the leading half can be compared
    x = RNG.standard_normal((6, 2)).astype(np.float32) * 0.2
    model = ml_model("LinearClassifier", {"x": x}, 2, ml=1, coefficients=[0.5, -1.0],
                     intercepts=[0.4], post_transform="PROBIT", classlabels_ints=[0, 1])
    ours_z = InferenceSession.builder().from_graph(model).run({"x": x})[1]
    theirs_z = run_ort(model, {"x": x})[1]
    np.testing.assert_allclose(ours_z.reshape(-1)[:6], theirs_z.reshape(-1)[:6], rtol=1e-3,
                               atol=1e-4)


def test_linear_classifier_binary_needs_two_labels():
    with pytest.raises(ModelLoadError, match="exactly 2"):
        ours("LinearClassifier", {"x": np.zeros((1, 2), np.float32)}, 2, ml=1,
             coefficients=[1.0, 2.0], intercepts=[0.0], classlabels_ints=[1, 2, 3])


@pytest.mark.parametrize("post", POSTS)
@pytest.mark.parametrize("targets", [1, 3])
def test_linear_regressor(post, targets):
    x = RNG.standard_normal((25, 4)).astype(np.float32)
    check("LinearRegressor", {"x": x}, ml=1, coefficients=RNG.random(4 * targets).tolist(),
          intercepts=RNG.random(targets).tolist(), targets=targets, post_transform=post,
          rtol=1e-3, atol=1e-4)


@pytest.mark.parametrize("dtype", [np.float64, np.int64, np.int32])
def test_linear_regressor_other_types(dtype):
    x = np.array([[1, 2], [3, -4]]).astype(dtype)
    (y,) = ours("LinearRegressor", {"x": x}, ml=1, coefficients=[0.5, 0.25], intercepts=[1.0])
    np.testing.assert_allclose(y, x.astype(np.float32) @ [[0.5], [0.25]] + 1.0)
    assert y.dtype == np.float32


# SVM


def _svc_attrs(rng, k, n_feat, kernel, proba, positive=False):
    per = rng.integers(1, 4, k).tolist()
    nv = sum(per)
    coef = rng.standard_normal((k - 1) * nv).round(3)
    attrs = {
        "vectors_per_class": per,
        "support_vectors": rng.standard_normal(nv * n_feat).round(3).tolist(),
        "coefficients": (np.abs(coef) if positive else coef).tolist(),
        "rho": rng.standard_normal(k * (k - 1) // 2).round(3).tolist(),
        "kernel_type": kernel,
        "kernel_params": [0.3, 0.5, 2.0],
    }
    if proba:
        attrs["prob_a"] = rng.uniform(-3, -0.5, k * (k - 1) // 2).round(3).tolist()
        attrs["prob_b"] = rng.uniform(-0.5, 0.5, k * (k - 1) // 2).round(3).tolist()
    return attrs


@pytest.mark.parametrize("kernel", ["LINEAR", "POLY", "RBF", "SIGMOID"])
@pytest.mark.parametrize("k", [2, 3, 4])
@pytest.mark.parametrize("proba", [False, True])
def test_svm_classifier_svc(kernel, k, proba):
    rng = np.random.default_rng(k * 10 + proba)
    x = rng.standard_normal((40, 3)).astype(np.float32)
    check("SVMClassifier", {"x": x}, 2, ml=1, rtol=1e-4, atol=1e-5,
          **_svc_attrs(rng, k, 3, kernel, proba), **_labels(k, "str" if k == 3 else "int"))


@pytest.mark.parametrize("post", POSTS)
@pytest.mark.parametrize("k", [2, 3])
def test_svm_classifier_post_transforms(post, k):
    rng = np.random.default_rng(3 + k)
    x = rng.standard_normal((30, 3)).astype(np.float32)
    model = ml_model("SVMClassifier", {"x": x}, 2, ml=1, post_transform=post,
                     **_svc_attrs(rng, k, 3, "RBF", k == 3), **_labels(k, "int"))
    if post == "PROBIT" and k == 2:
        # onnxruntime writes [probit(d), d]... in a partly uninitialised buffer: labels and
        # the probit column only
        (y, z) = InferenceSession.builder().from_graph(model).run({"x": x})
        (ry, rz) = run_ort(model, {"x": x})
        np.testing.assert_array_equal(y, ry)
        np.testing.assert_allclose(z[:, 0], rz[:, 0], rtol=1e-3, atol=1e-4)
        return
    assert_matches_ort(model, {"x": x}, rtol=1e-3, atol=1e-4)


@pytest.mark.parametrize("dtype", [np.float64, np.int64, np.int32])
def test_svm_classifier_linear_mode_and_types(dtype):
    x = (RNG.standard_normal((20, 3)) * 2).astype(dtype)
    check("SVMClassifier", {"x": x}, 2, ml=1, coefficients=RNG.standard_normal(9).tolist(),
          rho=[0.25], kernel_params=[0.0, 0.0, 0.0], post_transform="SOFTMAX",
          rtol=1e-4, atol=1e-5, **_labels(3, "str"))


@pytest.mark.parametrize("kernel", ["LINEAR", "POLY", "RBF", "SIGMOID"])
@pytest.mark.parametrize("n_sv", [0, 4])
@pytest.mark.parametrize("one_class", [0, 1])
def test_svm_regressor(kernel, n_sv, one_class):
    rng = np.random.default_rng(n_sv + one_class)
    x = rng.standard_normal((25, 3)).astype(np.float32)
    attrs = {"kernel_type": kernel, "kernel_params": [0.2, 0.3, 3.0], "rho": [0.4],
             "one_class": one_class, "post_transform": "PROBIT"}
    if n_sv:
        attrs.update(n_supports=n_sv, support_vectors=rng.standard_normal(n_sv * 3).tolist(),
                     coefficients=rng.standard_normal(n_sv).tolist())
    else:
        attrs["coefficients"] = rng.standard_normal(3).tolist()
    check("SVMRegressor", {"x": x}, ml=1, rtol=1e-4, atol=1e-5, **attrs)


# Tree ensembles: random trees written by hand in the attribute encodings converters emit


MODES = ["BRANCH_LEQ", "BRANCH_LT", "BRANCH_GTE", "BRANCH_GT", "BRANCH_EQ", "BRANCH_NEQ"]


def random_trees(rng, n_trees, depth, n_feat, modes=("BRANCH_LEQ",), leaf_prob=0.2,
                 missing=False):
    """Legacy nodes_* attributes of random trees, plus the (tree id, node id) of each leaf."""
    nodes = {k: [] for k in ("treeids", "nodeids", "featureids", "modes", "values",
                             "truenodeids", "falsenodeids", "missing")}
    leaves = []
    for t in range(n_trees):
        count = [0]

        def build(d, t=t, count=count):
            nid, i = count[0], len(nodes["treeids"])
            count[0] += 1
            for v in nodes.values():
                v.append(0)
            nodes["treeids"][i], nodes["nodeids"][i] = t, nid
            nodes["values"][i] = 0.0
            if d == 0 or (d < depth and rng.random() < leaf_prob):
                nodes["modes"][i] = "LEAF"
                leaves.append((t, nid))
                return nid
            nodes["modes"][i] = modes[rng.integers(len(modes))]
            nodes["featureids"][i] = int(rng.integers(n_feat))
            nodes["values"][i] = float(np.round(rng.standard_normal(), 1))
            nodes["missing"][i] = int(rng.random() < 0.5)
            nodes["truenodeids"][i] = build(d - 1)
            nodes["falsenodeids"][i] = build(d - 1)
            return nid

        build(depth)
    attrs = {f"nodes_{k}": v for k, v in nodes.items() if k != "missing"}
    if missing:
        attrs["nodes_missing_value_tracks_true"] = nodes["missing"]
    return attrs, leaves


def x_with_nan(rng, n, f, dtype=np.float32, nan=0.1):
    x = np.round(rng.standard_normal((n, f)), 1)
    x[rng.random(x.shape) < nan] = np.nan
    return x.astype(dtype)


def random_forest_classifier(rng, n_trees, k, depth=5, n_feat=5):
    """sklearn-style: each leaf votes a class distribution, pre-divided by the tree count."""
    attrs, leaves = random_trees(rng, n_trees, depth, n_feat)
    ct, cn, ci, cw = [], [], [], []
    for t, nid in leaves:
        p = rng.dirichlet(np.ones(k)) / n_trees
        for c in range(k):
            ct.append(t), cn.append(nid), ci.append(c), cw.append(float(p[c]))
    attrs.update(class_treeids=ct, class_nodeids=cn, class_ids=ci, class_weights=cw)
    return attrs


def gradient_boosting(rng, n_trees, n_targets=1, depth=3, n_feat=5, modes=("BRANCH_LEQ",),
                      prefix="target"):
    """One target per tree (round robin), leaf values ~ N(0, 0.3)."""
    attrs, leaves = random_trees(rng, n_trees, depth, n_feat, modes=modes, leaf_prob=0.0)
    tt, tn, ti, tw = [], [], [], []
    for t, nid in leaves:
        tt.append(t), tn.append(nid), ti.append(t % n_targets)
        tw.append(float(rng.normal(0, 0.3)))
    attrs.update({f"{prefix}_treeids": tt, f"{prefix}_nodeids": tn, f"{prefix}_ids": ti,
                  f"{prefix}_weights": tw})
    return attrs


@pytest.mark.parametrize("kind", ["int", "str"])
def test_random_forest_classifier(kind):
    rng = np.random.default_rng(11)
    attrs = random_forest_classifier(rng, 30, 3)
    x = x_with_nan(rng, 200, 5, nan=0.0)
    labels = {"classlabels_int64s": [3, 1, 2]} if kind == "int" else \
        {"classlabels_strings": ["setosa", "versicolor", "virginica"]}
    y, z = check("TreeEnsembleClassifier", {"x": x}, 2, rtol=1e-5, atol=1e-6, **attrs, **labels)
    np.testing.assert_allclose(z.sum(axis=1), 1.0, rtol=1e-5)
    assert set(y.tolist()) <= set(next(iter(labels.values())))


def test_gradient_boosting_regressor():
    rng = np.random.default_rng(12)
    attrs = gradient_boosting(rng, 100, depth=4)
    x = x_with_nan(rng, 500, 5, nan=0.0)
    check("TreeEnsembleRegressor", {"x": x}, n_targets=1, base_values=[0.75], rtol=1e-5,
          atol=1e-5, **attrs)


@pytest.mark.parametrize("post", ["NONE", "LOGISTIC", "SOFTMAX", "SOFTMAX_ZERO"])
def test_gradient_boosting_binary_classifier(post):
    # skl2onnx/onnxmltools style: every leaf votes class 0 with a raw margin
    rng = np.random.default_rng(13)
    attrs = gradient_boosting(rng, 20, prefix="class", modes=("BRANCH_LT",))
    x = x_with_nan(rng, 100, 5, nan=0.05)
    check("TreeEnsembleClassifier", {"x": x}, 2, post_transform=post,
          classlabels_strings=["no", "yes"], rtol=1e-5, atol=1e-6, **attrs)


@pytest.mark.parametrize("base", [False, True])
def test_gradient_boosting_multiclass(base):
    rng = np.random.default_rng(14)
    attrs = gradient_boosting(rng, 30, n_targets=4, prefix="class")
    if base:
        attrs["base_values"] = [0.1, -0.2, 0.3, 0.0]
    x = x_with_nan(rng, 100, 5, nan=0.0)
    check("TreeEnsembleClassifier", {"x": x}, 2, post_transform="SOFTMAX",
          classlabels_int64s=[0, 1, 2, 3], rtol=1e-5, atol=1e-6, **attrs)


@pytest.mark.parametrize("post", POSTS)
@pytest.mark.parametrize("weights", ["all", "class0", "class1", "split"])
@pytest.mark.parametrize("base", [None, [0.25, 0.5]])
def test_tree_classifier_binary_conventions(post, weights, base):
    # onnxruntime's binary rules: which class scored, weight signs, base_values
    rng = np.random.default_rng(15)
    attrs, leaves = random_trees(rng, 4, 3, 3)
    ct, cn, ci, cw = [], [], [], []
    for j, (t, nid) in enumerate(leaves):
        classes = {"all": [0, 1], "class0": [0], "class1": [1], "split": [j % 2]}[weights]
        for c in classes:
            ct.append(t), cn.append(nid), ci.append(c), cw.append(float(rng.normal(0.2, 0.5)))
    attrs.update(class_treeids=ct, class_nodeids=cn, class_ids=ci, class_weights=cw)
    if base:
        attrs["base_values"] = base
    x = x_with_nan(rng, 60, 3, nan=0.0)
    model = ml_model("TreeEnsembleClassifier", {"x": x}, 2, post_transform=post,
                     classlabels_int64s=[4, 8], **attrs)
    if post == "PROBIT" and weights in ("class0", "split") and not base:
        # one score: onnxruntime leaves the second column uninitialised
        y, z = InferenceSession.builder().from_graph(model).run({"x": x})
        ry, rz = run_ort(model, {"x": x})
        np.testing.assert_array_equal(y, ry)
        np.testing.assert_allclose(z[:, 0], rz[:, 0], rtol=1e-3, atol=1e-4)
        return
    assert_matches_ort(model, {"x": x}, rtol=1e-3, atol=1e-4)


@pytest.mark.parametrize("post", ["NONE", "LOGISTIC", "SOFTMAX", "SOFTMAX_ZERO"])
def test_tree_classifier_binary_one_base_value(post):
    # skl2onnx's binary GradientBoostingClassifier: class-0 margins and one base value
    rng = np.random.default_rng(25)
    attrs = gradient_boosting(rng, 12, prefix="class")
    x = x_with_nan(rng, 60, 5, nan=0.0)
    check("TreeEnsembleClassifier", {"x": x}, 2, post_transform=post, base_values=[-0.4],
          classlabels_int64s=[0, 1], **attrs)


@pytest.mark.parametrize("aggregate", ["SUM", "AVERAGE", "MIN", "MAX"])
@pytest.mark.parametrize("post", POSTS)
def test_tree_regressor_modes_nan_multitarget(aggregate, post):
    rng = np.random.default_rng(16)
    attrs, leaves = random_trees(rng, 5, 4, 4, modes=MODES, missing=True)
    tt, tn, ti, tw = [], [], [], []
    for t, nid in leaves:
        for target in range(3):
            if rng.random() < 0.7:  # some leaves leave some targets unscored
                tt.append(t), tn.append(nid), ti.append(target)
                tw.append(float(np.round(rng.standard_normal(), 2)))
    attrs.update(target_treeids=tt, target_nodeids=tn, target_ids=ti, target_weights=tw)
    x = x_with_nan(rng, 80, 4, nan=0.2)
    check("TreeEnsembleRegressor", {"x": x}, n_targets=3, aggregate_function=aggregate,
          post_transform=post, base_values=[0.5, -0.5, 0.25], rtol=1e-3, atol=1e-4, **attrs)


@pytest.mark.parametrize("dtype", [np.float64])
def test_tree_regressor_as_tensor_thresholds(dtype):
    # opset 3: double thresholds/weights; a float32 threshold would round 0.1 differently
    rng = np.random.default_rng(17)
    attrs, leaves = random_trees(rng, 3, 3, 2)
    values = attrs.pop("nodes_values")
    values = [v + 0.1 if v else v for v in values]
    attrs["nodes_values_as_tensor"] = numpy_helper.from_array(np.array(values, np.float64))
    attrs.update(target_treeids=[t for t, _ in leaves], target_nodeids=[n for _, n in leaves],
                 target_ids=[0] * len(leaves),
                 target_weights_as_tensor=numpy_helper.from_array(
                     rng.standard_normal(len(leaves))),
                 base_values_as_tensor=numpy_helper.from_array(np.array([1.0 / 3])))
    x = np.round(rng.standard_normal((50, 2)), 1) + 0.1
    check("TreeEnsembleRegressor", {"x": x.astype(dtype)}, n_targets=1, **attrs)


@pytest.mark.parametrize("dtype", [np.int64, np.int32])
def test_tree_ensembles_int_input(dtype):
    rng = np.random.default_rng(18)
    attrs = random_forest_classifier(rng, 5, 3, n_feat=3)
    x = rng.integers(-2, 3, (40, 3)).astype(dtype)
    check("TreeEnsembleClassifier", {"x": x}, 2, classlabels_int64s=[0, 1, 2], **attrs)
    reg = gradient_boosting(rng, 5, n_feat=3)
    (y,) = ours("TreeEnsembleRegressor", {"x": x}, n_targets=1, **reg)
    (want,) = ours("TreeEnsembleRegressor", {"x": x.astype(np.float32)}, n_targets=1, **reg)
    np.testing.assert_array_equal(y, want)


def test_tree_single_leaf_trees_and_errors():
    attrs = {
        "nodes_treeids": [0, 1, 1, 1],
        "nodes_nodeids": [0, 0, 1, 2],
        "nodes_featureids": [0, 1, 0, 0],
        "nodes_modes": ["LEAF", "BRANCH_LEQ", "LEAF", "LEAF"],
        "nodes_values": [0.0, 0.5, 0.0, 0.0],
        "nodes_truenodeids": [0, 1, 0, 0],
        "nodes_falsenodeids": [0, 2, 0, 0],
        "target_treeids": [0, 1, 1],
        "target_nodeids": [0, 1, 2],
        "target_ids": [0, 0, 0],
        "target_weights": [1.0, 2.0, 3.0],
    }
    x = np.array([[0.0, 0.0], [0.0, 1.0]], np.float32)
    (y,) = check("TreeEnsembleRegressor", {"x": x}, n_targets=1, **attrs)
    np.testing.assert_array_equal(y, [[3.0], [4.0]])
    with pytest.raises(KernelError, match="features"):
        ours("TreeEnsembleRegressor", {"x": x[:, :1]}, n_targets=1, **attrs)
    bad = dict(attrs, target_nodeids=[0, 1, 7])
    with pytest.raises(ModelLoadError, match="not in nodes_"):
        ours("TreeEnsembleRegressor", {"x": x}, n_targets=1, **bad)
    bad = dict(attrs, target_nodeids=[0, 0, 2])
    with pytest.raises(ModelLoadError, match="not a LEAF"):
        ours("TreeEnsembleRegressor", {"x": x}, n_targets=1, **bad)
    cyclic = dict(attrs, nodes_truenodeids=[0, 0, 0, 0])  # tree 1's root is its own child
    with pytest.raises(KernelError, match="cycle"):
        ours("TreeEnsembleRegressor", {"x": x}, n_targets=1, **cyclic)


# TreeEnsemble (ai.onnx.ml 5)


def to_v5(attrs, prefix="target", dtype=np.float32, modes=None):
    """Legacy nodes_*/target_* attributes rewritten in the opset-5 encoding."""
    tree, nid = attrs["nodes_treeids"], attrs["nodes_nodeids"]
    pos = {(t, n): i for i, (t, n) in enumerate(zip(tree, nid))}
    leaf = [m == "LEAF" for m in attrs["nodes_modes"]]
    interior = [i for i, is_leaf in enumerate(leaf) if not is_leaf]
    leaf_ids = [i for i, is_leaf in enumerate(leaf) if is_leaf]
    irank = {p: r for r, p in enumerate(interior)}
    lrank = {p: r for r, p in enumerate(leaf_ids)}
    weights = {}
    for t, n, w in zip(attrs[f"{prefix}_treeids"], attrs[f"{prefix}_nodeids"],
                       attrs[f"{prefix}_weights"]):
        weights[pos[(t, n)]] = w
    out = {k: [] for k in ("feat", "split", "mode", "tid", "tleaf", "fid", "fleaf")}
    for i in interior:
        out["feat"].append(attrs["nodes_featureids"][i])
        out["split"].append(attrs["nodes_values"][i])
        out["mode"].append(MODES.index(attrs["nodes_modes"][i]))
        for side, ids, flags in (("true", out["tid"], out["tleaf"]),
                                 ("false", out["fid"], out["fleaf"])):
            child = pos[(tree[i], attrs[f"nodes_{side}nodeids"][i])]
            ids.append(lrank[child] if leaf[child] else irank[child])
            flags.append(int(leaf[child]))
    roots = [irank[pos[(t, 0)]] for t in sorted(set(tree))]
    splits = np.array(out["split"], np.float32).astype(dtype)
    leaf_w = np.array([weights.get(p, 0.0) for p in leaf_ids], np.float32).astype(dtype)
    return {
        "nodes_featureids": out["feat"],
        "nodes_splits": numpy_helper.from_array(splits),
        "nodes_modes": numpy_helper.from_array(np.array(modes or out["mode"], np.uint8)),
        "nodes_truenodeids": out["tid"],
        "nodes_trueleafs": out["tleaf"],
        "nodes_falsenodeids": out["fid"],
        "nodes_falseleafs": out["fleaf"],
        "tree_roots": roots,
        "leaf_targetids": [0] * len(leaf_ids),
        "leaf_weights": numpy_helper.from_array(leaf_w),
        "n_targets": 1,
    }


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("aggregate", [0, 1, 2, 3])
def test_tree_ensemble_5_matches_the_legacy_regressor(dtype, aggregate):
    rng = np.random.default_rng(19)
    legacy = gradient_boosting(rng, 40, depth=4, modes=tuple(MODES))
    x = x_with_nan(rng, 300, 5, dtype, nan=0.1)
    (y5,) = check("TreeEnsemble", {"x": x}, ml=5, aggregate_function=aggregate, rtol=1e-5,
                  atol=1e-5, **to_v5(legacy, dtype=dtype))
    assert y5.dtype == dtype
    names = ["AVERAGE", "SUM", "MIN", "MAX"]
    (y3,) = ours("TreeEnsembleRegressor", {"x": x}, n_targets=1,
                 aggregate_function=names[aggregate], **legacy)
    np.testing.assert_allclose(y5, y3, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("post", [0, 3, 4])
def test_tree_ensemble_5_post_transforms(post):
    rng = np.random.default_rng(20)
    attrs = to_v5(gradient_boosting(rng, 6))
    attrs["n_targets"] = 2
    attrs["leaf_targetids"] = [i % 2 for i in range(len(attrs["leaf_targetids"]))]
    x = x_with_nan(rng, 50, 5)
    check("TreeEnsemble", {"x": x}, ml=5, post_transform=post, rtol=1e-3, atol=1e-4, **attrs)


@pytest.mark.parametrize("post", [1, 2])
def test_tree_ensemble_5_softmax_logistic_codes_follow_the_spec(post):
    # the spec numbers SOFTMAX 1 and LOGISTIC 2; onnxruntime 1.32 reads them swapped,
    # so compare with onnxruntime running the other code
    rng = np.random.default_rng(21)
    attrs = to_v5(gradient_boosting(rng, 6))
    attrs["n_targets"] = 2
    attrs["leaf_targetids"] = [i % 2 for i in range(len(attrs["leaf_targetids"]))]
    x = x_with_nan(rng, 50, 5)
    (y,) = ours("TreeEnsemble", {"x": x}, ml=5, post_transform=post, **attrs)
    theirs = run_ort(ml_model("TreeEnsemble", {"x": x}, ml=5, post_transform=3 - post,
                              **attrs), {"x": x})[0]
    np.testing.assert_allclose(y, theirs, rtol=1e-5, atol=1e-6)
    if post == 1:
        np.testing.assert_allclose(y.sum(axis=1), 1.0, rtol=1e-5)


def test_tree_ensemble_5_set_membership():
    rng = np.random.default_rng(22)
    legacy = gradient_boosting(rng, 10, depth=3, n_feat=3)
    attrs = to_v5(legacy, modes=None)
    n = len(attrs["nodes_featureids"])
    modes = rng.choice([0, 6], n).astype(np.uint8)
    attrs["nodes_modes"] = numpy_helper.from_array(modes)
    sets = [sorted(rng.choice(5, rng.integers(1, 4), replace=False).tolist())
            for _ in range(int((modes == 6).sum()))]
    attrs["membership_values"] = numpy_helper.from_array(
        np.array([v for s in sets for v in [*s, np.nan]][:-1], np.float32))
    attrs["nodes_missing_value_tracks_true"] = rng.integers(0, 2, n).tolist()
    # onnxruntime only handles integer members (and truncates non-integer inputs for some
    # sets); integer-valued inputs keep both sides on the spec's exact membership
    x = rng.integers(-1, 6, (200, 3)).astype(np.float32)
    x[rng.random(x.shape) < 0.1] = np.nan
    check("TreeEnsemble", {"x": x}, ml=5, **attrs)


def test_tree_ensemble_5_float16():
    rng = np.random.default_rng(23)
    legacy = gradient_boosting(rng, 8)
    x = x_with_nan(rng, 40, 5, np.float16)
    attrs = to_v5(legacy, dtype=np.float16)
    (y16,) = ours("TreeEnsemble", {"x": x}, ml=5, **attrs)
    for name in ("nodes_splits", "leaf_weights"):
        attrs[name] = numpy_helper.from_array(
            numpy_helper.to_array(attrs[name]).astype(np.float32))
    (y32,) = ours("TreeEnsemble", {"x": x.astype(np.float32)}, ml=5, **attrs)
    assert y16.dtype == np.float16
    np.testing.assert_allclose(y16.astype(np.float32), y32, rtol=2e-3, atol=2e-3)


def test_tree_ensemble_is_vectorised():
    import time

    rng = np.random.default_rng(24)
    attrs = gradient_boosting(rng, 100, depth=6, n_feat=10)
    x = x_with_nan(rng, 3000, 10, nan=0.0)
    model = ml_model("TreeEnsembleRegressor", {"x": x}, n_targets=1, **attrs)
    session = InferenceSession.builder().from_graph(model)
    session.run({"x": x})
    start = time.perf_counter()
    (y,) = session.run({"x": x})
    elapsed = time.perf_counter() - start
    np.testing.assert_allclose(y, run_ort(model, {"x": x})[0], rtol=1e-5, atol=1e-5)
    # ~0.2 s here; a per-sample Python loop would take minutes
    assert elapsed < 10.0, f"300k (sample, tree) walks took {elapsed:.2f}s"
