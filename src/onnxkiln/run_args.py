"""How a run is asked for: run's call forms (native, and onnxruntime's output names first),
the cancel event a `timeout` becomes, and the kind of each output value."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from onnxkiln.errors import InvalidInputError
from onnxkiln.executor import Deadline
from onnxkiln.validation import closest_name

__all__ = ["check_cancel", "deadline", "each_once", "output_kind", "split_run_args"]


def split_run_args(method: str, args: tuple, outputs: Sequence[str] | None,
                   names: Sequence[str]) -> tuple[Any, list[str] | None]:
    """(inputs, the selected output names or None for all) from `method`'s positional
    arguments (`inputs`, or onnxruntime's `(output names, inputs)`) and its `outputs=`;
    `names` are the model's outputs."""
    if len(args) == 2:
        if outputs is not None:
            raise InvalidInputError(f"{method}(): give the output names either first "
                                    "(onnxruntime's order) or as outputs=, not both")
        outputs, inputs = args
    elif len(args) == 1:
        inputs = args[0]
    else:
        hint = (" (onnxruntime's RunOptions: use onnxkiln.compat, or cancel= and "
                "timeout= here)" if len(args) == 3 else "")
        raise InvalidInputError(
            f"{method}() takes the inputs, or (output names, inputs) in onnxruntime's "
            f"order; got {len(args)} positional arguments{hint}")
    if outputs is None:
        return inputs, None
    if isinstance(outputs, str) or not isinstance(outputs, Sequence) or not all(
            isinstance(n, str) for n in outputs):
        raise InvalidInputError(f"output names must be a list of str, got {outputs!r}")
    for name in outputs:
        if name not in names:
            close = closest_name(name, list(names))
            hint = f"; did you mean '{close}'?" if close else ""
            raise InvalidInputError(f"unknown output '{name}'; the model's outputs are "
                                    f"{list(names)}{hint}")
    return inputs, (list(outputs) or None)


def each_once(values: list[Any]) -> list[Any]:
    """A name asked for twice gets its own copy, so writing one result leaves the other."""
    seen: set[int] = set()
    for i, v in enumerate(values):
        if id(v) in seen and isinstance(v, np.ndarray):
            values[i] = v.copy()
        seen.add(id(v))
    return values


def check_cancel(cancel: Any) -> None:
    """Refuse a `cancel` that is not an event (anything with `is_set()`)."""
    if not callable(getattr(cancel, "is_set", None)):
        raise InvalidInputError(
            f"cancel takes a threading.Event (anything with is_set()), got {type(cancel).__name__}"
        )


def deadline(cancel: Any, timeout: Any) -> Any:
    """The run's cancel event: `cancel` itself, or a Deadline over it with `timeout`."""
    if timeout is None:
        return cancel
    if (isinstance(timeout, bool) or not isinstance(timeout, int | float | np.integer
                                                    | np.floating)
            or not math.isfinite(timeout) or timeout <= 0):
        raise InvalidInputError(f"timeout takes a number of seconds > 0, got {timeout!r}")
    if cancel is not None:
        check_cancel(cancel)
    return Deadline(float(timeout), cancel)


def output_kind(value: Any) -> str:
    """"tensor", "sequence", "map" or "optional" (an empty one), as SessionOutput names it."""
    if isinstance(value, np.ndarray):
        return "tensor"
    if isinstance(value, list | tuple):
        return "sequence"
    if isinstance(value, dict):
        return "map"
    if value is None:
        return "optional"
    return "tensor"
