"""ai.onnx.ml attribute shapes real converters write, against onnxruntime.

skl2onnx, onnxmltools and hummingbird leave optional attributes out, write one value where
the spec speaks of one per feature, use int or string class labels and every post_transform;
onnxruntime accepts shapes the spec text does not mention. Each case runs on onnxruntime
first (ml_shapes_harness.check): onnxkiln must agree where it runs and refuse where it refuses.
"""

from __future__ import annotations

import numpy as np
import pytest
from ml_shapes_harness import F32, I64, MlCase, check
from onnx import TensorProto, helper

from onnxkiln.providers.cpu import _numba

RNG = np.random.default_rng(5)
X = RNG.standard_normal((4, 3)).astype(F32)
X[1, 2] = np.nan
XI = np.array([[1, -2, 3], [0, 5, -7]], I64)
FLOAT, INT64, STRING = TensorProto.FLOAT, TensorProto.INT64, TensorProto.STRING


def _preprocessing():
    return [
        MlCase("binarizer-default-threshold", "Binarizer", {"x": np.nan_to_num(X)}, {}),
        MlCase("binarizer-nan", "Binarizer", {"x": X}, {}, ort_refuses=True),
        MlCase("binarizer-int64", "Binarizer", {"x": XI}, {"threshold": 0.5},
               reference=[(XI > 0.5).astype(I64)]),  # the spec allows int64; onnxruntime: float
        MlCase("imputer-one-value-broadcast", "Imputer", {"x": X},
               {"imputed_value_floats": [9.0], "replaced_value_float": np.nan}),
        MlCase("imputer-per-feature", "Imputer", {"x": X},
               {"imputed_value_floats": [1.0, 2.0, 3.0], "replaced_value_float": np.nan}),
        MlCase("imputer-replaced-default-zero", "Imputer", {"x": np.abs(X).round()},
               {"imputed_value_floats": [7.0]}),
        MlCase("imputer-int64-one-value", "Imputer", {"x": XI},
               {"imputed_value_int64s": [42], "replaced_value_int64": 0}),
        MlCase("imputer-wrong-length", "Imputer", {"x": X},
               {"imputed_value_floats": [1.0, 2.0], "replaced_value_float": np.nan},
               we_refuse="onnxruntime silently imputes the first value everywhere when the list "
               "is neither 1 nor the feature count long; no converter writes that, and onnxkiln "
               "names the mismatch instead"),
        MlCase("scaler-one-value-broadcast", "Scaler", {"x": X}, {"offset": [0.5], "scale": [2.0]}),
        MlCase("scaler-offset-only", "Scaler", {"x": X}, {"offset": [0.5, 1.0, -1.0]},
               ort_refuses=True),
        MlCase("scaler-scale-only", "Scaler", {"x": X}, {"scale": [0.5, 1.0, -1.0]},
               ort_refuses=True),
        MlCase("scaler-int64-input", "Scaler", {"x": XI}, {"offset": [1.0], "scale": [0.5]}),
        MlCase("scaler-double-input", "Scaler", {"x": X.astype(np.float64)},
               {"offset": [1.0, 2.0, 3.0], "scale": [0.5, 2.0, 1.0]}),
        MlCase("scaler-one-scale-three-offsets", "Scaler", {"x": X},
               {"offset": [1.0, 2.0, 3.0], "scale": [0.5]}, ort_refuses=True),
        MlCase("scaler-wrong-length", "Scaler", {"x": X}, {"offset": [1.0, 2.0], "scale": [1.0]},
               ort_refuses=True),
        *[MlCase(f"normalizer-{norm}", "Normalizer", {"x": np.nan_to_num(X)}, {"norm": norm})
          for norm in ("MAX", "L1", "L2")],
        MlCase("normalizer-int64", "Normalizer", {"x": XI}, {"norm": "L1"}),
        MlCase("normalizer-1d", "Normalizer", {"x": np.array([3.0, -4.0], F32)}, {"norm": "L2"}),
        MlCase("normalizer-zero-row", "Normalizer", {"x": np.zeros((2, 3), F32)}, {"norm": "L2"}),
        MlCase("feature-vectorizer-pad", "FeatureVectorizer",
               {"a": X[:, :2].copy(), "b": X[:, :1].copy()},
               {"inputdimensions": [2, 3]}),
        MlCase("feature-vectorizer-truncate", "FeatureVectorizer", {"a": X},
               {"inputdimensions": [2]}),
    ]


def _encoders():
    s = np.array([["a", "b"], ["zz", "c"]], object)
    ids = np.array([[1, 7], [3, 2]], I64)
    return [
        MlCase("label-encoder-str-int-no-default", "LabelEncoder", {"x": s},
               {"keys_strings": ["a", "b", "c"], "values_int64s": [1, 2, 3]}, ml_opset=2),
        MlCase("label-encoder-int-str-no-default", "LabelEncoder", {"x": ids},
               {"keys_int64s": [1, 2, 3], "values_strings": ["x", "y", "z"]}, ml_opset=2),
        MlCase("label-encoder-float-float-nan-key", "LabelEncoder",
               {"x": np.array([1.5, np.nan, 3.0], F32)},
               {"keys_floats": [1.5, np.nan], "values_floats": [10.0, 20.0],
                "default_float": -1.0}, ml_opset=2),  # NaN matches no key before opset 4
        MlCase("label-encoder-4-nan-key", "LabelEncoder",
               {"x": np.array([1.5, np.nan, 3.0], F32)},
               {"keys_floats": [1.5, np.nan], "values_floats": [10.0, 20.0],
                "default_float": -1.0}, ml_opset=4),
        MlCase("label-encoder-int-float", "LabelEncoder", {"x": ids},
               {"keys_int64s": [1, 3], "values_floats": [0.5, 1.5]}, ml_opset=2),
        MlCase("label-encoder-4-tensor-keys-default-tensor", "LabelEncoder", {"x": ids},
               {"keys_tensor": _tensor([1, 3], INT64), "values_tensor": _tensor([5, 6], INT64),
                "default_tensor": _tensor([-9], INT64)}, ml_opset=4),
        MlCase("label-encoder-4-list-keys", "LabelEncoder", {"x": ids},
               {"keys_int64s": [1, 3], "values_int64s": [5, 6]}, ml_opset=4),
        MlCase("label-encoder-4-int-to-double", "LabelEncoder", {"x": ids},
               {"keys_int64s": [1, 3], "values_tensor": _tensor([0.5, 1.5], TensorProto.DOUBLE)},
               ml_opset=4),
        MlCase("label-encoder-4-no-default", "LabelEncoder", {"x": s},
               {"keys_strings": ["a", "c"], "values_tensor": _tensor([1.0, 2.0], FLOAT)},
               ml_opset=4),
        MlCase("category-mapper-str-to-int-no-default", "CategoryMapper", {"x": s},
               {"cats_strings": ["a", "b", "c"], "cats_int64s": [5, 6, 7]}),
        MlCase("category-mapper-int-to-str-no-default", "CategoryMapper", {"x": ids},
               {"cats_strings": ["a", "b", "c"], "cats_int64s": [1, 2, 3]}),
        MlCase("one-hot-int-zeros1", "OneHotEncoder", {"x": ids}, {"cats_int64s": [1, 2, 3]}),
        MlCase("one-hot-int-zeros0-unknown", "OneHotEncoder", {"x": ids},
               {"cats_int64s": [1, 2, 3], "zeros": 0}, ort_refuses=True),
        MlCase("one-hot-int-zeros0-known", "OneHotEncoder", {"x": ids[:, :1].copy()},
               {"cats_int64s": [1, 3], "zeros": 0}),
        MlCase("one-hot-string", "OneHotEncoder", {"x": s}, {"cats_strings": ["a", "c"]}),
        MlCase("one-hot-float-input", "OneHotEncoder", {"x": np.array([[1.0, 2.7]], F32)},
               {"cats_int64s": [1, 2]}),
        MlCase("one-hot-double-input", "OneHotEncoder", {"x": np.array([1.0, 3.0])},
               {"cats_int64s": [1, 2, 3]}),
        MlCase("array-feature-extractor-last", "ArrayFeatureExtractor",
               {"x": X, "i": np.array([2, 0], I64)}, {}),
        MlCase("array-feature-extractor-2d-indices", "ArrayFeatureExtractor",
               {"x": X, "i": np.array([[1, 2]], I64)}, {}),
        MlCase("array-feature-extractor-1d-x", "ArrayFeatureExtractor",
               {"x": X[0].copy(), "i": np.array([2], I64)}, {}),
        MlCase("array-feature-extractor-strings", "ArrayFeatureExtractor",
               {"x": s, "i": np.array([1], I64)}, {}),
        MlCase("array-feature-extractor-out-of-range", "ArrayFeatureExtractor",
               {"x": X, "i": np.array([3], I64)}, {}, ort_refuses=True),
        MlCase("array-feature-extractor-negative", "ArrayFeatureExtractor",
               {"x": X, "i": np.array([-1], I64)}, {}, ort_refuses=True),
    ]


def _empty_lists_and_zipmap():
    probs = np.array([[0.2, 0.8], [0.6, 0.4]], F32)
    return [
        MlCase("imputer-empty-list", "Imputer", {"x": X}, {"imputed_value_floats": []},
               ort_refuses=True),
        MlCase("label-encoder-empty-keys", "LabelEncoder", {"x": np.array([1, 2], I64)},
               {"keys_int64s": [], "values_int64s": []}, ml_opset=2),  # all to the default
        MlCase("scaler-empty-lists", "Scaler", {"x": X}, {"offset": [], "scale": []},
               ort_refuses=True),
        MlCase("zipmap-int-labels", "ZipMap", {"x": probs}, {"classlabels_int64s": [0, 7]}),
        MlCase("zipmap-string-labels", "ZipMap", {"x": probs}, {"classlabels_strings": ["a", "b"]}),
        MlCase("zipmap-too-few-labels", "ZipMap", {"x": probs}, {"classlabels_int64s": [0]},
               ort_refuses=True),
    ]


def _maps():
    def of(key, value):
        return {"x": helper.make_map_type_proto(key, helper.make_tensor_type_proto(value, None))}

    str_float, int_float = of(STRING, FLOAT), of(INT64, FLOAT)
    return [
        MlCase("dict-vectorizer-strings-unknown-key", "DictVectorizer",
               {"x": {"a": 1.0, "c": 3.0, "z": 9.0}}, {"string_vocabulary": ["a", "b", "c"]},
               (("y", FLOAT),), input_types=str_float),
        MlCase("dict-vectorizer-ints", "DictVectorizer", {"x": {1: 2.0, 7: 3.0}},
               {"int64_vocabulary": [5, 1]}, (("y", FLOAT),), input_types=int_float),
        MlCase("cast-map-dense", "CastMap", {"x": {0: 1.5, 2: 2.5}}, {"cast_to": "TO_FLOAT"},
               (("y", FLOAT),), input_types=int_float),
        MlCase("cast-map-sparse-max-map", "CastMap", {"x": {0: 1.5, 2: 2.5}},
               {"cast_to": "TO_FLOAT", "map_form": "SPARSE", "max_map": 4}, (("y", FLOAT),),
               input_types=int_float),
        MlCase("cast-map-to-string", "CastMap", {"x": {0: 1.5, 1: -2.0}},
               {"cast_to": "TO_STRING"}, (("y", STRING),), input_types=int_float),
        MlCase("cast-map-to-int64", "CastMap", {"x": {0: 1.5, 1: -2.7}}, {"cast_to": "TO_INT64"},
               (("y", INT64),), input_types=int_float),
    ]


def _more_types():
    """Other input types and explicit defaults the converters write."""
    x = RNG.standard_normal((3, 4)).astype(F32)
    i32, i64 = np.array([[1, -2, 3]], np.int32), np.array([1, 2, 9], I64)
    strs = np.array(["a", "q"], object)
    return [
        MlCase("normalizer-int32-max", "Normalizer", {"x": i32}, {"norm": "MAX"}),
        MlCase("normalizer-double", "Normalizer", {"x": x.astype(np.float64)}, {"norm": "L2"}),
        MlCase("scaler-int32", "Scaler", {"x": i32}, {"offset": [1.0], "scale": [2.0]}),
        MlCase("label-encoder-4-default-int64", "LabelEncoder", {"x": i64},
               {"keys_int64s": [1, 2], "values_int64s": [10, 20], "default_int64": -5},
               ml_opset=4),
        MlCase("label-encoder-float-to-string", "LabelEncoder",
               {"x": np.array([1.5, 2.0], F32)},
               {"keys_floats": [1.5], "values_strings": ["a"], "default_string": "zz"},
               ml_opset=2),
        MlCase("label-encoder-4-string-default-tensor", "LabelEncoder", {"x": strs},
               {"keys_strings": ["a"], "values_strings": ["A"],
                "default_tensor": _tensor([b"D"], STRING)}, ml_opset=4),
        MlCase("label-encoder-4-double-keys", "LabelEncoder",
               {"x": np.array([1.5, 2.5], np.float64)},
               {"keys_tensor": _tensor([1.5], TensorProto.DOUBLE),
                "values_tensor": _tensor([7], INT64)}, ml_opset=4),
        MlCase("category-mapper-explicit-default-string", "CategoryMapper",
               {"x": np.array([1, 5], I64)},
               {"cats_strings": ["a", "b"], "cats_int64s": [1, 2], "default_string": "none"}),
        MlCase("category-mapper-explicit-default-int", "CategoryMapper", {"x": strs},
               {"cats_strings": ["a", "b"], "cats_int64s": [1, 2], "default_int64": 99}),
        MlCase("array-feature-extractor-rank3", "ArrayFeatureExtractor",
               {"x": np.arange(24, dtype=F32).reshape(2, 3, 4), "i": np.array([3, 0], I64)}, {}),
        MlCase("array-feature-extractor-int64", "ArrayFeatureExtractor",
               {"x": np.arange(6, dtype=I64).reshape(2, 3), "i": np.array([2], I64)}, {}),
        MlCase("one-hot-rank3-strings-zeros0", "OneHotEncoder",
               {"x": np.array([[["a", "b"]]], object)}, {"cats_strings": ["b", "a"], "zeros": 0}),
        MlCase("feature-vectorizer-three-inputs", "FeatureVectorizer",
               {"a": x[:, :1].copy(), "b": x[:, 1:3].copy(), "c": x},
               {"inputdimensions": [1, 2, 4]}),
        MlCase("feature-vectorizer-int64-pad", "FeatureVectorizer",
               {"a": np.array([[1, 2]], I64)}, {"inputdimensions": [3]}),
        MlCase("imputer-int64-per-feature", "Imputer", {"x": np.array([[1, -1, 3]], I64)},
               {"imputed_value_int64s": [7, 8, 9], "replaced_value_int64": -1}),
        MlCase("zipmap-1d", "ZipMap", {"x": np.array([0.2, 0.8], F32)},
               {"classlabels_int64s": [0, 7]}),
    ]


def _tensor(values, elem):
    return helper.make_tensor("t", elem, [len(values)], values)


CASES = [*_preprocessing(), *_encoders(), *_empty_lists_and_zipmap(), *_maps(), *_more_types()]


@pytest.mark.parametrize("numba_on", [True, False], ids=["numba", "numpy"])
@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_matches_onnxruntime(case, numba_on, monkeypatch):
    monkeypatch.setattr(_numba, "ENABLED", numba_on)  # read at plan time: both paths
    assert check(case) == case.expected()
