"""Capture-safe kernels: clamped indices + a latched violation word, eager errors,
and the in-place static-cache KV write (ScatterND / ScatterElements on a bound past)."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import pytest
from onnx import TensorProto, helper

import onnxkiln as ok
from onnxkiln.binding_plans import scatter_write_kernel
from onnxkiln.plan import Step
from onnxkiln.providers.base import NodeInfo
from onnxkiln.providers.capture_safe import ViolationWord, capture_safe_kernel, guarded_bit
from onnxkiln.providers.cpu import REGISTRY as CPU
from onnxkiln.providers.cpu.provider import CpuProvider
from onnxkiln.types import CaptureViolation as CV

torch = pytest.importorskip("torch", reason="the torch provider's kernels are torch ops")

from onnxkiln.providers.cuda import REGISTRY as CUDA  # noqa: E402
from onnxkiln.providers.cuda.provider import TorchProvider  # noqa: E402

R = np.random.default_rng(7)
MS = "com.microsoft"


def f32(*shape):
    return R.standard_normal(shape).astype(np.float32)


def i64(v):
    return np.array(v, np.int64)


class Case(NamedTuple):
    id: str
    op: str
    domain: str
    opset: int
    attrs: dict
    before: list  # inputs before the indices
    after: list  # inputs after them
    good: np.ndarray  # in range, negatives included
    bad: np.ndarray
    clamped: np.ndarray  # the bad ones clamped
    bit: CV


CASES = [Case(*c) for c in [
    ("gather", "Gather", "", 13, {"axis": 1}, [f32(3, 4)], [],
     i64([[0, -1], [3, -4]]), i64([[5, -9], [1, -1]]), i64([[3, 0], [1, 3]]), CV.GATHER_INDEX),
    ("gather_scalar", "Gather", "", 13, {"axis": 0}, [f32(3, 4)], [],
     i64(-3), i64(7), i64(2), CV.GATHER_INDEX),
    ("gather_elements", "GatherElements", "", 13, {"axis": 0}, [f32(3, 4)], [],
     i64([[0, 2, -1, -3], [1, 1, 0, 2]]), i64([[3, 0, -4, 1], [1, 9, 0, 2]]),
     i64([[2, 0, 0, 1], [1, 2, 0, 2]]), CV.GATHER_INDEX),
    ("gather_nd", "GatherND", "", 13, {"batch_dims": 0}, [f32(2, 3, 4)], [],
     i64([[0, 2], [1, -1], [-2, -3]]), i64([[2, 0], [-3, 3], [1, 1]]),
     i64([[1, 0], [0, 2], [1, 1]]), CV.GATHER_INDEX),
    ("gather_nd_batch", "GatherND", "", 13, {"batch_dims": 1}, [f32(2, 3, 4)], [],
     i64([[[2]], [[-1]]]), i64([[[5]], [[-4]]]), i64([[[2]], [[0]]]), CV.GATHER_INDEX),
    ("scatter_nd", "ScatterND", "", 18, {"reduction": "none"}, [f32(4, 3)], [f32(2, 3)],
     i64([[1], [-1]]), i64([[4], [-5]]), i64([[3], [0]]), CV.SCATTER_INDEX),
    ("scatter_nd_add", "ScatterND", "", 18, {"reduction": "add"}, [f32(2, 3, 2)],
     [f32(2, 2)], i64([[0, 1], [-1, -3]]), i64([[0, 3], [2, 1]]), i64([[0, 2], [1, 1]]),
     CV.SCATTER_INDEX),
    ("scatter_elements", "ScatterElements", "", 18, {"axis": 1, "reduction": "none"},
     [f32(2, 3)], [f32(2, 2)], i64([[0, 2], [1, -1]]), i64([[3, 0], [-4, 1]]),
     i64([[2, 0], [0, 1]]), CV.SCATTER_INDEX),
    ("scatter_v9", "Scatter", "", 9, {"axis": 0}, [f32(3, 2)], [f32(1, 2)],
     i64([[0, -1]]), i64([[3, -4]]), i64([[2, 0]]), CV.SCATTER_INDEX),
    ("rope", "RotaryEmbedding", "", 23,
     {"interleaved": 0, "rotary_embedding_dim": 0, "num_heads": None},
     [f32(1, 2, 3, 4), f32(8, 2), f32(8, 2)], [], i64([[0, 1, 7]]), i64([[6, 8, -1]]),
     i64([[6, 7, 0]]), CV.POSITION_RANGE),
    ("rope_ms", "RotaryEmbedding", MS, 1,
     {"interleaved": 0, "rotary_embedding_dim": 0, "num_heads": 2, "is_packed_batching": 0,
      "scale": 1.0}, [f32(1, 3, 8)], [f32(8, 2), f32(8, 2)], i64([[0, 5, 7]]),
     i64([[9, 0, -2]]), i64([[7, 0, 0]]), CV.POSITION_RANGE),
    ("rope_ms_start", "RotaryEmbedding", MS, 1,
     {"interleaved": 0, "rotary_embedding_dim": 0, "num_heads": 2, "is_packed_batching": 0,
      "scale": 1.0}, [f32(1, 3, 8)], [f32(8, 2), f32(8, 2)], i64([5]), i64([6]),
     i64([[6, 7, 7]]), CV.POSITION_RANGE),
]]


def _step(op, domain, opset, attrs, n_inputs, registry, provider):
    spec = registry.resolve(domain, op, opset)
    info = NodeInfo(name="n", op_type=op, domain=domain, opset=opset, attrs=attrs,
                    n_inputs=n_inputs, n_outputs=1, input_present=(True,) * n_inputs,
                    output_present=(True,))
    kernel = spec.build(info)
    return Step(0, "n", op, domain, opset, provider, spec, kernel, tuple(range(n_inputs)),
                (n_inputs,))


def _backend(where):
    if where == "numpy":
        return CPU, "cpu", CpuProvider(), (lambda a: a), (lambda t: np.asarray(t))
    return (CUDA, "cuda", TorchProvider(torch.device("cpu")), torch.from_numpy,
            lambda t: t.numpy())


def _args(case, idx, dev):
    return [dev(a) for a in case.before] + [dev(idx)] + [dev(a) for a in case.after]


def _case_step(case, registry, provider):
    n = len(case.before) + 1 + len(case.after)
    return _step(case.op, case.domain, case.opset, case.attrs, n, registry, provider)


@pytest.mark.parametrize("where", ["numpy", "torch"])
@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_guarded_op_clamps_and_latches(case, where):
    registry, prov_name, provider, dev, host = _backend(where)
    step = _case_step(case, registry, prov_name)
    word = ViolationWord.for_provider(provider)
    buffer = word.buffer
    bit = case.bit
    assert guarded_bit(case.op, case.domain) == bit
    safe = capture_safe_kernel(step, case.attrs, word)
    assert safe is not None and safe.violation_bit == bit

    # in range (negative indices included): identical to the original kernel, nothing flagged
    got = host(safe(*_args(case, case.good, dev)))
    np.testing.assert_array_equal(got, host(step.kernel(*_args(case, case.good, dev))))
    assert word.read() == 0

    # out of range: the result of the clamped indices, exactly the op's bit set
    got = host(safe(*_args(case, case.bad, dev)))
    np.testing.assert_allclose(got, host(step.kernel(*_args(case, case.clamped, dev))),
                               rtol=1e-6, atol=1e-6)
    assert word.read() == int(bit)

    # the word latches across clean calls; clear() zeroes the same buffer
    safe(*_args(case, case.good, dev))
    assert word.read() == int(bit)
    word.clear()
    assert word.read() == 0 and word.buffer is buffer


def test_uncapturable_ops_need_no_guard_and_the_word_ors_bits():
    word = ViolationWord.for_provider(CpuProvider())
    step = _step("Relu", "", 14, {}, 1, CPU, "cpu")
    assert capture_safe_kernel(step, {}, word) is None and guarded_bit("Relu") is None
    word.flag(CV.GATHER_INDEX, np.array(True))
    word.flag(CV.KV_CAPACITY, np.array([False]))
    word.flag(CV.POSITION_RANGE, np.bool_(True))
    assert word.read() == CV.GATHER_INDEX | CV.POSITION_RANGE
    tw = ViolationWord.for_provider(TorchProvider(torch.device("cpu")))
    assert isinstance(tw.buffer, torch.Tensor) and tw.buffer.dtype == torch.int32
    tw.flag(CV.SCATTER_INDEX, torch.tensor(False))
    tw.flag(CV.KV_CAPACITY, torch.tensor([True]))
    tw.flag(CV.GATHER_INDEX, torch.tensor(True))
    assert tw.read() == CV.KV_CAPACITY | CV.GATHER_INDEX


@pytest.fixture
def no_host_sync(monkeypatch):
    """Any tensor -> Python conversion (what syncs a CUDA stream) raises."""
    def refuse(*_a, **_k):
        raise AssertionError("host sync in a capture-safe kernel")
    for name in ("__bool__", "item", "tolist", "__int__", "__float__", "numpy", "cpu"):
        monkeypatch.setattr(torch.Tensor, name, refuse)


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_torch_guards_never_sync_the_host(case, no_host_sync):
    step = _case_step(case, CUDA, "cuda")
    word = ViolationWord.for_provider(TorchProvider(torch.device("cpu")))
    safe = capture_safe_kernel(step, case.attrs, word)
    out = safe(*_args(case, case.bad, torch.from_numpy))
    assert isinstance(out, torch.Tensor)
    assert torch.equal(word.buffer, torch.tensor([int(case.bit)], dtype=torch.int32))


@pytest.mark.parametrize("case", [c for c in CASES if c.op != "RotaryEmbedding"],
                         ids=[c.id for c in CASES if c.op != "RotaryEmbedding"])
def test_eager_torch_kernels_raise_like_the_cpu_ones(case):
    for registry, prov, dev in ((CUDA, "cuda", torch.from_numpy), (CPU, "cpu", lambda a: a)):
        step = _case_step(case, registry, prov)
        with pytest.raises(IndexError) as e:
            step.kernel(*_args(case, case.bad, dev))
        assert case.op in str(e.value) and "out of range" in str(e.value)
    step = _case_step(case, CUDA, "cuda")
    with pytest.raises(IndexError, match=r"index -?\d+ is out of range for axis \d.* size \d"):
        step.kernel(*_args(case, case.bad, torch.from_numpy))


# ---------------------------------------------------------------------------------------------
# in-place static-cache KV write through a device binding

SHAPE = (1, 2, 8, 4)


def _kv_model(op):
    if op == "ScatterElements":
        nodes = [helper.make_node("Reshape", ["pos", "one"], ["p4"]),
                 helper.make_node("Expand", ["p4", "wide"], ["idx"]),
                 helper.make_node("ScatterElements", ["past", "idx", "new"], ["present"],
                                  axis=2)]
        extra = [helper.make_tensor_value_info("pos", TensorProto.INT64, [1])]
        inits = [helper.make_tensor("one", TensorProto.INT64, [4], [1, 1, 1, 1]),
                 helper.make_tensor("wide", TensorProto.INT64, [4], [1, 2, 1, 4])]
    else:
        nodes = [helper.make_node("ScatterND", ["past", "idx", "new"], ["present"])]
        extra = [helper.make_tensor_value_info("idx", TensorProto.INT64, [1, 2, 1, 3])]
        inits = []
    nodes.append(helper.make_node("ReduceSum", ["present"], ["total"], keepdims=0))
    graph = helper.make_graph(
        nodes, "static_kv",
        [helper.make_tensor_value_info("past", TensorProto.FLOAT, list(SHAPE)),
         helper.make_tensor_value_info("new", TensorProto.FLOAT, [1, 2, 1, 4]), *extra],
        [helper.make_tensor_value_info("present", TensorProto.FLOAT, list(SHAPE)),
         helper.make_tensor_value_info("total", TensorProto.FLOAT, [])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


def _feeds(op, t):
    if op == "ScatterElements":
        return {"pos": i64([t])}
    return {"idx": i64([[[[0, h, t]] for h in range(2)]])}


def _session(model, where):
    b = ok.InferenceSession.builder()
    if where == "cpu":
        return b.providers(["cpu"]).from_graph(model)
    return b.providers(["cuda", "cpu"]).option("testing.cuda_on_torch_cpu", "1").from_graph(model)


def _host(binding):
    return np.array(binding._provider.to_host(binding.tensor), copy=True)


OPS = ["ScatterND", "ScatterElements"]
WHERE = ["cpu", "torch-cpu"]


@pytest.mark.parametrize("where", WHERE)
@pytest.mark.parametrize("op", OPS)
def test_static_cache_write_in_place_matches_onnxruntime(op, where):
    ort = pytest.importorskip("onnxruntime", reason="reference outputs")
    model = _kv_model(op)
    ref = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    s = _session(model, where)
    kv = s.allocate_device_binding("past", "present", ok.DataType.FLOAT, SHAPE, SHAPE)
    buffer = kv.tensor
    past = np.zeros(SHAPE, np.float32)
    for t in [0, 1, 2, 5, 3, 7]:
        new = f32(1, 2, 1, 4)
        want_present, want_total = ref.run(None, {"past": past, "new": new, **_feeds(op, t)})
        before = _host(kv)
        present, total = s.run_with_device_bindings({"new": new, **_feeds(op, t)}, [kv])
        assert present is None and kv.tensor is buffer and kv.logical_shape == SHAPE
        np.testing.assert_allclose(total, want_total, rtol=1e-5, atol=1e-5)
        after = _host(kv)
        np.testing.assert_array_equal(after, want_present)
        changed = np.argwhere((after != before).any(axis=(0, 1, 3))).reshape(-1)
        assert changed.tolist() == [t]  # only the written position moved
        past = want_present
    compiled, in_place = s._bindings.plans.get([kv])
    assert in_place == frozenset({"present"})
    variant = {"ScatterND": "scatter_nd", "ScatterElements": "scatter_elements"}[op]
    kernels = [st.kernel for st in compiled.plan.steps if st.op_type == op]
    assert [k.variant for k in kernels] == [f"{variant}.kv_write_in_place"]


@pytest.mark.parametrize("where", WHERE)
@pytest.mark.parametrize("op", OPS)
def test_static_cache_write_past_capacity(op, where):
    s = _session(_kv_model(op), where)
    kv = s.allocate_device_binding("past", "present", ok.DataType.FLOAT, SHAPE, SHAPE)
    new = f32(1, 2, 1, 4)
    s.run_with_device_bindings({"new": new, **_feeds(op, -1)}, [kv])  # -1 wraps to 7
    np.testing.assert_array_equal(kv.read()[:, :, 7:8], new)
    with pytest.raises(ok.DeviceBindingError) as e:
        s.run_with_device_bindings({"new": new, **_feeds(op, 8)}, [kv])
    msg = str(e.value)
    assert "past" in msg and "index 8" in msg and "capacity 8" in msg and "axis 2" in msg

    # the capture-safe variant of the same kernel clamps and flags KV_CAPACITY
    compiled, _ = s._bindings.plans.get([kv])
    (step,) = [st for st in compiled.plan.steps if st.op_type == op]
    word = ViolationWord.for_provider(kv._provider)
    safe = capture_safe_kernel(step, {}, word)
    assert safe.variant.endswith("kv_write_in_place.capture_safe")
    dev = kv._provider.to_device
    idx = _feeds(op, 9)["idx"] if op == "ScatterND" else np.full((1, 2, 1, 4), 9, np.int64)
    marker = np.full((1, 2, 1, 4), 5.0, np.float32)
    out = safe(kv.view(), dev(idx), dev(marker))
    assert word.read() == int(CV.KV_CAPACITY)
    assert tuple(out.shape) == SHAPE
    np.testing.assert_array_equal(kv.read()[:, :, 7:8], marker)  # clamped to the last slot
    word.clear()
    first = _feeds(op, 0)["idx"] if op == "ScatterND" else np.zeros_like(idx)
    safe(kv.view(), dev(first), dev(marker))
    assert word.read() == 0
    np.testing.assert_array_equal(kv.read()[:, :, 0:1], marker)


@pytest.mark.parametrize("where", ["numpy", "torch"])
def test_scatter_write_kernel_direct(where):
    provider = CpuProvider() if where == "numpy" else TorchProvider(torch.device("cpu"))
    s = _session(_kv_model("ScatterND"), "cpu" if where == "numpy" else "torch-cpu")
    kv = s.allocate_device_binding("past", "present", ok.DataType.FLOAT, (2, 6, 3), (2, 4, 3))
    kv.write(np.ones((2, 4, 3), np.float32))
    write = scatter_write_kernel(kv, "ScatterND")
    assert write.variant == "scatter_nd.kv_write_in_place"
    upd = np.full((2, 3), 9.0, np.float32)
    out = write(kv.view(), provider.to_device(i64([[0, -1], [1, 5]])), provider.to_device(upd))
    assert tuple(out.shape) == (2, 4, 3)  # the logical view, no copy
    full = _host(kv)
    np.testing.assert_array_equal(full[0, 3], upd[0])  # -1 wraps by the logical size 4
    np.testing.assert_array_equal(full[1, 5], upd[1])  # inside the capacity 6
    with pytest.raises(ok.DeviceBindingError, match="index 6 on axis 1.*capacity 6"):
        write(kv.view(), provider.to_device(i64([[0, 6]])), provider.to_device(upd[:1]))
    with pytest.raises(ValueError, match="updates shape"):
        write(kv.view(), provider.to_device(i64([[0, 1]])), provider.to_device(upd))
    elements = scatter_write_kernel(kv, "ScatterElements", axis=1)
    assert elements.variant == "scatter_elements.kv_write_in_place"
    word = ViolationWord.for_provider(provider)
    safe = elements.capture_safe(word)
    safe(kv.view(), provider.to_device(np.full((1, 1, 3), 7, np.int64)),
         provider.to_device(np.full((1, 1, 3), 4.0, np.float32)))
    assert word.read() == int(CV.KV_CAPACITY)
    np.testing.assert_array_equal(_host(kv)[0, 5], [4.0] * 3)  # clamped to capacity - 1


def _guarded_model(kind):
    """ScatterND on the bound past that must NOT become an in-place write."""
    attrs = {"reduction": "add"} if kind == "reduction" else {"reduction": "none"}
    nodes = [helper.make_node("ScatterND", ["past", "idx", "new"], ["present"], **attrs)]
    # "late_reader": the past is also read after the scatter (it must not see the updates)
    total_of = "past" if kind == "late_reader" else "present"
    nodes.append(helper.make_node("ReduceSum", [total_of], ["total"], keepdims=0))
    graph = helper.make_graph(
        nodes, "kv_guarded",
        [helper.make_tensor_value_info("past", TensorProto.FLOAT, list(SHAPE)),
         helper.make_tensor_value_info("new", TensorProto.FLOAT, [1, 2, 1, 4]),
         helper.make_tensor_value_info("idx", TensorProto.INT64, [1, 2, 1, 3])],
        [helper.make_tensor_value_info("present", TensorProto.FLOAT, list(SHAPE)),
         helper.make_tensor_value_info("total", TensorProto.FLOAT, [])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


@pytest.mark.parametrize("kind", ["reduction", "late_reader"])
def test_scatter_stays_a_copy_when_in_place_would_change_results(kind):
    ort = pytest.importorskip("onnxruntime", reason="reference outputs")
    model = _guarded_model(kind)
    ref = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    s = _session(model, "cpu")
    kv = s.allocate_device_binding("past", "present", ok.DataType.FLOAT, SHAPE, SHAPE)
    start = f32(*SHAPE)
    kv.write(start)
    new, feeds = f32(1, 2, 1, 4), _feeds("ScatterND", 3)
    want_present, want_total = ref.run(None, {"past": start, "new": new, **feeds})
    _, total = s.run_with_device_bindings({"new": new, **feeds}, [kv])
    np.testing.assert_allclose(total, want_total, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(kv.read(), want_present, rtol=1e-6, atol=1e-6)
    assert s._bindings.plans.get([kv])[1] == frozenset()
