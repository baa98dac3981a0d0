"""Run one ONNX op on numpy arrays without building a model: `eager.dispatch("Add", [a, b])`."""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import onnx

from onnxkiln.dtypes import DataType, from_numpy
from onnxkiln.errors import InvalidInputError, KernelError, UnsupportedOpError
from onnxkiln.providers.base import NodeInfo, normalize_domain
from onnxkiln.schema import schema_defaults
from onnxkiln.types import CacheStats

__all__ = ["cache_stats", "clear_cache", "dispatch"]

_cache: dict[tuple, tuple[Any, bool, int]] = {}
_counts = {"hits": 0, "misses": 0}
_lock = threading.Lock()


def dispatch(
    op_type: str,
    inputs: Sequence[Any],
    attributes: Mapping[str, Any] | None = None,
    *,
    domain: str = "",
    opset: int | None = None,
    n_outputs: int | None = None,
) -> list[np.ndarray]:
    """Run `op_type` on `inputs` (None for an absent optional input) and return its outputs.

    `opset` defaults to the newest the installed onnx knows for the domain; `n_outputs`
    defaults to the schema's output count (Split takes it from `num_outputs` or `split`).
    Kernels are built once per (op, opset, attributes, input dtypes) and cached.
    """
    from onnxkiln.providers.cpu import REGISTRY

    domain = normalize_domain(domain)
    version = opset if opset is not None else _latest_opset(domain)
    arrays = [None if x is None else _as_array(x, op_type, i) for i, x in enumerate(inputs)]
    attrs = dict(attributes or {})
    key = (domain, op_type, version, _freeze(attrs), n_outputs,
           tuple(None if a is None else a.dtype for a in arrays))
    entry = _cache.get(key)
    if entry is None:
        spec = REGISTRY.resolve(domain, op_type, version)
        if spec is None:
            raise UnsupportedOpError(
                f"no CPU kernel for {domain or 'ai.onnx'}::{op_type} opset {version}"
                + _registered(REGISTRY, domain, op_type)
            )
        count = n_outputs or _output_count(op_type, domain, version, attrs)
        info = NodeInfo(
            name=f"eager.{op_type}", op_type=op_type, domain=domain, opset=version,
            attrs={**schema_defaults(op_type, domain, version), **attrs},
            n_inputs=len(arrays), n_outputs=count,
            input_present=tuple(a is not None for a in arrays),
            output_present=(True,) * count,
            input_dtypes=tuple(None if a is None else _dtype(a) for a in arrays),
            output_dtypes=(None,) * count, input_shapes=(None,) * len(arrays),
            const_inputs=(None,) * len(arrays),
        )
        entry = (spec.build(info), spec.multi_output, count)
        with _lock:
            _cache[key] = entry
            _counts["misses"] += 1
    else:
        _counts["hits"] += 1
    kernel, multi, count = entry
    try:
        result = kernel(*arrays)
    except Exception as e:
        raise KernelError(f"eager {op_type} failed: {type(e).__name__}: {e}",
                          node_name=f"eager.{op_type}", op_type=op_type) from e
    outputs = list(result[:count]) if multi else [result]
    return [o if not isinstance(o, np.generic) else np.asarray(o) for o in outputs]


def cache_stats() -> CacheStats:
    """Kernels built (misses), reused (hits) and held (entries) by `dispatch`."""
    return CacheStats(len(_cache), _counts["hits"], _counts["misses"], 0)


def clear_cache() -> None:
    """Drop every cached kernel and zero the counters."""
    with _lock:
        _cache.clear()
        _counts.update(hits=0, misses=0)


def _latest_opset(domain: str) -> int:
    if domain == "":
        return onnx.defs.onnx_opset_version()
    versions = [s.since_version for s in onnx.defs.get_all_schemas_with_history()
                if s.domain == domain]
    return max(versions, default=1)


def _output_count(op_type: str, domain: str, opset: int, attrs: Mapping[str, Any]) -> int:
    if op_type == "Split":
        if attrs.get("num_outputs"):
            return int(attrs["num_outputs"])
        if attrs.get("split") is not None:
            return len(attrs["split"])
    try:
        schema = onnx.defs.get_schema(op_type, opset, domain)
    except onnx.defs.SchemaError:
        return 1
    return max(1, len(schema.outputs))


def _as_array(x: Any, op_type: str, index: int) -> Any:
    """Arrays pass through; a list of arrays is a sequence value; the rest becomes an array."""
    if isinstance(x, np.ndarray):
        return x
    if isinstance(x, list) and x and all(isinstance(v, np.ndarray) for v in x):
        return x
    try:
        return np.asarray(x)
    except (TypeError, ValueError) as e:
        raise InvalidInputError(f"eager {op_type}: input {index} is not array-like: {e}") from e


def _dtype(a: Any) -> DataType | None:
    try:
        return from_numpy(a.dtype) if isinstance(a, np.ndarray) else None
    except KeyError:
        return None


def _freeze(value: Any) -> Any:
    if isinstance(value, Mapping):
        return tuple(sorted((k, _freeze(v)) for k, v in value.items()))
    if isinstance(value, list | tuple):
        return tuple(_freeze(v) for v in value)
    if isinstance(value, np.ndarray):
        return (value.dtype.str, value.shape, value.tobytes())
    return value


def _registered(registry, domain: str, op_type: str) -> str:
    versions = registry.versions(domain, op_type)
    if not versions:
        return " (no kernel for any opset)"
    spans = ", ".join(f"{a}-{b if b is not None else 'latest'}" for a, b in versions)
    return f" (registered for opsets {spans})"
