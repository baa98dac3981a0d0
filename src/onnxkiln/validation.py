"""Checks and converts the inputs of a run against the graph's declared inputs."""

from __future__ import annotations

import difflib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from onnxkiln.dtypes import DataType, from_numpy, to_numpy
from onnxkiln.errors import InputNotFoundError, InvalidInputError, SessionError, ShapeError
from onnxkiln.types import IoMeta

__all__ = ["InputSpec", "InputValidator"]


@dataclass(frozen=True, slots=True)
class InputSpec:
    """One declared input, precomputed for fast checks."""

    meta: IoMeta
    position: int
    np_dtype: np.dtype | None
    default: np.ndarray | None


class InputValidator:
    """Turns user inputs into the positional list a plan runs on, or raises a clear error."""

    def __init__(self, metas: Sequence[IoMeta], defaults: Sequence[np.ndarray | None],
                 device: Any = None) -> None:
        self.device = device  # a device provider: its tensors are taken as they are
        self.specs = [
            InputSpec(m, i, _np_dtype(m), d) for i, (m, d) in enumerate(zip(metas, defaults))
        ]
        self.by_name = {s.meta.name: s for s in self.specs}
        self.names = [m.name for m in metas]
        # (name, dtype, shape) per given array -> (positions, values template, signature) of
        # a binding that passed every check with the arrays taken as they are
        self._memo: dict[tuple, tuple[tuple[int, ...], list[Any], tuple]] = {}

    def bind(self, inputs: Any) -> tuple[list[Any], tuple]:
        """Positional values and the run's signature (dtype and shape per input).

        A dict of numpy arrays whose names, dtypes and shapes passed the checks before
        skips them: the checks depend on nothing else."""
        if type(inputs) is dict:
            key = []
            for name, v in inputs.items():
                if type(v) is not np.ndarray:
                    break
                key.append((name, v.dtype, v.shape))
            else:
                key = tuple(key)
                hit = self._memo.get(key)
                if hit is not None:
                    positions, template, signature = hit
                    values = template.copy()
                    for p, v in zip(positions, inputs.values()):
                        values[p] = v
                    return values, signature
                values, signature = self._bind(inputs)
                self._remember(key, inputs, values, signature)
                return values, signature
        return self._bind(inputs)

    def _remember(self, key: tuple, inputs: dict, values: list[Any], signature: tuple) -> None:
        positions = tuple(self.by_name[name].position for name in inputs)
        if any(values[p] is not v for p, v in zip(positions, inputs.values())):
            return  # an input was converted: keep checking those
        template = list(values)
        for p in positions:
            template[p] = None
        if len(self._memo) >= 64:
            self._memo.clear()
        self._memo[key] = (positions, template, signature)

    def _bind(self, inputs: Any) -> tuple[list[Any], tuple]:
        given = self._normalise(inputs)
        values: list[Any] = [None] * len(self.specs)
        for name, raw in given.items():
            position, value = self.convert(name, raw)
            values[position] = value
        missing = [s.meta.name for s in self.specs if values[s.position] is None]
        for name in missing:
            spec = self.by_name[name]
            if spec.default is not None:
                values[spec.position] = spec.default
            elif not spec.meta.optional:
                required = [s.meta.name for s in self.specs if not s.meta.optional]
                raise InputNotFoundError(
                    f"missing required input '{name}' ({spec.meta}); the model requires "
                    f"{required}"
                )
        signature = tuple(
            (v.dtype, v.shape) if isinstance(v, np.ndarray)
            else (v.dtype, tuple(v.shape)) if self.device is not None and hasattr(v, "shape")
            else (type(v), None)
            for v in values
        )
        return values, signature

    def convert(self, name: str, raw: Any) -> tuple[int, Any]:
        """(position, array) of one named input, converted and checked as `bind` does."""
        spec = self.by_name.get(name)
        if spec is None:
            raise InputNotFoundError(self._unknown(name))
        try:
            return spec.position, self._convert(spec, raw)
        except SessionError:
            raise
        except Exception as e:  # numpy or the caller's __array__/__dlpack__ refused it
            raise InvalidInputError(
                f"input '{name}' ({spec.meta}) cannot be converted to an array: "
                f"{type(e).__name__}: {e}"
            ) from e

    def _normalise(self, inputs: Any) -> dict[str, Any]:
        if isinstance(inputs, Mapping):
            items = list(inputs.items())
        elif isinstance(inputs, Sequence) and not isinstance(inputs, str | bytes):
            items = []
            for item in inputs:
                if not (isinstance(item, tuple | list) and len(item) == 2):
                    raise InvalidInputError(
                        "inputs must be a mapping {name: array} or a sequence of (name, array) "
                        f"pairs; got an item of type {type(item).__name__}"
                    )
                items.append((item[0], item[1]))
        else:
            raise InvalidInputError(
                "inputs must be a mapping {name: array} or a sequence of (name, array) pairs, "
                f"got {type(inputs).__name__}"
            )
        out: dict[str, Any] = {}
        for name, value in items:
            if not isinstance(name, str):
                raise InvalidInputError(f"input names must be str, got {name!r}")
            if name in out:
                raise InvalidInputError(f"input '{name}' is given twice")
            out[name] = value
        return out

    def _unknown(self, name: str) -> str:
        close = closest_name(name, self.names)
        hint = f"; did you mean '{close}'?" if close else ""
        return f"unknown input '{name}'; the model's inputs are {self.names}{hint}"

    def _convert(self, spec: InputSpec, raw: Any) -> Any:
        meta = spec.meta
        if meta.kind != "tensor":
            return _convert_container(spec, raw)
        expected = spec.np_dtype
        if self.device is not None and not isinstance(raw, np.ndarray):
            tensor = self.device.adopt(raw)
            if tensor is not None:
                return self._device_tensor(spec, tensor, self.device.array_dtype(tensor))
        if isinstance(raw, np.ndarray):
            array = raw if type(raw) is np.ndarray else _plain(raw)
        elif isinstance(raw, np.generic) or hasattr(raw, "__array__"):
            array = np.asarray(raw)
        elif hasattr(raw, "__dlpack__"):
            array = np.from_dlpack(raw)
        else:
            array = _from_python(raw, expected, meta)
        if expected is not None and array.dtype != expected:
            if not (expected.kind == "O" and array.dtype.kind in "USO"):
                raise InvalidInputError(
                    f"input '{meta.name}' expects {meta.dtype} ({meta}), got {_describe(array)}; "
                    f"cast it with x.astype({_np_name(expected)})"
                )
            array = _strings(array, meta)
        _check_shape(meta, array)
        return array

    def _device_tensor(self, spec: InputSpec, raw: Any, dtype: np.dtype) -> Any:
        """A tensor on the session's device: checked like an array, never copied here."""
        meta = spec.meta
        if spec.np_dtype is not None and dtype != spec.np_dtype:
            raise InvalidInputError(
                f"input '{meta.name}' expects {meta.dtype} ({meta}), got a {raw.dtype} tensor "
                f"of shape {tuple(raw.shape)}; cast it first (e.g. x.to(torch.float32))")
        _check_shape(meta, raw)
        return raw

    def check_shape(self, position: int, value: Any) -> None:
        """Raise ShapeError when `value` does not fit the static dims of input `position`."""
        _check_shape(self.specs[position].meta, value)


def closest_name(name: str, names: Sequence[str]) -> str | None:
    """The valid name a mistyped one most likely meant: same letters in another case first,
    else the closest spelling (difflib), else None."""
    folded = [n for n in names if n.lower() == str(name).lower()]
    if folded:
        return folded[0]
    close = difflib.get_close_matches(str(name), list(names), n=1)
    return close[0] if close else None


def _convert_container(spec: InputSpec, raw: Any) -> Any:
    """Map inputs must be dicts; sequences become lists of arrays of the element type."""
    meta = spec.meta
    if meta.kind == "map":
        if not isinstance(raw, dict):
            raise InvalidInputError(
                f"input '{meta.name}' expects a map (a dict), got {type(raw).__name__}"
            )
        return raw
    if raw is None:
        if meta.kind == "optional":
            return None
        raise InvalidInputError(f"input '{meta.name}' expects a {meta.kind}, got None")
    if meta.kind == "sequence" or isinstance(raw, list | tuple):
        if not isinstance(raw, list | tuple):
            raise InvalidInputError(
                f"input '{meta.name}' expects a sequence (a list of arrays), got "
                f"{type(raw).__name__}"
            )
        return [_element(spec, item, i) for i, item in enumerate(raw)]
    return _plain(raw)


def _plain(raw: Any) -> np.ndarray:
    """A base-class ndarray: np.matrix stays 2-D and masked arrays keep their masks under
    numpy's functions, so kernels would compute something else; a masked array gives its
    data, masked entries included, as onnxruntime reads it."""
    return np.asarray(raw)


def _element(spec: InputSpec, item: Any, index: int) -> Any:
    if isinstance(item, dict):
        return item
    expected = spec.np_dtype
    array = _plain(item) if isinstance(item, np.ndarray) else np.asarray(item, dtype=expected)
    if expected is not None and expected.kind == "O" and array.dtype.kind in "US":
        return _strings(array, spec.meta)
    if expected is not None and array.dtype != expected and expected.kind != "O":
        raise InvalidInputError(
            f"input '{spec.meta.name}' element {index} expects {spec.meta.dtype}, got "
            f"{_describe(array)}; cast it with x.astype({_np_name(expected)})"
        )
    return array


def _check_shape(meta: IoMeta, array: np.ndarray) -> None:
    if meta.shape is None:
        return
    if array.ndim != len(meta.shape):
        raise ShapeError(
            f"input '{meta.name}' expects rank {len(meta.shape)} ({meta}), got shape "
            f"{tuple(array.shape)} (rank {array.ndim})"
        )
    for axis, (want, got) in enumerate(zip(meta.shape, array.shape)):
        if isinstance(want, int) and want != got:
            raise ShapeError(
                f"input '{meta.name}' expects dim {want} at axis {axis} ({meta}), got shape "
                f"{tuple(array.shape)}"
            )


def _from_python(raw: Any, expected: np.dtype | None, meta: IoMeta) -> np.ndarray:
    """Python scalars and (nested) lists: take the model's dtype when no precision is lost."""
    try:
        natural = np.asarray(raw)
    except (ValueError, TypeError) as e:
        raise InvalidInputError(f"input '{meta.name}': cannot make an array of {raw!r}: {e}") from e
    if natural.dtype == object and expected is not None and expected.kind != "O":
        raise InvalidInputError(
            f"input '{meta.name}' expects {meta.dtype}, got a {type(raw).__name__} that is "
            "not a rectangular array of numbers"
        )
    if expected is None or natural.dtype == expected:
        return natural
    if natural.dtype.kind in "US" and expected.kind == "O":
        return _strings(natural, meta)
    if natural.size == 0 or np.can_cast(natural.dtype, expected, casting="same_kind") or (
            natural.dtype.kind in "iu" and expected.kind in "iu"):
        return _cast_exactly(natural, expected, meta)
    raise InvalidInputError(
        f"input '{meta.name}' expects {meta.dtype}, got Python values of kind "
        f"{natural.dtype}; convert them first"
    )


def _strings(array: np.ndarray, meta: IoMeta) -> np.ndarray:
    """A string tensor as onnxruntime holds it: an object array of str; numpy bytes (`S`)
    decode as UTF-8."""
    if array.dtype.kind != "S":
        return array.astype(object)
    out = np.empty(array.shape, dtype=object)
    for index, item in np.ndenumerate(array):
        try:
            out[index] = item.decode("utf-8")
        except UnicodeDecodeError as e:
            raise InvalidInputError(
                f"input '{meta.name}' ({meta}): element {list(index)} is not UTF-8 text: "
                f"{e}") from e
    return out


def _cast_exactly(natural: np.ndarray, expected: np.dtype, meta: IoMeta) -> np.ndarray:
    """Python numbers in the model's dtype, refused where the cast would wrap an integer or
    turn a finite number into infinity (numpy does both silently)."""
    if natural.size and natural.dtype.kind in "iu" and expected.kind in "iu":
        info = np.iinfo(expected)
        low, high = natural.min(), natural.max()
        if low < info.min or high > info.max:
            bad = low if low < info.min else high
            raise InvalidInputError(
                f"input '{meta.name}' expects {meta.dtype}, but the value {bad} is outside "
                f"its range [{info.min}, {info.max}]")
    with np.errstate(over="ignore"):
        array = natural.astype(expected)
    if expected.kind == "f" and natural.dtype.kind in "iuf":
        overflow = np.isinf(array) & np.isfinite(natural)
        if overflow.any():
            bad = natural[overflow].flat[0]
            raise InvalidInputError(
                f"input '{meta.name}' expects {meta.dtype}, but the value {bad} overflows it "
                f"(largest finite: {float(np.finfo(expected).max)})")
    return array


def _np_dtype(meta: IoMeta) -> np.dtype | None:
    if meta.dtype == DataType.UNDEFINED:
        return None
    try:
        return to_numpy(meta.dtype)
    except KeyError:
        return None


def _np_name(dtype: np.dtype) -> str:
    """How to spell the dtype in a cast: np.float32, ml_dtypes.bfloat16, object."""
    if dtype.kind == "O":
        return "object"
    module = "ml_dtypes" if dtype.type.__module__.startswith("ml_dtypes") else "np"
    return f"{module}.{dtype.name}"


def _describe(array: np.ndarray) -> str:
    try:
        name = str(from_numpy(array.dtype))
    except KeyError:
        name = str(array.dtype)
    return f"{name} array of shape {tuple(array.shape)}"
