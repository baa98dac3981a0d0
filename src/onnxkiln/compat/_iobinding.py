"""IOBinding: onnxruntime's bind-then-run API, over host memory."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from onnxkiln.compat._errors import ort_errors_class
from onnxkiln.compat._values import (
    OrtValue,
    OrtValueVector,
    check_cpu_device,
    elem_name,
    numpy_dtype,
    owner_of,
    view_of,
)
from onnxkiln.dtypes import from_numpy
from onnxkiln.errors import DeviceBindingError, InvalidInputError, ShapeError

if TYPE_CHECKING:
    from onnxkiln.compat._options import RunOptions
    from onnxkiln.compat._session import InferenceSession

__all__ = ["IOBinding"]


@ort_errors_class
class IOBinding:
    """Inputs and outputs bound ahead of `InferenceSession.run_with_iobinding`.

    Everything lives in host memory: `bind_cpu_input` / `bind_ortvalue_input` take an
    array or OrtValue without copying; `bind_input(..., buffer_ptr)` accepts only the
    `data_ptr()` of a live onnxkiln.compat OrtValue (onnxkiln never reads raw foreign
    pointers). An output bound with a preallocated OrtValue (or buffer_ptr) receives
    the result in that memory (copied in after the run; shape and dtype must match);
    other outputs are allocated by the run. `synchronize_inputs/outputs` are no-ops
    (nothing is asynchronous on the host).

    Example:
        >>> b = sess.io_binding()
        >>> b.bind_cpu_input("x", x)
        >>> b.bind_output("y")
        >>> sess.run_with_iobinding(b)
        >>> y, = b.copy_outputs_to_cpu()
    """

    def __init__(self, session: InferenceSession) -> None:
        self._session = session
        self._inputs: dict[str, Any] = {}
        self._outputs: dict[str, OrtValue | None] = {}  # bound order; None: allocate
        self._results: list[OrtValue] = []

    # inputs -------------------------------------------------------------------------
    def bind_cpu_input(self, name: str, arr_on_cpu: Any) -> None:
        """Bind a host array (taken as is, not copied) to input `name`."""
        self._session._check_input_name(name, "bind_cpu_input")
        self._inputs[name] = arr_on_cpu.value if isinstance(arr_on_cpu, OrtValue) else (
            np.asarray(arr_on_cpu))

    def bind_input(self, name: str, device_type: str, device_id: int, element_type: Any,
                   shape: Sequence[int], buffer_ptr: int) -> None:
        """Bind `element_type[shape]` read from `buffer_ptr`, which must be the data_ptr()
        of a live OrtValue."""
        what = f"bind_input('{name}')"
        self._session._check_input_name(name, "bind_input")
        check_cpu_device(device_type, device_id, what)
        self._inputs[name] = _pointer_view(buffer_ptr, element_type, shape, what)

    def bind_ortvalue_input(self, name: str, ortvalue: OrtValue) -> None:
        """Bind an OrtValue to input `name`."""
        self._session._check_input_name(name, "bind_ortvalue_input")
        self._inputs[name] = _ortvalue(ortvalue, "bind_ortvalue_input").value

    def synchronize_inputs(self) -> None:
        """No-op: host inputs need no synchronisation."""

    def clear_binding_inputs(self) -> None:
        """Forget every bound input."""
        self._inputs.clear()

    # outputs ------------------------------------------------------------------------
    def bind_output(self, name: str, device_type: str = "cpu", device_id: int = 0,
                    element_type: Any = None, shape: Sequence[int] | None = None,
                    buffer_ptr: int | None = None) -> None:
        """Bind output `name`: allocated by the run, or written into `buffer_ptr`
        (the data_ptr() of a live OrtValue; then element_type and shape are required)."""
        what = f"bind_output('{name}')"
        self._session._check_output_name(name, "bind_output")
        check_cpu_device(device_type, device_id, what)
        if buffer_ptr is None:
            self._outputs[name] = None
            return
        if element_type is None or shape is None:
            raise InvalidInputError(
                f"{what}: `element_type` and `shape` are to be provided if pre-allocated "
                "memory is provided")
        self._outputs[name] = OrtValue(_pointer_view(buffer_ptr, element_type, shape, what))

    def bind_ortvalue_output(self, name: str, ortvalue: OrtValue) -> None:
        """Bind a preallocated OrtValue: the run writes output `name` into its memory."""
        self._session._check_output_name(name, "bind_ortvalue_output")
        self._outputs[name] = _ortvalue(ortvalue, "bind_ortvalue_output")

    def synchronize_outputs(self) -> None:
        """No-op: host outputs are complete when the run returns."""

    def clear_binding_outputs(self) -> None:
        """Forget every bound output (and the last results)."""
        self._outputs.clear()
        self._results = []

    def get_outputs(self) -> list[OrtValue]:
        """The last run's outputs as OrtValues, in the order they were bound."""
        return list(self._results)

    def get_outputs_as_ortvaluevector(self) -> OrtValueVector:
        """The outputs of the last run as an OrtValueVector."""
        return OrtValueVector(self.get_outputs())

    def copy_outputs_to_cpu(self) -> list[Any]:
        """Copies of the last run's outputs: numpy arrays (lists/dicts for sequences and
        maps)."""
        return [_copy(v.value) for v in self._results]

    # running ------------------------------------------------------------------------
    def _run(self, run_options: RunOptions | None) -> None:
        if not self._outputs:
            raise InvalidInputError(
                "run_with_iobinding: at least one output should be requested; bind one with "
                "bind_output(name)")
        session = self._session
        names = list(self._outputs)
        feed = session._check_feed(self._inputs)
        values = session._execute(names, feed, run_options)
        results = []
        for name, value in zip(names, values):
            bound = self._outputs[name]
            if bound is None:
                results.append(OrtValue(value))
                continue
            _write(bound, value, name)
            results.append(bound)
        self._results = results


def _ortvalue(value: Any, what: str) -> OrtValue:
    if not isinstance(value, OrtValue):
        raise InvalidInputError(
            f"{what} takes an onnxkiln.compat OrtValue, got {type(value).__name__}; wrap "
            "arrays with OrtValue.ortvalue_from_numpy(x)")
    return value


def _pointer_view(ptr: Any, element_type: Any, shape: Sequence[int], what: str) -> np.ndarray:
    if isinstance(ptr, bool) or not isinstance(ptr, int | np.integer):
        raise DeviceBindingError(f"{what}: buffer_ptr must be an int, got {ptr!r}")
    owner = owner_of(int(ptr))
    if owner is None:
        raise DeviceBindingError(
            f"{what}: buffer_ptr 0x{int(ptr):x} is not the data_ptr() of a live "
            "onnxkiln.compat OrtValue, and onnxkiln does not read raw pointers. Wrap the "
            "array with OrtValue.ortvalue_from_numpy(arr), keep that OrtValue alive and pass "
            "its data_ptr(), or use bind_cpu_input / bind_ortvalue_input / "
            "bind_ortvalue_output")
    return view_of(owner, numpy_dtype(element_type), shape, what)


def _write(bound: OrtValue, value: Any, name: str) -> None:
    target = bound.value
    if not isinstance(value, np.ndarray) or not isinstance(target, np.ndarray):
        raise DeviceBindingError(
            f"output '{name}' is bound to a preallocated OrtValue, but the run produced a "
            f"{type(value).__name__}; bind it with bind_output('{name}') instead")
    if value.shape != target.shape or value.dtype != target.dtype:
        raise ShapeError(
            f"The output OrtValue provided for output '{name}' is "
            f"{_describe(target)} but this run computed {_describe(value)}; bind an "
            f"unallocated output (bind_output('{name}')) or preallocate that shape")
    np.copyto(target, value)


def _describe(array: np.ndarray) -> str:
    try:
        elem = elem_name(int(from_numpy(array.dtype)))
    except KeyError:
        elem = str(array.dtype)
    return f"{elem}{list(array.shape)}"


def _copy(value: Any) -> Any:
    if isinstance(value, np.ndarray):
        return value.copy()
    if isinstance(value, list | tuple):
        return [_copy(v) for v in value]
    if isinstance(value, dict):
        return dict(value)
    return value
