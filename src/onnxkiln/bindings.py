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

import dataclasses
import operator
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from onnxkiln.dtypes import DataType, from_numpy
from onnxkiln.errors import DeviceBindingError, InputNotFoundError, SessionError
from onnxkiln.executor import CompiledPlan
from onnxkiln.kv_attention import attention_writes
from onnxkiln.plan import Plan, Step
from onnxkiln.types import CaptureViolation, IoMeta
from onnxkiln.validation import closest_name

__all__ = ["BindingPlans", "DeviceIoBinding", "SessionBindings", "TransferStats", "WriteStats",
           "append_kernel", "scatter_write_kernel"]


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
                and isinstance(offset, int) and offset == 0
                and array.shape == self.physical_shape and array.dtype == self.tensor.dtype):
            np.copyto(self.tensor, array)  # the common case: a whole host buffer refilled
            self._writes += 1
            self._h2d += array.nbytes
            return
        if (type(array) is np.ndarray and type(self.tensor) is np.ndarray and offset == 0
                and type(offset) is int and array.dtype == self.tensor.dtype
                and array.ndim == self.tensor.ndim
                and all(n <= p for n, p in zip(array.shape, self.physical_shape))):
            self.tensor[tuple(map(slice, array.shape))] = array  # a leading part refilled
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


APPEND_VARIANT = "concat.kv_append_in_place"
"""The variant of a KV output appended in place: its binding grows every step."""


def copy_value(value: Any) -> Any:
    """A copy of a numpy array or torch tensor (other values as they are)."""
    if isinstance(value, np.ndarray):
        return value.copy()
    clone = getattr(value, "clone", None)
    return clone() if callable(clone) else value


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
        binding.note_in_place(new.nbytes)
        return buffer[(*lead, slice(0, end), *tail)]

    append.variant = APPEND_VARIANT
    return append


def scatter_write_kernel(binding: DeviceIoBinding, op: str, axis: int = 0):
    """A ScatterND / ScatterElements(past, indices, updates) kernel (reduction 'none') for a
    static-cache KV binding whose past is `data`: writes `updates` into the buffer at the
    indices and returns the binding's logical view (data's shape), with no copy of the cache:
    O(updates) work. Negative indices wrap by data's dim as in ONNX; an index outside the
    capacity raises DeviceBindingError. `.capture_safe(word)` is the variant for captured
    replays: it clamps such indices and sets CaptureViolation.KV_CAPACITY in `word` instead
    (no host sync on torch)."""
    if op not in ("ScatterND", "ScatterElements"):
        raise ValueError(f"scatter_write_kernel: {op} is not ScatterND or ScatterElements")
    nd = op == "ScatterND"
    variant = "scatter_nd.kv_write_in_place" if nd else "scatter_elements.kv_write_in_place"

    def make(word: Any) -> Callable[..., Any]:
        def write(data: Any, indices: Any, updates: Any) -> Any:
            buffer = binding.tensor
            if nd:
                k = _check_nd(binding, data, indices, updates)
                idx = _kv_index(binding, op, indices, data.shape[:k], 0, True, word)
                _write_nd(buffer, idx, updates, data.shape[k:])
            else:
                a = _check_elements(binding, data, indices, updates, axis)
                idx = _kv_index(binding, op, indices, (data.shape[a],), a, False, word)
                _write_elements(buffer, idx, updates, a)
            binding.note_in_place(updates.nbytes)
            return buffer[tuple(slice(0, n) for n in data.shape)]

        write.variant = variant if word is None else f"{variant}.capture_safe"
        if word is None:
            write.capture_safe = make
        return write

    return make(None)


def _check_nd(binding: DeviceIoBinding, data: Any, indices: Any, updates: Any) -> int:
    k = indices.shape[-1] if len(indices.shape) else -1
    want = (*indices.shape[:-1], *data.shape[k:])
    if not 1 <= k <= len(data.shape) or tuple(updates.shape) != want:
        raise ValueError(f"ScatterND on {binding!r}: updates shape {list(updates.shape)} "
                         f"should be {list(want)} for data {list(data.shape)} and indices "
                         f"{list(indices.shape)}")
    return k


def _check_elements(binding: DeviceIoBinding, data: Any, indices: Any, updates: Any,
                    axis: int) -> int:
    rank = len(data.shape)
    a = axis + rank if axis < 0 else axis
    if not 0 <= a < rank or tuple(indices.shape) != tuple(updates.shape) or len(
            indices.shape) != rank or any(i != a and n > d for i, (n, d) in enumerate(
                zip(indices.shape, data.shape))):
        raise ValueError(f"ScatterElements on {binding!r}: indices {list(indices.shape)} and "
                         f"updates {list(updates.shape)} must have equal shapes within data "
                         f"{list(data.shape)} (axis {axis})")
    return a


def _kv_index(binding: DeviceIoBinding, op: str, indices: Any, dims: Sequence[int],
              first: int, tuples: bool, word: Any) -> Any:
    """int64 indices into the buffer, negatives wrapped by the logical `dims`. `tuples`: the
    last axis of `indices` addresses dims first, first + 1, ...; else every element is a
    position on axis `first`. Positions outside the capacity raise DeviceBindingError (word
    None) or are clamped into it with KV_CAPACITY set in `word` (no host sync on torch)."""
    caps = binding.physical_shape[first:first + len(dims)]
    if not hasattr(indices, "to"):  # numpy: one vectorised check
        idx = np.asarray(indices, dtype=np.int64)
        if idx.size <= 64:  # a few positions (a decode step): plain Python is faster
            rows = idx.reshape(-1, len(dims)).tolist() if tuples else [[v] for v in
                                                                      idx.ravel().tolist()]
            if all(0 <= v < c for row in rows for v, c in zip(row, caps)):
                return idx
        idx = np.where(idx < 0, idx + np.asarray(dims, np.int64), idx)
        cap = np.asarray(caps, np.int64)
        if idx.size and ((idx < 0) | (idx >= cap)).any():
            if word is None:
                raise _capacity_error(binding, op, np.asarray(indices), idx, cap, first,
                                      tuples)
            word.flag(CaptureViolation.KV_CAPACITY, True)
            idx = np.clip(idx, 0, np.maximum(cap - 1, 0))
        return idx
    import torch
    idx = indices.to(torch.int64)
    cols = [idx[..., j] for j in range(len(dims))] if tuples else [idx]
    out, bad = [], None
    for col, n, c in zip(cols, dims, caps):
        col = torch.where(col < 0, col + n, col)
        wrong = (col < 0) | (col >= c)
        bad = wrong if bad is None else bad | wrong
        out.append(col if word is None else col.clamp(0, max(c - 1, 0)))
    if word is None:
        if bool(bad.any()):  # the one host sync of an eager call
            wrapped = torch.stack(out, -1) if tuples else out[0]
            raise _capacity_error(binding, op, indices.cpu().numpy(), wrapped.cpu().numpy(),
                                  np.asarray(caps, np.int64), first, tuples)
    else:
        word.flag(CaptureViolation.KV_CAPACITY, bad.any())
    return torch.stack(out, -1) if tuples else out[0]


def _capacity_error(binding: DeviceIoBinding, op: str, given: np.ndarray, wrapped: np.ndarray,
                    cap: np.ndarray, first: int, tuples: bool) -> DeviceBindingError:
    wrong = (wrapped < 0) | (wrapped >= cap)
    at = tuple(int(w) for w in np.argwhere(wrong)[0])
    axis = first + (at[-1] if tuples else 0)
    size = int(cap[at[-1]] if tuples else cap[0])
    return DeviceBindingError(
        f"{binding!r}: {op} writes at index {int(given[at])} on axis {axis}, outside its "
        f"capacity {size} on that axis (valid positions [0, {size - 1}]); allocate a larger "
        "binding or reset the cache")


def _write_nd(buffer: Any, idx: Any, updates: Any, tail: Sequence[int]) -> None:
    """buffer[idx tuples, :tail...] = updates (numpy or torch)."""
    where = (*(idx[..., j] for j in range(idx.shape[-1])), *(slice(0, n) for n in tail))
    buffer[where] = updates


def _write_elements(buffer: Any, idx: Any, updates: Any, axis: int) -> None:
    """buffer[..., idx (on axis), ...] = updates, the other coordinates those of idx."""
    if isinstance(buffer, np.ndarray):
        where = list(np.ogrid[tuple(slice(0, n) for n in idx.shape)])
        where[axis] = idx
        buffer[tuple(where)] = updates
    else:
        buffer.scatter_(axis, idx, updates)


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

    Bound outputs stay on the device (no download); a KV output computed as Concat(past,
    new) on the binding of its own past becomes an in-place append, one computed as
    ScatterND / ScatterElements(past, indices, updates) (reduction 'none') an in-place write,
    and the presents of an attention kernel whose pasts share their bindings are written by
    its in-place variant (onnxkiln.kv_attention).
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
        """The compiled plan for these bindings, and the bound outputs it writes in place
        (appended or scattered into their buffer already: write_back skips them)."""
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
        in_place = set()  # bound outputs the plan writes into their buffer itself
        for b in bindings:
            if b.input_name is None or b.output_name is None:
                continue
            out, past = self._out_slot[b.output_name], self._in_slot[b.input_name]
            index = producer.get(out)
            if index is None:
                continue
            step = steps[index]
            if step.provider != b._provider.name or not step.inputs:
                continue
            if hasattr(step.kernel, "kv_in_place"):
                continue  # an attention step: all its KV pairs at once, below
            if step.inputs[0] != past:
                continue
            if (step.op_type, step.domain) == ("Concat", "") and len(step.inputs) == 2:
                axis = self._graph.node(step.node_id).attributes["axis"].as_int()
                axis += len(b.physical_shape) if axis < 0 else 0
                kernel = append_kernel(b, axis)
            else:
                kernel = self._scatter_write(steps, index, past, b)
                if kernel is None:
                    continue
            steps[index] = dataclasses.replace(step, kernel=kernel)
            in_place.add(b.output_name)
        in_place |= attention_writes(steps, self._plan.output_slots, bindings, self._in_slot,
                                     self._out_slot)
        plan = dataclasses.replace(self._plan, steps=steps)
        keep = frozenset(self._out_slot[b.output_name] for b in bindings if b.output_name)
        return CompiledPlan(self._finish(plan, keep), self._inplace), frozenset(in_place)

    def _scatter_write(self, steps: Sequence[Step], index: int, past: int,
                       binding: DeviceIoBinding) -> Callable[..., Any] | None:
        """The in-place kernel for a static-cache write ScatterND / ScatterElements(past,
        indices, updates) with reduction 'none', or None when the step is not one, or when
        another step reads the past after it (it would see the updates) or as a view."""
        step = steps[index]
        if step.domain != "" or step.op_type not in ("ScatterND", "ScatterElements") \
                or step.opset < 11 or len(step.inputs) != 3 or None in step.inputs \
                or past in self._plan.output_slots:
            return None
        attrs = self._graph.node(step.node_id).attributes
        reduction = attrs.get("reduction")
        if reduction is not None and reduction.as_string() != "none":
            return None
        for i, other in enumerate(steps):
            if i != index and past in other.inputs and (i > index or other.spec.view):
                return None
        axis = attrs.get("axis")
        return scatter_write_kernel(binding, step.op_type,
                                    0 if axis is None else axis.as_int())


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
        if names == last_names and len(bindings) == len(last) \
                and all(map(operator.is_, bindings, last)):
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
        if len(bindings) != len(last) or not all(map(operator.is_, bindings, last)):
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
