"""In-place KV writes of attention kernels whose past and present share one binding.

An attention kernel that reads a KV past and returns the present (com.microsoft
GroupQueryAttention, MultiHeadAttention, Attention; ai.onnx Attention) may carry two
attributes:

- `kv_pairs`: ((past input index, present output index), ...), e.g. GroupQueryAttention's
  ((3, 1), (4, 2));
- `kv_in_place(targets)`: given one binding per pair (in `kv_pairs` order), a kernel with the
  same call signature that writes only the new positions into the bindings' buffers (the
  growing form after the logical past, the static-cache form at the position the node's
  inputs give), attends over the buffers, and returns the presents as views of them; or None
  when this node's form cannot (a sliding-window cache, say).

`attention_writes` swaps those kernels into a binding plan, so a bound decode step does
O(new tokens) work on the cache instead of building a new present and copying it back.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from onnxkiln.errors import DeviceBindingError

__all__ = ["attention_writes", "capacity_error", "in_place_of", "note_written"]


def attention_writes(steps: list[Any], output_slots: Sequence[int], bindings: Sequence[Any],
                     in_slot: Mapping[str, int], out_slot: Mapping[str, int]) -> set[str]:
    """Replace, in `steps`, each attention kernel all of whose KV pairs are bound (past and
    present to one binding each) by its in-place kernel; the bound outputs it now writes."""
    paired = {(in_slot[b.input_name], out_slot[b.output_name]): b for b in bindings
              if b.input_name is not None and b.output_name is not None}
    done: set[str] = set()
    if not paired:
        return done
    for index, step in enumerate(steps):
        make = getattr(step.kernel, "kv_in_place", None)
        pairs = getattr(step.kernel, "kv_pairs", ())
        if make is None or not pairs:
            continue
        targets = []
        for i, o in pairs:
            past = step.inputs[i] if i < len(step.inputs) else None
            present = step.outputs[o] if o < len(step.outputs) else None
            b = paired.get((past, present))
            if b is None or b._provider.name != step.provider or not _sole_reader(
                    steps, index, past, output_slots):
                break
            targets.append(b)
        else:
            kernel = make(tuple(targets))
            if kernel is None:
                continue
            steps[index] = dataclasses.replace(step, kernel=kernel)
            done.update(b.output_name for b in targets)
    return done


def _sole_reader(steps: Sequence[Any], index: int, past: int,
                 output_slots: Sequence[int]) -> bool:
    """Whether writing into `past`'s buffer at step `index` changes nothing another step or
    the caller sees: no later step reads it, no view of it is taken, it is no graph output."""
    if past in output_slots:
        return False
    return not any(i != index and past in other.inputs and (i > index or other.spec.view)
                   for i, other in enumerate(steps))


def capacity_error(target: Any, op: str, need: int, axis: int) -> DeviceBindingError:
    """The error of a write that would end past the binding's capacity on `axis`."""
    return DeviceBindingError(
        f"{target!r}: {op} writes the KV cache up to position {need} on axis {axis}, beyond "
        f"its capacity {target.physical_shape[axis]}; allocate a larger binding or reset the "
        "cache")


def note_written(target: Any, nbytes: int) -> None:
    """Count an in-place write on `target` when it keeps counters (bindings do)."""
    note = getattr(target, "note_in_place", None)
    if note is not None:
        note(nbytes)


def in_place_of(run: Callable[..., tuple], variant: str, wanted: bool):
    """A `kv_in_place` for `run`, a kernel taking the bindings as keyword `_into`: the
    kernel calling it with them (None when the node does not want its presents)."""
    def in_place(targets):
        if not wanted:
            return None

        def run_in_place(*args, **kwargs):
            return run(*args, _into=targets, **kwargs)

        run_in_place.variant = variant
        return run_in_place

    return in_place
