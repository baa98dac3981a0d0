"""CPU kernels: sequences (Python lists of arrays) and optionals (None or the value).

Kernels never mutate a sequence they read: every op that changes one returns a new list.
Tensors entering a sequence (SequenceConstruct, SequenceInsert, SplitToSequence) are
copied, so a sequence's elements never share memory with tensors outside sequences.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from onnxkiln.providers.base import NodeInfo
from onnxkiln.providers.cpu.control import body_may_alias, own, unbuilt
from onnxkiln.providers.cpu.registry import kernel


def _seq(value: Any, op: str) -> list[Any]:
    if not isinstance(value, list | tuple):
        kind = "an empty optional" if value is None else f"a {type(value).__name__}"
        raise ValueError(f"{op}: input_sequence must be a sequence of tensors, got {kind}")
    return value  # type: ignore[return-value]


def _tensor(value: Any, op: str) -> np.ndarray:
    """A fresh array holding `value`, to be stored in a sequence."""
    if isinstance(value, np.ndarray):
        return value.copy()
    if value is None or isinstance(value, list | tuple | dict):
        raise ValueError(f"{op}: expected a tensor, got {type(value).__name__}")
    return np.array(value)


def _position(value: Any, op: str) -> int:
    arr = np.asarray(value)
    if arr.size != 1 or arr.dtype.kind not in "iu":
        raise ValueError(f"{op}: position must be an int32/int64 scalar, got {arr.dtype} "
                         f"of shape {arr.shape}")
    return int(arr.reshape(()))


def _check_dtype(seq: list[Any], tensor: np.ndarray, op: str) -> None:
    if seq:
        first = np.asarray(seq[0]).dtype
        if tensor.dtype != first:
            raise ValueError(f"{op}: tensor dtype {tensor.dtype} differs from the sequence's "
                             f"element dtype {first}")


@kernel("SequenceConstruct", since=11, variant="sequence.list")
def sequence_construct(*inputs):
    """A sequence of (copies of) the input tensors, in order."""
    return [_tensor(x, "SequenceConstruct") for x in inputs]


@kernel("SequenceEmpty", since=11, variant="sequence.list")
def sequence_empty(*, dtype):
    """An empty sequence (its element type lives in the graph's types only)."""
    return []


@kernel("SequenceInsert", since=11, variant="sequence.list")
def sequence_insert(input_sequence, tensor, position=None):
    """A new sequence with `tensor` inserted at `position` (default: at the end)."""
    seq = _seq(input_sequence, "SequenceInsert")
    value = _tensor(tensor, "SequenceInsert")
    _check_dtype(seq, value, "SequenceInsert")
    n = len(seq)
    if position is None:
        at = n
    else:
        at = _position(position, "SequenceInsert")
        if not -n <= at <= n:
            raise IndexError(f"SequenceInsert: position {at} is out of range [{-n}, {n}] for a "
                             f"sequence of length {n}")
        if at < 0:
            at += n
    out = list(seq)
    out.insert(at, value)
    return out


@kernel("SequenceErase", since=11, variant="sequence.list")
def sequence_erase(input_sequence, position=None):
    """A new sequence without the element at `position` (default: the last one)."""
    seq = _seq(input_sequence, "SequenceErase")
    n = len(seq)
    at = n - 1 if position is None else _position(position, "SequenceErase")
    if not -n <= at < n:
        raise IndexError(f"SequenceErase: position {at} is out of range [{-n}, {n - 1}] for a "
                         f"sequence of length {n}")
    if at < 0:
        at += n
    return [*seq[:at], *seq[at + 1:]]


@kernel("SequenceAt", since=11, view=True, variant="sequence.list")
def sequence_at(input_sequence, position):
    """The element at `position` (negative counts from the end)."""
    seq = _seq(input_sequence, "SequenceAt")
    n = len(seq)
    at = _position(position, "SequenceAt")
    if not -n <= at < n:
        raise IndexError(f"SequenceAt: position {at} is out of range [{-n}, {n - 1}] for a "
                         f"sequence of length {n}")
    return seq[at]


@kernel("SequenceLength", since=11, variant="sequence.list")
def sequence_length(input_sequence):
    """The number of elements, as an int64 scalar."""
    return np.array(len(_seq(input_sequence, "SequenceLength")), dtype=np.int64)


def _axis(axis: int, rank: int, op: str, extra: int = 0) -> int:
    """Normalise `axis` for a rank-`rank` tensor (`extra` = 1 allows the new axis `rank`)."""
    hi = rank + extra
    if not -hi <= axis < hi:
        raise ValueError(f"{op}: axis {axis} is out of range [{-hi}, {hi - 1}] for rank {rank}")
    return axis + hi if axis < 0 else axis


@kernel("SplitToSequence", since=11, variant="sequence.split")
def split_to_sequence(input, split=None, *, axis, keepdims):
    """Split along `axis`: pieces of 1 (squeezed unless keepdims), of `split`, or sized by it."""
    x = np.asarray(input)
    if x.ndim == 0:
        raise ValueError("SplitToSequence: input must have rank >= 1, got a scalar")
    a = _axis(int(axis), x.ndim, "SplitToSequence")
    dim = x.shape[a]
    if split is None:
        moved = np.moveaxis(x, a, 0)
        if keepdims:
            return [np.expand_dims(moved[i], a).copy() for i in range(dim)]
        return [moved[i].copy() for i in range(dim)]
    sizes = np.asarray(split)
    if sizes.dtype.kind not in "iu":
        raise ValueError(f"SplitToSequence: split must be int32/int64, got {sizes.dtype}")
    if sizes.ndim == 0:
        step = int(sizes)
        if step <= 0:
            raise ValueError(f"SplitToSequence: split must be positive, got {step}")
        bounds = list(range(step, dim, step))
    elif sizes.ndim == 1:
        parts = [int(s) for s in sizes]
        if any(s < 0 for s in parts) or sum(parts) != dim:
            raise ValueError(f"SplitToSequence: split {parts} must be non-negative and sum to "
                             f"the size {dim} of axis {axis} (input shape {x.shape})")
        bounds = list(np.cumsum(parts[:-1]))
    else:
        raise ValueError(f"SplitToSequence: split must be a scalar or 1-D, got shape "
                         f"{sizes.shape}")
    return [p.copy() for p in np.split(x, bounds, axis=a)]


@kernel("ConcatFromSequence", since=11, variant="sequence.concat")
def concat_from_sequence(input_sequence, *, axis, new_axis):
    """Concatenate the elements along `axis`, or stack them on a new axis when new_axis=1."""
    seq = _seq(input_sequence, "ConcatFromSequence")
    if not seq:
        raise ValueError("ConcatFromSequence: the input sequence is empty; the result's "
                         "shape is undefined")
    arrays = [np.asarray(v) for v in seq]
    rank = arrays[0].ndim
    try:
        if new_axis:
            return np.stack(arrays, axis=_axis(int(axis), rank, "ConcatFromSequence", 1))
        if rank == 0:
            raise ValueError("ConcatFromSequence: cannot concatenate scalars without new_axis=1")
        return np.concatenate(arrays, axis=_axis(int(axis), rank, "ConcatFromSequence"))
    except ValueError as e:
        if str(e).startswith("ConcatFromSequence"):
            raise
        shapes = [a.shape for a in arrays]
        raise ValueError(f"ConcatFromSequence: element shapes {shapes} do not fit axis {axis} "
                         f"(new_axis={new_axis}): {e}") from None


@kernel("SequenceMap", since=17, factory=True, multi_output=True, variant="sequence.map")
def sequence_map(info: NodeInfo):
    """Run body on the i-th element of each sequence input (tensor inputs as they are)."""
    placeholder = unbuilt(info, ("body",))
    if placeholder is not None:
        return placeholder
    body = info.subgraphs["body"]
    n_in = info.n_inputs
    n_out = len(body.output_names)
    copy = tuple(j for j, f in enumerate(body_may_alias(body)) if f)

    def run(*args):
        inputs = args[:n_in]
        captured = args[n_in:]
        seq0 = _seq(inputs[0], "SequenceMap")
        n = len(seq0)
        is_seq = [isinstance(v, list | tuple) for v in inputs]
        for k, (v, s) in enumerate(zip(inputs, is_seq)):
            if s and len(v) != n:
                raise ValueError(f"SequenceMap: sequence input {k} has {len(v)} elements, "
                                 f"input 0 has {n}")
        outs: list[list[Any]] = [[] for _ in range(n_out)]
        for i in range(n):
            res = body(tuple(v[i] if s else v for v, s in zip(inputs, is_seq)), captured)
            for j in copy:
                res[j] = own(res[j])
            for lst, r in zip(outs, res):
                lst.append(r)
        return outs

    return run


@kernel("Optional", since=15, view=True, variant="optional.value")
def optional(input=None, *, type):
    """An optional holding `input`, or an empty optional (None) when it is absent."""
    return input


@kernel("OptionalHasElement", since=15, variant="optional.value")
def optional_has_element(input=None):
    """True when the input is present and not an empty optional."""
    return np.array(input is not None)


@kernel("OptionalGetElement", since=15, view=True, variant="optional.value")
def optional_get_element(input=None):
    """The value inside an optional (a plain tensor or sequence is returned as it is)."""
    if input is None:
        raise ValueError("OptionalGetElement: the optional input is empty (holds no element)")
    return input
