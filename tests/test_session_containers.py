"""Sequence, map and optional graph inputs/outputs through the session."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

from onnxkiln import InferenceSession, InvalidInputError, SequenceOutputError

SEQ_F32 = helper.make_sequence_type_proto(helper.make_tensor_type_proto(TensorProto.FLOAT, None))


def _seq_model():
    """Input a sequence; outputs its length and the sequence with one element erased."""
    g = helper.make_graph(
        [helper.make_node("SequenceLength", ["s"], ["n"]),
         helper.make_node("SequenceErase", ["s"], ["rest"])],
        "seq", [helper.make_value_info("s", SEQ_F32)],
        [helper.make_tensor_value_info("n", TensorProto.INT64, []),
         helper.make_value_info("rest", SEQ_F32)],
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def _map_model():
    mt = helper.make_map_type_proto(TensorProto.STRING,
                                    helper.make_tensor_type_proto(TensorProto.FLOAT, None))
    g = helper.make_graph(
        [helper.make_node("DictVectorizer", ["m"], ["y"], domain="ai.onnx.ml",
                          string_vocabulary=["a", "b", "c"])],
        "map", [helper.make_value_info("m", mt)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17),
                                               helper.make_opsetid("ai.onnx.ml", 3)])


def test_sequence_inputs_are_converted_and_outputs_returned_by_run_outputs():
    s = InferenceSession.from_graph(_seq_model())
    assert [(m.name, m.kind) for m in s.inputs()] == [("s", "sequence")]
    a, b = np.ones(2, np.float32), np.zeros(3, np.float32)
    n, rest = s.run_outputs({"s": [a, [4.0, 5.0]]})
    assert n.kind == "tensor" and int(n.value) == 2
    assert rest.kind == "sequence" and len(rest.as_sequence()) == 1
    np.testing.assert_array_equal(rest.value[0], a)
    rest.value[0][:] = 7  # a copy: the caller's array is untouched
    np.testing.assert_array_equal(a, 1)
    with pytest.raises(SequenceOutputError, match="'rest' is a sequence"):
        s.run({"s": [a, b]})


def test_bad_sequence_inputs_are_clear_errors():
    s = InferenceSession.from_graph(_seq_model())
    with pytest.raises(InvalidInputError, match="expects a sequence"):
        s.run_outputs({"s": np.ones(2, np.float32)})
    with pytest.raises(InvalidInputError, match="element 1 expects float32, got float64"):
        s.run_outputs({"s": [np.ones(2, np.float32), np.ones(2)]})


def test_map_inputs():
    s = InferenceSession.from_graph(_map_model())
    assert [(m.name, m.kind) for m in s.inputs()] == [("m", "map")]
    y = s.run({"m": {"c": 3.0, "a": 1.0}})[0]
    np.testing.assert_array_equal(y, [[1.0, 0.0, 3.0]])
    with pytest.raises(InvalidInputError, match="expects a map"):
        s.run({"m": [1.0, 2.0]})
