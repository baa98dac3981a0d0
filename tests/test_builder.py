"""SessionBuilder options, warmup, memory limits, cache and control-flow counters (exact)."""

from __future__ import annotations

import dataclasses
import os
import threading
import time

import numpy as np
import onnx
import pytest
from onnx import helper

import onnxkiln as ok
from onnxkiln import (
    CacheStats,
    ControlFlowStats,
    InferenceSession,
    InputNotFoundError,
    InvalidInputError,
    InvalidOptionError,
    KernelError,
    MemoryLimitError,
    UnknownOptionError,
    WarmupShape,
)
from onnxkiln.options import KNOWN_OPTIONS, OPTIONS, SessionConfig
from onnxkiln.specialize import Specialization, SpecializationCache
from onnxkiln.testing import make_model, tensor_info
from onnxkiln.trace import TraceContext


def _pair_model() -> onnx.ModelProto:
    """y = a + b, both [batch, 3]."""
    return make_model([helper.make_node("Add", ["a", "b"], ["y"])],
                      [tensor_info("a", np.float32, ["batch", 3]),
                       tensor_info("b", np.float32, ["batch", 3])],
                      [tensor_info("y", np.float32, ["batch", 3])])


def _chain_model(n: int = 1000) -> onnx.ModelProto:
    """a = relu(x); b = -a; y = x + b over float32[n]."""
    return make_model([helper.make_node("Relu", ["x"], ["a"], name="relu"),
                       helper.make_node("Neg", ["a"], ["b"], name="neg"),
                       helper.make_node("Add", ["x", "b"], ["y"], name="add")],
                      [tensor_info("x", np.float32, [n])], [tensor_info("y", np.float32, [n])])


def _feeds(batch: int = 2) -> dict[str, np.ndarray]:
    return {"a": np.ones((batch, 3), np.float32), "b": np.ones((batch, 3), np.float32)}


# builder options ------------------------------------------------------------------------


@pytest.mark.parametrize("call", [
    lambda b: b.device("cpu"), lambda b: b.providers(["cpu"]), lambda b: b.optimization("basic"),
    lambda b: b.intra_op_threads(2), lambda b: b.option("decode.verify", "1"),
    lambda b: b.trace(TraceContext.disabled()), lambda b: b.warmup([]),
    lambda b: b.memory_limit(1 << 20),
])
def test_every_setter_returns_the_builder(call):
    b = InferenceSession.builder()
    assert call(b) is b


@pytest.mark.parametrize("device", ["auto", "cpu", "CPU", "cuda", "cuda:1"])
def test_device_accepts_the_documented_values(device):
    assert InferenceSession.builder().device(device)._device == device.lower()


@pytest.mark.parametrize("device", ["tpu", "cuda:", "cuda:x", "", 0])
def test_device_rejects_others_listing_the_expected_values(device):
    with pytest.raises(InvalidOptionError, match=r"device must be 'auto', 'cpu', 'cuda' or "
                                                 r"'cuda:N', got"):
        InferenceSession.builder().device(device)


def test_providers_validation():
    b = InferenceSession.builder()
    assert b.providers(("cuda", "cpu"))._providers == ["cuda", "cpu"]
    for bad in ("cpu", [1], None):
        with pytest.raises(InvalidOptionError, match="providers takes a list of names"):
            b.providers(bad)
    with pytest.raises(InvalidOptionError, match="needs at least one provider"):
        b.providers([])
    with pytest.raises(InvalidOptionError, match=r"unknown provider 'rocm'; known providers "
                                                 r"are \['cpu', 'cuda', 'fuse'\]"):
        b.providers(["cpu", "rocm"])
    assert b._providers == ["cuda", "cpu"]


def test_onnxruntime_provider_names_are_aliases():
    b = InferenceSession.builder()
    assert b.providers(["CUDAExecutionProvider", "CPUExecutionProvider"])._providers == [
        "cuda", "cpu"]
    assert b.providers([("CUDAExecutionProvider", {"device_id": 1}), "cpu"])._providers == [
        "cuda:1", "cpu"]
    with pytest.warns(UserWarning, match=r"\['arena_extend_strategy'\] have no onnxkiln"):
        b.providers([("CUDAExecutionProvider", {"arena_extend_strategy": "kSameAsRequested"})])
    with pytest.raises(InvalidOptionError, match="device_id must be an int"):
        b.providers([("CUDAExecutionProvider", {"device_id": "x"})])
    with pytest.raises(InvalidOptionError, match="'TensorrtExecutionProvider' is an "
                                                 "onnxruntime provider onnxkiln does not serve"):
        b.providers(["TensorrtExecutionProvider"])
    with pytest.raises(InvalidOptionError, match="takes no options"):
        b.providers([("cpu", {"x": 1})])


@pytest.mark.parametrize("level", ["disabled", "basic", "extended", "all"])
def test_optimization_levels_are_stored(level):
    s = InferenceSession.builder().optimization(level).from_graph(_pair_model())
    assert s._optimization == level
    assert InferenceSession.from_graph(_pair_model())._optimization == "all"


def test_optimization_rejects_unknown_levels():
    with pytest.raises(InvalidOptionError, match=r"must be one of \['disabled', 'basic', "
                                                 r"'extended', 'all'\], got 'max'"):
        InferenceSession.builder().optimization("max")


@pytest.mark.parametrize("n", [0, -1, True, 1.5, "2"])
def test_intra_op_threads_rejects_non_positive_ints(n):
    with pytest.raises(InvalidOptionError, match="intra_op_threads must be an int >= 1, got"):
        InferenceSession.builder().intra_op_threads(n)


def test_intra_op_threads_is_stored():
    assert InferenceSession.builder().intra_op_threads(3).from_graph(_pair_model())._threads == 3


OPTION_CASES = [  # key, a valid value, an invalid value, the error it gives
    ("decode.verify", "1", "yes", r"must be one of \['0', '1'\], got 'yes'"),
    ("decode.memo", "0", "off", r"must be one of \['0', '1'\], got 'off'"),
    ("capture.allow_seams", "0", "no", r"must be one of \['0', '1'\], got 'no'"),
    ("ep.context_enable", "0", "true", r"must be one of \['0', '1'\], got 'true'"),
    ("ep.context_embed_mode", "0", "2", r"must be one of \['0', '1'\], got '2'"),
    ("ep.context_file_path", "out_ctx.onnx", "", "needs a non-empty value"),
    ("ep.context_file_path", "out_ctx.onnx", "models/", "must name a file"),
    ("ep.context_node_name_prefix", "pre_", "", "needs a non-empty value"),
    ("optimized_model_path", "opt.onnx", "", "needs a non-empty value"),
    ("optimized_model_path", "opt.onnx", "out\\", "must name a file"),
    ("memory.inplace", "0", "yes", r"must be one of \['0', '1'\], got 'yes'"),
    ("memory.track", "1", "2", r"must be one of \['0', '1'\], got '2'"),
    ("load.max_inlined_nodes", "5000", "1e6", "takes a whole number >= 1, got '1e6'"),
    ("specialize", "0", "off", r"must be one of \['0', '1'\], got 'off'"),
    ("testing.cuda_on_torch_cpu", "0", "yes", r"must be one of \['0', '1'\], got 'yes'"),
]


def test_option_cases_cover_every_documented_key():
    assert {c[0] for c in OPTION_CASES} == set(KNOWN_OPTIONS)


def test_every_option_has_a_typed_config_field_and_test_switches_say_so():
    assert [f.name for f in dataclasses.fields(SessionConfig)] == [o.field for o in OPTIONS]
    for option in OPTIONS:
        assert option.doc and option.kind in ("flag", "int", "text", "file", "count")
        assert option.key.startswith("testing.") == option.doc.startswith("test-only")


@pytest.mark.parametrize(("key", "good", "bad", "error"), OPTION_CASES)
def test_each_option_key_accepts_valid_and_rejects_invalid_values(key, good, bad, error,
                                                                  tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # file options write there
    s = InferenceSession.builder().option(key, good).from_graph(_pair_model())
    field = key.replace(".", "_")
    kind = next(o.kind for o in OPTIONS if o.key == key)
    typed = (good == "1" if kind == "flag" else int(good) if kind in ("int", "count")
             else good)
    assert getattr(s._config, field) == typed and type(getattr(s._config, field)) is type(typed)
    default = getattr(SessionConfig(), field)
    assert dataclasses.replace(s._config, **{field: default}) == SessionConfig()
    with pytest.raises(InvalidOptionError, match=f"option '{key}' {error}"):
        InferenceSession.builder().option(key, bad)
    with pytest.raises(InvalidOptionError, match=f"option '{key}' takes a string value, got int"):
        InferenceSession.builder().option(key, 1)


def test_unknown_option_lists_every_valid_key_and_the_closest():
    with pytest.raises(UnknownOptionError) as info:
        InferenceSession.builder().option("ep.context_embedmode", "1")
    assert str(info.value) == (
        "unknown session option 'ep.context_embedmode'; valid keys are ['capture.allow_seams', "
        "'decode.memo', 'decode.verify', "
        "'ep.context_embed_mode', 'ep.context_enable', 'ep.context_file_path', "
        "'ep.context_node_name_prefix', 'load.max_inlined_nodes', 'memory.inplace', "
        "'memory.track', "
        "'optimized_model_path', 'specialize', 'testing.cuda_on_torch_cpu']; did you mean "
        "'ep.context_embed_mode'?")
    assert isinstance(info.value, KeyError)


@pytest.mark.parametrize("value", [0, -5, True, 1.0, "1GB"])
def test_memory_limit_rejects_non_positive_ints(value):
    with pytest.raises(InvalidOptionError, match="memory_limit takes a byte count >= 1, got"):
        InferenceSession.builder().memory_limit(value)


def test_warmup_takes_a_list_of_warmup_shapes():
    with pytest.raises(InvalidOptionError, match="warmup takes a list of WarmupShape"):
        InferenceSession.builder().warmup(WarmupShape("a", (1, 3)))
    with pytest.raises(InvalidOptionError, match="warmup takes a list of WarmupShape"):
        InferenceSession.builder().warmup([("a", (1, 3))])


def test_load_load_bytes_and_from_graph_build_equal_sessions(tmp_path):
    model = _pair_model()
    path = tmp_path / "m.onnx"
    onnx.save(model, path)
    b = InferenceSession.builder().device("cpu").intra_op_threads(1)
    sessions = [b.load(path), b.load(str(path)), b.load_bytes(path.read_bytes()),
                b.load_bytes(bytearray(path.read_bytes()), external_data_dir=str(tmp_path)),
                b.from_graph(model)]
    for s in sessions:
        np.testing.assert_array_equal(s.run(_feeds())[0], np.full((2, 3), 2, np.float32))
        assert s._threads == 1 and s.device_id() == ok.DeviceId(ok.DeviceType.CPU)


# warmup ---------------------------------------------------------------------------------


def test_warmup_builds_one_specialisation_per_shape_set():
    s = (InferenceSession.builder()
         .warmup([WarmupShape("a", (4, 3)), WarmupShape("b", (4, 3)),
                  WarmupShape("a", (1, 3)), WarmupShape("b", (1, 3))])
         .from_graph(_pair_model()))
    assert s.cache_stats() == CacheStats(entries=2, hits=0, misses=2, evictions=0)
    s.run(_feeds(4))
    s.run(_feeds(1))
    assert s.cache_stats() == CacheStats(entries=2, hits=2, misses=2, evictions=0)


def test_warmup_binds_symbolic_dims_of_inputs_it_does_not_name():
    s = InferenceSession.from_graph(_pair_model())
    s.warmup([WarmupShape("a", (5, 3))])
    assert s.cache_stats() == CacheStats(1, 0, 1, 0)
    s.run(_feeds(5))
    assert s.cache_stats() == CacheStats(1, 1, 1, 0)


def test_warmup_errors_name_the_input():
    model = make_model([helper.make_node("Identity", ["a"], ["y"]),
                        helper.make_node("Identity", ["c"], ["z"])],
                       [tensor_info("a", np.float32, ["batch", 3]),
                        tensor_info("c", np.int64, ["seq"])],
                       [tensor_info("y", np.float32, ["batch", 3]),
                        tensor_info("z", np.int64, ["seq"])])
    s = InferenceSession.from_graph(model)
    with pytest.raises(InvalidInputError, match="warmup cannot size input 'c'.*dim 'seq' at "
                                                "axis 0 is not bound"):
        s.warmup([WarmupShape("a", (1, 3))])
    with pytest.raises(InputNotFoundError, match="warmup names unknown input 'x'"):
        s.warmup([WarmupShape("x", (1,))])
    with pytest.raises(InvalidInputError, match="must hold sizes >= 0"):
        s.warmup([WarmupShape("a", (-1, 3))])
    with pytest.raises(InvalidInputError, match="expects float32"):
        s.warmup([WarmupShape("a", (1, 3), ok.DataType.DOUBLE), WarmupShape("c", (2,))])
    s.warmup([WarmupShape("a", (1, 3), np.float32), WarmupShape("c", (2,), np.int64)])
    assert s.cache_stats() == CacheStats(1, 0, 1, 0)


def test_warmup_runs_are_not_traced():
    ctx = TraceContext.in_memory()
    s = (InferenceSession.builder().trace(ctx).warmup([WarmupShape("a", (2, 3))])
         .from_graph(_pair_model()))
    assert ctx.spans == []
    s.run(_feeds())
    assert [sp.name for sp in ctx.spans] == ["Add", "model_run"]


# cache and control-flow counters -------------------------------------------------------


def test_cache_counts_hits_and_misses_per_signature():
    s = InferenceSession.from_graph(_pair_model())
    assert s.cache_stats() == CacheStats(0, 0, 0, 0)
    for batch, expected in ((2, (1, 0, 1)), (2, (1, 1, 1)), (3, (2, 1, 2)), (2, (2, 2, 2))):
        s.run(_feeds(batch))
        assert s.cache_stats() == CacheStats(*expected, 0)
    s.run({"a": np.ones((2, 3), np.float32), "b": np.ones((2, 3), np.float32)[:, ::-1]})
    assert s.cache_stats() == CacheStats(2, 3, 2, 0)  # strides are not part of the signature


def test_cache_evicts_the_oldest_entry_beyond_its_size():
    built = []
    cache = SpecializationCache(lambda sig: built.append(sig) or Specialization(sig),
                                max_entries=2)
    for sig in ("a", "b", "a", "c", "a", "b"):
        cache.get(sig)
    assert built == ["a", "b", "c", "a", "b"]
    assert cache.stats() == CacheStats(entries=2, hits=1, misses=5, evictions=3)


def test_cache_builds_once_when_threads_race():
    builds = []

    def build(sig):
        time.sleep(0.05)
        builds.append(sig)
        return Specialization(sig)

    cache = SpecializationCache(build)
    threads = [threading.Thread(target=cache.get, args=("sig",)) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert builds == ["sig"] and cache.stats() == CacheStats(1, 7, 1, 0)


def test_loop_of_100_iterations_builds_its_body_once_and_runs_it_100_times():
    from test_trace import _loop_model

    s = InferenceSession.from_graph(_loop_model(100))
    assert s.control_flow_stats() == ControlFlowStats(0, 0)
    s.run({"v0": np.zeros(2, np.float32)})
    assert s.control_flow_stats() == ControlFlowStats(subgraph_builds=1, subgraph_runs=100)
    s.run({"v0": np.ones(2, np.float32)})
    assert s.control_flow_stats() == ControlFlowStats(subgraph_builds=1, subgraph_runs=200)


def test_scan_counts_one_body_run_per_slice():
    from test_trace import _scan_model

    s = InferenceSession.from_graph(_scan_model())
    s.run({"s0": np.zeros(2, np.float32), "x": np.ones((4, 2), np.float32)})
    assert s.control_flow_stats() == ControlFlowStats(subgraph_builds=1, subgraph_runs=4)


# memory limit ---------------------------------------------------------------------------


def test_peak_live_bytes_follow_value_lifetimes():
    s = InferenceSession.builder().memory_limit(1 << 30).from_graph(_chain_model())
    assert s.last_run_peak_bytes() is None
    s.run({"x": np.ones(1000, np.float32)})
    # x (4000) + a (4000) + b (4000) live while Neg runs; a dies before y is made
    assert s.last_run_peak_bytes() == 12000
    spec = next(iter(s._cache._entries.values()))
    assert spec.predicted_peak == 12000
    assert InferenceSession.from_graph(_chain_model()).last_run_peak_bytes() is None


def test_a_limit_crossed_by_known_sizes_fails_before_running():
    s = InferenceSession.builder().memory_limit(11999).from_graph(_chain_model())
    with pytest.raises(MemoryLimitError) as info:
        s.run({"x": np.ones(1000, np.float32)})
    e = info.value
    assert (e.node_name, e.op_type, e.live_bytes, e.output_bytes, e.limit) == (
        "neg", "Neg", 8000, 4000, 11999)
    assert str(e).startswith(
        "memory limit exceeded at node 'neg' (ai.onnx::Neg, node id 1): 8,000 bytes live plus "
        "4,000 bytes of outputs = 12,000 > limit 11,999 bytes (predicted from shape inference "
        "before running)")
    assert s.cache_stats() == CacheStats(entries=0, hits=0, misses=1, evictions=0)
    assert s.last_run_peak_bytes() is None
    s12 = InferenceSession.builder().memory_limit(12000).from_graph(_chain_model())
    s12.run({"x": np.ones(1000, np.float32)})
    assert s12.last_run_peak_bytes() == 12000


def test_the_static_check_raises_before_any_kernel_runs():
    """The Gather would fail with an index error if it ran; the limit check comes first."""
    model = make_model([helper.make_node("Gather", ["d", "i"], ["y"], name="gather")],
                       [tensor_info("d", np.float32, [1000]), tensor_info("i", np.int64, [1000])],
                       [tensor_info("y", np.float32, [1000])])
    feeds = {"d": np.ones(1000, np.float32), "i": np.full(1000, 5000, np.int64)}
    with pytest.raises(KernelError):
        InferenceSession.from_graph(model).run(feeds)
    s = InferenceSession.builder().memory_limit(15000).from_graph(model)
    with pytest.raises(MemoryLimitError, match=r"node 'gather'.*12,000 bytes live plus 4,000"):
        s.run(feeds)


def test_data_dependent_sizes_are_checked_when_the_kernel_returns():
    model = make_model([helper.make_node("NonZero", ["x"], ["idx"], name="nz")],
                       [tensor_info("x", np.float32, [1000])],
                       [tensor_info("idx", np.int64, [1, None])])
    s = InferenceSession.builder().memory_limit(10000).from_graph(model)
    s.run({"x": np.zeros(1000, np.float32)})  # no non-zeros: 0 bytes of output
    assert s.last_run_peak_bytes() == 4000
    with pytest.raises(MemoryLimitError) as info:
        s.run({"x": np.ones(1000, np.float32)})
    assert "observed after the kernel returned" in str(info.value)
    assert (info.value.node_name, info.value.output_bytes) == ("nz", 8000)


def test_views_share_their_inputs_bytes():
    model = make_model([helper.make_node("Reshape", ["x", "shape"], ["r"], name="reshape"),
                        helper.make_node("Relu", ["r"], ["y"], name="relu")],
                       [tensor_info("x", np.float32, [1000])],
                       [tensor_info("y", np.float32, [10, 100])],
                       {"shape": np.array([10, 100], np.int64)})
    s = InferenceSession.builder().memory_limit(1 << 20).from_graph(model)
    s.run({"x": np.ones(1000, np.float32)})
    assert s.last_run_peak_bytes() == 8000
    assert next(iter(s._cache._entries.values())).predicted_peak == 8000


def test_memory_limit_applies_to_warmup_at_load_and_with_tracing():
    with pytest.raises(MemoryLimitError, match="node 'neg'"):
        (InferenceSession.builder().memory_limit(10000)
         .warmup([WarmupShape("x", (1000,))]).from_graph(_chain_model()))
    ctx = TraceContext.in_memory()
    s = InferenceSession.builder().memory_limit(12000).trace(ctx).from_graph(_chain_model())
    s.run({"x": np.ones(1000, np.float32)})
    assert s.last_run_peak_bytes() == 12000
    assert [sp.name for sp in ctx.spans] == ["Relu", "Neg", "Add", "model_run"]


def _value_sized(op: str, feeds: dict, rank: int):
    node = helper.make_node(op, list(feeds), ["y"], name="grow")
    return make_model([node], [tensor_info(k, v.dtype, v.shape) for k, v in feeds.items()],
                      [tensor_info("y", np.float32, [f"d{i}" for i in range(rank)])])


VALUE_SIZED = [  # op, feeds, expected output bytes: each from a few bytes of input values
    ("ConstantOfShape", {"shape": np.array([1 << 20, 1 << 20], np.int64)}, 2, 4 << 40),
    ("Expand", {"x": np.ones((1, 1), np.float32), "shape": np.array([1 << 18, 1 << 18])}, 2,
     4 << 36),
    ("Tile", {"x": np.ones((2,), np.float32), "r": np.array([1 << 40], np.int64)}, 1, 8 << 40),
    ("Range", {"a": np.array(0, np.float32), "b": np.array(1e12, np.float32),
               "d": np.array(1, np.float32)}, 1, 4 * int(np.float32(1e12))),
]


@pytest.mark.parametrize(("op", "feeds", "rank", "nbytes"), VALUE_SIZED,
                         ids=[c[0] for c in VALUE_SIZED])
def test_sizes_that_follow_from_input_values_are_refused_before_allocating(op, feeds, rank,
                                                                          nbytes):
    s = (InferenceSession.builder().memory_limit(1 << 30)
         .from_graph(_value_sized(op, feeds, rank)))
    with pytest.raises(MemoryLimitError) as info:
        s.run(feeds)
    assert "predicted from its input values before running" in str(info.value)
    assert (info.value.node_name, info.value.output_bytes) == ("grow", nbytes)


def test_broadcasting_over_computed_shapes_is_refused_before_allocating():
    """Two small vectors reshaped at run time into [n, 1] and [1, n]: Add would make n*n."""
    n = 1 << 16
    nodes = [helper.make_node("Reshape", ["a", "col"], ["ac"]),
             helper.make_node("Reshape", ["b", "row"], ["br"]),
             helper.make_node("Add", ["ac", "br"], ["y"], name="outer")]
    model = make_model(nodes, [tensor_info("a", np.float32, ["n"]),
                               tensor_info("b", np.float32, ["n"]),
                               tensor_info("col", np.int64, [2]),
                               tensor_info("row", np.int64, [2])],
                       [tensor_info("y", np.float32, ["r", "c"])])
    feeds = {"a": np.ones(n, np.float32), "b": np.ones(n, np.float32),
             "col": np.array([n, 1]), "row": np.array([1, n])}
    s = InferenceSession.builder().memory_limit(1 << 30).from_graph(model)
    with pytest.raises(MemoryLimitError, match="node 'outer'.*predicted from its input values"):
        s.run(feeds)
    small = {**feeds, "col": np.array([n, 1]), "row": np.array([n, 1])}
    np.testing.assert_array_equal(s.run(small)[0], np.full((n, 1), 2, np.float32))


def test_default_threads_are_the_physical_cores():
    from onnxkiln import threads

    assert 1 <= threads.physical_cores() <= (os.cpu_count() or 1)
    s = InferenceSession.from_graph(_pair_model())
    assert s._threads == threads.physical_cores() == threads.default_threads()
    assert InferenceSession.builder().intra_op_threads(1).from_graph(_pair_model())._threads == 1
