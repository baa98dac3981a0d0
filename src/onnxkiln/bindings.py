"""Persistent device buffers bound to graph inputs and outputs.

A binding owns a buffer of `physical_shape` (its capacity) on the session's device; kernels
see the leading `logical_shape` part of it. Bound to an input and an output at once, the
output is written back into the same buffer: the KV-cache pattern, where `present_k` =
Concat(`past_k`, new) along the sequence axis becomes a write of the new positions only,
a static cache's ScatterND / ScatterElements(`past_k`, indices, new) a write of the
updates in place, and an attention kernel that takes the past and gives the present
(GroupQueryAttention, MultiHeadAttention, Attention: see onnxkiln.kv_attention) writes the
new positions into the buffer and attends over it.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from onnxkiln.dtypes import DataType, from_numpy
from onnxkiln.errors import DeviceBindingError, InputNotFoundError, SessionError
from onnxkiln.types import IoMeta
from onnxkiln.validation import closest_name

if TYPE_CHECKING:
    from onnxkiln.binding_plans import BindingPlans

__all__ = ["DeviceIoBinding", "SessionBindings", "TransferStats", "WriteStats", "copy_value",
           "same_objects", "store"]


@dataclass(frozen=True)
class TransferStats:
    """Bytes and calls that crossed between host and device through one binding."""

    host_to_device_bytes: int
    device_to_host_bytes: int
    writes: int
    reads: int


@dataclass(frozen=True)
class WriteStats:
    """Bytes and calls that went into one binding on the device during runs.

    `in_place_*`: written by a kernel straight into the buffer (a KV append, scatter or
    attention write: only the new positions); `copied_*`: a bound output the kernel made
    elsewhere and write-back copied into the buffer (the whole logical part each time).
    """

    in_place_bytes: int
    in_place_writes: int
    copied_bytes: int
    copies: int


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
        self._kernel_bytes = self._kernel_writes = self._copy_bytes = self._copies = 0

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
        if (type(array) is np.ndarray and type(self.tensor) is np.ndarray
                and array.dtype == self.tensor.dtype and array.ndim == self.tensor.ndim):
            # the common case, a host buffer written from host data: a refill from its start
            # (offset 0), or a block at one start per axis (a mask's new columns)
            starts = ((0,) * array.ndim if type(offset) is int and offset == 0
                      else offset if type(offset) is tuple and len(offset) == array.ndim
                      else None)
            if starts is not None and all(
                    type(o) is int and o >= 0 and o + n <= p
                    for o, n, p in zip(starts, array.shape, self.physical_shape)):
                self.tensor[tuple(slice(o, o + n) for o, n in zip(starts, array.shape))] = array
                self._writes += 1
                self._h2d += array.nbytes
                return
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
        if not self._logical:  # x[()] of a 0-d numpy array is a scalar copy, x[...] a view
            return self.tensor[...]
        return self.tensor[tuple(slice(0, n) for n in self._logical)]

    def transfer_stats(self) -> TransferStats:
        """Host<->device traffic through write() and read() so far."""
        return TransferStats(self._h2d, self._d2h, self._writes, self._reads)

    def write_stats(self) -> WriteStats:
        """Device-side writes into the buffer by runs so far (in place vs copied back).
        A captured replay counts only kernels that run in Python (CPU replays, seams): not
        what a CUDA graph replays, nor the replay's own stores of bound outputs."""
        return WriteStats(self._kernel_bytes, self._kernel_writes, self._copy_bytes,
                          self._copies)

    def note_in_place(self, nbytes: int) -> None:
        """Count a kernel's write of `nbytes` straight into the buffer."""
        self._kernel_bytes += int(nbytes)
        self._kernel_writes += 1

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
        if type(shape) is tuple and len(shape) == len(self.physical_shape) and all(
                type(n) is int and 0 <= n <= p for n, p in zip(shape, self.physical_shape)):
            return shape  # the common case (an array's .shape that fits): nothing to convert
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


def copy_value(value: Any) -> Any:
    """A copy of a numpy array or torch tensor (other values as they are)."""
    if isinstance(value, np.ndarray):
        return value.copy()
    clone = getattr(value, "clone", None)
    return clone() if callable(clone) else value


def same_objects(given: Sequence[Any], held: Sequence[Any]) -> bool:
    """Whether `given` holds exactly the objects of `held`, in order (a binding's names,
    dtype and capacity never change: the same bindings are the same layout)."""
    return len(given) == len(held) and all(map(operator.is_, given, held))


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


class SessionBindings:
    """One session's side of device bindings: allocation and its checks, the checks before
    a bound run, and writing bound outputs back into their buffers after it."""

    def __init__(self, provider: Any, inputs: Sequence[IoMeta], outputs: Sequence[IoMeta],
                 plans: BindingPlans) -> None:
        self.provider = provider
        self._inputs = list(inputs)
        self._outputs = list(outputs)
        self.plans = plans
        self.release_hooks: list[Callable[[DeviceIoBinding], None]] = []  # memo, capture
        self._passed: tuple[tuple, tuple] = ((), ())  # the last bindings and names check passed
        self._written: tuple[tuple, list] = ((), [])  # the last bindings written back, by output

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
        if any(b is binding for b in self._passed[0]):
            self._passed = ((), ())
        if any(b is binding for b in self._written[0]):
            self._written = ((), [])
        for hook in self.release_hooks:
            hook(binding)

    def check(self, given: Iterable[str], bindings: Any) -> list[DeviceIoBinding]:
        """The bindings of one run, refused when foreign, released, duplicated, or also
        given as plain inputs (`given`: the names in the run's inputs)."""
        if isinstance(bindings, DeviceIoBinding) or not isinstance(bindings, Sequence):
            raise DeviceBindingError(f"bindings must be a list of DeviceIoBinding, got "
                                     f"{type(bindings).__name__}")
        names = tuple(given)
        last, last_names = self._passed
        if names == last_names and same_objects(bindings, last):
            for b in last:  # the same objects and names as a check that passed: only liveness
                b._check_live()
            return list(last)
        given = set(names)
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
        self._passed = (tuple(bindings), names)
        return list(bindings)

    def write_back(self, outputs: list[Any], bindings: Sequence[DeviceIoBinding],
                   in_place: frozenset[str]) -> None:
        """Store each bound output in its binding (those written in place are there
        already), set its logical shape, and leave None in its place in `outputs`."""
        last, pairs = self._written
        if not same_objects(bindings, last):
            bound = {b.output_name: b for b in bindings if b.output_name}
            pairs = [(i, meta, bound[meta.name]) for i, meta in enumerate(self._outputs)
                     if meta.name in bound]
            self._written = (tuple(bindings), pairs)
        for i, meta, b in pairs:
            value, outputs[i] = outputs[i], None
            shape = tuple(value.shape)
            if meta.name not in in_place:
                if len(shape) != len(b.physical_shape) or any(
                        n > p for n, p in zip(shape, b.physical_shape)):
                    raise DeviceBindingError(
                        f"output '{meta.name}' has shape {shape}, which exceeds the capacity "
                        f"{b.physical_shape} of its binding; allocate a larger one")
                store(b.tensor, tuple(slice(0, n) for n in shape), self.provider.to_device(value))
                b._copies += 1
                b._copy_bytes += int(np.prod(shape)) * b.dtype.numpy.itemsize
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
