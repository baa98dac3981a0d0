"""Memory planning: in-place reuse of dying buffers (static check + runtime guard) and the
peak-memory numbers a session reports."""

from __future__ import annotations

import re

import numpy as np
import pytest
from onnx import TensorProto, helper

from onnxkiln import (
    InferenceSession,
    InvalidOptionError,
    MemoryLimitError,
    MemoryStats,
    executor,
    loader,
    zoo,
)
from onnxkiln.executor import CompiledPlan
from onnxkiln.memory import plan_donations
from onnxkiln.plan import build_plan
from onnxkiln.providers.base import KernelRegistry
from onnxkiln.providers.cpu import REGISTRY
from onnxkiln.testing import make_model, tensor_info

N = 1024  # float32 elements: 4096 bytes, the smallest size the executor donates
F32 = np.float32


def _node(op, ins, outs, **attrs):
    return helper.make_node(op, ins, outs, **attrs)


def _model(nodes, inputs, outputs, inits=None, **kw):
    outputs = [o if isinstance(o, tuple) else (o, [N]) for o in outputs]
    return make_model(nodes, [tensor_info(n, F32, s) for n, s in inputs],
                      [tensor_info(n, F32, s) for n, s in outputs], inits, **kw)


def _session(model, inplace="1", track="1"):
    return (InferenceSession.builder().optimization("disabled").option("memory.inplace", inplace)
            .option("memory.track", track).from_graph(model))


def _both(model, feeds):
    """Outputs with in-place on and off (must agree), and the in-place session."""
    on, off = _session(model, "1"), _session(model, "0")
    got_on, got_off = on.run(feeds), off.run(feeds)
    for a, b in zip(got_on, got_off):
        np.testing.assert_array_equal(a, b)
    return got_on, on


class _Recorder:
    """Step hooks remembering, per step, whether the output is the object of an input."""

    def __init__(self):
        self.reused: dict[int, int] = {}

    def sizing(self, index, ins):
        pass

    def start(self, index):
        return index

    def finish(self, index, ins, outs):
        for pos, value in enumerate(ins):
            if outs and outs[0] is value and isinstance(value, np.ndarray):
                self.reused[index] = pos


def _chain_model(n=N):
    # x -> Mul 2 -> Exp -> Relu -> Sigmoid -> Tanh -> Neg -> Abs -> Sqrt -> Add x -> y
    nodes = [_node("Mul", ["x", "two"], ["a"]), _node("Exp", ["a"], ["b"]),
             _node("Relu", ["b"], ["c"]), _node("Sigmoid", ["c"], ["d"]),
             _node("Tanh", ["d"], ["e"]), _node("Neg", ["e"], ["f"]),
             _node("Abs", ["f"], ["g"]), _node("Sqrt", ["g"], ["h"]),
             _node("Add", ["h", "x"], ["y"])]
    return _model(nodes, [("x", [n])], [("y", [n])], {"two": np.array(2, F32)})


def test_dying_intermediates_are_overwritten_in_place():
    model = _chain_model()
    x = np.linspace(-3, 3, N, dtype=F32)
    keep = x.copy()
    (y,), session = _both(model, {"x": x})
    expected = np.sqrt(np.abs(-np.tanh(1 / (1 + np.exp(-np.maximum(np.exp(2 * keep), 0))))))
    np.testing.assert_allclose(y, expected + keep, rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(x, keep)  # the caller's input is never written
    stats = session.memory_stats()
    assert stats.inplace_steps == 8  # every step but the first (it reads the graph input)
    assert stats.inplace_reuses == 8


def test_output_buffer_is_the_dying_input_buffer():
    plan = build_plan(loader.from_graph(_chain_model()), [REGISTRY])
    compiled = CompiledPlan(plan, inplace=True)
    recorder = _Recorder()
    compiled.hooked([np.ones(N, F32)], recorder)
    assert recorder.reused == dict.fromkeys(range(1, 9), 0)  # step 0 reads the graph input
    plain = _Recorder()
    CompiledPlan(plan, inplace=False).hooked([np.ones(N, F32)], plain)
    assert plain.reused == {}


def test_large_plans_donate_without_a_try_block_per_step(monkeypatch):
    from onnxkiln import executor

    monkeypatch.setattr(executor, "COMPACT_STEPS", 0)
    plan = build_plan(loader.from_graph(_chain_model()), [REGISTRY])
    compiled = CompiledPlan(plan, inplace=True)
    assert "_out_or_plain(" in compiled.source and "try:" not in compiled.source
    recorder = _Recorder()
    compiled.hooked([np.ones(N, F32)], recorder)
    assert recorder.reused == dict.fromkeys(range(1, 9), 0)
    x = np.linspace(-3, 3, N, dtype=F32)
    np.testing.assert_array_equal(compiled([x])[0], CompiledPlan(plan, inplace=False)([x])[0])


def test_out_or_plain_falls_back_when_the_ufunc_refuses_the_out():
    from onnxkiln.executor import _out_or_plain

    ints = np.arange(4)
    got = _out_or_plain(np.add, ints, ints, np.float32(0.5))  # float result, int out
    np.testing.assert_array_equal(got, [0.5, 1.5, 2.5, 3.5])
    np.testing.assert_array_equal(ints, [0, 1, 2, 3])
    floats = np.zeros(4, F32)
    assert _out_or_plain(np.add, floats, floats, F32(1)) is floats


def test_small_arrays_are_not_donated():
    session = _session(_chain_model(N // 2))
    session.run({"x": np.ones(N // 2, F32)})  # 2048 bytes < MIN_DONATE_BYTES
    assert session.memory_stats().inplace_reuses == 0


def test_graph_input_is_never_overwritten():
    model = _model([_node("Exp", ["x"], ["y"])], [("x", [N])], ["y"])
    x = np.full(N, 0.5, F32)
    (y,), session = _both(model, {"x": x})
    np.testing.assert_array_equal(x, np.full(N, 0.5, F32))
    np.testing.assert_allclose(y, np.exp(np.float32(0.5)))
    assert session.memory_stats().inplace_steps == 0


def test_graph_output_is_never_overwritten():
    model = _model([_node("Mul", ["x", "x"], ["a"]), _node("Exp", ["a"], ["y"])],
                   [("x", [N])], ["a", "y"])
    x = np.full(N, 0.5, F32)
    (a, y), session = _both(model, {"x": x})
    np.testing.assert_array_equal(a, np.full(N, 0.25, F32))
    assert a is not y and not np.shares_memory(a, y)
    assert session.memory_stats().inplace_steps == 0


def test_initializer_is_never_overwritten():
    w = np.linspace(0, 1, N, dtype=F32)
    model = _model([_node("Exp", ["w"], ["a"]), _node("Add", ["a", "x"], ["y"])],
                   [("x", [N])], ["y"], {"w": w}, opset=13)
    x = np.zeros(N, F32)
    session = _session(model)
    first = session.run({"x": x})[0]
    second = session.run({"x": x})[0]
    np.testing.assert_array_equal(first, second)
    np.testing.assert_allclose(second, np.exp(w), rtol=1e-6, atol=1e-6)
    assert plan_donations(session._plan) == {1: (0, session._plan.steps[1].inputs[0])}


def test_view_of_a_live_value_blocks_donation():
    # a dies at Exp, but r = Reshape(a) (a view of its buffer) is read afterwards
    nodes = [_node("Mul", ["x", "two"], ["a"]), _node("Reshape", ["a", "shape"], ["r"]),
             _node("Exp", ["a"], ["b"]), _node("Add", ["b", "r"], ["y"])]
    model = make_model(nodes, [tensor_info("x", F32, [N])], [tensor_info("y", F32, [N])],
                       {"two": np.array(2, F32), "shape": np.array([N], np.int64)})
    x = np.linspace(-1, 1, N, dtype=F32)
    (y,), session = _both(model, {"x": x})
    np.testing.assert_allclose(y, np.exp(2 * x) + 2 * x, rtol=1e-6, atol=1e-6)
    steps = session._plan.steps
    exp_step = next(i for i, s in enumerate(steps) if s.op_type == "Exp")
    assert steps[exp_step + 1].op_type == "Add"  # r is still to be read
    assert exp_step not in plan_donations(session._plan)
    assert session.memory_stats().inplace_reuses == 1  # the Add writes into b


def test_unmarked_view_is_caught_by_the_reference_count():
    # a kernel that returns a view without declaring view=True still pins the buffer
    reg = KernelRegistry("test")
    reg.kernel("Alias", domain="test")(lambda x: x[:])
    nodes = [_node("Mul", ["x", "two"], ["a"]), helper.make_node("Alias", ["a"], ["r"],
                                                                 domain="test"),
             _node("Exp", ["a"], ["b"]), _node("Add", ["b", "r"], ["y"])]
    model = make_model(nodes, [tensor_info("x", F32, [N])], [tensor_info("y", F32, [N])],
                       {"two": np.array(2, F32)}, extra_opsets={"test": 1})
    plan = build_plan(loader.from_graph(model), [reg, REGISTRY])
    assert 2 in plan_donations(plan)  # the static check cannot see this view
    x = np.linspace(-1, 1, N, dtype=F32)
    (y,) = CompiledPlan(plan, inplace=True)([x])
    np.testing.assert_allclose(y, np.exp(2 * x) + 2 * x, rtol=1e-6, atol=1e-6)


def test_value_used_later_is_not_donated():
    nodes = [_node("Mul", ["x", "two"], ["a"]), _node("Exp", ["a"], ["b"]),
             _node("Add", ["a", "b"], ["y"])]
    model = _model(nodes, [("x", [N])], ["y"], {"two": np.array(2, F32)})
    x = np.linspace(-1, 1, N, dtype=F32)
    (y,), session = _both(model, {"x": x})
    np.testing.assert_allclose(y, 2 * x + np.exp(2 * x), rtol=1e-6, atol=1e-6)
    exp_step = next(i for i, s in enumerate(session._plan.steps) if s.op_type == "Exp")
    assert exp_step not in plan_donations(session._plan)
    assert session.memory_stats().inplace_reuses == 1  # only the final Add (into a or b)


def _if_model(body_reads_a_before_outer_exp: bool):
    then_nodes = [_node("Exp", ["a"], ["t"])]
    then_g = helper.make_graph(then_nodes, "then", [], [tensor_info("t", F32, [N])])
    else_g = helper.make_graph([_node("Neg", ["a"], ["t2"])], "else", [],
                               [tensor_info("t2", F32, [N])])
    if_node = helper.make_node("If", ["cond"], ["z"], then_branch=then_g, else_branch=else_g)
    outer_exp = _node("Exp", ["a"], ["b"])
    nodes = [_node("Mul", ["x", "two"], ["a"])]
    nodes += [if_node, outer_exp] if body_reads_a_before_outer_exp else [outer_exp, if_node]
    nodes.append(_node("Add", ["b", "z"], ["y"]))
    return make_model(nodes, [tensor_info("x", F32, [N]),
                              helper.make_tensor_value_info("cond", TensorProto.BOOL, [])],
                      [tensor_info("y", F32, [N])], {"two": np.array(2, F32)})


@pytest.mark.parametrize("if_first", [True, False])
def test_value_captured_by_a_subgraph_is_protected(if_first):
    model = _if_model(if_first)
    x = np.linspace(-1, 1, N, dtype=F32)
    (y,), session = _both(model, {"x": x, "cond": np.array(True)})
    np.testing.assert_allclose(y, 2 * np.exp(2 * x), rtol=1e-6, atol=1e-6)
    exp_step = next(i for i, s in enumerate(session._plan.steps) if s.op_type == "Exp")
    # the outer Exp may overwrite `a` only once the If (which captures it) has run
    assert (exp_step in plan_donations(session._plan)) is if_first


def test_broadcasting_input_is_not_overwritten_with_the_wrong_shape():
    # a (1, N) dies in Add(a, b) with b (4, N): the output cannot live in a's buffer
    nodes = [_node("Mul", ["x", "two"], ["a"]), _node("Add", ["a", "b"], ["y"])]
    model = _model(nodes, [("x", [1, N]), ("b", [4, N])], [("y", [4, N])],
                   {"two": np.array(2, F32)})
    x = np.ones((1, N), F32)
    b = np.arange(4 * N, dtype=F32).reshape(4, N)
    (y,), session = _both(model, {"x": x, "b": b})
    np.testing.assert_array_equal(y, b + 2)
    assert y.shape == (4, N)
    assert session.memory_stats().inplace_reuses == 0


@pytest.mark.parametrize("base, exponent", [
    (np.int32, np.float32), (np.float32, np.float64), (np.float32, np.int64)])
def test_pow_with_other_exponent_dtype_keeps_the_base_dtype(base, exponent):
    nodes = [_node("Abs", ["x"], ["a"]), _node("Pow", ["a", "e"], ["y"])]
    model = make_model(nodes, [tensor_info("x", base, [N])], [tensor_info("y", base, [N])],
                       {"e": np.array([2], exponent) if exponent != np.int64 else
                        np.array(3, exponent)}, opset=15)
    x = (np.arange(N) % 7 - 3).astype(base)
    (y,), _ = _both(model, {"x": x})
    assert y.dtype == base
    power = 3 if exponent == np.int64 else 2
    np.testing.assert_allclose(y, np.abs(x).astype(np.float64) ** power, rtol=1e-6, atol=1e-6)


def test_kernel_cached_array_is_never_overwritten():
    reg = KernelRegistry("test")
    cache = np.linspace(0, 1, N, dtype=F32)

    @reg.kernel("Cached", domain="test")
    def cached(x):
        return cache  # the same array every run: it must survive the Exp reading it

    nodes = [helper.make_node("Cached", ["x"], ["a"], domain="test"),
             _node("Exp", ["a"], ["y"])]
    model = make_model(nodes, [tensor_info("x", F32, [N])], [tensor_info("y", F32, [N])],
                       extra_opsets={"test": 1})
    plan = build_plan(loader.from_graph(model), [reg, REGISTRY])
    assert 1 in plan_donations(plan)
    compiled = CompiledPlan(plan, inplace=True)
    first = compiled([np.zeros(N, F32)])[0]
    second = compiled([np.zeros(N, F32)])[0]
    np.testing.assert_array_equal(cache, np.linspace(0, 1, N, dtype=F32))
    np.testing.assert_array_equal(first, second)


def test_read_only_fresh_array_falls_back_to_a_new_buffer():
    reg = KernelRegistry("test")

    @reg.kernel("Frozen", domain="test")
    def frozen(x):
        y = x * 2
        y.flags.writeable = False
        return y

    for op in ("Exp", "Relu", "Sigmoid", "Clip"):
        nodes = [helper.make_node("Frozen", ["x"], ["a"], domain="test"),
                 _node(op, ["a"], ["y"])]
        model = make_model(nodes, [tensor_info("x", F32, [N])], [tensor_info("y", F32, [N])],
                           extra_opsets={"test": 1})
        plan = build_plan(loader.from_graph(model), [reg, REGISTRY])
        assert 1 in plan_donations(plan), op
        x = np.linspace(-1, 1, N, dtype=F32)
        (y,) = CompiledPlan(plan, inplace=True)([x])
        (ref,) = CompiledPlan(plan, inplace=False)([x])
        np.testing.assert_array_equal(y, ref)


@pytest.mark.parametrize("op, attrs, ref", [
    ("Relu", {}, lambda v: np.maximum(v, 0)),
    ("LeakyRelu", {"alpha": 0.1}, lambda v: np.where(v >= 0, v, 0.1 * v)),
    ("LeakyRelu", {"alpha": -2.0}, lambda v: np.where(v >= 0, v, -2.0 * v)),
    ("HardSigmoid", {"alpha": 0.3, "beta": 0.4}, lambda v: np.clip(0.3 * v + 0.4, 0, 1)),
    ("Sigmoid", {}, lambda v: 1 / (1 + np.exp(-v))),
    ("Tanh", {}, np.tanh),
    ("Neg", {}, np.negative), ("Abs", {}, np.abs), ("Exp", {}, np.exp),
    ("Floor", {}, np.floor), ("Ceil", {}, np.ceil), ("Sin", {}, np.sin), ("Cos", {}, np.cos),
    ("Reciprocal", {}, np.reciprocal),
])
def test_each_inplace_kernel_matches_its_reference(op, attrs, ref):
    nodes = [_node("Mul", ["x", "two"], ["a"]), _node(op, ["a"], ["y"], **attrs)]
    model = _model(nodes, [("x", [4, N])], [("y", [4, N])], {"two": np.array(2, F32)})
    x = np.random.default_rng(0).standard_normal((4, N)).astype(F32)
    (y,), session = _both(model, {"x": x})
    np.testing.assert_allclose(y, ref((2 * x).astype(np.float64)), rtol=2e-6, atol=1e-6)
    assert session.memory_stats().inplace_reuses == 1


def test_clip_with_bounds_in_place():
    nodes = [_node("Mul", ["x", "two"], ["a"]), _node("Clip", ["a", "lo", "hi"], ["y"])]
    model = _model(nodes, [("x", [N])], ["y"], {"two": np.array(2, F32),
                                               "lo": np.array(-1, F32), "hi": np.array(1, F32)})
    x = np.linspace(-2, 2, N, dtype=F32)
    (y,), session = _both(model, {"x": x})
    np.testing.assert_array_equal(y, np.clip(2 * x, -1, 1))
    assert session.memory_stats().inplace_reuses == 1


@pytest.mark.parametrize("name", sorted(zoo.MODELS))
def test_zoo_models_agree_with_inplace_off(name, monkeypatch):
    monkeypatch.setattr(executor, "MIN_DONATE_BYTES", 0)  # small configs: donate everything
    generator, small, _ = zoo.MODELS[name]
    model = generator(small)
    feeds = zoo.random_inputs(model, seed=1)
    on = InferenceSession.builder().option("memory.track", "1").from_graph(model)
    off = InferenceSession.builder().option("memory.inplace", "0").from_graph(model)
    for a, b in zip(on.run(feeds), off.run(feeds)):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6)
    stats = on.memory_stats()
    assert off.memory_stats().inplace_steps == 0
    assert stats.inplace_reuses is not None and stats.inplace_reuses <= stats.inplace_steps


_UNARY = ["Exp", "Neg", "Abs", "Relu", "Sigmoid", "Tanh", "Sin"]
_BINARY = ["Add", "Sub", "Mul"]


def _random_graph(rng):
    """Elementwise ops over (4, N), (1, N) and (N,) values, with reuse, views and outputs."""
    shapes = {"x": (4, N), "r": (1, N)}
    names, nodes, inits = ["x", "r"], [], {"shape": np.array([4 * N], np.int64),
                                           "back": np.array([4, N], np.int64)}
    for i in range(rng.integers(6, 16)):
        out = f"v{i}"
        kind = rng.integers(0, 5)
        a = names[rng.integers(len(names))]
        if kind == 0 and shapes[a] == (4, N):  # a view round trip through Reshape
            nodes += [_node("Reshape", [a, "shape"], [out + "f"]),
                      _node("Reshape", [out + "f", "back"], [out])]
            shapes[out] = (4, N)
        elif kind <= 2:
            nodes.append(_node(_UNARY[rng.integers(len(_UNARY))], [a], [out]))
            shapes[out] = shapes[a]
        else:
            b = names[rng.integers(len(names))]
            nodes.append(_node(_BINARY[rng.integers(len(_BINARY))], [a, b], [out]))
            shapes[out] = (4, N) if (4, N) in (shapes[a], shapes[b]) else shapes[a]
        names.append(out)
    outputs = [names[-1]] + [n for n in names[2:-1] if rng.random() < 0.2]
    model = make_model(nodes, [tensor_info("x", F32, [4, N]), tensor_info("r", F32, [1, N])],
                       [tensor_info(n, F32, list(shapes[n])) for n in outputs], inits)
    return model


@pytest.mark.parametrize("seed", range(12))
def test_random_graphs_agree_with_inplace_off(seed):
    rng = np.random.default_rng(seed)
    model = _random_graph(rng)
    feeds = {"x": rng.standard_normal((4, N)).astype(F32) * 0.5,
             "r": rng.standard_normal((1, N)).astype(F32) * 0.5}
    copies = {k: v.copy() for k, v in feeds.items()}
    got, _ = _both(model, feeds)
    for k in feeds:
        np.testing.assert_array_equal(feeds[k], copies[k])
    plan = build_plan(loader.from_graph(model), [REGISTRY])
    ref = CompiledPlan(plan, inplace=False)([feeds["x"], feeds["r"]])
    traced = CompiledPlan(plan, inplace=True).hooked([feeds["x"], feeds["r"]], _Recorder())
    for a, b, c in zip(got, ref, traced):
        np.testing.assert_array_equal(a, b)
        np.testing.assert_array_equal(c, b)


def _stats_model():
    # x (4096 B) -> a = 2x -> b = exp(a) -> c = relu(b) -> y = c + x: x lives to the end
    nodes = [_node("Mul", ["x", "two"], ["a"]), _node("Exp", ["a"], ["b"]),
             _node("Relu", ["b"], ["c"]), _node("Add", ["c", "x"], ["y"])]
    return _model(nodes, [("x", [N])], ["y"], {"two": np.array(2, F32)})


@pytest.mark.parametrize("inplace, peak", [("1", 2 * 4 * N), ("0", 3 * 4 * N)])
def test_memory_stats_peaks_match_hand_computed_values(inplace, peak):
    session = _session(_stats_model(), inplace)
    assert session.memory_stats() == MemoryStats(None, None, None,
                                                 3 if inplace == "1" else 0)
    session.run({"x": np.ones(N, F32)})
    stats = session.memory_stats()
    assert stats.last_run_peak_bytes == peak  # x + a, plus b when Exp cannot reuse a
    assert stats.planned_peak_bytes == peak
    assert stats.inplace_reuses == (3 if inplace == "1" else 0)


def test_planned_peak_covers_the_largest_intermediate_and_follows_the_signature():
    session = _session(_stats_model(), track="0")
    session.run({"x": np.ones(N, F32)})
    small = session.memory_stats()
    assert small.last_run_peak_bytes is None and small.inplace_reuses is None
    assert small.planned_peak_bytes >= 4 * N
    model = _model([_node("Mul", ["x", "x"], ["a"]), _node("Exp", ["a"], ["y"])],
                   [("x", ["n"])], [("y", ["n"])])
    dyn = _session(model, track="0")
    dyn.run({"x": np.ones(3 * N, F32)})
    assert dyn.memory_stats().planned_peak_bytes == 2 * 4 * 3 * N  # x + a (y in place: no)
    dyn.run({"x": np.ones(N, F32)})
    assert dyn.memory_stats().planned_peak_bytes == 2 * 4 * N


def test_memory_options_are_validated():
    builder = InferenceSession.builder()
    with pytest.raises(InvalidOptionError, match="memory.inplace"):
        builder.option("memory.inplace", "yes")
    with pytest.raises(InvalidOptionError, match="memory.track"):
        builder.option("memory.track", "2")


def test_environment_variable_turns_inplace_off(monkeypatch):
    monkeypatch.setenv("ONNXKILN_INPLACE", "0")
    session = InferenceSession.builder().option("memory.track", "1").from_graph(_chain_model())
    session.run({"x": np.ones(N, F32)})
    assert session.memory_stats().inplace_steps == 0
    assert session.memory_stats().inplace_reuses == 0
    monkeypatch.setenv("ONNXKILN_INPLACE", "1")
    assert CompiledPlan(session._plan).donations


def test_reference_count_calibration_matches_the_generated_guard():
    assert executor._RC is not None
    ns = {"_rc": __import__("sys").getrefcount, "_nd": np.ndarray, "_MIN": 0,
          "_RC": executor._RC}
    exec("def f(v):\n    v1 = v.copy()\n    return " + executor._guard("v1") + "\n", ns)
    assert ns["f"](np.ones(4)) is True
    exec("def g(v):\n    v1 = v.copy()\n    keep = v1\n    return " + executor._guard("v1")
         + "\n", ns)
    assert ns["g"](np.ones(4)) is False


def test_planned_peak_of_an_optimized_model_uses_the_tracked_sizes(monkeypatch):
    monkeypatch.setattr(executor, "MIN_DONATE_BYTES", 0)
    generator, small, _ = zoo.MODELS["bert"]
    model = generator(small)
    feeds = zoo.random_inputs(model, seed=1)
    untracked = InferenceSession.from_graph(model)
    untracked.run(feeds)
    lower = untracked.memory_stats().planned_peak_bytes
    tracked = InferenceSession.builder().option("memory.track", "1").from_graph(model)
    tracked.run(feeds)
    stats = tracked.memory_stats()
    (observed,) = tracked._peaks._observed.values()  # bytes of every value of the run
    largest = max(observed.values())
    assert lower <= stats.planned_peak_bytes
    assert largest <= stats.planned_peak_bytes <= stats.last_run_peak_bytes
    # every donation the plan counts on happened, so plan and measurement agree
    assert stats.inplace_reuses == stats.inplace_steps
    assert stats.planned_peak_bytes == stats.last_run_peak_bytes


def test_traced_and_tracked_run_reuses_buffers_and_records_every_step():
    from onnxkiln import TraceContext

    ctx = TraceContext.in_memory()
    session = (InferenceSession.builder().optimization("disabled").trace(ctx)
               .option("memory.track", "1").from_graph(_chain_model()))
    x = np.linspace(-1, 1, N, dtype=F32)
    (y,) = session.run({"x": x})
    (plain,) = _session(_chain_model(), "0", "0").run({"x": x})
    np.testing.assert_array_equal(y, plain)
    assert session.memory_stats().inplace_reuses == 8
    nodes = [s for s in ctx.spans if s.category == "node"]
    assert len(nodes) == 9
    assert all(s.attributes["output_shapes"] == [(N,)] for s in nodes)


@pytest.mark.parametrize("shared", [False, True])
def test_view_of_a_kernel_temporary_is_reused_but_a_view_of_a_cache_is_not(shared):
    reg = KernelRegistry("test")
    cache = np.linspace(0, 1, 2 * N, dtype=F32)

    @reg.kernel("Flat", domain="test")
    def flat(x):  # a view: of a fresh temporary, or of an array the kernel keeps
        base = cache if shared else np.concatenate([x, x])
        return base.reshape(2, N)

    nodes = [helper.make_node("Flat", ["x"], ["a"], domain="test"), _node("Exp", ["a"], ["y"])]
    model = make_model(nodes, [tensor_info("x", F32, [N])], [tensor_info("y", F32, [2, N])],
                       extra_opsets={"test": 1})
    plan = build_plan(loader.from_graph(model), [reg, REGISTRY])
    recorder = _Recorder()
    x = np.zeros(N, F32)
    (y,) = CompiledPlan(plan, inplace=True).hooked([x], recorder)
    assert recorder.reused == ({} if shared else {1: 0})
    np.testing.assert_array_equal(cache, np.linspace(0, 1, 2 * N, dtype=F32))
    expected = np.exp(cache if shared else np.zeros(2 * N, F32)).reshape(2, N)
    np.testing.assert_allclose(y, expected, rtol=1e-6)


def test_matmul_bias_add_reuses_the_matmul_result():
    nodes = [_node("MatMul", ["x", "w"], ["m"]), _node("Add", ["m", "b"], ["y"])]
    w = np.eye(N, dtype=F32)[:, : N // 2] * 2
    model = _model(nodes, [("x", [2, 4, N])], [("y", [2, 4, N // 2])],
                   {"w": w, "b": np.ones(N // 2, F32)})
    x = np.random.default_rng(0).standard_normal((2, 4, N)).astype(F32)
    (y,), session = _both(model, {"x": x})
    np.testing.assert_allclose(y, x[..., : N // 2] * 2 + 1, rtol=1e-6, atol=1e-6)
    assert session.memory_stats().inplace_reuses == 1


# memory_limit: refused before allocating, inside bodies too --------------------------

MB = 1 << 20
LIMIT = 16 * MB


def _i64(v):
    return np.array(v, np.int64)


def _one(op, ins, out_rank, inputs, **attrs):
    node = _node(op, ins, ["y"], name="big", **attrs)
    dims = [f"d{k}" for k in range(out_rank)]
    return make_model([node], inputs, [tensor_info("y", F32, dims)])


def _loop(body_nodes, body_ins, body_outs, loop_ins, loop_outs, graph_ins, graph_outs,
          before=(), after=()):
    body = helper.make_graph(body_nodes, "body", body_ins, body_outs)
    loop = _node("Loop", loop_ins, loop_outs, name="loop", body=body)
    return make_model([*before, loop, *after], graph_ins, graph_outs)


_ITER = [tensor_info("i", np.int64, []), tensor_info("c", np.bool_, [])]
_COND = [_node("Identity", ["c"], ["c_out"])]
_C_OUT = tensor_info("c_out", np.bool_, [])
_M_X = [tensor_info("m", np.int64, []), tensor_info("x", F32, ["n"])]


def _concat_doubling():
    return _loop([*_COND, _node("Concat", ["x", "x"], ["x_out"], name="doubling", axis=0)],
                 [*_ITER, tensor_info("x", F32, ["k"])],
                 [_C_OUT, tensor_info("x_out", F32, ["k2"])],
                 ["m", "", "x"], ["y"], _M_X, [tensor_info("y", F32, ["p"])])


def _scan_outputs():
    return _loop([*_COND, _node("Add", ["x", "x"], ["s"], name="fresh")], _ITER,
                 [_C_OUT, tensor_info("s", F32, ["k"])],
                 ["m", ""], ["y"], _M_X, [tensor_info("y", F32, ["p", "q"])])


def _sequence_insert():
    seq = helper.make_tensor_sequence_value_info
    return _loop([*_COND, _node("Add", ["x", "x"], ["s"], name="fresh"),
                  _node("SequenceInsert", ["seq", "s"], ["seq_out"], name="insert")],
                 [*_ITER, seq("seq", TensorProto.FLOAT, ["k"])],
                 [_C_OUT, seq("seq_out", TensorProto.FLOAT, ["k"])],
                 ["m", "", "s0"], ["seq"], _M_X, [tensor_info("y", np.int64, [])],
                 before=[_node("SequenceEmpty", [], ["s0"], dtype=TensorProto.FLOAT)],
                 after=[_node("SequenceLength", ["seq"], ["y"])])


def _reshaped(op, **attrs):
    """`op` over inputs reshaped by a shape given at run time: no inference can size it."""
    nodes = [_node("Reshape", ["a", "sa"], ["a2"]), _node("Reshape", ["b", "sb"], ["b2"]),
             _node(op, ["a2", "b2"], ["y"], name="big", **attrs)]
    return make_model(nodes, [tensor_info(n, t, s) for n, t, s in (
        ("a", F32, ["n"]), ("b", F32, ["m"]), ("sa", np.int64, [2]), ("sb", np.int64, [2]))],
        [tensor_info("y", F32, ["p", "q"])])


_SIDE = 4096  # an outer product of two 4096-vectors: 64 MiB of float32
_VEC = np.ones(_SIDE, F32)
_LIMIT_CASES = {
    "gemm": (lambda: _reshaped("Gemm"), "big",
             {"a": _VEC, "b": _VEC, "sa": _i64([_SIDE, 1]), "sb": _i64([1, _SIDE])}),
    "einsum": (lambda: _reshaped("Einsum", equation="ik,kj->ij"), "big",
               {"a": _VEC, "b": _VEC, "sa": _i64([_SIDE, 1]), "sb": _i64([1, _SIDE])}),
    "hann": (lambda: _one("HannWindow", ["n"], 1, [tensor_info("n", np.int64, [])]), "big",
             {"n": _i64(16 * MB)}),
    "blackman": (lambda: _one("BlackmanWindow", ["n"], 1, [tensor_info("n", np.int64, [])]),
                 "big", {"n": _i64(16 * MB)}),
    "mel": (lambda: _one("MelWeightMatrix", ["b", "d", "r", "lo", "hi"], 2,
                         [tensor_info(n, t, []) for n, t in (
                             ("b", np.int64), ("d", np.int64), ("r", np.int64), ("lo", F32),
                             ("hi", F32))]), "big",
            {"b": _i64(2048), "d": _i64(8192), "r": _i64(16000), "lo": np.array(0, F32),
             "hi": np.array(8000, F32)}),
    "dft": (lambda: _one("DFT", ["x", "len"], 3, [tensor_info("x", F32, [1, "n", 1]),
                                                   tensor_info("len", np.int64, [])]), "big",
            {"x": np.ones((1, 16, 1), F32), "len": _i64(4 * MB)}),
    "concat_in_loop": (_concat_doubling, "doubling", {"m": _i64(40), "x": np.ones(1024, F32)}),
    "loop_scan_outputs": (_scan_outputs, "(loop|fresh)",
                          {"m": _i64(10_000), "x": np.ones(MB // 4, F32)}),
    "sequence_insert_in_loop": (_sequence_insert, "insert",
                                {"m": _i64(10_000), "x": np.ones(MB // 4, F32)}),
    "plain_add": (lambda: _one("Add", ["a", "b"], 1, [tensor_info("a", F32, ["n"]),
                                                      tensor_info("b", F32, ["n"])]), "big",
                  {"a": np.ones(3 * MB // 2, F32), "b": np.ones(3 * MB // 2, F32)}),
}


@pytest.mark.parametrize("name", sorted(_LIMIT_CASES))
def test_memory_limit_refuses_before_allocating_past_it(name):
    import tracemalloc

    make, node, feeds = _LIMIT_CASES[name]
    session = InferenceSession.builder().memory_limit(LIMIT).from_graph(make())
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        with pytest.raises(MemoryLimitError, match=f"at node '{node}'") as info:
            session.run(feeds)
        peak = tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()
    assert re.fullmatch(node, info.value.node_name) and info.value.limit == LIMIT
    assert peak <= LIMIT + 2 * MB, f"{peak:,} bytes allocated before the refusal"


def test_loop_under_the_limit_matches_the_unlimited_run_and_reports_its_peak():
    feeds = {"m": _i64(8), "x": np.arange(MB // 8, dtype=F32)}
    free = InferenceSession.from_graph(_scan_outputs())
    limited = InferenceSession.builder().memory_limit(LIMIT).from_graph(_scan_outputs())
    (want,), (got,) = free.run(feeds), limited.run(feeds)
    np.testing.assert_array_equal(got, want)
    assert got.shape == (8, MB // 8)
    # 8 scan outputs of 512 KiB, their stacked copy and the input
    assert 8 * MB <= limited.last_run_peak_bytes() <= 10 * MB


def test_sequence_sharing_its_tensors_is_counted_once():
    feeds = {"m": _i64(24), "x": np.ones(MB // 4, F32)}  # 24 MiB of tensors in the sequence
    limited = InferenceSession.builder().memory_limit(28 * MB).from_graph(_sequence_insert())
    assert limited.run(feeds)[0] == 24
    assert 24 * MB <= limited.last_run_peak_bytes() <= 28 * MB


def test_memory_limit_checks_every_iteration_of_a_scan():
    body = helper.make_graph(
        [_node("Add", ["s_in", "x_t"], ["s_out"]), _node("Tile", ["x_t", "reps"], ["wide"],
                                                          name="tile")], "body",
        [tensor_info("s_in", F32, [1]), tensor_info("x_t", F32, [1])],
        [tensor_info("s_out", F32, [1]), tensor_info("wide", F32, ["w"])])
    scan = _node("Scan", ["s", "xs"], ["y", "stack"], name="scan", body=body, num_scan_inputs=1)
    model = make_model([scan], [tensor_info("s", F32, [1]), tensor_info("xs", F32, ["t", 1])],
                       [tensor_info("y", F32, [1]), tensor_info("stack", F32, ["t", "w"])],
                       {"reps": _i64([MB // 4])})
    session = InferenceSession.builder().memory_limit(LIMIT).from_graph(model)
    feeds = {"s": np.zeros(1, F32), "xs": np.ones((1000, 1), F32)}
    with pytest.raises(MemoryLimitError, match="at node '(scan|tile)'"):
        session.run(feeds)
    feeds["xs"] = np.ones((4, 1), F32)
    y, stack = session.run(feeds)
    assert y[0] == 4 and stack.shape == (4, MB // 4)


def test_data_propagation_is_skipped_for_long_vectors(monkeypatch):
    import onnx

    calls = []
    infer = onnx.shape_inference.infer_shapes
    monkeypatch.setattr(onnx.shape_inference, "infer_shapes",
                        lambda model, **kw: calls.append(kw.get("data_prop")) or infer(model, **kw))
    for n, expected in ((40_000_000, False), (16, True)):
        calls.clear()
        model = make_model([_node("Add", ["x", "x"], ["y"])], [tensor_info("x", F32, [n])],
                           [tensor_info("y", F32, [n])])
        InferenceSession.from_graph(model)
        assert calls and set(calls) == {expected}


_PREDICTED = [  # (op, attrs, inputs, output rank): the prediction is the output's exact size
    ("Gemm", {}, [(3, 5), (5, 7)], 2),
    ("Gemm", {"transA": 1, "transB": 1}, [(5, 3), (7, 5)], 2),
    ("Einsum", {"equation": "ij,jk->ik"}, [(3, 4), (4, 6)], 2),
    ("Einsum", {"equation": "bij,bjk->bik"}, [(2, 3, 4), (2, 4, 5)], 3),
    ("Einsum", {"equation": "...ij,...jk"}, [(2, 3, 4), (4, 5)], 3),
    ("Einsum", {"equation": "i,j"}, [(3,), (4,)], 2),
    ("Einsum", {"equation": "ii->i"}, [(4, 4)], 1),
    ("Concat", {"axis": 1}, [(2, 3), (2, 5), (2, 1)], 2),
    ("Cast", {"to": TensorProto.DOUBLE}, [(4, 3)], 2),
    ("Add", {}, [(4, 1), (1, 5)], 2),
    ("Mul", {}, [(6,), ()], 1),
    ("Softmax", {}, [(3, 7)], 2),
]


def _sized_session(op, attrs, feeds, rank, out_type=F32):
    model = make_model([_node(op, list(feeds), ["y"], **attrs)],
                       [tensor_info(n, v.dtype, list(v.shape)) for n, v in feeds.items()],
                       [tensor_info("y", out_type, [f"d{k}" for k in range(rank)])])
    return InferenceSession.builder().optimization("disabled").from_graph(model)


@pytest.mark.parametrize(("op", "attrs", "shapes", "rank"), _PREDICTED,
                         ids=[f"{row[0]}-{i}" for i, row in enumerate(_PREDICTED)])
def test_size_predictions_match_the_outputs(op, attrs, shapes, rank):
    from onnxkiln import sizes

    feeds = {f"x{k}": np.ones(s, F32) for k, s in enumerate(shapes)}
    session = _sized_session(op, attrs, feeds, rank, np.float64 if op == "Cast" else F32)
    (want,) = session.run(feeds)
    (predict,) = sizes.predictors(session._plan.steps, session.graph()).values()
    assert predict(tuple(feeds.values())) == want.nbytes


def test_window_and_dft_predictions_cover_the_output_and_the_float64_work():
    from onnxkiln import sizes

    cases = [("HannWindow", {}, {"n": _i64(1000)}, 1, 1000 * 4),
             ("DFT", {"onesided": 1}, {"x": np.ones((2, 100, 1), F32)}, 3, 2 * 51 * 2 * 4),
             ("MelWeightMatrix", {}, {"b": _i64(8), "d": _i64(64), "r": _i64(16000),
                                      "lo": np.array(0, F32), "hi": np.array(7000, F32)},
              2, 33 * 8 * 4)]
    for op, attrs, feeds, rank, out_bytes in cases:
        session = _sized_session(op, attrs, feeds, rank)
        (want,) = session.run(feeds)
        assert want.nbytes == out_bytes
        (predict,) = sizes.predictors(session._plan.steps, session.graph()).values()
        assert out_bytes < predict(tuple(feeds.values())) <= 10 * out_bytes
