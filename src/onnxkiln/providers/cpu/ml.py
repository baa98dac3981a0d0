"""CPU kernels: ai.onnx.ml preprocessing and encoding ops.

Binarizer, Imputer, Scaler, Normalizer, OneHotEncoder, LabelEncoder (1, 2, 4), CategoryMapper,
FeatureVectorizer, ArrayFeatureExtractor, and the map-typed ZipMap, DictVectorizer, CastMap
(maps are Python dicts, ZipMap returns a list of dicts). The classifiers and regressors live
in ml_linear (linear and SVM models) and ml_tree (tree ensembles), imported at the end.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from itertools import repeat
from typing import Any

import numpy as np

from onnxkiln.dtypes import DataType
from onnxkiln.ops.attrs import attr_str, attr_tensor
from onnxkiln.providers.base import CaptureSupport, NodeInfo, report_variant
from onnxkiln.providers.cpu import _numba
from onnxkiln.providers.cpu.ml_common import ML, as_features, string_list
from onnxkiln.providers.cpu.registry import kernel

_F32 = np.dtype(np.float32)
_F64 = np.dtype(np.float64)
_I64 = np.dtype(np.int64)
_OBJ = np.dtype(object)


def _is_str(dt: np.dtype) -> bool:
    return dt.kind in "OUS"


def _float_out(x: np.ndarray) -> np.dtype:
    """Compute dtype for float-output ops: float64 for double input, float32 otherwise."""
    return _F64 if x.dtype == _F64 else _F32


def _str_array(values: list[str]) -> np.ndarray:
    out = np.empty(len(values), dtype=object)
    out[:] = values
    return out


# Binarizer, Imputer, Scaler, Normalizer


@kernel("Binarizer", since=1, domain=ML)
def binarizer(x, *, threshold):
    """Y = 1 where X > threshold else 0, in X's type (NaN input is an error, as in onnxruntime)."""
    if x.dtype.kind == "f" and np.isnan(x).any():
        bad = int(np.flatnonzero(np.isnan(x.reshape(-1)))[0])
        raise ValueError(f"Binarizer: input element {bad} is NaN")
    th = np.asarray(threshold, dtype=_F64 if x.dtype.kind != "f" else x.dtype)
    return np.greater(x, th).astype(x.dtype)


@kernel("Imputer", since=1, domain=ML, factory=True)
def imputer(info: NodeInfo):
    """Replace elements equal to replaced_value_* with imputed_value_* (per feature or one)."""
    a = info.attrs
    floats = a.get("imputed_value_floats")
    ints = a.get("imputed_value_int64s")
    rv_float = float(a.get("replaced_value_float", 0.0))
    rv_int = int(a.get("replaced_value_int64", 0))
    values = {"f": np.asarray(floats or [], dtype=_F32), "i": np.asarray(ints or [], _I64)}
    by_dtype: dict[np.dtype, Any] = {}  # the imputed values in each input dtype seen

    def run(x):
        kind = "i" if x.dtype.kind in "iu" else x.dtype.kind
        if kind not in values:
            raise ValueError(f"Imputer: unsupported input type {x.dtype}")
        if values[kind].size == 0:
            raise ValueError("Imputer: float input needs imputed_value_floats" if kind == "f"
                             else "Imputer: integer input needs imputed_value_int64s")
        imputed = by_dtype.get(x.dtype)
        if imputed is None:
            imputed = values[kind].astype(x.dtype)
            imputed = by_dtype[x.dtype] = imputed if imputed.size > 1 else imputed[0]
        n_feat = x.shape[-1] if x.ndim else 1
        if np.ndim(imputed) and imputed.size != n_feat:
            raise ValueError(
                f"Imputer: {imputed.size} imputed values; expected 1 or the feature count {n_feat}"
            )
        if kind == "f":
            mask = np.isnan(x) if np.isnan(rv_float) else (x == x.dtype.type(rv_float))
        else:
            mask = x == rv_int
        return np.where(mask, imputed, x).astype(x.dtype, copy=False)

    return run


@kernel("Scaler", since=1, domain=ML, factory=True)
def scaler(info: NodeInfo):
    """Y = (X - offset) * scale as float32; offset/scale per feature or single."""
    offset = np.asarray(info.attrs.get("offset") or [], dtype=_F32)
    scale = np.asarray(info.attrs.get("scale") or [], dtype=_F32)
    if offset.size != scale.size:
        raise ValueError(f"Scaler: scale has {scale.size} values but offset has {offset.size}")
    # in the compute dtype (float64 for double input, else float32), converted once
    consts = {dt: (offset.astype(dt), scale.astype(dt)) for dt in (_F32, _F64)}

    def run(x):
        n_feat = x.shape[-1] if x.ndim else 1
        if offset.size not in (1, n_feat):
            raise ValueError(
                f"Scaler: offset and scale have {offset.size} values; expected 1 or the "
                f"feature count {n_feat}"
            )
        dt = _F64 if x.dtype == _F64 else _F32
        off, sc = consts[dt]
        y = (x if x.dtype == dt else x.astype(dt)) - off  # (a ufunc's dtype= costs ~1 us)
        y *= sc
        return y if dt == _F32 else y.astype(_F32)

    return run


_NORMS = ("MAX", "L1", "L2")


def _normalize_signature(dt: np.dtype):
    from numba import types

    f = types.float32 if dt == _F32 else types.float64
    return (types.Array(f, 2, "C", readonly=True), types.int64,
            types.Array(types.float32, 2, "C"))


_numba.register("normalize_rows", "onnxkiln.providers.cpu._numba_ml", _normalize_signature,
                (_F32, _F64))


@kernel("Normalizer", since=1, domain=ML, factory=True)
def normalizer(info: NodeInfo):
    """Row-normalise [N, C] (or [C]) by MAX (of the non-NaN values), L1 or L2; rows with a
    zero divisor pass through. One numba call per batch when numba is on (loaded on first
    use), else numpy."""
    norm = attr_str(info.attrs.get("norm", "MAX"))
    if norm not in _NORMS:
        raise ValueError(f"Normalizer: norm must be MAX, L1 or L2, got {norm!r}")
    fast = {dt: _numba.lazy("normalize_rows", dt) for dt in (_F32, _F64)}
    code = _NORMS.index(norm)

    def run(x):
        if x.ndim not in (1, 2):
            raise ValueError(f"Normalizer: X must be 1-D or 2-D, got shape {list(x.shape)}")
        dt = _float_out(x)
        v = as_features(x, "Normalizer").astype(dt, copy=False)
        handle = fast[dt]
        if handle is not None and handle.ready():
            y = np.empty(v.shape, _F32)
            handle.fn(np.ascontiguousarray(v), code, y)
            report_variant("normalizer.numba")
            return y.reshape(x.shape)
        report_variant("normalizer.numpy",
                       handle.reason if handle is not None else _numba.disabled_reason())
        return _normalize(v, norm).reshape(x.shape)

    return run


def _normalize(v: np.ndarray, norm: str) -> np.ndarray:
    """The numpy Normalizer of [N, C] v in its compute dtype, as float32."""
    dt = v.dtype
    if norm == "MAX":  # the max of the row's non-NaN values, as onnxruntime takes it
        d = np.fmax.reduce(v, axis=1, keepdims=True) if v.shape[1] else \
            np.zeros((v.shape[0], 1), dt)
        y = np.divide(v, d, out=v.copy(), where=d != 0)
    elif norm == "L1":
        d = np.abs(v).sum(axis=1, keepdims=True)
        y = np.divide(v, d, out=v.copy(), where=d != 0)
    else:
        sq = v * v
        d = sq.sum(axis=1, keepdims=True)
        r = np.sqrt(np.divide(sq, d, out=np.zeros_like(sq), where=d != 0))
        y = np.where(d != 0, np.where(v < 0, -r, r), v)
    return y.astype(_F32, copy=False)


# Lookup tables: LabelEncoder, CategoryMapper, OneHotEncoder


class _Lookup:
    """A key -> value table applied elementwise; keys numeric or str, last duplicate wins."""

    def __init__(self, keys: np.ndarray, values: np.ndarray, default: Any, op: str,
                 last_wins: bool = False, nan_matches: bool = True) -> None:
        if keys.shape[0] != values.shape[0]:
            raise ValueError(f"{op}: {keys.shape[0]} keys but {values.shape[0]} values")
        self.op = op
        self.values_dtype = values.dtype
        self.str_keys = _is_str(keys.dtype)
        self.default = default
        if not last_wins:  # first occurrence wins: keep it by scanning reversed
            keys, values = keys[::-1], values[::-1]
        if self.str_keys:
            self.table = {str(k): v for k, v in zip(keys.tolist(), values.tolist())}
            return
        self.nan_value: Any = None
        if keys.dtype.kind == "f":
            nan = np.isnan(keys)
            if nan.any():
                if nan_matches:
                    self.nan_value = values[np.flatnonzero(nan)[-1]]
                keys, values = keys[~nan], values[~nan]
        # the later occurrence of a key wins: unique over the reversed arrays
        uniq, first_rev = np.unique(keys[::-1], return_index=True)
        self.keys = uniq
        # values with the default appended, so a miss indexes the last slot
        picked = values[::-1][first_rev]
        table = np.empty(picked.shape[0] + 1, dtype=values.dtype)
        table[:-1] = picked
        table[-1] = default
        self.table_values = table

    def __call__(self, x: np.ndarray) -> np.ndarray:
        if self.str_keys:
            if not _is_str(x.dtype):
                raise ValueError(f"{self.op}: keys are strings but the input is {x.dtype}")
            get, d = self.table.get, self.default
            flat = [get(s if isinstance(s, str) else _text(s), d) for s in x.reshape(-1).tolist()]
            if self.values_dtype == _OBJ:
                return _str_array(flat).reshape(x.shape)
            return np.asarray(flat, dtype=self.values_dtype).reshape(x.shape)
        if _is_str(x.dtype):
            raise ValueError(f"{self.op}: keys are numbers but the input is a string tensor")
        keys = self.keys
        if keys.size == 0:
            idx = np.zeros(x.shape, dtype=np.intp)
        else:
            pos = np.searchsorted(keys, x)
            np.minimum(pos, keys.size - 1, out=pos)
            idx = np.where(keys[pos] == x, pos, keys.size)
        out = self.table_values[idx]
        if self.nan_value is not None and x.dtype.kind == "f":
            nan = np.isnan(x)
            if nan.any():
                out[nan] = self.nan_value
        return out


def _text(s: Any) -> str:
    return s.decode("utf-8") if isinstance(s, (bytes, bytearray)) else str(s)


_NUMERIC_KEY = {
    "keys_int64s": _I64,
    "keys_floats": _F32,
}
_VALUE_LISTS = {"values_int64s": _I64, "values_floats": _F32, "values_strings": _OBJ}


def _label_encoder_table(a: Mapping[str, Any], op: str, last_wins: bool,
                         nan_matches: bool = True) -> _Lookup:
    """keys_*/values_* (lists or tensors) and the matching default, as a lookup table."""
    keys = None
    if a.get("keys_tensor") is not None:
        keys = attr_tensor(a["keys_tensor"]).reshape(-1)
    elif a.get("keys_strings") is not None:
        keys = _str_array(string_list(a["keys_strings"]))
    else:
        for name, dt in _NUMERIC_KEY.items():
            if a.get(name) is not None:
                keys = np.asarray(a[name], dtype=dt)
    values = None
    if a.get("values_tensor") is not None:
        values = attr_tensor(a["values_tensor"]).reshape(-1)
    elif a.get("values_strings") is not None:
        values = _str_array(string_list(a["values_strings"]))
    else:
        for name, dt in _VALUE_LISTS.items():
            if a.get(name) is not None and name != "values_strings":
                values = np.asarray(a[name], dtype=dt)
    if keys is None or values is None:
        raise ValueError(f"{op}: one keys_* and one values_* attribute must be set")
    default_tensor = a.get("default_tensor")
    if default_tensor is not None:
        dv = attr_tensor(default_tensor).reshape(-1)
        if dv.size != 1:
            raise ValueError(f"{op}: default_tensor must hold one value, got {dv.size}")
        default: Any = dv[0]
    elif values.dtype == _OBJ:
        default = attr_str(a.get("default_string", "_Unused"))
    elif values.dtype.kind == "f":
        default = a.get("default_float", -0.0)
    else:
        default = a.get("default_int64", -1)
    if values.dtype == _OBJ:
        default = _text(default)
    else:
        default = values.dtype.type(default)
    return _Lookup(keys, values, default, op, last_wins, nan_matches)


def _label_encoder_fn(table: _Lookup) -> Callable[[np.ndarray], np.ndarray]:
    def run(x):
        if not table.str_keys and not _is_str(x.dtype) and x.dtype != table.keys.dtype:
            raise ValueError(
                f"LabelEncoder: input type {x.dtype} does not match the keys' type "
                f"{table.keys.dtype}"
            )
        return table(x)

    return run


@kernel("LabelEncoder", since=1, until=1, domain=ML, factory=True)
def label_encoder_1(info: NodeInfo):
    """String <-> int64 through classes_strings (index of the string, or string at index)."""
    classes = _str_array(string_list(info.attrs.get("classes_strings")) or [])
    d_int = int(info.attrs.get("default_int64", -1))
    d_str = attr_str(info.attrs.get("default_string", "_Unused"))
    # first occurrence wins for string -> index
    first = {}
    for i, s in enumerate(classes.tolist()):
        first.setdefault(s, i)
    to_int = _Lookup(_str_array(list(first)), np.asarray(list(first.values()), _I64), d_int,
                     "LabelEncoder")
    to_str = _Lookup(np.arange(classes.size, dtype=_I64), classes, d_str, "LabelEncoder")

    def run(x):
        return to_int(x) if _is_str(x.dtype) else to_str(x.astype(_I64, copy=False))

    return run


@kernel("LabelEncoder", since=2, until=3, domain=ML, factory=True)
def label_encoder_2(info: NodeInfo):
    """Map each element through keys_* -> values_* (string, int64, float); default on miss.
    A repeated key keeps its first value, and a NaN key matches nothing (NaN != NaN), as in
    onnxruntime, whose NaN-equal keys came with opset 4."""
    return _label_encoder_fn(_label_encoder_table(info.attrs, "LabelEncoder", False,
                                                  nan_matches=False))


@kernel("LabelEncoder", since=4, domain=ML, factory=True)
def label_encoder_4(info: NodeInfo):
    """LabelEncoder with keys/values/default also given as tensors (any T1/T2 of the schema).
    A repeated key takes its last value, as the spec says (onnxruntime keeps the first)."""
    return _label_encoder_fn(_label_encoder_table(info.attrs, "LabelEncoder", True))


@kernel("CategoryMapper", since=1, domain=ML, factory=True)
def category_mapper(info: NodeInfo):
    """String -> int64 (cats_strings -> cats_int64s) or int64 -> string, with defaults."""
    strings = _str_array(string_list(info.attrs.get("cats_strings")) or [])
    ints = np.asarray(info.attrs.get("cats_int64s") or [], dtype=_I64)
    if strings.size != ints.size:
        raise ValueError(
            f"CategoryMapper: {strings.size} cats_strings but {ints.size} cats_int64s"
        )
    d_int = int(info.attrs.get("default_int64", -1))
    d_str = attr_str(info.attrs.get("default_string", "_Unused"))
    to_int = _Lookup(strings, ints, d_int, "CategoryMapper")
    to_str = _Lookup(ints, strings, d_str, "CategoryMapper")

    def run(x):
        return to_int(x) if _is_str(x.dtype) else to_str(x.astype(_I64, copy=False))

    return run


@kernel("OneHotEncoder", since=1, domain=ML, factory=True)
def one_hot_encoder(info: NodeInfo):
    """Y[..., k] = 1.0 where X equals category k (numbers truncated to int64); shape X + [K]."""
    strings = string_list(info.attrs.get("cats_strings"))
    ints = info.attrs.get("cats_int64s")
    zeros = int(info.attrs.get("zeros", 1))
    cats: Any = strings if strings else ints
    if not cats:
        raise ValueError("OneHotEncoder: one of cats_strings and cats_int64s must be set")
    n = len(cats)
    if strings:
        table = _Lookup(_str_array(strings), np.arange(n, dtype=_I64), -1, "OneHotEncoder")
    else:
        table = _Lookup(np.asarray(ints, _I64), np.arange(n, dtype=_I64), -1, "OneHotEncoder")

    def run(x):
        if strings and not _is_str(x.dtype):
            raise ValueError(f"OneHotEncoder: categories are strings but the input is {x.dtype}")
        if not strings and _is_str(x.dtype):
            raise ValueError("OneHotEncoder: categories are integers but the input is strings")
        idx = table(x if strings else x.astype(_I64)).reshape(-1)
        missing = idx < 0
        if not zeros and missing.any():
            raise ValueError("OneHotEncoder: unknown category and zeros = 0")
        out = np.zeros((idx.size, n), dtype=_F32)
        rows = np.flatnonzero(~missing)
        out[rows, idx[rows]] = 1.0
        return out.reshape(*x.shape, n)

    return run


# FeatureVectorizer, ArrayFeatureExtractor


@kernel("FeatureVectorizer", since=1, domain=ML, factory=True)
def feature_vectorizer(info: NodeInfo):
    """Concatenate inputs as [N, C_i] float32 blocks of inputdimensions[i] columns each."""
    dims = [int(d) for d in (info.attrs.get("inputdimensions") or [])]

    def run(*xs):
        if len(dims) != len(xs):
            raise ValueError(
                f"FeatureVectorizer: {len(xs)} inputs but {len(dims)} inputdimensions"
            )
        blocks = [as_features(x, "FeatureVectorizer") for x in xs]
        n = blocks[0].shape[0] if blocks else 0
        out = np.zeros((n, sum(dims)), dtype=_F32)
        col = 0
        for b, d in zip(blocks, dims):
            if b.shape[0] != n:
                raise ValueError(
                    f"FeatureVectorizer: inputs have {n} and {b.shape[0]} rows; they must match"
                )
            w = min(d, b.shape[1])
            out[:, col : col + w] = b[:, :w]
            col += d
        return out

    return run


@kernel("ArrayFeatureExtractor", since=1, domain=ML)
def array_feature_extractor(x, y):
    """Z = X[..., Y] on the last axis (a 1-D X gives [1, len(Y)])."""
    if x.ndim == 0:
        raise ValueError("ArrayFeatureExtractor: X must have at least one dimension")
    z = np.take(x, _feature_indices(y, x.shape[-1]), axis=-1)
    return z.reshape(1, -1) if x.ndim == 1 else z


def _feature_indices(y: Any, size: int) -> np.ndarray:
    idx = np.asarray(y, dtype=_I64).reshape(-1)
    if idx.size and (idx.min() < 0 or idx.max() >= size):
        bad = int(idx[(idx < 0) | (idx >= size)][0])
        raise IndexError(f"ArrayFeatureExtractor: index {bad} is out of range [0, {size})")
    return idx


def _extractor_specialize(dtypes, shapes, consts):
    """With constant indices Y (the usual case), checked once: one np.take a run."""
    sx, y = shapes[0], consts[1]
    if sx is None or len(sx) == 0 or y is None:
        return None
    idx = _feature_indices(y, sx[-1])
    flat = len(sx) == 1

    def run(x, y):
        z = np.take(x, idx, axis=-1)
        return z.reshape(1, -1) if flat else z

    return run


array_feature_extractor.specialize = _extractor_specialize


# Map-typed ops (ZipMap, DictVectorizer, CastMap). Maps are Python dicts.


@kernel("ZipMap", since=1, domain=ML, factory=True, capture=CaptureSupport.HOST_SYNC)
def zip_map(info: NodeInfo):
    """[N, C] float scores -> list of N dicts {class label: float}."""
    strings = string_list(info.attrs.get("classlabels_strings"))
    ints = info.attrs.get("classlabels_int64s")
    if bool(strings) == bool(ints):
        raise ValueError("ZipMap: set exactly one of classlabels_strings and classlabels_int64s")
    labels = list(strings) if strings else [int(v) for v in ints]

    def run(x):
        v = as_features(np.asarray(x), "ZipMap")
        if x.ndim > 2:
            raise ValueError(f"ZipMap: X must be 1-D or 2-D, got shape {list(x.shape)}")
        if v.shape[1] != len(labels):
            raise ValueError(f"ZipMap: X has {v.shape[1]} columns but there are "
                             f"{len(labels)} labels")
        # every row's dict built in C (map/zip): ~0.7 us a row, most of it the dict itself
        return list(map(dict, map(zip, repeat(labels), v.astype(_F32, copy=False).tolist())))

    return run


_MAP_OUT = {DataType.FLOAT: _F32, DataType.DOUBLE: _F64, DataType.INT64: _I64,
            DataType.STRING: _OBJ}


def _value_dtype(values: list[Any], declared: DataType | None) -> np.dtype:
    if declared in _MAP_OUT:
        return _MAP_OUT[declared]
    for v in values:
        if isinstance(v, (str, bytes)):
            return _OBJ
        if isinstance(v, np.generic):
            return v.dtype
        if isinstance(v, (int, np.integer)) and not isinstance(v, bool):
            return _I64
    return _F32


@kernel("DictVectorizer", since=1, domain=ML, factory=True, capture=CaptureSupport.HOST_SYNC)
def dict_vectorizer(info: NodeInfo):
    """A dict (or list of dicts) -> [N, V] by the vocabulary's positions; absent keys are 0."""
    strings = string_list(info.attrs.get("string_vocabulary"))
    ints = info.attrs.get("int64_vocabulary")
    if bool(strings) == bool(ints):
        raise ValueError(
            "DictVectorizer: set exactly one of string_vocabulary and int64_vocabulary"
        )
    vocab = list(strings) if strings else [int(v) for v in ints]
    position = {k: i for i, k in enumerate(vocab)}
    declared = info.output_dtypes[0] if info.output_dtypes else None

    def run(x):
        maps = x if isinstance(x, (list, tuple)) else [x]
        if not all(isinstance(m, Mapping) for m in maps):
            raise ValueError(f"DictVectorizer: input must be a dict, got {type(x).__name__}")
        dt = _value_dtype([v for m in maps for v in m.values()], declared)
        out = np.zeros((len(maps), len(vocab)), dtype=dt)
        if dt == _OBJ:
            out[...] = ""
        for r, m in enumerate(maps):
            for k, v in m.items():
                key = _text(k) if strings else int(k)
                i = position.get(key)
                if i is not None:
                    out[r, i] = _text(v) if dt == _OBJ else v
        return out

    return run


def _to_string(v: Any) -> str:
    if isinstance(v, str):
        return v
    if isinstance(v, bytes):
        return v.decode("utf-8")
    f = float(v)
    if f != f:
        return "nan" if np.signbit(f) is np.False_ else "-nan"
    if f in (np.inf, -np.inf):
        return "inf" if f > 0 else "-inf"
    return f"{f:f}"


@kernel("CastMap", since=1, domain=ML, factory=True, capture=CaptureSupport.HOST_SYNC)
def cast_map(info: NodeInfo):
    """map(int64, float|string) -> [1, n] tensor ordered by key (DENSE) or at key (SPARSE)."""
    cast_to = attr_str(info.attrs.get("cast_to", "TO_FLOAT"))
    form = attr_str(info.attrs.get("map_form", "DENSE"))
    max_map = int(info.attrs.get("max_map", 1))
    convert: dict[str, tuple[np.dtype, Callable[[Any], Any], Any]] = {
        "TO_FLOAT": (_F32, lambda v: float(v), 0.0),
        "TO_INT64": (_I64, lambda v: int(float(v)) if isinstance(v, str) else int(v), 0),
        "TO_STRING": (_OBJ, _to_string, "0.f"),
    }
    if cast_to not in convert:
        raise ValueError(f"CastMap: cast_to must be one of {list(convert)}, got {cast_to!r}")
    if form not in ("DENSE", "SPARSE"):
        raise ValueError(f"CastMap: map_form must be DENSE or SPARSE, got {form!r}")
    dt, conv, pad = convert[cast_to]

    def run(x):
        if not isinstance(x, Mapping):
            raise ValueError(f"CastMap: input must be a dict, got {type(x).__name__}")
        if not x:
            raise ValueError("CastMap: the input map is empty")
        items = sorted((int(k), v) for k, v in x.items())
        if form == "DENSE":
            out = np.empty((1, len(items)), dtype=dt)
            for i, (_, v) in enumerate(items):
                out[0, i] = conv(v)
            return out
        out = np.empty((1, max_map), dtype=dt)
        out[...] = pad
        for k, v in items:
            if 0 <= k < max_map:
                out[0, k] = conv(v)
        return out

    return run
