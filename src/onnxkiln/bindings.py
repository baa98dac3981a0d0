"""Persistent device buffers bound to graph inputs and outputs (SPEC §7, first half).

A binding owns a buffer of `physical_shape` (its capacity) on the session's device; kernels
see the leading `logical_shape` part of it. Bound to an input and an output at once, the
output is written back into the same buffer: the KV-cache pattern, where `present_k` =
Concat(`past_k`, new) along the sequence axis becomes a write of the new positions only.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from onnxkiln.dtypes import DataType, from_numpy
from onnxkiln.errors import DeviceBindingError, InputNotFoundError, SessionError
from onnxkiln.executor import CompiledPlan
from onnxkiln.plan import Plan
from onnxkiln.types import IoMeta
from onnxkiln.validation import closest_name

__all__ = ["BindingPlans", "DeviceIoBinding", "SessionBindings", "TransferStats", "append_kernel"]


@dataclass(frozen=True)
class TransferStats:
    """Bytes and calls that crossed between host and device through one binding."""

    host_to_device_bytes: int
    device_to_host_bytes: int
    writes: int
    reads: int


class DeviceIoBinding:
    """A persistent buffer on a session's device, bound to an input and/or an output.

    `tensor` is the whole buffer (numpy on the CPU, torch on CUDA); `write` copies host
    data into it, `read` returns a host copy of the logical part. Create bindings with
    `InferenceSession.allocate_device_binding` / `allocate_device_output_binding`.
    """

    def __init__(self, owner: Any, provider: Any, input_name: str | None,
                 output_name: str | None, dtype: DataType, physical_shape: Sequence[int],
                 logical_shape: Sequence[int]) -> None:
        self._owner = owner
        self._provider = provider
        self.input_name = input_name
        self.output_name = output_name
        self.dtype = DataType(dtype)
        self.physical_shape = _shape(physical_shape, "physical_shape")
        self._logical = self._checked(logical_shape)
        self.tensor = provider.empty(self.dtype, self.physical_shape)
        self._released = False
        self._h2d = self._d2h = self._writes = self._reads = 0

    def __repr__(self) -> str:
        names = " -> ".join(n for n in (self.input_name, self.output_name) if n)
        return (f"DeviceIoBinding({names}, {self.dtype}, logical {self._logical} of "
                f"{self.physical_shape} on {self._provider.device})")

    @property
    def logical_shape(self) -> tuple[int, ...]:
        """The part of the buffer in use (each dim <= the physical one)."""
        return self._logical

    def set_logical_shape(self, shape: Sequence[int]) -> None:
        """Change the part in use, e.g. rewind a KV cache to a shorter past."""
        self._check_live()
        self._logical = self._checked(shape)

    def write(self, array: Any, offset: int | Sequence[int] = 0) -> None:
        """Copy `array` into the buffer starting at `offset` (an int: along axis 0; or one
        start per axis). The logical shape is left as it is."""
        self._check_live()
        value = np.asarray(array) if not hasattr(array, "__dlpack__") else array
        if len(value.shape) != len(self.physical_shape):
            raise DeviceBindingError(
                f"{self!r}: write of rank {len(value.shape)} into a rank "
                f"{len(self.physical_shape)} buffer")
        starts = _offsets(offset, len(self.physical_shape))
        ends = [s + n for s, n in zip(starts, value.shape)]
        if any(s < 0 for s in starts) or any(e > p for e, p in zip(ends, self.physical_shape)):
            raise DeviceBindingError(
                f"{self!r}: write of shape {tuple(value.shape)} at offset {tuple(starts)} "
                f"does not fit the capacity {self.physical_shape}")
        region = tuple(slice(s, e) for s, e in zip(starts, ends))
        if isinstance(value, np.ndarray) and value.dtype != self.dtype.numpy:
            raise DeviceBindingError(
                f"{self!r}: write of {value.dtype} data; the binding holds {self.dtype}")
        store(self.tensor, region, self._provider.to_device(value))
        self._writes += 1
        self._h2d += int(np.prod(value.shape)) * self.dtype.numpy.itemsize

    def read(self) -> np.ndarray:
        """A host copy of the logical part."""
        self._check_live()
        out = np.array(self._provider.to_host(self.view()), copy=True)
        self._reads += 1
        self._d2h += out.nbytes
        return out

    def view(self) -> Any:
        """The logical part of the buffer, without copying (what kernels see)."""
        return self.tensor[tuple(slice(0, n) for n in self._logical)]

    def transfer_stats(self) -> TransferStats:
        """Host<->device traffic through write() and read() so far."""
        return TransferStats(self._h2d, self._d2h, self._writes, self._reads)

    def release(self) -> None:
        """Free the buffer; using the binding afterwards raises DeviceBindingError."""
        if not self._released:
            self._released = True
            self.tensor = None
            self._owner._binding_released(self)

    @property
    def released(self) -> bool:
        """Whether release() was called."""
        return self._released

    def _check_live(self) -> None:
        if self._released:
            raise DeviceBindingError(f"binding for {self.input_name or self.output_name!r} "
                                     "was released")

    def _checked(self, shape: Sequence[int]) -> tuple[int, ...]:
        logical = _shape(shape, "logical_shape")
        if len(logical) != len(self.physical_shape) or any(
                n > p for n, p in zip(logical, self.physical_shape)):
            raise DeviceBindingError(
                f"logical shape {logical} must have the rank of the physical shape "
                f"{self.physical_shape} and no dim larger than it")
        return logical


def store(buffer: Any, region: tuple[slice, ...], value: Any) -> None:
    """buffer[region] = value, for numpy and torch buffers alike."""
    if isinstance(buffer, np.ndarray):
        buffer[region] = value
    else:
        buffer[region].copy_(value)


def append_kernel(binding: DeviceIoBinding, axis: int):
    """A Concat(past, new) kernel for a KV binding: writes only `new`, after the past.

    `past` is the binding's logical view; the result is the view grown by the new
    positions, so the output needs no copy back. O(new) work, whatever the past length.
    """
    def append(past: Any, new: Any) -> Any:
        buffer = binding.tensor
        start = past.shape[axis]
        end = start + new.shape[axis]
        if end > binding.physical_shape[axis]:
            raise DeviceBindingError(
                f"{binding!r}: appending {new.shape[axis]} position(s) after {start} exceeds "
                f"its capacity {binding.physical_shape[axis]} on axis {axis}; allocate a "
                "larger binding or reset the cache")
        if tuple(new.shape[:axis]) != tuple(past.shape[:axis]) or tuple(
                new.shape[axis + 1:]) != tuple(past.shape[axis + 1:]):
            raise DeviceBindingError(
                f"{binding!r}: cannot append shape {tuple(new.shape)} to the past "
                f"{tuple(past.shape)} on axis {axis}")
        lead = tuple(slice(0, n) for n in past.shape[:axis])
        tail = tuple(slice(0, n) for n in past.shape[axis + 1:])
        store(buffer, (*lead, slice(start, end), *tail), new)
        return buffer[(*lead, slice(0, end), *tail)]

    append.variant = "concat.kv_append_in_place"
    return append


def _shape(shape: Sequence[int], what: str) -> tuple[int, ...]:
    try:
        dims = tuple(int(d) for d in shape)
    except (TypeError, ValueError):
        raise DeviceBindingError(f"{what} must be a sequence of ints, got {shape!r}") from None
    if any(d < 0 for d in dims):
        raise DeviceBindingError(f"{what} must hold sizes >= 0, got {dims}")
    return dims


def _offsets(offset: int | Sequence[int], rank: int) -> list[int]:
    if isinstance(offset, int | np.integer):
        return [int(offset)] + [0] * (rank - 1)
    starts = [int(o) for o in offset]
    if len(starts) != rank:
        raise DeviceBindingError(f"offset needs one start per axis ({rank}), got {offset!r}")
    return starts


class BindingPlans:
    """Compiled plans for runs with device bindings, one per binding layout.

    Bound outputs stay on the device (no download), and a KV output computed as
    Concat(past, new) on the binding of its own past becomes an in-place append.
    """

    def __init__(self, plan: Plan, graph: Any, finish: Callable[[Plan, frozenset[int]], Plan],
                 input_names: Sequence[str], output_names: Sequence[str],
                 inplace: bool | None = None) -> None:
        self._plan = plan
        self._inplace = inplace
        self._graph = graph
        self._finish = finish
        self._in_slot = dict(zip(input_names, plan.input_slots))
        self._out_slot = dict(zip(output_names, plan.output_slots))
        self._cache: dict[tuple, tuple[CompiledPlan, frozenset[str]]] = {}

    def get(self, bindings: Sequence[DeviceIoBinding]) -> tuple[CompiledPlan, frozenset[str]]:
        """The compiled plan for these bindings, and the outputs it appends in place."""
        key = tuple((b.input_name, b.output_name, id(b)) for b in bindings)
        found = self._cache.get(key)
        if found is None:
            found = self._cache[key] = self._build(bindings)
        return found

    def forget(self, binding: DeviceIoBinding) -> None:
        """Drop the plans that write into a released binding."""
        for key in [k for k in self._cache if any(i == id(binding) for *_, i in k)]:
            del self._cache[key]

    def _build(self, bindings: Sequence[DeviceIoBinding]) -> tuple[CompiledPlan, frozenset[str]]:
        steps = list(self._plan.steps)
        producer = {s: i for i, st in enumerate(steps) for s in st.outputs if s is not None}
        appended = set()
        for b in bindings:
            if b.input_name is None or b.output_name is None:
                continue
            out, past = self._out_slot[b.output_name], self._in_slot[b.input_name]
            index = producer.get(out)
            if index is None:
                continue
            step = steps[index]
            if (step.op_type, step.domain) != ("Concat", "") or len(step.inputs) != 2 \
                    or step.inputs[0] != past or step.provider != b._provider.name:
                continue
            axis = self._graph.node(step.node_id).attributes["axis"].as_int()
            axis += len(b.physical_shape) if axis < 0 else 0
            steps[index] = dataclasses.replace(step, kernel=append_kernel(b, axis))
            appended.add(b.output_name)
        plan = dataclasses.replace(self._plan, steps=steps)
        keep = frozenset(self._out_slot[b.output_name] for b in bindings if b.output_name)
        return CompiledPlan(self._finish(plan, keep), self._inplace), frozenset(appended)


class SessionBindings:
    """One session's side of device bindings: allocation and its checks, the checks before
    a bound run, and writing bound outputs back into their buffers after it."""

    def __init__(self, provider: Any, inputs: Sequence[IoMeta], outputs: Sequence[IoMeta],
                 plans: BindingPlans) -> None:
        self.provider = provider
        self._inputs = list(inputs)
        self._outputs = list(outputs)
        self.plans = plans

    def allocate(self, input_name: str | None, output_name: str | None, dtype: Any,
                 physical: Sequence[int], logical: Sequence[int]) -> DeviceIoBinding:
        """A binding after checking the names and that `dtype` is what the model declares."""
        wanted = _data_type(dtype)
        if input_name is not None:
            _check_dtype(_named(self._inputs, input_name, "input"), wanted)
        if output_name is not None:
            _check_dtype(_named(self._outputs, output_name, "output"), wanted)
        try:
            return DeviceIoBinding(self, self.provider, input_name, output_name, wanted,
                                   physical, logical)
        except (MemoryError, RuntimeError) as e:
            if isinstance(e, SessionError):
                raise
            raise DeviceBindingError(f"cannot allocate a {wanted} binding of shape "
                                     f"{tuple(physical)}: {e}") from e

    def _binding_released(self, binding: DeviceIoBinding) -> None:
        self.plans.forget(binding)

    def check(self, given: Iterable[str], bindings: Any) -> list[DeviceIoBinding]:
        """The bindings of one run, refused when foreign, released, duplicated, or also
        given as plain inputs (`given`: the names in the run's inputs)."""
        if isinstance(bindings, DeviceIoBinding) or not isinstance(bindings, Sequence):
            raise DeviceBindingError(f"bindings must be a list of DeviceIoBinding, got "
                                     f"{type(bindings).__name__}")
        given = set(given)
        seen_in: set[str] = set()
        seen_out: set[str] = set()
        for b in bindings:
            if not isinstance(b, DeviceIoBinding):
                raise DeviceBindingError(f"bindings must hold DeviceIoBinding, got {b!r}")
            if b._owner is not self:
                raise DeviceBindingError(f"{b!r} belongs to another session; bindings live on "
                                         "the device of the session that allocated them")
            b._check_live()
            if b.input_name in seen_in or b.output_name in seen_out:
                raise DeviceBindingError(
                    f"{b!r}: '{b.input_name or b.output_name}' is bound twice")
            if b.input_name in given:
                raise DeviceBindingError(
                    f"input '{b.input_name}' is both given in inputs and bound by {b!r}")
            if b.input_name:
                seen_in.add(b.input_name)
            if b.output_name:
                seen_out.add(b.output_name)
        return list(bindings)

    def write_back(self, outputs: list[Any], bindings: Sequence[DeviceIoBinding],
                   appended: frozenset[str]) -> None:
        """Store each bound output in its binding (appended ones are there already), set
        its logical shape, and leave None in its place in `outputs`."""
        bound = {b.output_name: b for b in bindings if b.output_name}
        for i, meta in enumerate(self._outputs):
            b = bound.get(meta.name)
            if b is None:
                continue
            value, outputs[i] = outputs[i], None
            shape = tuple(value.shape)
            if meta.name not in appended:
                if len(shape) != len(b.physical_shape) or any(
                        n > p for n, p in zip(shape, b.physical_shape)):
                    raise DeviceBindingError(
                        f"output '{meta.name}' has shape {shape}, which exceeds the capacity "
                        f"{b.physical_shape} of its binding; allocate a larger one")
                store(b.tensor, tuple(slice(0, n) for n in shape), self.provider.to_device(value))
            b._logical = shape


def _data_type(dtype: Any) -> DataType:
    try:
        return DataType(dtype) if not hasattr(dtype, "kind") else from_numpy(dtype)
    except (ValueError, KeyError, TypeError):
        raise DeviceBindingError(f"binding dtype must be a DataType, got {dtype!r}") from None


def _check_dtype(meta: IoMeta, wanted: DataType) -> None:
    if meta.dtype != DataType.UNDEFINED and wanted != meta.dtype:
        raise DeviceBindingError(f"binding for '{meta.name}' has dtype {wanted}, but the model "
                                 f"declares {meta.dtype} ({meta})")


def _named(metas: Sequence[IoMeta], name: str, kind: str) -> IoMeta:
    for meta in metas:
        if meta.name == name:
            return meta
    names = [m.name for m in metas]
    close = closest_name(name, names)
    hint = f"; did you mean '{close}'?" if close else ""
    raise InputNotFoundError(f"unknown {kind} '{name}'; the model's {kind}s are {names}{hint}")
