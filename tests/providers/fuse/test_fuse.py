"""The fuse provider: which nodes it claims, and that its generated kernels (numpy and numba
code) compute what the unfused CPU session computes."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnxkiln import InferenceSession, ep_context, ep_context_load, loader
from onnxkiln import builder as builder_module
from onnxkiln.partition import Placement
from onnxkiln.providers.base import reported_variant
from onnxkiln.providers.cpu.provider import CpuProvider
from onnxkiln.providers.fuse import FuseProvider, codegen
from onnxkiln.types import DeviceId, DeviceType

F32, F16 = TensorProto.FLOAT, TensorProto.FLOAT16


@pytest.fixture(autouse=True, scope="module")
def _numba_cache_dir(tmp_path_factory):
    """Compiled numba loops go to a temporary folder, not the user's cache."""
    with pytest.MonkeyPatch.context() as mp:
        folder = tmp_path_factory.mktemp("fuse-cache")
        mp.setenv(codegen.CACHE_ENV, str(folder))
        yield folder


def _backends():
    reason = codegen.numba_available()
    return ["numpy", pytest.param("numba", marks=pytest.mark.skipif(
        reason is not None, reason=reason or ""))]


def _model(nodes, inputs, outputs, inits=(), opset=17, extra_opsets=()):
    graph = helper.make_graph(nodes, "g", inputs, outputs, list(inits))
    ops = [helper.make_opsetid("", opset), *(helper.make_opsetid(d, v) for d, v in extra_opsets)]
    return helper.make_model(graph, opset_imports=ops)


def _vi(name, elem, shape):
    return helper.make_tensor_value_info(name, elem, shape)


def _const(name, value, dtype=np.float32):
    return numpy_helper.from_array(np.asarray(value, dtype), name)


def _fused(proto, backend, monkeypatch):
    """(fused session, unfused session, partitions, the fuse provider)."""
    plain = InferenceSession.builder().optimization("disabled").from_graph(proto)
    fuse = FuseProvider(backend)
    model, parts = ep_context_load.apply_fuse(loader.from_graph(proto), fuse,
                                         ep_context.EpContextDumpConfig())
    placement = Placement((fuse, CpuProvider()), DeviceId(DeviceType.CPU), "cpu", None)
    monkeypatch.setattr(builder_module, "select_providers", lambda *_: placement)
    fused = InferenceSession.builder().optimization("disabled").from_graph(model)
    return fused, plain, parts, fuse


def _compare(fused, plain, feeds, rtol=1e-5, atol=1e-5):
    got, want = fused.run(feeds), plain.run(feeds)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.shape == w.shape
        np.testing.assert_allclose(g.astype(np.float64), w.astype(np.float64), rtol=rtol,
                                   atol=atol)


def _ops(model):
    return [f"{n.domain}::{n.op_type}" if n.domain else n.op_type for n in model.graph]


# ------------------------------------------------------------------------ partitioning

def test_elementwise_chain_becomes_one_partition_and_other_ops_stay():
    proto = _model(
        [helper.make_node("MatMul", ["x", "w"], ["h"]),
         helper.make_node("Add", ["h", "b"], ["a"]),
         helper.make_node("Sigmoid", ["a"], ["s"]),
         helper.make_node("Mul", ["a", "s"], ["y"]),
         helper.make_node("Transpose", ["y"], ["t"]),
         helper.make_node("Relu", ["t"], ["z"])],
        [_vi("x", F32, [2, 4])], [_vi("z", F32, None)],
        [_const("w", np.ones((4, 4))), _const("b", np.ones(4))])
    parts = FuseProvider("numpy").compile(loader.from_graph(proto).graph)
    assert [p.covered_nodes for p in parts] == [(1, 2, 3)]  # Relu alone is not worth it
    assert parts[0].inputs == ("h", "b") and parts[0].outputs == ("y",)


def test_non_convex_merge_is_avoided():
    # a -> Exp -> e ; a -> Transpose(outside) -> t ; Add(e, t): joining Add to {Exp} would
    # make a path Exp -> ... no; a path from the partition through Transpose back is the case:
    # x -> Neg -> n -> Transpose -> t -> Add(n, t): {Neg, Add} is not convex.
    proto = _model(
        [helper.make_node("Neg", ["x"], ["n"]),
         helper.make_node("Transpose", ["n"], ["t"], perm=[1, 0]),
         helper.make_node("Add", ["n", "t"], ["y"]),
         helper.make_node("Relu", ["y"], ["z"])],
        [_vi("x", F32, [3, 3])], [_vi("z", F32, [3, 3])])
    parts = FuseProvider("numpy").compile(loader.from_graph(proto).graph)
    assert [p.covered_nodes for p in parts] == [(2, 3)]


def test_reduction_ends_a_partition_and_integer_ops_are_declined():
    proto = _model(
        [helper.make_node("Add", ["x", "x"], ["a"]),
         helper.make_node("Softmax", ["a"], ["s"], axis=-1),
         helper.make_node("Exp", ["s"], ["e"]),
         helper.make_node("Neg", ["e"], ["y"]),
         helper.make_node("Add", ["i", "i"], ["j"]),
         helper.make_node("Mul", ["j", "j"], ["k"])],
        [_vi("x", F32, [2, 5]), _vi("i", TensorProto.INT64, [3])],
        [_vi("y", F32, [2, 5]), _vi("k", TensorProto.INT64, [3])])
    parts = FuseProvider("numpy").compile(loader.from_graph(proto).graph)
    assert [p.covered_nodes for p in parts] == [(0, 1), (2, 3)]


def test_softmax_over_another_axis_is_declined():
    proto = _model(
        [helper.make_node("Add", ["x", "x"], ["a"]),
         helper.make_node("Softmax", ["a"], ["y"], axis=0)],
        [_vi("x", F32, [2, 5])], [_vi("y", F32, [2, 5])])
    assert FuseProvider("numpy").compile(loader.from_graph(proto).graph) == []


# ------------------------------------------------------------------------------ numerics

def _gelu_ln_model(dtype=F32):
    nodes = [
        helper.make_node("Add", ["x", "b"], ["h"]),
        helper.make_node("Div", ["h", "sq2"], ["d"]),
        helper.make_node("Erf", ["d"], ["e"]),
        helper.make_node("Add", ["e", "one"], ["e1"]),
        helper.make_node("Mul", ["h", "e1"], ["m"]),
        helper.make_node("Mul", ["m", "half"], ["g"]),
        helper.make_node("Add", ["g", "r"], ["s"]),
        helper.make_node("LayerNormalization", ["s", "scale", "bias"], ["y"], axis=-1,
                         epsilon=1e-5),
    ]
    np_dt = np.float16 if dtype == F16 else np.float32
    rng = np.random.default_rng(0)
    inits = [_const("b", rng.standard_normal(16), np_dt), _const("sq2", 1.4142135, np_dt),
             _const("one", 1.0, np_dt), _const("half", 0.5, np_dt),
             _const("scale", rng.standard_normal(16), np_dt),
             _const("bias", rng.standard_normal(16), np_dt)]
    return _model(nodes, [_vi("x", dtype, ["n", 4, 16]), _vi("r", dtype, [1, 16])],
                  [_vi("s", dtype, None), _vi("y", dtype, None)], inits)


@pytest.mark.parametrize("backend", _backends())
def test_gelu_layer_norm_chain_matches_unfused(backend, monkeypatch):
    fused, plain, parts, _ = _fused(_gelu_ln_model(), backend, monkeypatch)
    assert len(parts) == 1 and len(parts[0].covered_nodes) == 8
    assert [n.op_type for n in fused.graph()] == ["FusedPartition"]
    rng = np.random.default_rng(1)
    feeds = {"x": rng.standard_normal((3, 4, 16)).astype(np.float32),
             "r": rng.standard_normal((1, 16)).astype(np.float32)}
    _compare(fused, plain, feeds)


@pytest.mark.parametrize("backend", _backends())
def test_float16_partition_matches_unfused(backend, monkeypatch):
    fused, plain, parts, _ = _fused(_gelu_ln_model(F16), backend, monkeypatch)
    assert len(parts) == 1
    rng = np.random.default_rng(2)
    feeds = {"x": rng.standard_normal((2, 4, 16)).astype(np.float16),
             "r": rng.standard_normal((1, 16)).astype(np.float16)}
    _compare(fused, plain, feeds, rtol=1e-2, atol=1e-2)  # fused: float32 inside, rounded once


def _activations_model():
    names = []
    nodes = []
    x = "x"
    for k, (op, attrs) in enumerate([("LeakyRelu", {"alpha": 0.2}), ("Tanh", {}),
                                     ("Sigmoid", {}), ("HardSigmoid", {"alpha": 0.3}),
                                     ("Softplus", {}), ("Elu", {"alpha": 0.7}),
                                     ("Gelu", {"approximate": "tanh"}), ("Abs", {}),
                                     ("Sqrt", {}), ("Softsign", {}), ("Exp", {}),
                                     ("Log", {}), ("Neg", {}), ("HardSwish", {}),
                                     ("Reciprocal", {}), ("Relu", {})]):
        y = f"v{k}"
        nodes.append(helper.make_node(op, [x], [y], **attrs))
        names.append(y)
        x = y
    nodes += [helper.make_node("Greater", ["x", "zero"], ["c"]),
              helper.make_node("Where", ["c", x, "x"], ["w"]),
              helper.make_node("Clip", ["w", "lo", "hi"], ["cl"]),
              helper.make_node("Cast", ["cl"], ["c16"], to=F16),
              helper.make_node("Cast", ["c16"], ["c32"], to=F32),
              helper.make_node("Pow", ["c32", "two"], ["p"]),
              helper.make_node("Max", ["p", "y0"], ["mx"]),
              helper.make_node("Sub", ["mx", "x"], ["y"])]
    inits = [_const("zero", 0.0), _const("lo", -0.5), _const("hi", 2.0), _const("two", 2.0)]
    return _model(nodes, [_vi("x", F32, [5, 1, 6]), _vi("y0", F32, [3, 1])],
                  [_vi("y", F32, None), _vi("v3", F32, None)], inits, opset=20)


@pytest.mark.parametrize("backend", _backends())
def test_activations_where_clip_cast_with_broadcasting(backend, monkeypatch):
    fused, plain, _, _ = _fused(_activations_model(), backend, monkeypatch)
    ops = [n.op_type for n in fused.graph()]
    assert ops == ["Greater", "FusedPartition"]  # the bool op is left to the CPU
    rng = np.random.default_rng(3)
    feeds = {"x": rng.standard_normal((5, 1, 6)).astype(np.float32),
             "y0": rng.standard_normal((3, 1)).astype(np.float32)}
    _compare(fused, plain, feeds, rtol=2e-5, atol=1e-5)
    assert fused.run(feeds)[0].shape == (5, 3, 6)


@pytest.mark.parametrize("backend", _backends())
def test_softmax_rms_norm_and_smaller_outputs(backend, monkeypatch):
    nodes = [helper.make_node("Mul", ["x", "k"], ["a"]),           # a: (4, 1, 8)
             helper.make_node("Add", ["a", "m"], ["s"]),           # s: (4, 3, 8)
             helper.make_node("Softmax", ["s"], ["y"], axis=-1),
             helper.make_node("Sub", ["z", "k"], ["q"]),
             helper.make_node("Mul", ["q", "q"], ["q2"]),
             helper.make_node("SimplifiedLayerNormalization", ["q2", "g"], ["r"], axis=-1,
                              epsilon=1e-6, domain="com.microsoft")]
    proto = _model(nodes, [_vi("x", F32, [4, 1, 8]), _vi("m", F32, [3, 8]),
                           _vi("z", F32, [2, 3, 4, 5, 8])],
                   [_vi("a", F32, None), _vi("y", F32, None), _vi("r", F32, None)],
                   [_const("k", 0.5), _const("g", np.linspace(0.5, 2, 8))],
                   extra_opsets=[("com.microsoft", 1)])
    fused, plain, parts, _ = _fused(proto, backend, monkeypatch)
    assert [p.covered_nodes for p in parts] == [(0, 1, 2), (3, 4, 5)]
    rng = np.random.default_rng(4)
    feeds = {"x": rng.standard_normal((4, 1, 8)).astype(np.float32),
             "m": rng.standard_normal((3, 8)).astype(np.float32),
             "z": rng.standard_normal((2, 3, 4, 5, 8)).astype(np.float32)}  # rank 5: numpy code
    _compare(fused, plain, feeds)
    a = fused.run(feeds)[0]
    assert a.shape == (4, 1, 8)  # an output smaller than the partition's iteration space


def test_numba_kernel_reports_its_variant_and_numpy_code_runs_the_same_blob(_numba_cache_dir):
    pytest.importorskip("numba", reason="numba is optional (extra 'fuse')")
    fuse = FuseProvider("numba")
    parts = fuse.compile(loader.from_graph(_gelu_ln_model()).graph)
    assert parts[0].payload["backend"] == "numba" and parts[0].payload["numba_source"]
    rng = np.random.default_rng(5)
    args = [rng.standard_normal(s).astype(np.float32) for s in [(2, 4, 16), (16,), (1, 16),
                                                                 (16,), (16,)]]
    jit = fuse.make_kernel(parts[0])
    plain = codegen.FusedKernel(parts[0].payload, use_numba=False)  # as without numba
    got = jit(*args)
    jit_ran = reported_variant()
    want = plain(*args)
    assert (jit_ran, reported_variant()) == (("fuse.numba", None), ("fuse.numpy", None))
    assert list(_numba_cache_dir.glob("k_*.py"))  # generated module kept for numba's cache
    assert list(_numba_cache_dir.glob("__pycache__/k_*.nbi"))
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)


def test_loading_a_context_blob_generates_no_code():
    proto = _gelu_ln_model()
    fuse = FuseProvider("numpy")
    before = codegen.CODEGEN_CALLS[0]
    parts = fuse.compile(loader.from_graph(proto).graph)
    assert codegen.CODEGEN_CALLS[0] == before + 1
    blob, sdk = fuse.save_context(parts[0])
    assert sdk.startswith("onnxkiln.fuse 1")
    kernel = fuse.load_context({}, blob)
    assert codegen.CODEGEN_CALLS[0] == before + 1
    x = np.zeros((1, 4, 16), np.float32)
    y = kernel(x, np.zeros(16, np.float32), np.zeros((1, 16), np.float32),
               np.ones(16, np.float32), np.full(16, 3.0, np.float32))
    np.testing.assert_array_equal(y[1], np.full((1, 4, 16), 3.0, np.float32))


def test_bad_blob_is_refused():
    with pytest.raises(ValueError, match="not a onnxkiln.fuse"):
        FuseProvider("numpy").load_context({}, b'{"format": "other", "version": 1}')
    with pytest.raises(ValueError, match="JSON"):
        FuseProvider("numpy").load_context({}, b"\x00\x01")


def test_rewritten_model_runs_from_its_serialized_form(monkeypatch):
    """A FusedPartition node carries its context: a saved rewritten model runs again."""
    fuse = FuseProvider("numpy")
    model, _ = ep_context_load.apply_fuse(loader.from_graph(_gelu_ln_model()), fuse,
                                     ep_context.EpContextDumpConfig())
    proto = loader.ir.serde.serialize_model(model)
    for node in proto.graph.node:  # as in another process: no kernel to find by token
        kept = [a for a in node.attribute if a.name != "kernel_token"]
        del node.attribute[:]
        node.attribute.extend(kept)
    before = codegen.CODEGEN_CALLS[0]
    placement = Placement((fuse, CpuProvider()), DeviceId(DeviceType.CPU), "cpu", None)
    monkeypatch.setattr(builder_module, "select_providers", lambda *_: placement)
    s = InferenceSession.builder().optimization("disabled").from_graph(proto)
    x = np.zeros((1, 4, 16), np.float32)
    out = s.run({"x": x, "r": np.zeros((1, 16), np.float32)})
    assert out[1].shape == (1, 4, 16) and np.isfinite(out[1]).all()
    assert codegen.CODEGEN_CALLS[0] == before
