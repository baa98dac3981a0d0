"""If, Loop and Scan over compiled subgraphs, written once for every provider.

Each provider registers these drivers with its `ArrayOps` (numpy on the host, torch on a
device). The decisions stay on the host: If's condition and Loop's trip count and
condition arrive as host values (a device provider declares them host inputs, so reading
them is the one declared sync per branch or iteration), while the bodies' values stay
wherever the bodies' kernels put them.

Bodies run through `info.subgraphs[name](inputs, captured)`. Values that a body hands
back unchanged (a body input, an outer capture or a constant, directly or through a view)
are copied once when they leave the node, so no output shares memory with an input.
Under a memory limit, Loop and Scan report what they hold after each iteration (the scan
outputs so far and the carried values) and before stacking (onnxkiln.memory).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from onnxkiln.dtypes import DataType
from onnxkiln.memory import MemoryTracker, current_tracker, value_bytes
from onnxkiln.providers.base import NodeInfo, Subgraph

__all__ = ["NUMPY", "ArrayOps", "body_may_alias", "body_output_meta", "if_kernel",
           "loop_kernel", "own", "scan8_kernel", "scan_kernel", "truth", "unbuilt"]

_TRUE = np.array(True)
_TRUE.flags.writeable = False
_UNBOUNDED = int(np.iinfo(np.int64).max)


@dataclass(frozen=True)
class ArrayOps:
    """What the drivers need of a provider's arrays.

    `asarray(x)` (a kernel input as the backend's array), `stack(items, axis)`,
    `front(x, axis)` (axis moved to 0), `reverse(x)` (along axis 0), `zeros(shape, dtype)`
    (dtype: a numpy dtype or the backend's own), `copy(x)`, and `errors`, the exception
    types the backend raises for mismatched shapes."""

    asarray: Callable[[Any], Any]
    stack: Callable[[list[Any], int], Any]
    front: Callable[[Any, int], Any]
    reverse: Callable[[Any], Any]
    zeros: Callable[[tuple[int, ...], Any], Any]
    copy: Callable[[Any], Any]
    errors: tuple[type[BaseException], ...] = (ValueError,)


NUMPY = ArrayOps(asarray=np.asarray,
                 stack=lambda items, axis: np.stack(items, axis=axis),
                 front=lambda x, axis: np.moveaxis(x, axis, 0) if axis else x,
                 reverse=lambda x: x[::-1],
                 zeros=lambda shape, dtype: np.zeros(shape, dtype=dtype),
                 copy=np.copy)


def truth(value: Any, what: str) -> bool:
    """The bool of a one-element host tensor (If cond, Loop cond), or a clear ValueError."""
    if value.__class__ is np.ndarray and value.size == 1:
        return bool(value)
    if value is None:
        raise ValueError(f"{what} is absent; expected a bool tensor with one element")
    if isinstance(value, list):
        raise ValueError(f"{what} must be a bool tensor with one element, got a sequence")
    try:
        return bool(value.item() if hasattr(value, "item") else value)
    except (ValueError, RuntimeError):
        raise ValueError(
            f"{what} must hold exactly one element, got shape {tuple(np.shape(value))}"
        ) from None


def unbuilt(info: NodeInfo, names: Sequence[str]):
    """None when every named subgraph is compiled, else a kernel that says why it cannot run.

    The planner skips compiling bodies once some node lacks a kernel; it then raises one
    UnsupportedOpError for the whole model, so this placeholder must not fail first.
    """
    missing = [n for n in names if n not in info.subgraphs]
    if not missing:
        return None

    def run(*args):
        raise ValueError(f"{info.op_type}: subgraph(s) {missing} were not compiled")

    return run


def own(value: Any, ops: ArrayOps = NUMPY) -> Any:
    """A copy that shares no memory with `value` (sequences: a new list; None stays)."""
    if isinstance(value, list):
        return list(value)
    if value is None or not hasattr(value, "shape"):
        return value
    return ops.copy(value)


def body_may_alias(body: Subgraph) -> tuple[bool, ...]:
    """Per body output: may it share memory with a body input, capture or constant?"""
    flags = getattr(body, "output_may_alias", None)
    if flags is None:  # a runner that keeps it on its compiled plan
        plan = getattr(getattr(body, "_compiled", None), "plan", None)
        flags = getattr(plan, "output_may_alias", None)
    n = len(body.output_names)
    if flags is None or len(flags) != n:
        return (True,) * n
    return tuple(bool(f) for f in flags)


def body_output_meta(
    body: Subgraph, index: int, fallback: DataType | None = None
) -> tuple[np.dtype, tuple[int, ...] | None]:
    """Declared numpy dtype and static shape of body output `index` (for empty results).

    Reads `body.output_dtypes` / `body.output_shapes` when the runner provides them;
    the dtype falls back to `fallback` (the node output's type) and then float32, the
    shape to None (unknown or symbolic).
    """
    dtype: Any = None
    shape: Any = None
    dtypes = getattr(body, "output_dtypes", None)
    shapes = getattr(body, "output_shapes", None)
    if dtypes is not None and index < len(dtypes):
        dtype = dtypes[index]
    if shapes is not None and index < len(shapes):
        shape = shapes[index]
    if dtype is None:
        dtype = fallback
    try:
        np_dtype = DataType(dtype).numpy if dtype is not None else np.dtype(np.float32)
    except (KeyError, ValueError):
        np_dtype = np.dtype(np.float32)
    if shape is not None and not all(isinstance(d, int) and d >= 0 for d in shape):
        shape = None
    return np_dtype, None if shape is None else tuple(shape)


def _empty_scan(ops: ArrayOps, body: Subgraph, index: int, fallback: DataType | None,
                lead: tuple[int, ...], axis: int = 0) -> Any:
    """An empty scan output: `lead` dims inserted at `axis` of the element's shape."""
    dtype, shape = body_output_meta(body, index, fallback)
    elem = shape if shape is not None else ()
    rank = len(elem) + len(lead)
    if axis < 0:
        axis += len(elem) + 1
    axis = min(max(axis, 0), rank - len(lead))
    return ops.zeros((*elem[:axis], *lead, *elem[axis:]), dtype)


def _stack(ops: ArrayOps, items: list[Any], axis: int, what: str) -> Any:
    try:
        return ops.stack(items, axis)
    except ops.errors:
        shapes = sorted({tuple(v.shape) for v in items})
        raise ValueError(
            f"{what} must have the same shape in every iteration, got shapes {shapes}"
        ) from None


class _Held:
    """What a Loop or Scan holds between iterations, reported to the memory tracker."""

    __slots__ = ("_op", "_tracker", "stacked")

    def __init__(self, tracker: MemoryTracker, op: str) -> None:
        self._tracker = tracker
        self._op = op
        self.stacked = 0  # bytes of the scan outputs collected so far

    def iteration(self, i: int, new: Sequence[Any], carried: Sequence[Any]) -> None:
        self.stacked += sum(value_bytes(v) for v in new)
        self._tracker.hold(self.stacked, value_bytes(list(carried)),
                           f"{self._op} scan outputs and carried values after iteration {i}")

    def stacking(self, carried: Sequence[Any]) -> None:
        self._tracker.hold(self.stacked, self.stacked + value_bytes(list(carried)),
                           f"{self._op} scan outputs, their stacked copy and carried values")


def _held(op: str) -> _Held | None:
    tracker = current_tracker()
    return None if tracker is None else _Held(tracker, op)


def _node_dtype(info: NodeInfo, index: int) -> DataType | None:
    dtypes = info.output_dtypes
    return dtypes[index] if index < len(dtypes) else None


# If ----------------------------------------------------------------------------------


def if_kernel(info: NodeInfo, ops: ArrayOps = NUMPY):
    """Run then_branch or else_branch on the captured outer values."""
    placeholder = unbuilt(info, ("then_branch", "else_branch"))
    if placeholder is not None:
        return placeholder
    then_branch = info.subgraphs["then_branch"]
    else_branch = info.subgraphs["else_branch"]
    for name, branch in (("then_branch", then_branch), ("else_branch", else_branch)):
        if len(branch.output_names) != len(info.output_present):
            raise ValueError(f"If has {len(info.output_present)} output(s) but its {name} "
                             f"produces {len(branch.output_names)}")
    copy_then = tuple(i for i, f in enumerate(body_may_alias(then_branch)) if f)
    copy_else = tuple(i for i, f in enumerate(body_may_alias(else_branch)) if f)

    def run(cond, *captured):
        if truth(cond, "If cond"):
            outs, copy = then_branch((), captured), copy_then
        else:
            outs, copy = else_branch((), captured), copy_else
        for i in copy:
            outs[i] = own(outs[i], ops)
        return outs

    return run


# Loop --------------------------------------------------------------------------------


def _trip_count(m: Any) -> int | None:
    if m is None:
        return None
    if isinstance(m, list) or np.size(m) != 1:
        raise ValueError(f"Loop M (max trip count) must be an int64 scalar, got shape "
                         f"{np.shape(m) if not isinstance(m, list) else 'sequence'}")
    return int(np.asarray(m).reshape(()))


def loop_kernel(info: NodeInfo, ops: ArrayOps = NUMPY):
    """Run body while i < M and cond; carry N values, stack K scan outputs on a new axis 0."""
    placeholder = unbuilt(info, ("body",))
    if placeholder is not None:
        return placeholder
    body = info.subgraphs["body"]
    n_in = info.n_inputs
    n_carried = max(n_in - 2, 0)
    n_scan = len(body.output_names) - 1 - n_carried
    if n_scan < 0:
        raise ValueError(
            f"Loop body has {len(body.output_names)} outputs; it needs at least "
            f"1 + {n_carried} (cond and the loop-carried values)"
        )
    if len(body.input_names) != 2 + n_carried:
        raise ValueError(
            f"Loop body has {len(body.input_names)} inputs; it needs 2 + {n_carried} "
            f"(iteration_num, cond and the loop-carried values)"
        )
    aliased = body_may_alias(body)[1:1 + n_carried]
    scan_dtypes = [_node_dtype(info, n_carried + j) for j in range(n_scan)]
    present = info.output_present
    wanted = tuple(j for j in range(n_scan)
                   if n_carried + j < len(present) and present[n_carried + j])
    wanted_at = tuple(1 + n_carried + j for j in wanted)  # their positions in body outputs

    def run(*args):
        m = args[0] if n_in > 0 else None
        cond = args[1] if n_in > 1 else None
        carried = args[2:n_in]
        captured = args[n_in:]
        trips = _trip_count(m)
        if cond is None:
            cond_in, going = _TRUE, True
        else:
            cond_in, going = cond, truth(cond, "Loop cond")
        scans: list[list[Any]] = [[] for _ in wanted]
        i = 0
        limit = _UNBOUNDED if trips is None else trips
        held = _held("Loop")
        while going and i < limit:
            outs = body((np.array(i, dtype=np.int64), cond_in, *carried), captured)
            cond_in = outs[0]
            going = truth(cond_in, "Loop body's cond output")
            carried = outs[1:1 + n_carried]
            for lst, k in zip(scans, wanted_at):
                lst.append(outs[k])
            if held is not None:
                held.iteration(i, [outs[k] for k in wanted_at], carried)
            i += 1
        if held is not None and scans:
            held.stacking(carried)
        finals = [own(v, ops) if (i == 0 or a) else v for v, a in zip(carried, aliased)]
        finals.extend([None] * n_scan)
        for j, lst in zip(wanted, scans):
            if lst:
                finals[n_carried + j] = _stack(ops, lst, 0, f"Loop scan output {j}")
            else:
                finals[n_carried + j] = _empty_scan(ops, body, 1 + n_carried + j,
                                                    scan_dtypes[j], (0,))
        return finals

    return run


# Scan --------------------------------------------------------------------------------


def _list_attr(value: Any, n: int, name: str, default: int = 0) -> list[int]:
    if value is None or (isinstance(value, list) and not value):
        return [default] * n
    out = [int(v) for v in value]
    if len(out) != n:
        raise ValueError(f"Scan attribute {name} has {len(out)} entries, expected {n}")
    return out


def _scan_attrs(info: NodeInfo, n_scan_in: int, n_scan_out: int):
    a = info.attrs
    in_axes = _list_attr(a.get("scan_input_axes"), n_scan_in, "scan_input_axes")
    in_dirs = _list_attr(a.get("scan_input_directions"), n_scan_in, "scan_input_directions")
    out_axes = _list_attr(a.get("scan_output_axes"), n_scan_out, "scan_output_axes")
    out_dirs = _list_attr(a.get("scan_output_directions"), n_scan_out, "scan_output_directions")
    for name, dirs in (("scan_input_directions", in_dirs), ("scan_output_directions", out_dirs)):
        if any(d not in (0, 1) for d in dirs):
            raise ValueError(f"Scan {name} must be 0 (forward) or 1 (reverse), got {dirs}")
    return in_axes, in_dirs, out_axes, out_dirs


def _scan_counts(info: NodeInfo, body: Subgraph, leading: int) -> tuple[int, int, int, int]:
    """(scan inputs, node inputs, state variables, scan outputs) of a Scan node whose first
    `leading` inputs are neither (Scan-8's sequence_lens), or a clear ValueError."""
    n_scan_in = int(info.attrs["num_scan_inputs"])
    n_in = info.n_inputs
    n_state = n_in - leading - n_scan_in
    if n_scan_in < 1 or n_state < 0:
        raise ValueError(f"Scan num_scan_inputs={n_scan_in} does not fit {n_in} inputs")
    n_scan_out = len(body.output_names) - n_state
    if n_scan_out < 0:
        raise ValueError(f"Scan body has {len(body.output_names)} outputs, fewer than its "
                         f"{n_state} state variables")
    return n_scan_in, n_in, n_state, n_scan_out


def scan_kernel(info: NodeInfo, ops: ArrayOps = NUMPY):
    """Iterate body over slices of the scan inputs along their axes, carrying N states."""
    placeholder = unbuilt(info, ("body",))
    if placeholder is not None:
        return placeholder
    body = info.subgraphs["body"]
    n_scan_in, n_in, n_state, n_scan_out = _scan_counts(info, body, 0)
    in_axes, in_dirs, out_axes, out_dirs = _scan_attrs(info, n_scan_in, n_scan_out)
    aliased = body_may_alias(body)[:n_state]
    out_dtypes = [_node_dtype(info, n_state + j) for j in range(n_scan_out)]

    def run(*args):
        states = args[:n_state]
        xs = args[n_state:n_in]
        captured = args[n_in:]
        slices = []
        length = -1
        for k, (x, axis, rev) in enumerate(zip(xs, in_axes, in_dirs)):
            x = ops.asarray(x)
            a = axis + x.ndim if axis < 0 else axis
            if not 0 <= a < x.ndim:
                raise ValueError(f"Scan scan_input_axes[{k}]={axis} is out of range for scan "
                                 f"input {k} of shape {tuple(x.shape)}")
            if length < 0:
                length = x.shape[a]
            elif x.shape[a] != length:
                raise ValueError(f"Scan inputs disagree on the sequence length: input 0 has "
                                 f"{length}, input {k} has {x.shape[a]} (axis {axis})")
            xm = ops.front(x, a)
            slices.append(ops.reverse(xm) if rev else xm)
        collected: list[list[Any]] = [[] for _ in range(n_scan_out)]
        held = _held("Scan")
        for t in range(length):
            outs = body((*states, *(xm[t] for xm in slices)), captured)
            states = outs[:n_state]
            for j, lst in enumerate(collected):
                lst.append(outs[n_state + j])
            if held is not None:
                held.iteration(t, outs[n_state:], states)
        if held is not None and collected:
            held.stacking(states)
        results = [own(v, ops) if (length <= 0 or a) else v for v, a in zip(states, aliased)]
        for j, lst in enumerate(collected):
            if not lst:
                results.append(_empty_scan(ops, body, n_state + j, out_dtypes[j], (0,),
                                           out_axes[j]))
                continue
            if out_dirs[j]:
                lst.reverse()
            axis = out_axes[j]
            rank = lst[0].ndim + 1
            if not -rank <= axis < rank:
                raise ValueError(f"Scan scan_output_axes[{j}]={axis} is out of range for "
                                 f"rank-{rank} scan output {j}")
            results.append(_stack(ops, lst, axis, f"Scan output {j}"))
        return results

    return run


def scan8_kernel(info: NodeInfo, ops: ArrayOps = NUMPY):
    """Scan-8: batch axis 0, sequence axis 1, optional sequence_lens, per-input directions."""
    placeholder = unbuilt(info, ("body",))
    if placeholder is not None:
        return placeholder
    body = info.subgraphs["body"]
    n_scan_in, n_in, n_state, n_scan_out = _scan_counts(info, body, 1)
    dirs = _list_attr(info.attrs.get("directions"), n_scan_in, "directions")
    out_dtypes = [_node_dtype(info, n_state + j) for j in range(n_scan_out)]

    def run(seq_lens, *rest):
        states0 = [ops.asarray(s) for s in rest[:n_state]]
        xs = [ops.asarray(x) for x in rest[n_state:n_in - 1]]
        captured = rest[n_in - 1:]
        for k, x in enumerate(xs):
            if x.ndim < 2:
                raise ValueError(f"Scan-8 input {k} needs [batch, sequence, ...] dims, got "
                                 f"shape {tuple(x.shape)}")
            if x.shape[:2] != xs[0].shape[:2]:
                raise ValueError(f"Scan-8 inputs disagree on [batch, sequence]: "
                                 f"{tuple(xs[0].shape[:2])} vs {tuple(x.shape[:2])} (input {k})")
        batch, max_len = xs[0].shape[:2]
        for j, s in enumerate(states0):
            if s.ndim < 1 or s.shape[0] != batch:
                raise ValueError(f"Scan-8 initial state {j} must have batch size {batch} on "
                                 f"axis 0, got shape {tuple(s.shape)}")
        if seq_lens is None:
            lens = [max_len] * batch
        else:
            lens = [int(v) for v in np.asarray(seq_lens).reshape(-1)]
            if len(lens) != batch or any(not 0 <= v <= max_len for v in lens):
                raise ValueError(f"Scan-8 sequence_lens must hold {batch} values in "
                                 f"[0, {max_len}], got {lens}")
        finals: list[list[Any]] = [[] for _ in range(n_state)]
        per_batch: list[list[list[Any]]] = [[] for _ in range(n_scan_out)]
        held = _held("Scan")
        for b in range(batch):
            states = [s[b] for s in states0]
            n = lens[b]
            slices = [ops.reverse(x[b, :n]) if d else x[b, :n] for x, d in zip(xs, dirs)]
            collected: list[list[Any]] = [[] for _ in range(n_scan_out)]
            for t in range(n):
                outs = body((*states, *(xm[t] for xm in slices)), captured)
                states = outs[:n_state]
                for j, lst in enumerate(collected):
                    lst.append(outs[n_state + j])
                if held is not None:
                    held.iteration(t, outs[n_state:], [*states, *(f for fs in finals for f in fs)])
            for j, v in enumerate(states):
                finals[j].append(v)
            for j, lst in enumerate(collected):
                per_batch[j].append(lst)
        if held is not None and per_batch:
            held.stacking([f for fs in finals for f in fs])
        results: list[Any] = [
            _stack(ops, f, 0, f"Scan-8 state {j}") if f else own(states0[j], ops)
            for j, f in enumerate(finals)
        ]
        for j, batches in enumerate(per_batch):
            results.append(_scan8_output(ops, body, n_state + j, out_dtypes[j], batches, batch,
                                         max_len))
        return results

    return run


def _scan8_output(ops: ArrayOps, body: Subgraph, index: int, fallback: DataType | None,
                  batches: Sequence[list[Any]], batch: int, max_len: int) -> Any:
    """[batch, max_len, ...] from per-batch element lists, zero-padded past each length."""
    first = next((lst[0] for lst in batches if lst), None)
    if first is None:
        return _empty_scan(ops, body, index, fallback, (batch, max_len))
    out = ops.zeros((batch, max_len, *first.shape), first.dtype)
    for b, lst in enumerate(batches):
        if lst:
            try:
                out[b, :len(lst)] = _stack(ops, lst, 0, f"Scan-8 output {index}")
            except ValueError as e:
                raise ValueError(f"Scan-8 output {index}: {e}") from None
    return out
