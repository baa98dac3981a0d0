"""Property tests: elementwise binary ops broadcast exactly like numpy, dtype preserved."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from onnx import helper

from onnxkiln import InferenceSession
from onnxkiln.testing import make_model, tensor_info

OPS = {
    "Add": np.add,
    "Sub": np.subtract,
    "Mul": np.multiply,
    "Max": np.maximum,
    "Min": np.minimum,
}
DTYPES = [np.float32, np.float16, np.int32, np.int64]
_sessions: dict[tuple, InferenceSession] = {}


def _session(op: str, dtype, shape_a, shape_b) -> InferenceSession:
    key = (op, np.dtype(dtype).str, shape_a, shape_b)
    if key not in _sessions:
        out_shape = np.broadcast_shapes(shape_a, shape_b)
        model = make_model(
            [helper.make_node(op, ["a", "b"], ["y"])],
            [tensor_info("a", dtype, shape_a), tensor_info("b", dtype, shape_b)],
            [tensor_info("y", dtype, out_shape)],
        )
        _sessions[key] = InferenceSession.from_graph(model)
    return _sessions[key]


@settings(max_examples=150, deadline=None)
@given(
    op=st.sampled_from(sorted(OPS)),
    dtype=st.sampled_from(DTYPES),
    shapes=hnp.mutually_broadcastable_shapes(num_shapes=2, min_dims=0, max_dims=4, max_side=4),
    data=st.data(),
)
def test_binary_ops_broadcast_like_numpy(op, dtype, shapes, data):
    shape_a, shape_b = shapes.input_shapes
    elements = st.integers(-50, 50)
    a = data.draw(hnp.arrays(dtype, shape_a, elements=elements))
    b = data.draw(hnp.arrays(dtype, shape_b, elements=elements))
    y = _session(op, dtype, shape_a, shape_b).run({"a": a, "b": b})[0]
    expected = OPS[op](a, b)
    assert y.dtype == np.dtype(dtype)
    assert y.shape == shapes.result_shape
    np.testing.assert_array_equal(y, expected)
