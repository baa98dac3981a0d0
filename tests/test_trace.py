"""TraceContext: spans per executed op (subgraph ops as children), Chrome trace, OpenTelemetry."""

from __future__ import annotations

import json
import subprocess
import sys
import threading

import numpy as np
import pytest
from onnx import helper

from onnxkiln import InferenceSession, InvalidOptionError, KernelError
from onnxkiln.testing import make_model, tensor_info
from onnxkiln.trace import Span, TraceContext, active_context, summarize

A = np.array([[1, -2, 3], [-4, 5, -6]], np.float32)
B = np.array([[0.5, 0.5, -5], [1, 1, 1]], np.float32)
STEP_KEYS = {"node_id", "node", "op_type", "domain", "provider", "graph", "kernel_variant",
             "input_shapes", "input_dtypes", "output_shapes", "output_dtypes", "thread_id"}
CHROME_ARGS = {"op_name", "provider", "node_index", "input_type_shape", "output_type_shape",
               "kernel_variant", "domain", "graph"}


def _model():
    """y = relu(a + b), z = a * 2."""
    nodes = [helper.make_node("Add", ["a", "b"], ["s"], name="add"),
             helper.make_node("Relu", ["s"], ["y"], name="relu"),
             helper.make_node("Mul", ["a", "two"], ["z"], name="double")]
    return make_model(nodes, [tensor_info("a", np.float32, ["batch", 3]),
                              tensor_info("b", np.float32, ["batch", 3])],
                      [tensor_info("y", np.float32, ["batch", 3]),
                       tensor_info("z", np.float32, ["batch", 3])],
                      {"two": np.float32(2)}, name="two_inputs")


def _if_model():
    """y = If(c, then: x + w, else: If(c2, -x, x * w)), named nodes."""
    def branch(name, nodes, out):
        return helper.make_graph(nodes, name, [], [tensor_info(out, np.float32, [2])])

    inner = helper.make_node(
        "If", ["c2"], ["e"], name="inner_if",
        then_branch=branch("neg", [helper.make_node("Neg", ["x"], ["n"], name="neg")], "n"),
        else_branch=branch("mul", [helper.make_node("Mul", ["x", "w"], ["m"], name="mul")], "m"))
    outer = helper.make_node(
        "If", ["c"], ["y"], name="outer_if",
        then_branch=branch("then", [helper.make_node("Add", ["x", "w"], ["t"], name="plus")], "t"),
        else_branch=branch("else", [inner], "e"))
    return make_model([outer], [tensor_info("x", np.float32, [2]), tensor_info("c", np.bool_, []),
                                tensor_info("c2", np.bool_, [])],
                      [tensor_info("y", np.float32, [2])], {"w": np.array([10, 20], np.float32)})


def _loop_model(trips: int):
    """v = Loop(trips) { v + one } starting from zeros; `one` is read from the outer graph."""
    body = helper.make_graph(
        [helper.make_node("Identity", ["cond"], ["cond_out"], name="keep_going"),
         helper.make_node("Add", ["v", "one"], ["v_out"], name="step")],
        "body", [tensor_info("i", np.int64, []), tensor_info("cond", np.bool_, []),
                 tensor_info("v", np.float32, [2])],
        [tensor_info("cond_out", np.bool_, []), tensor_info("v_out", np.float32, [2])])
    loop = helper.make_node("Loop", ["m", "", "v0"], ["v"], name="loop", body=body)
    return make_model([loop], [tensor_info("v0", np.float32, [2])],
                      [tensor_info("v", np.float32, [2])],
                      {"m": np.array(trips, np.int64), "one": np.ones(2, np.float32)})


def _scan_model():
    """Running sum over the rows of x with Scan: state s, scan output the partial sums."""
    body = helper.make_graph(
        [helper.make_node("Add", ["s", "row"], ["s_out"], name="acc"),
         helper.make_node("Identity", ["s_out"], ["out"], name="emit")],
        "scan_body", [tensor_info("s", np.float32, [2]), tensor_info("row", np.float32, [2])],
        [tensor_info("s_out", np.float32, [2]), tensor_info("out", np.float32, [2])])
    scan = helper.make_node("Scan", ["s0", "x"], ["s", "partial"], name="scan", body=body,
                            num_scan_inputs=1)
    return make_model([scan], [tensor_info("s0", np.float32, [2]),
                               tensor_info("x", np.float32, [4, 2])],
                      [tensor_info("s", np.float32, [2]),
                       tensor_info("partial", np.float32, [4, 2])])


def _nodes(ctx):
    return [s for s in ctx.spans if s.category == "node"]


def test_disabled_is_the_default_and_records_nothing():
    import onnxkiln

    assert onnxkiln.TraceContext is TraceContext and onnxkiln.Span is Span
    s = InferenceSession.from_graph(_model())
    assert s._trace.enabled is False and TraceContext.disabled().enabled is False
    s.run({"a": A, "b": B})
    assert s._trace.spans == []


def test_disabled_runs_take_the_plain_function(monkeypatch):
    s = InferenceSession.from_graph(_model())
    monkeypatch.setattr(type(s._compiled), "hooked", lambda *a: pytest.fail("hooked run"))
    s.run({"a": A, "b": B})
    plain = s._compiled.source.split("def run_hooked")[0]
    assert "h." not in plain and "enabled" not in plain


def test_one_span_per_op_with_the_spec_attributes():
    ctx = TraceContext.in_memory()
    s = InferenceSession.builder().trace(ctx).from_graph(_model())
    s.run({"a": A, "b": B})
    nodes = _nodes(ctx)
    assert [n.name for n in nodes] == ["Add", "Relu", "Mul"]
    run = [x for x in ctx.spans if x.category == "session"]
    assert len(run) == 1 and run[0].name == "model_run"
    add = nodes[0]
    assert set(add.attributes) == STEP_KEYS
    assert {k: add.attributes[k] for k in STEP_KEYS - {"thread_id"}} == {
        "node_id": 0, "node": "add", "op_type": "Add", "domain": "ai.onnx", "provider": "cpu",
        "graph": "main", "kernel_variant": "add.numpy",
        "input_shapes": [(2, 3), (2, 3)], "input_dtypes": ["float32", "float32"],
        "output_shapes": [(2, 3)], "output_dtypes": ["float32"]}
    assert nodes[2].attributes["input_shapes"] == [(2, 3), ()]  # the scalar constant
    for n in nodes:
        assert n.parent_id == run[0].span_id
        assert run[0].start_ns <= n.start_ns <= n.end_ns <= run[0].end_ns
    assert len({x.span_id for x in ctx.spans}) == 4
    s.run({"a": A, "b": B})
    assert len(_nodes(ctx)) == 6 and len(ctx.spans) == 8


def test_if_body_ops_are_child_spans_of_their_node():
    ctx = TraceContext.in_memory()
    s = InferenceSession.builder().trace(ctx).from_graph(_if_model())
    x = np.array([1.5, -2], np.float32)
    np.testing.assert_array_equal(
        s.run({"x": x, "c": np.array(False), "c2": np.array(True)})[0], -x)
    by_name = {sp.attributes["node"]: sp for sp in _nodes(ctx)}
    assert set(by_name) == {"outer_if", "inner_if", "neg"}
    assert by_name["inner_if"].parent_id == by_name["outer_if"].span_id
    assert by_name["neg"].parent_id == by_name["inner_if"].span_id
    assert by_name["inner_if"].attributes["graph"] == "outer_if.else_branch"
    assert by_name["neg"].attributes["graph"] == "inner_if.then_branch"
    assert by_name["outer_if"].attributes["kernel_variant"] == "if.subgraph"
    assert by_name["outer_if"].start_ns <= by_name["neg"].start_ns
    assert by_name["neg"].end_ns <= by_name["outer_if"].end_ns
    assert active_context() is None


def test_loop_of_100_iterations_has_100_child_spans_per_body_op():
    ctx = TraceContext.in_memory()
    s = InferenceSession.builder().trace(ctx).from_graph(_loop_model(100))
    np.testing.assert_array_equal(s.run({"v0": np.zeros(2, np.float32)})[0], [100, 100])
    assert s.control_flow_stats().subgraph_builds == 1
    assert s.control_flow_stats().subgraph_runs == 100
    loop = next(sp for sp in _nodes(ctx) if sp.name == "Loop")
    children = [sp for sp in _nodes(ctx) if sp.parent_id == loop.span_id]
    assert len(children) == 200 and len(_nodes(ctx)) == 201
    assert sorted({c.attributes["node"] for c in children}) == ["keep_going", "step"]
    assert {c.attributes["graph"] for c in children} == {"loop.body"}


def test_scan_body_ops_are_child_spans():
    ctx = TraceContext.in_memory()
    s = InferenceSession.builder().trace(ctx).from_graph(_scan_model())
    x = np.arange(8, dtype=np.float32).reshape(4, 2)
    _, partial = s.run({"s0": np.zeros(2, np.float32), "x": x})
    np.testing.assert_array_equal(partial, np.cumsum(x, axis=0))
    scan = next(sp for sp in _nodes(ctx) if sp.name == "Scan")
    children = [sp for sp in _nodes(ctx) if sp.parent_id == scan.span_id]
    assert [c.attributes["node"] for c in children] == ["acc", "emit"] * 4
    assert children[0].attributes["input_shapes"] == [(2,), (2,)]


def _custom_relu_session(monkeypatch, run_factory, ctx, shape=(2, 2)):
    """A session whose Relu is `run_factory(info)` from a registry of its own."""
    from onnxkiln import builder as builder_module
    from onnxkiln.partition import Placement
    from onnxkiln.providers.base import KernelRegistry
    from onnxkiln.providers.cpu.provider import CpuProvider
    from onnxkiln.types import DeviceId, DeviceType

    registry = KernelRegistry("cpu")
    registry.kernel("Relu", factory=True, variant="relu.fast")(run_factory)

    class Custom(CpuProvider):
        pass

    Custom.registry = registry
    placement = Placement((Custom(), CpuProvider()), DeviceId(DeviceType.CPU), "cpu", None)
    monkeypatch.setattr(builder_module, "select_providers", lambda *_: placement)
    model = make_model([helper.make_node("Relu", ["x"], ["y"])],
                       [tensor_info("x", np.float32, list(shape))],
                       [tensor_info("y", np.float32, list(shape))])
    return InferenceSession.builder().trace(ctx).from_graph(model)


def test_kernel_variant_and_reason_come_from_the_kernel(monkeypatch):
    from onnxkiln.providers.base import report_variant

    def relu(info):
        def run(x):
            fast = x.flags.c_contiguous
            report_variant("relu.fast" if fast else "relu.strided",
                           None if fast else "input is not C-contiguous")
            return np.maximum(x, 0)
        return run

    ctx = TraceContext.in_memory()
    s = _custom_relu_session(monkeypatch, relu, ctx)
    x = np.array([[1, -1], [-2, 2]], np.float32)
    s.run({"x": x})
    s.run({"x": np.asfortranarray(x.T)})
    first, second = _nodes(ctx)
    assert first.attributes["kernel_variant"] == "relu.fast"
    assert "kernel_variant_reason" not in first.attributes
    assert second.attributes["kernel_variant"] == "relu.strided"
    assert second.attributes["kernel_variant_reason"] == "input is not C-contiguous"


def test_two_threads_with_different_shapes_trace_their_own_variants(monkeypatch):
    """Each call reports its variant, then waits until the other thread's call has reported
    too: a report shared between threads would show one thread the other's variant."""
    import threading

    from onnxkiln.providers.base import report_variant

    both = threading.Barrier(2, timeout=10)

    def relu(info):
        def run(x):
            report_variant(f"relu.rows{x.shape[0]}")
            both.wait()
            return np.maximum(x, 0)
        return run

    ctx = TraceContext.in_memory()
    s = _custom_relu_session(monkeypatch, relu, ctx, shape=("n", 2))
    errors = []

    def call(rows):
        try:
            s.run({"x": np.ones((rows, 2), np.float32)})
        except Exception as e:  # reported below: a thread's exception is otherwise lost
            errors.append(e)

    threads = [threading.Thread(target=call, args=(rows,)) for rows in (1, 3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    seen = {(n.attributes["input_shapes"][0][0], n.attributes["kernel_variant"])
            for n in _nodes(ctx)}
    assert seen == {(1, "relu.rows1"), (3, "relu.rows3")}


def test_a_report_from_an_untraced_call_is_not_taken_by_the_next_traced_step():
    from onnxkiln.providers.base import report_variant

    report_variant("stale.variant", "left by a call outside any trace")
    ctx = TraceContext.in_memory()
    s = InferenceSession.builder().trace(ctx).from_graph(_model())
    s.run({"a": A, "b": B})
    assert [n.attributes["kernel_variant"] for n in _nodes(ctx)] == [
        "add.numpy", "relu.numpy", "mul.numpy"]


def test_chrome_trace_is_an_ort_style_json_array(tmp_path):
    path = tmp_path / "trace.json"
    with TraceContext.chrome(path) as ctx:
        s = InferenceSession.builder().trace(ctx).from_graph(_model())
        s.run({"a": A, "b": B})
        s.run({"a": A[:1], "b": B[:1]})
    assert ctx.enabled is False
    events = json.loads(path.read_text())
    assert isinstance(events, list) and len(events) == 8
    assert [e["ts"] for e in events] == sorted(e["ts"] for e in events)
    for e in events:
        assert {"cat", "pid", "tid", "dur", "ts", "ph", "name", "args"} <= set(e)
        assert e["ph"] == "X" and e["dur"] >= 0 and e["ts"] >= 0
        assert all(isinstance(e[k], int | float) for k in ("ts", "dur", "pid", "tid"))
    nodes = [e for e in events if e["cat"] == "Node"]
    assert [e["name"] for e in nodes] == ["add_kernel_time", "relu_kernel_time",
                                          "double_kernel_time"] * 2
    assert all(set(e["args"]) == CHROME_ARGS for e in nodes)
    add = nodes[0]["args"]
    assert add["op_name"] == "Add" and add["provider"] == "CPUExecutionProvider"
    assert add["input_type_shape"] == [{"float": [2, 3]}, {"float": [2, 3]}]
    assert add["output_type_shape"] == [{"float": [2, 3]}]
    assert add["kernel_variant"] == "add.numpy" and add["node_index"] == "0"
    assert nodes[3]["args"]["input_type_shape"] == [{"float": [1, 3]}, {"float": [1, 3]}]
    assert [e["name"] for e in events if e["cat"] == "Session"] == ["model_run"] * 2
    s.run({"a": A, "b": B})  # closed: nothing more is recorded
    assert len(ctx.spans) == 8


def test_chrome_child_events_nest_inside_their_parent(tmp_path):
    ctx = TraceContext.chrome(tmp_path / "t.json")
    s = InferenceSession.builder().trace(ctx).from_graph(_if_model())
    s.run({"x": np.ones(2, np.float32), "c": np.array(False), "c2": np.array(False)})
    ctx.flush()
    events = {e["name"]: e for e in json.loads((tmp_path / "t.json").read_text())}
    assert set(events) == {"model_run", "outer_if_kernel_time", "inner_if_kernel_time",
                           "mul_kernel_time"}
    for child, parent in (("mul", "inner_if"), ("inner_if", "outer_if")):
        c, p = events[f"{child}_kernel_time"], events[f"{parent}_kernel_time"]
        assert p["ts"] <= c["ts"] and c["ts"] + c["dur"] <= p["ts"] + p["dur"] + 1e-3
        assert c["tid"] == p["tid"]
    assert events["mul_kernel_time"]["args"]["graph"] == "inner_if.else_branch"
    ctx.close()


def test_chrome_event_fields_match_onnxruntime_profile(tmp_path):
    ort = pytest.importorskip("onnxruntime")
    model_path = tmp_path / "m.onnx"
    model_path.write_bytes(_model().SerializeToString())
    options = ort.SessionOptions()
    options.enable_profiling = True
    options.profile_file_prefix = str(tmp_path / "ort")
    session = ort.InferenceSession(str(model_path), options, providers=["CPUExecutionProvider"])
    session.run(None, {"a": A, "b": B})
    with open(session.end_profiling()) as f:
        theirs = json.load(f)
    their_node = next(e for e in theirs if e["name"].endswith("_kernel_time"))
    with TraceContext.chrome(tmp_path / "ours.json") as ctx:
        InferenceSession.builder().trace(ctx).load(model_path).run({"a": A, "b": B})
    ours = json.loads((tmp_path / "ours.json").read_text())
    our_node = next(e for e in ours if e["name"].endswith("_kernel_time"))
    assert set(their_node) == set(our_node)
    shared = {"op_name", "provider", "input_type_shape", "output_type_shape", "node_index"}
    assert shared <= set(their_node["args"]) and shared <= set(our_node["args"])
    assert their_node["args"]["provider"] == our_node["args"]["provider"]


def test_chrome_trace_is_written_at_interpreter_exit(tmp_path):
    path = tmp_path / "exit.json"
    script = (
        "import numpy as np, onnx, sys\n"
        "from onnxkiln import InferenceSession\nfrom onnxkiln.trace import TraceContext\n"
        f"ctx = TraceContext.chrome({str(path)!r})\n"
        f"s = InferenceSession.builder().trace(ctx).load({str(tmp_path / 'm.onnx')!r})\n"
        "s.run({'a': np.ones((1, 3), np.float32), 'b': np.ones((1, 3), np.float32)})\n"
    )
    (tmp_path / "m.onnx").write_bytes(_model().SerializeToString())
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert len(json.loads(path.read_text())) == 4


def test_opentelemetry_spans_nest_under_the_callers_span():
    pytest.importorskip("opentelemetry.sdk", reason="opentelemetry-sdk is not installed")
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("test")
    ctx = TraceContext.opentelemetry(tracer)
    assert ctx.enabled and ctx.kind == "otel"
    s = InferenceSession.builder().trace(ctx).from_graph(_if_model())
    with tracer.start_as_current_span("request") as request:
        s.run({"x": np.ones(2, np.float32), "c": np.array(False), "c2": np.array(True)})
    spans = {sp.name: sp for sp in exporter.get_finished_spans()}
    assert set(spans) == {"request", "model_run", "If", "Neg"}
    assert len(exporter.get_finished_spans()) == 5
    ifs = [sp for sp in exporter.get_finished_spans() if sp.name == "If"]
    outer = next(sp for sp in ifs if sp.attributes["node"] == "outer_if")
    inner = next(sp for sp in ifs if sp.attributes["node"] == "inner_if")
    assert spans["model_run"].parent.span_id == request.get_span_context().span_id
    assert outer.parent.span_id == spans["model_run"].context.span_id
    assert inner.parent.span_id == outer.context.span_id
    assert spans["Neg"].parent.span_id == inner.context.span_id
    neg = spans["Neg"].attributes
    assert neg["node"] == "neg" and neg["provider"] == "cpu"
    assert neg["graph"] == "inner_if.then_branch"
    assert tuple(neg["input_shapes"]) == ("2",) and tuple(neg["input_dtypes"]) == ("float32",)
    assert neg["kernel_variant"] == "neg.numpy"
    assert spans["Neg"].start_time <= spans["Neg"].end_time <= outer.end_time
    assert ctx.spans == []


def test_opentelemetry_missing_is_a_clear_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "opentelemetry", None)
    with pytest.raises(ImportError, match=r"pip install 'onnxkiln\[otel\]'"):
        TraceContext.opentelemetry()


def test_trace_takes_only_a_trace_context():
    with pytest.raises(InvalidOptionError, match="trace takes a TraceContext"):
        InferenceSession.builder().trace("trace.json")
    s = InferenceSession.from_graph(_model())
    with pytest.raises(InvalidOptionError, match="trace takes a TraceContext"):
        s.set_trace_context(None)


def test_set_trace_context_switches_tracing_on_and_off():
    s = InferenceSession.from_graph(_model())
    ctx = TraceContext.in_memory()
    s.set_trace_context(ctx)
    s.run({"a": A, "b": B})
    s.set_trace_context(TraceContext.disabled())
    s.run({"a": A, "b": B})
    assert len(ctx.spans) == 4
    ctx.clear()
    assert ctx.spans == []


def test_a_failing_kernel_still_raises_kernel_error_and_resets_the_thread_state():
    model = make_model([helper.make_node("Gather", ["d", "i"], ["y"], name="lookup")],
                       [tensor_info("d", np.float32, [3]), tensor_info("i", np.int64, [1])],
                       [tensor_info("y", np.float32, [1])])
    ctx = TraceContext.in_memory()
    s = InferenceSession.builder().trace(ctx).from_graph(model)
    with pytest.raises(KernelError, match="node 'lookup'"):
        s.run({"d": np.zeros(3, np.float32), "i": np.array([9])})
    assert active_context() is None
    assert [sp.name for sp in ctx.spans] == ["model_run"]


def test_traced_runs_from_threads_keep_their_own_parents():
    ctx = TraceContext.in_memory()
    s = InferenceSession.builder().trace(ctx).from_graph(_if_model())
    feeds = {"x": np.ones(2, np.float32), "c": np.array(False), "c2": np.array(True)}

    def work():
        for _ in range(20):
            s.run(feeds)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    by_id = {sp.span_id: sp for sp in ctx.spans}
    assert len(ctx.spans) == 80 * 4
    for sp in ctx.spans:
        if sp.parent_id is not None:
            assert by_id[sp.parent_id].attributes["thread_id"] == sp.attributes["thread_id"]


def test_summarize_counts_self_time_per_op_and_node():
    def span(sid, parent, name, node, start, end, cat="node", graph="main"):
        return Span(name, cat, start, end, {"node": node, "graph": graph}, sid, parent)

    spans = [
        span(1, None, "model_run", "", 0, 100, cat="session"),
        span(2, 1, "If", "branch", 10, 60),
        span(3, 2, "Add", "add", 20, 30, graph="branch.then_branch"),
        span(4, 2, "Add", "add", 30, 45, graph="branch.then_branch"),
        span(5, 1, "Add", "add", 70, 90),
    ]
    p = summarize(spans)
    assert (p.runs, p.run_ns) == (1, 100)
    assert {k: (v.count, v.self_ns) for k, v in p.by_op.items()} == {
        "If": (1, 25), "Add": (3, 45)}
    assert {k: (v.count, v.self_ns) for k, v in p.by_node.items()} == {
        "branch": (1, 25), "branch.then_branch/add": (2, 25), "add": (1, 20)}


def test_a_fused_node_span_names_the_model_nodes_it_replaced(tmp_path):
    model = make_model(
        [helper.make_node("MatMul", ["x", "w"], ["t"], name="mm"),
         helper.make_node("Add", ["t", "b"], ["u"], name="bias"),
         helper.make_node("Relu", ["u"], ["y"], name="act")],
        [tensor_info("x", np.float32, [2, 3])], [tensor_info("y", np.float32, [2, 2])],
        {"w": np.ones((3, 2), np.float32), "b": np.ones(2, np.float32)})
    ctx = TraceContext.chrome(tmp_path / "t.json")
    s = InferenceSession.builder().trace(ctx).from_graph(model)
    s.run({"x": np.ones((2, 3), np.float32)})
    ctx.close()
    (node,) = _nodes(ctx)
    assert node.name == "FusedGemm" and node.attributes["fused_from"] == ["mm", "bias", "act"]
    assert summarize(ctx.spans).by_node["FusedGemm"].fused_from == ("mm", "bias", "act")
    (event,) = [e for e in json.loads((tmp_path / "t.json").read_text()) if e["cat"] == "Node"]
    assert event["args"]["fused_from"] == ["mm", "bias", "act"]


def test_every_hooks_class_is_a_step_hooks():
    """The hooked run's protocol: each class a run passes as hooks declares all three."""
    from onnxkiln import decode, executor, memory, replay, specialize, trace

    classes = [executor.CancelHook, executor.HookPair, trace.StepTracer, memory.MemoryTracker,
               replay.Recorder, specialize._Recorder, decode._Recorder]
    for cls in classes:
        for name in ("sizing", "start", "finish"):
            assert callable(getattr(cls, name, None)), f"{cls.__qualname__} lacks {name}"
    ctx = TraceContext.in_memory()
    s = InferenceSession.builder().trace(ctx).from_graph(_model())
    tracer = s._compiled.tracer(ctx)
    assert isinstance(tracer, executor.StepHooks)
    assert isinstance(executor.combine_hooks(tracer, None), executor.StepHooks)
    assert not isinstance(object(), executor.StepHooks)
