"""Where the command line's text goes, and how values and times read there.

Results go to stdout (or one JSON document with `--json`); errors, notes and progress go
to stderr. rich's markup is off: a model's text (`int64[batch, seq]`) prints as it is.
"""

from __future__ import annotations

import contextlib
import json
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
from rich.console import Console
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text

__all__ = ["Output", "describe", "plain", "print_wide", "timing"]

SHOW_AFTER_S = 1.0  # a step that takes longer gets a spinner (a terminal) or a line


class Output:
    """The two streams of one command: `console` (results) and `err` (messages)."""

    def __init__(self, as_json: bool = False) -> None:
        self.as_json = as_json
        self.console = Console(highlight=False, markup=False, soft_wrap=True)
        self.err = Console(stderr=True, highlight=False, markup=False, soft_wrap=True)

    def print(self, *items: Any, **kwargs: Any) -> None:
        """Results on stdout; nothing with --json (the document is the output)."""
        if not self.as_json:
            self.console.print(*items, **kwargs)

    def json(self, doc: dict[str, Any]) -> None:
        """The --json document."""
        sys.stdout.write(json.dumps(doc, indent=2, default=str) + "\n")
        sys.stdout.flush()

    def error(self, message: str) -> None:
        """One `error: ...` line on stderr."""
        self.err.print(Text.assemble(("error: ", "bold red"), message))

    def note(self, message: str) -> None:
        """A remark on stderr (a skipped comparison, a hint)."""
        self.err.print(message)

    @contextlib.contextmanager
    def step(self, what: str) -> Iterator[None]:
        """Say on stderr what is under way once it has taken over a second: a spinner on a
        terminal, else a line; either way its time when it ends."""
        lock, state = threading.Lock(), {"done": False, "shown": False, "status": None}

        def show() -> None:
            with lock:
                if state["done"]:
                    return
                state["shown"] = True
                if self.err.is_terminal:
                    state["status"] = self.err.status(f"{what}…")
                    state["status"].start()
                else:
                    self.err.print(f"{what}…")

        timer = threading.Timer(SHOW_AFTER_S, show)
        timer.daemon = True
        start = time.perf_counter()
        timer.start()
        try:
            yield
        finally:
            timer.cancel()
            with lock:
                state["done"] = True
            if state["status"] is not None:
                state["status"].stop()
            if state["shown"]:
                self.err.print(f"{what}: {time.perf_counter() - start:.1f} s")


def print_wide(out: Output, table: Table) -> None:
    """Print a table no narrower than its content, so names stay on one line."""
    console = out.console
    width = Measurement.get(console, console.options.update_width(1 << 16), table).maximum
    narrow = console.width
    console.width = max(narrow, width)  # print(width=) cannot widen past the console
    try:
        out.print(table)
    finally:
        console.width = narrow


def describe(value: Any) -> tuple[str, str, str]:
    """(type, shape, a short preview) of an output: a tensor, a sequence or a map."""
    if isinstance(value, np.ndarray | np.generic):
        value = np.asarray(value)
        with np.printoptions(precision=4, threshold=8, edgeitems=3, linewidth=70):
            return str(value.dtype), str(tuple(value.shape)), str(value.ravel())
    if isinstance(value, dict):
        return "map", f"({len(value)},)", _short(value)
    if isinstance(value, list | tuple):
        kinds = sorted({"map" if isinstance(v, dict) else
                        str(np.asarray(v).dtype) for v in value})
        return f"sequence[{', '.join(kinds) or '?'}]", f"({len(value)},)", _short(list(value))
    return type(value).__name__, "", _short(value)


def _short(value: Any, limit: int = 70) -> str:
    text = json.dumps(plain(value, limit=3), default=str)
    return text if len(text) <= limit else text[:limit - 1] + "…"


def plain(value: Any, limit: int | None = None) -> Any:
    """An output as JSON-ready data; `limit` cuts sequences (and tensors: summarized)."""
    if isinstance(value, np.ndarray | np.generic):
        array = np.asarray(value)
        if limit is None or array.size <= 64:
            return array.tolist() if array.dtype.kind != "V" else str(array)
        return {"dtype": str(array.dtype), "shape": list(array.shape),
                **_stats(array)}
    if isinstance(value, dict):
        items = list(value.items())[:limit]
        return {str(_scalar(k)): plain(v, limit) for k, v in items}
    if isinstance(value, list | tuple):
        return [plain(v, limit) for v in value[:limit]]
    return _scalar(value)


def _scalar(value: Any) -> Any:
    return value.item() if isinstance(value, np.generic) else value


def _stats(array: np.ndarray) -> dict[str, float]:
    if array.size == 0 or array.dtype.kind not in "biuf":
        return {}
    with np.errstate(all="ignore"):
        a = array.astype(np.float64)
        return {"min": float(np.min(a)), "max": float(np.max(a)), "mean": float(np.mean(a))}


def timing(times: list[float]) -> dict[str, float | int]:
    """Runs, median, min, p90 and mean of run times in seconds, as milliseconds."""
    if not times:
        return {"runs": 0}
    ms = np.array(times) * 1e3
    return {"runs": len(ms), "median_ms": float(np.median(ms)), "min_ms": float(ms.min()),
            "p90_ms": float(np.percentile(ms, 90)), "mean_ms": float(ms.mean())}
