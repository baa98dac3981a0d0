"""`BatchPredictor`: a callable class for `ray.data.Dataset.map_batches`.

It needs neither Ray nor pandas to import: Ray Data instantiates it once per actor and
calls it with each batch (a dict of numpy arrays, or a pandas DataFrame).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import onnx

from onnxkiln.dtypes import DataType
from onnxkiln.errors import InputNotFoundError, InvalidOptionError, SessionError
from onnxkiln.integrations.ray._config import SessionConfig, model_source
from onnxkiln.session import InferenceSession

__all__ = ["BatchPredictor"]

_CASTS = ("no", "equiv", "safe", "same_kind", "unsafe")


class BatchPredictor:
    """Runs an ONNX model on Ray Data batches; one `InferenceSession` per actor.

    Ray Data builds the class once in each actor of the pool (the model loads once per
    actor) and calls it on every batch. Each model input is read from the batch column of
    the same name unless `input_columns` says otherwise; each model output becomes a
    column named after it (or as `output_columns` renames it). Batches may be dicts of
    numpy arrays (`batch_format="numpy"`) or pandas DataFrames (`batch_format="pandas"`);
    the result has the same form.

    Args:
        model: a file path (every node must see it there), model bytes or an
            `onnx.ModelProto`.
        input_columns: input name -> column name, or -> a list of column names whose
            values are stacked along a new last axis (tabular features into an `[N, k]`
            input). Inputs not named take the column of their own name; optional
            inputs are fed only when that column exists.
        output_columns: output name -> column name (default: the output's name). Outputs
            not named keep their name; name an output `None` to drop it.
        keep_columns: batch columns copied into the result (e.g. an id), or True for all.
        cast: columns whose dtype differs from the input's are cast when numpy allows it
            under this rule (default "same_kind": float64 -> float32, int64 -> float32);
            None passes them as they are, so a mismatch raises the session's error.
        device, providers, optimization, intra_op_threads, options: passed to
            `InferenceSession.builder()`. With `num_gpus=1` actors, "auto" or "cuda" runs
            on the actor's GPU.

    Example:
        >>> ds.map_batches(BatchPredictor, fn_constructor_kwargs={"model": "m.onnx"},
        ...                batch_size=1024, compute=ray.data.ActorPoolStrategy(size=2))
    """

    def __init__(
        self,
        model: str | os.PathLike | bytes | onnx.ModelProto,
        *,
        input_columns: Mapping[str, str | Sequence[str]] | None = None,
        output_columns: Mapping[str, str | None] | None = None,
        keep_columns: Sequence[str] | bool = (),
        cast: str | None = "same_kind",
        device: str = "auto",
        providers: Sequence[str] | None = None,
        optimization: str = "all",
        intra_op_threads: int | None = None,
        options: Mapping[str, str] | None = None,
        config: SessionConfig | None = None,
    ) -> None:
        if cast is not None and cast not in _CASTS:
            raise InvalidOptionError(f"cast must be one of {list(_CASTS)} or None, got {cast!r}")
        config = config or SessionConfig.of(device, providers, optimization, intra_op_threads,
                                            options)
        self.session: InferenceSession = config.load(model_source(model))
        self._cast = cast
        self._keep = keep_columns if isinstance(keep_columns, bool) else tuple(keep_columns)
        metas = {m.name: m for m in self.session.inputs()}
        mapping = dict(input_columns or {})
        unknown = sorted(set(mapping) - set(metas))
        if unknown:
            raise InputNotFoundError(
                f"input_columns names {unknown}, which are not inputs of the model; its inputs "
                f"are {list(metas)}")
        self._sources: list[tuple[str, str | tuple[str, ...], bool]] = []
        for name, meta in metas.items():
            cols = mapping.get(name, name)
            cols = cols if isinstance(cols, str) else tuple(cols)
            self._sources.append((name, cols, meta.optional and name not in mapping))
        self._targets = {m.name: _numpy_dtype(m.dtype) for m in metas.values()}
        out_names = [m.name for m in self.session.outputs()]
        renames = dict(output_columns or {})
        unknown = sorted(set(renames) - set(out_names))
        if unknown:
            raise InvalidOptionError(
                f"output_columns names {unknown}, which are not outputs of the model; its "
                f"outputs are {out_names}")
        self._outputs = [(i, renames.get(n, n)) for i, n in enumerate(out_names)
                         if renames.get(n, n) is not None]

    def __call__(self, batch: Any) -> Any:
        """Run the model on one batch; returns the batch's kind (dict or DataFrame)."""
        is_frame = hasattr(batch, "columns") and hasattr(batch, "iloc")
        columns = list(batch.columns) if is_frame else list(batch)
        rows = len(batch) if is_frame else _rows(batch)
        feeds = {}
        for name, cols, optional in self._sources:
            if isinstance(cols, str):
                if cols not in columns:
                    if optional:
                        continue
                    raise InputNotFoundError(
                        f"the batch has no column '{cols}' for model input '{name}'; its "
                        f"columns are {columns}; map one with input_columns={{'{name}': ...}}")
                value = _column(batch[cols])
            else:
                missing = [c for c in cols if c not in columns]
                if missing:
                    raise InputNotFoundError(
                        f"the batch has no column(s) {missing} for model input '{name}'; its "
                        f"columns are {columns}")
                value = np.stack([_column(batch[c]) for c in cols], axis=-1)
            feeds[name] = self._cast_to(name, value)
        outputs = self.session.run(feeds)
        result: dict[str, Any] = {}
        if self._keep:
            for col in columns if self._keep is True else self._keep:
                result[col] = batch[col]
        for i, col in self._outputs:
            value = outputs[i]
            if value.ndim == 0 or value.shape[0] != rows:
                raise SessionError(
                    f"output '{self.session.outputs()[i].name}' has shape {value.shape}, which "
                    f"has not the batch's {rows} rows along axis 0, so it cannot be a column; "
                    "drop it with output_columns={name: None}")
            result[col] = value
        if not is_frame:
            return result
        return _frame(result, batch)

    def _cast_to(self, name: str, value: np.ndarray) -> np.ndarray:
        target = self._targets.get(name)
        if self._cast is None or target is None or value.dtype == target:
            return value
        try:
            castable = np.can_cast(value.dtype, target, self._cast)
        except TypeError:
            castable = False
        return value.astype(target) if castable else value


def _numpy_dtype(dtype: DataType) -> np.dtype | None:
    if dtype in (DataType.UNDEFINED, DataType.STRING):
        return None
    try:
        return DataType(dtype).numpy
    except Exception:  # a type numpy cannot hold: leave the column as it is
        return None


def _rows(batch: Mapping[str, Any]) -> int:
    for value in batch.values():
        return len(value)
    return 0


def _column(values: Any) -> np.ndarray:
    """A column as one array: per-row arrays (object columns) are stacked."""
    if hasattr(values, "to_numpy"):  # a pandas Series (Ray's tensor columns convert too)
        values = values.to_numpy()
    arr = np.asarray(values)
    if arr.dtype == object and arr.size and isinstance(arr.flat[0], np.ndarray | list | tuple):
        arr = np.stack([np.asarray(v) for v in arr])
    return arr


def _frame(result: dict[str, Any], like: Any) -> Any:
    import pandas as pd

    data = {}
    for col, value in result.items():
        if isinstance(value, np.ndarray) and value.ndim > 1:
            value = list(value)  # one array per row; Ray stores it as a tensor column
        data[col] = value
    return pd.DataFrame(data, index=like.index)
