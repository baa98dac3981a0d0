"""The plans of runs with device bindings: a KV output computed from its own past's binding
is written into that buffer instead of a new array. Concat(past, new) becomes an append of
`new`, ScatterND / ScatterElements(past, indices, updates) with reduction 'none' a write of
the updates, and the presents of an attention kernel whose pasts share their bindings its
in-place variant (onnxkiln.kv_attention)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from onnxkiln.bindings import DeviceIoBinding, store
from onnxkiln.errors import DeviceBindingError
from onnxkiln.executor import CompiledPlan
from onnxkiln.kv_attention import attention_writes
from onnxkiln.plan import Plan, Step
from onnxkiln.types import CaptureViolation

__all__ = ["APPEND_VARIANT", "BindingPlans", "append_kernel", "scatter_write_kernel"]


APPEND_VARIANT = "concat.kv_append_in_place"
"""The variant of a KV output appended in place: its binding grows every step."""



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
