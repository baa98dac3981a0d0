"""The view plan's growing half: views over a KV buffer whose logical length moves each step.

On a decode loop's replayed steps, a pure-view step (Unsqueeze, Transpose, Reshape, an
upload that is the tensor itself ...) whose data input is a growing binding's view, or the
output of an in-place KV append, and whose other inputs are constants gives, each step, the
same view of the persistent buffer cut at another length. Recording it once over the whole
buffer (the physical shape) and checking that the recorded step's output is that view cut
on one axis turns the step into a re-slice: `full[..., :length + delta]`, O(1) and not
dispatched. Anything that is not such a re-slice (a copy, a shape that moves on two axes, a
kernel that refuses the whole buffer) keeps running as usual.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from onnxkiln.binding_plans import APPEND_VARIANT
from onnxkiln.bindings import DeviceIoBinding
from onnxkiln.plan import Plan, Step

_UPLOAD = ("onnxkiln", "MemcpyFromHost")  # of a bound input on a device: the tensor itself

__all__ = ["Reslice", "Source", "appends_held", "growing_candidates", "growing_sources",
           "resliced"]


@dataclass(frozen=True)
class Source:
    """A value that is `full` (the whole buffer, or a view of it) cut to `binding`'s logical
    length on `binding_axis` plus `delta`, on axis `axis` of the value."""

    binding: int  # position in the run's bindings
    binding_axis: int
    full: Any
    axis: int
    delta: int
    appended: int | None = None  # from an append: the positions it added when recorded

    def holds(self, bindings: Sequence[DeviceIoBinding]) -> bool:
        """Whether the binding still differs from its capacity on `binding_axis` only (as
        when recorded): the cut is the whole view then."""
        b = bindings[self.binding]
        return all(n == p or a == self.binding_axis
                   for a, (n, p) in enumerate(zip(b.logical_shape, b.physical_shape)))

    def value(self, bindings: Sequence[DeviceIoBinding]) -> Any:
        n = bindings[self.binding].logical_shape[self.binding_axis] + self.delta
        return self.full[(slice(None),) * self.axis + (slice(0, n),)]


@dataclass(frozen=True)
class Reslice:
    """An elided view step's output slot and how to cut it each step."""

    slot: int
    source: Source


def growing_sources(plan: Plan, bindings: Sequence[DeviceIoBinding],
                    input_slots: Sequence[int | None], growing: Sequence[int],
                    values: Sequence[Any]) -> dict[int, Source]:
    """Slot -> Source of the growing bindings' views (`growing`: their positions in
    `bindings`; `values`: the run's plan inputs) and of in-place appends to them."""
    slot_input = dict(zip(plan.input_slots, values))
    found: dict[int, Source] = {}
    by_slot: dict[int, tuple[int, int]] = {}
    for i in growing:
        b, slot = bindings[i], input_slots[i]
        view = slot_input.get(slot) if slot is not None else None
        axis = _moved_axis(getattr(view, "shape", None), b.physical_shape)
        if axis is None or b.tensor is None:
            continue
        found[slot] = Source(i, axis, b.tensor, axis, 0)
        by_slot[slot] = (i, axis)
    for step in plan.steps:
        if not step.inputs or not step.outputs or step.outputs[0] is None:
            continue
        if (step.domain, step.op_type) == _UPLOAD and step.inputs[0] in by_slot:
            by_slot[step.outputs[0]] = by_slot[step.inputs[0]]  # the tensor itself
            found[step.outputs[0]] = found[step.inputs[0]]
            continue
        if getattr(step.kernel, "variant", "") != APPEND_VARIANT:
            continue
        src = by_slot.get(step.inputs[0])
        if src is not None:
            found[step.outputs[0]] = Source(src[0], src[1], bindings[src[0]].tensor, src[1],
                                            None)  # type: ignore[arg-type]  # delta: recorded
    return found


def appends_held(cuts: Sequence[Reslice], bindings: Sequence[DeviceIoBinding],
                 before: Sequence[tuple[int, ...]]) -> bool:
    """Whether every append that re-sliced views follow added as many positions as when
    it was recorded (checked after the run: the views were cut for that many)."""
    for c in cuts:
        src = c.source
        if src.appended is not None and (bindings[src.binding].logical_shape[src.binding_axis]
                                         != before[src.binding][src.binding_axis]
                                         + src.appended):
            return False
    return True


def growing_candidates(plan: Plan, sources: Mapping[int, Source], done: set[int],
                       is_candidate: Any) -> set[int]:
    """Steps (not in `done`) to record: views whose data input follows a source and whose
    other inputs are constants."""
    const = set(plan.constants)
    follow = set(sources)
    found = set()
    for i, step in enumerate(plan.steps):
        if i in done or not is_candidate(step) or not step.inputs:
            continue
        data, *rest = step.inputs
        if data in follow and all(s is None or s in const for s in rest):
            follow.update(s for s in step.outputs if s is not None)
            found.add(i)
    return found


def resliced(plan: Plan, sources: Mapping[int, Source], bindings: Sequence[DeviceIoBinding],
             lengths: Sequence[tuple[int, ...]], recorded: Mapping[int, tuple[tuple, tuple]],
             wanted: set[int]) -> dict[int, Reslice]:
    """Step index -> Reslice for each recorded step in `wanted` whose output really is its
    whole-buffer version cut on one axis (`lengths`: the bindings' logical shapes during
    the recording run), in plan order so a refused step refuses its users."""
    known = dict(sources)
    out: dict[int, Reslice] = {}
    for i in sorted(wanted):
        if i not in recorded:
            continue
        step = plan.steps[i]
        ins, outs = recorded[i]
        src = known.get(step.inputs[0])
        if src is None or len(outs) != 1 or step.spec.multi_output or step.outputs[0] is None:
            continue
        if src.delta is None:  # an append's output: its delta from what it returned
            src = _with_delta(src, ins[0] if ins else None, lengths)
            if src is None:
                continue
            known[step.inputs[0]] = src
        found = _reslice(step, src, ins, outs[0], lengths)
        if found is not None:
            known[step.outputs[0]] = found
            out[i] = Reslice(step.outputs[0], found)
    return out


def _with_delta(src: Source, data: Any, lengths: Sequence[tuple[int, ...]]) -> Source | None:
    """An append output's Source, its delta read off `data` (its value in the recording run,
    which must be the buffer cut on the binding's axis)."""
    shape = _shape_of(data)
    if shape is None or len(shape) <= src.axis or not _is_cut(data, src.full, src.axis):
        return None
    delta = shape[src.axis] - lengths[src.binding][src.binding_axis]
    return Source(src.binding, src.binding_axis, src.full, src.axis, delta, delta)


def _reslice(step: Step, src: Source, ins: tuple, out: Any,
             lengths: Sequence[tuple[int, ...]]) -> Source | None:
    """The Source of the step's output when it is its whole-buffer version cut on one
    axis, else None."""
    try:
        full = step.kernel(src.full, *ins[1:])
    except Exception:  # the kernel refuses the whole buffer (a fixed reshape target)
        return None
    if isinstance(full, tuple):
        return None
    shape, whole = _shape_of(out), _shape_of(full)
    if shape is None or whole is None or len(shape) != len(whole):
        return None
    moved = [a for a, (n, m) in enumerate(zip(shape, whole)) if n != m]
    if len(moved) != 1:
        return None
    axis = moved[0]
    if not _is_cut(out, full, axis):
        return None
    delta = shape[axis] - lengths[src.binding][src.binding_axis]
    return Source(src.binding, src.binding_axis, full, axis, delta, src.appended)


def _is_cut(value: Any, full: Any, axis: int) -> bool:
    """Whether `value` is `full[..., :n]` on `axis` (same memory, strides and shape)."""
    shape = _shape_of(value)
    if shape is None:
        return False
    cut = full[(slice(None),) * axis + (slice(0, shape[axis]),)]
    if _shape_of(cut) != shape:
        return False
    if hasattr(value, "__array_interface__") and hasattr(cut, "__array_interface__"):
        same = value.__array_interface__["data"][0] == cut.__array_interface__["data"][0]
        strides = value.strides, cut.strides
    elif hasattr(value, "data_ptr") and hasattr(cut, "data_ptr"):
        same, strides = value.data_ptr() == cut.data_ptr(), (value.stride(), cut.stride())
    else:
        return False
    # a dim of size 1 may carry any stride
    return same and all(a == b for a, b, n in zip(*strides, shape) if n > 1)


def _moved_axis(shape: Any, physical: Sequence[int]) -> int | None:
    if shape is None or len(shape) != len(physical):
        return None
    moved = [a for a, (n, p) in enumerate(zip(shape, physical)) if n != p]
    return moved[0] if len(moved) == 1 else None


def _shape_of(value: Any) -> tuple[int, ...] | None:
    shape = getattr(value, "shape", None)
    return None if shape is None else tuple(shape)
