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


def _tensor(values, elem):
    return helper.make_tensor("t", elem, [len(values)], values)


CASES = [*_preprocessing(), *_encoders(), *_empty_lists_and_zipmap(), *_maps()]


@pytest.mark.parametrize("numba_on", [True, False], ids=["numba", "numpy"])
@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_matches_onnxruntime(case, numba_on, monkeypatch):
    monkeypatch.setattr(_numba, "ENABLED", numba_on)  # read at plan time: both paths
    check(case)
