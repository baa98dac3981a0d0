"""Running one ai.onnx.ml node on onnxkiln and onnxruntime, whatever onnxruntime makes of it.

The attribute shapes converters write (skl2onnx, onnxmltools, hummingbird) are not all in the
ONNX spec text; onnxruntime is the reference for which ones a runtime must accept. Each case
runs on onnxruntime first: when it runs, onnxkiln must run and agree; when it refuses (at load
or at run), onnxkiln must refuse too, with a SessionError.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import helper

from onnxkiln import InferenceSession
from onnxkiln.errors import SessionError
from onnxkiln.testing import ort_session, tensor_info

ML = "ai.onnx.ml"
F32 = np.float32
I64 = np.int64


@dataclass
class MlCase:
    """One ai.onnx.ml node: `feeds` become inputs, `outputs` names its outputs with their
    element types (None: leave the type to the runtimes); `ort_refuses` says onnxruntime is
    expected to refuse the node (the test checks that it does)."""

    id: str
    op: str
    feeds: dict[str, np.ndarray]
    attrs: dict[str, Any]
    outputs: tuple[tuple[str, int | None], ...] = (("y", None),)
    ml_opset: int = 3
    ort_refuses: bool = False
    # onnxruntime runs it but onnxkiln refuses on purpose: the reason (checked both ways)
    we_refuse: str = ""
    # attributes the spec makes optional but onnxruntime requires: given to onnxruntime
    # only, at their spec default (onnxkiln must take the node without them)
    ort_attrs: dict[str, Any] = field(default_factory=dict)
    # onnxruntime's CPU build has no kernel for a form the spec allows: numpy's answer
    reference: list[np.ndarray] | None = None
    rtol: float = 1e-5
    atol: float = 1e-6
    input_types: dict[str, onnx.TypeProto] = field(default_factory=dict)  # map inputs

    def expected(self) -> str:
        """Which comparison `check` must end in for this case."""
        if self.reference is not None:
            return "agrees with numpy"
        if self.we_refuse:
            return "onnxkiln refuses"
        return "both refuse" if self.ort_refuses else "agrees with onnxruntime"


def build(case: MlCase, extra: dict[str, Any] | None = None) -> onnx.ModelProto:
    node = helper.make_node(case.op, list(case.feeds), [n for n, _ in case.outputs], domain=ML)
    node.attribute.extend(_attribute(k, v) for k, v in {**case.attrs, **(extra or {})}.items())
    inputs = [helper.make_value_info(k, case.input_types[k]) if k in case.input_types
              else tensor_info(k, v.dtype, v.shape) for k, v in case.feeds.items()]
    outputs = [helper.make_tensor_value_info(n, t, None) if t is not None
               else helper.make_value_info(n, onnx.TypeProto()) for n, t in case.outputs]
    graph = helper.make_graph([node], case.op.lower(), inputs, outputs)
    return helper.make_model(graph, ir_version=10, opset_imports=[
        helper.make_opsetid("", 21), helper.make_opsetid(ML, case.ml_opset)])


def _attribute(name: str, value: Any) -> onnx.AttributeProto:
    """helper.make_attribute, which cannot type an empty list: typed from the name then."""
    if isinstance(value, list) and not value:
        kind = (onnx.AttributeProto.INTS if "int" in name else onnx.AttributeProto.STRINGS
                if "string" in name else onnx.AttributeProto.FLOATS)
        return helper.make_attribute(name, value, attr_type=kind)
    return helper.make_attribute(name, value)


def _ort(model: onnx.ModelProto, feeds) -> list[Any] | Exception:
    try:
        return ort_session(model).run(None, dict(feeds))
    except Exception as e:  # onnxruntime's errors are several unrelated classes
        return e


def _ours(model: onnx.ModelProto, feeds) -> list[Any]:
    session = InferenceSession.builder().from_graph(model)
    return [o.value for o in session.run_outputs(dict(feeds))]


def _same(case: MlCase, ours: list[Any], theirs: list[Any]) -> None:
    assert len(ours) == len(theirs)
    for i, (a, b) in enumerate(zip(ours, theirs)):
        where = f"{case.id} output {i}"
        if isinstance(b, list):  # ZipMap's sequence of maps
            assert isinstance(a, list) and len(a) == len(b), where
            for ma, mb in zip(a, b):
                assert set(ma) == set(mb), f"{where}: keys {sorted(ma)} vs {sorted(mb)}"
                np.testing.assert_allclose([ma[k] for k in mb], [mb[k] for k in mb],
                                           rtol=case.rtol, atol=case.atol, err_msg=where)
            continue
        a, b = np.asarray(a), np.asarray(b)
        assert a.dtype == b.dtype, f"{where}: dtype {a.dtype} vs onnxruntime's {b.dtype}"
        assert a.shape == b.shape, f"{where}: shape {a.shape} vs onnxruntime's {b.shape}"
        if a.dtype.kind in "fc":
            np.testing.assert_allclose(a, b, rtol=case.rtol, atol=case.atol, err_msg=where)
        else:
            np.testing.assert_array_equal(a, b, err_msg=where)


def check(case: MlCase) -> str:
    """Run the case on both runtimes and compare; returns which comparison it made."""
    model = build(case)
    theirs = _ort(build(case, case.ort_attrs) if case.ort_attrs else model, case.feeds)
    if case.reference is not None:
        assert isinstance(theirs, Exception) and "NOT_IMPLEMENTED" in str(theirs), (
            f"{case.id}: onnxruntime runs it now: compare with it instead of numpy")
        _same(case, _ours(model, case.feeds), case.reference)
        return "agrees with numpy"
    if case.we_refuse:
        assert not isinstance(theirs, Exception), f"{case.id}: onnxruntime refuses it now"
        with pytest.raises(SessionError):
            _ours(model, case.feeds)
        return "onnxkiln refuses"
    if isinstance(theirs, Exception):
        assert case.ort_refuses, f"{case.id}: onnxruntime refused it: {theirs}"
        with pytest.raises(SessionError):
            _ours(model, case.feeds)
        return "both refuse"
    assert not case.ort_refuses, f"{case.id}: onnxruntime now runs it"
    _same(case, _ours(model, case.feeds), theirs)
    return "agrees with onnxruntime"
