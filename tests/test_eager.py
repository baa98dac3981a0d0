"""onnxkiln.eager.dispatch: one op at a time, with a kernel cache."""

from __future__ import annotations

import numpy as np
import pytest

from onnxkiln import CacheStats, KernelError, UnsupportedOpError, eager


@pytest.fixture(autouse=True)
def _fresh_cache():
    eager.clear_cache()
    yield
    eager.clear_cache()


def test_single_output_op_with_broadcasting():
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    (y,) = eager.dispatch("Add", [a, np.float32(1)])
    np.testing.assert_array_equal(y, a + 1)
    assert y.dtype == np.float32


def test_attributes_and_schema_defaults():
    x = np.array([-2.0, 3.0], np.float32)
    (default,) = eager.dispatch("LeakyRelu", [x])
    (custom,) = eager.dispatch("LeakyRelu", [x], {"alpha": 0.5})
    np.testing.assert_allclose(default, [-0.02, 3.0], rtol=1e-6)
    np.testing.assert_allclose(custom, [-1.0, 3.0], rtol=1e-6)


def test_multi_output_ops():
    x = np.arange(6, dtype=np.int64)
    parts = eager.dispatch("Split", [x], {"num_outputs": 3, "axis": 0})
    assert [p.tolist() for p in parts] == [[0, 1], [2, 3], [4, 5]]
    values, indices = eager.dispatch("TopK", [np.array([3.0, 9.0, 1.0, 7.0]), np.array([2])])
    np.testing.assert_array_equal(values, [9.0, 7.0])
    np.testing.assert_array_equal(indices, [1, 3])


def test_opset_selects_semantics():
    x = np.arange(8, dtype=np.float32).reshape(1, 2, 4)
    (old,) = eager.dispatch("Softmax", [x], opset=11)
    (new,) = eager.dispatch("Softmax", [x], opset=13)
    np.testing.assert_allclose(old.sum(), 1.0, rtol=1e-6)
    np.testing.assert_allclose(new.sum(axis=-1), [[1.0, 1.0]], rtol=1e-6)


def test_kernels_are_cached_per_op_attributes_and_dtypes():
    a = np.ones(3, np.float32)
    eager.dispatch("Mul", [a, a])
    eager.dispatch("Mul", [a, a])
    eager.dispatch("Mul", [a.astype(np.float64), a.astype(np.float64)])
    eager.dispatch("LeakyRelu", [a], {"alpha": 0.1})
    eager.dispatch("LeakyRelu", [a], {"alpha": 0.1})
    assert eager.cache_stats() == CacheStats(entries=3, hits=2, misses=3, evictions=0)


def test_unknown_op_and_kernel_failure_are_clear_errors():
    with pytest.raises(UnsupportedOpError, match="ai.onnx::NoSuchOp opset"):
        eager.dispatch("NoSuchOp", [np.ones(1)])
    with pytest.raises(KernelError, match="eager Gather failed"):
        eager.dispatch("Gather", [np.ones((2, 2)), np.array([5])])
