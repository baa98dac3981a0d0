"""Warmup inputs: WarmupShape lists split into shape sets, and zero feeds for each."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from onnxkiln.dtypes import DataType, from_numpy
from onnxkiln.errors import InputNotFoundError, InvalidInputError
from onnxkiln.types import IoMeta, WarmupShape

__all__ = ["feeds", "shape_sets"]


def feeds(inputs: Sequence[IoMeta], group: Sequence[WarmupShape]) -> dict[str, np.ndarray]:
    """Zeros for one shape set; inputs it leaves out take their declared shape, symbolic
    dims bound from the named inputs."""
    metas = {m.name: m for m in inputs}
    sizes: dict[str, int] = {}
    out: dict[str, np.ndarray] = {}
    for ws in group:
        meta = metas.get(ws.input_name)
        if meta is None:
            raise InputNotFoundError(
                f"warmup names unknown input '{ws.input_name}'; the model's inputs are "
                f"{[m.name for m in inputs]}"
            )
        shape = _warmup_shape(ws)
        for dim, size in zip(meta.shape or (), shape):
            if isinstance(dim, str):
                sizes.setdefault(dim, size)
        out[ws.input_name] = _zeros(shape, _warmup_dtype(ws, meta))
    for meta in inputs:
        if meta.name not in out and not meta.optional:
            out[meta.name] = _zeros(_declared_shape(meta, sizes), meta.dtype)
    return out


def shape_sets(shapes: Sequence[WarmupShape]) -> list[list[WarmupShape]]:
    """Split a WarmupShape list into shape sets: a repeated input name starts a new one."""
    sets: list[list[WarmupShape]] = []
    current: dict[str, WarmupShape] = {}
    for ws in shapes:
        if not isinstance(ws, WarmupShape):
            raise InvalidInputError(f"warmup takes WarmupShape items, got {ws!r}")
        if ws.input_name in current:
            sets.append(list(current.values()))
            current = {}
        current[ws.input_name] = ws
    if current:
        sets.append(list(current.values()))
    return sets


def _warmup_shape(ws: WarmupShape) -> tuple[int, ...]:
    shape = tuple(ws.shape)
    if not all(isinstance(d, int | np.integer) and d >= 0 for d in shape):
        raise InvalidInputError(
            f"warmup shape for '{ws.input_name}' must hold sizes >= 0, got {ws.shape!r}")
    return tuple(int(d) for d in shape)


def _warmup_dtype(ws: WarmupShape, meta: IoMeta) -> DataType:
    if ws.dtype is None:
        return meta.dtype
    if isinstance(ws.dtype, int):
        return DataType(ws.dtype)
    return from_numpy(ws.dtype)


def _declared_shape(meta: IoMeta, sizes: dict[str, int]) -> tuple[int, ...]:
    if meta.shape is None or meta.kind != "tensor" or meta.dtype == DataType.UNDEFINED:
        raise InvalidInputError(
            f"warmup needs a WarmupShape for input '{meta.name}' ({meta}): its type is unknown")
    dims = []
    for axis, dim in enumerate(meta.shape or ()):
        size = dim if isinstance(dim, int) else sizes.get(dim) if isinstance(dim, str) else None
        if size is None:
            raise InvalidInputError(
                f"warmup cannot size input '{meta.name}' ({meta}): dim {dim!r} at axis {axis} "
                f"is not bound by the other warmup shapes; add WarmupShape('{meta.name}', ...)")
        dims.append(size)
    return tuple(dims)


def _zeros(shape: tuple[int, ...], dtype: DataType) -> np.ndarray:
    np_dtype = DataType(dtype).numpy
    if np_dtype.kind == "O":
        return np.full(shape, "", dtype=object)
    return np.zeros(shape, dtype=np_dtype)
