"""The inputs of `run`, `bench` and `profile`: .npy files, or random values.

Named dims take their sizes from the inputs given as files first, then from `--dim`, else
1. Random integers are token-like: [0, 2) is a valid id for every vocabulary, type-id and
mask table (an input whose name says "mask" gets 1s); `--input NAME=ints:LOW:HIGH` asks
for another range.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from onnxkiln.cli import UsageError
from onnxkiln.dtypes import DataType, to_numpy
from onnxkiln.types import IoMeta

__all__ = ["Feeds", "make_feeds", "random_input"]

INTS = (0, 2)
MASK_INTS = (1, 2)


@dataclass(frozen=True)
class Feeds:
    """The arrays to run on, the named dims they use, and each input's origin."""

    arrays: dict[str, np.ndarray]
    dims: dict[str, int]
    origin: dict[str, str]  # name -> the file, "random" or "ints:LOW:HIGH"


@dataclass(frozen=True)
class _Source:
    path: Path | None = None
    ints: tuple[int, int] | None = None


def make_feeds(inputs: list[IoMeta], input_args: list[str], dim_args: list[str],
               seed: int) -> Feeds:
    """Feeds for a model's inputs from `--input` and `--dim` values; UsageError names what
    on the command line is wrong."""
    names = [m.name for m in inputs]
    sources = {name: _source(name, text) for name, text in _pairs(input_args, "--input")}
    unknown = sorted(set(sources) - set(names))
    if unknown:
        raise UsageError(f"unknown input(s) {unknown}; the model's inputs are {names}")
    asked = {name: _size(name, text) for name, text in _pairs(dim_args, "--dim")}
    known = {d for m in inputs for d in (m.shape or ()) if isinstance(d, str)}
    if set(asked) - known:
        raise UsageError(f"unknown --dim name(s) {sorted(set(asked) - known)}; the model's "
                         f"named dims are {sorted(known) or 'none'}")
    arrays = {name: _load(name, s.path) for name, s in sources.items() if s.path is not None}
    dims = _dims_of(inputs, arrays, asked)
    rng = np.random.default_rng(seed)
    origin = {name: str(s.path) for name, s in sources.items() if s.path is not None}
    for meta in inputs:
        if meta.name in arrays or (meta.optional and meta.name not in sources):
            continue
        ints = sources.get(meta.name, _Source()).ints
        if ints is not None:
            _check_fits(meta, ints)
        arrays[meta.name] = random_input(meta, dims, rng, ints)
        origin[meta.name] = f"ints:{ints[0]}:{ints[1]}" if ints else "random"
    for d in known - set(dims):
        dims[d] = 1
    return Feeds({m.name: arrays[m.name] for m in inputs if m.name in arrays}, dims, origin)


def random_input(meta: IoMeta, dims: dict[str, int], rng: np.random.Generator,
                 ints: tuple[int, int] | None = None) -> np.ndarray:
    """A random array for an input: named dims from `dims` (else 1), other free dims 1.
    Values: integers from [ints[0], ints[1]) when given; else integers (and strings of
    digits) from INTS, masks (integer or bool) all 1, floats from a normal distribution."""
    shape = tuple(d if isinstance(d, int) else dims.get(d, 1) if isinstance(d, str) else 1
                  for d in (meta.shape or ()))
    dtype = to_numpy(meta.dtype) if meta.dtype != DataType.UNDEFINED else np.dtype(np.float32)
    mask = "mask" in meta.name.lower()
    if dtype == np.bool_ and ints is None:
        return np.ones(shape, bool) if mask else rng.random(shape) < 0.5
    if dtype.kind in "iuO" or ints is not None:
        low, high = ints or (MASK_INTS if mask and dtype.kind != "O" else INTS)
        values = rng.integers(low, high, size=shape)
        if dtype.kind == "O":
            return np.array(values.astype(str), dtype=object)
        return values.astype(dtype)
    return rng.standard_normal(shape).astype(np.float32).astype(dtype)


def _check_fits(meta: IoMeta, ints: tuple[int, int]) -> None:
    dtype = to_numpy(meta.dtype) if meta.dtype != DataType.UNDEFINED else None
    if dtype is not None and dtype.kind in "iu":
        info = np.iinfo(dtype)
        if ints[0] < info.min or ints[1] - 1 > info.max:
            raise UsageError(f"--input {meta.name}=ints:{ints[0]}:{ints[1]}: the input is "
                             f"{dtype}, which holds {info.min}..{info.max}")


def _dims_of(inputs: list[IoMeta], arrays: dict[str, np.ndarray],
             asked: dict[str, int]) -> dict[str, int]:
    """Named dims bound by the given arrays' shapes, then by --dim (which must agree)."""
    dims: dict[str, int] = {}
    for meta in inputs:
        array = arrays.get(meta.name)
        if array is None or meta.shape is None or array.ndim != len(meta.shape):
            continue  # a rank mismatch is the session's to report
        for d, size in zip(meta.shape, array.shape):
            if isinstance(d, str):
                dims.setdefault(d, int(size))
    for d, size in asked.items():
        if d in dims and dims[d] != size:
            raise UsageError(f"--dim {d}={size} disagrees with the given inputs, where "
                             f"{d} is {dims[d]}")
        dims[d] = size
    return dims


def _pairs(items: list[str], flag: str) -> list[tuple[str, str]]:
    out = []
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name or not value:
            raise UsageError(f"{flag} takes NAME=VALUE, got {item!r}")
        out.append((name, value))
    return out


def _source(name: str, text: str) -> _Source:
    if text == "random":
        return _Source()
    if text.startswith("ints:"):
        parts = text.split(":")
        try:
            low, high = int(parts[1]), int(parts[2])
        except (IndexError, ValueError):
            low = high = None
        if len(parts) != 3 or low is None or high is None or low >= high:
            raise UsageError(f"--input {name}=ints:LOW:HIGH takes integers with LOW < HIGH, "
                             f"got {text!r}")
        return _Source(ints=(low, high))
    return _Source(path=Path(text))


def _size(name: str, text: str) -> int:
    try:
        size = int(text)
    except ValueError:
        size = -1
    if size < 0:
        raise UsageError(f"--dim {name} takes a size >= 0, got {text!r}")
    return size


def _load(name: str, path: Path) -> np.ndarray:
    """One array from a .npy file; every way it can fail is a UsageError naming the file."""
    where = f"--input {name}={path}"
    if not path.is_file():
        raise UsageError(f"{where}: no such file" if not path.exists() else
                         f"{where}: not a file")
    with open(path, "rb") as f:
        magic = f.read(6)
    if magic.startswith(b"PK"):
        with np.load(path, allow_pickle=False) as archive:
            keys = ", ".join(archive.files[:8]) + (", …" if len(archive.files) > 8 else "")
        raise UsageError(f"{where}: an .npz archive (arrays {keys or 'none'}); an input "
                         "takes one .npy array: save each with numpy.save")
    if magic != b"\x93NUMPY":
        raise UsageError(f"{where}: not a .npy file (numpy.save writes them)")
    try:
        return np.load(path, allow_pickle=False)
    except ValueError as e:
        if "pickle" in str(e).lower():
            raise UsageError(f"{where}: the array holds Python objects (pickled), which "
                             "onnxkiln does not load; save a plain array") from None
        raise UsageError(f"{where}: a broken .npy file ({e})") from None
    except (OSError, EOFError) as e:
        raise UsageError(f"{where}: cannot read the .npy file ({e})") from None
