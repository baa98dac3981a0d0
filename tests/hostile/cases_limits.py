"""Limits that hold: a `memory_limit` refuses a run before it allocates past it (sizes from
run-time values, control-flow bodies, a plain large Add), creating a session costs nothing
proportional to its tensors' sizes, and `timeout=` ends a Loop that never stops.

onnxruntime has neither a memory limit nor a run timeout, so those cases are onnxkiln's
only (on_ort=False); each sets the case's memory bound well under what an unchecked run
would allocate, so a limit that does not hold shows as "oom", not as "ok".
"""

from __future__ import annotations

import time

import numpy as np
from harness import case
from onnx import TensorProto, helper

MB = 1 << 20
LIMIT = 64 * MB
BOUND = 512 * MB  # the case's address-space bound: an unchecked run goes past it
F = TensorProto.FLOAT
I64 = TensorProto.INT64


def _vi(name, elem, shape):
    return helper.make_tensor_value_info(name, elem, shape)


def _model(nodes, inputs, outputs, initializers=()) -> bytes:
    graph = helper.make_graph(nodes, "g", inputs, outputs, list(initializers))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)]
                             ).SerializeToString()


def _refused(rt, model: bytes, feeds: dict, *nodes: str) -> None:
    """Run under LIMIT; it must stop with MemoryLimitError naming one of `nodes` (running out
    of the case's memory bound first, a KernelError, is a limit that did not hold)."""
    session = rt.kiln.InferenceSession.builder().memory_limit(LIMIT).load_bytes(model)
    try:
        session.run_outputs(feeds)
    except rt.kiln.MemoryLimitError as e:
        assert any(f"at node '{node}'" in str(e) for node in nodes), str(e)
        raise
    except rt.kiln.SessionError as e:
        raise AssertionError(f"not stopped by the memory limit: {e}") from e
    raise AssertionError("the run finished past its memory limit")


def _i64(v):
    return np.array(v, np.int64)


def _reshaped(op, **attrs) -> bytes:
    """`op` over two vectors reshaped to [n, 1] and [1, n] by shapes given at run time."""
    nodes = [helper.make_node("Reshape", ["a", "sa"], ["a2"]),
             helper.make_node("Reshape", ["b", "sb"], ["b2"]),
             helper.make_node(op, ["a2", "b2"], ["y"], name="outer", **attrs)]
    return _model(nodes, [_vi("a", F, ["n"]), _vi("b", F, ["m"]), _vi("sa", I64, [2]),
                          _vi("sb", I64, [2])], [_vi("y", F, ["p", "q"])])


_SIDE = 16384  # the outer product: 1 GiB of float32
_OUTER = {"a": np.ones(_SIDE, np.float32), "b": np.ones(_SIDE, np.float32),
          "sa": _i64([_SIDE, 1]), "sb": _i64([1, _SIDE])}


@case("memory limit holds", "refused", on_ort=False, memory=BOUND)
def case_limit_gemm_outer_product(rt, tmp):
    """Gemm of [n, 1] x [1, n] shaped at run time: 1 GiB under a 64 MiB limit."""
    _refused(rt, _reshaped("Gemm"), _OUTER, "outer")


@case("memory limit holds", "refused", on_ort=False, memory=BOUND)
def case_limit_einsum_outer_product(rt, tmp):
    """Einsum ik,kj->ij of run-time shaped vectors: 1 GiB under a 64 MiB limit."""
    _refused(rt, _reshaped("Einsum", equation="ik,kj->ij"), _OUTER, "outer")


def _sized(op, inputs, feeds, rank) -> tuple[bytes, dict]:
    node = helper.make_node(op, [i.name for i in inputs], ["y"], name="sized")
    return _model([node], inputs, [_vi("y", F, [f"d{k}" for k in range(rank)])]), feeds


@case("memory limit holds", "refused", on_ort=False, memory=BOUND)
def case_limit_hann_window_size(rt, tmp):
    """HannWindow of a size given at run time (256M samples)."""
    _refused(rt, *_sized("HannWindow", [_vi("n", I64, [])], {"n": _i64(256 * MB)}, 1), "sized")


@case("memory limit holds", "refused", on_ort=False, memory=BOUND)
def case_limit_blackman_window_size(rt, tmp):
    """BlackmanWindow of a size given at run time (256M samples)."""
    _refused(rt, *_sized("BlackmanWindow", [_vi("n", I64, [])], {"n": _i64(256 * MB)}, 1),
             "sized")


@case("memory limit holds", "refused", on_ort=False, memory=BOUND)
def case_limit_mel_weight_matrix_size(rt, tmp):
    """MelWeightMatrix with 16K mel bins over a 64K-point DFT, sizes given at run time."""
    inputs = [_vi("bins", I64, []), _vi("dft", I64, []), _vi("rate", I64, []),
              _vi("lo", F, []), _vi("hi", F, [])]
    feeds = {"bins": _i64(16384), "dft": _i64(65536), "rate": _i64(16000),
             "lo": np.array(0, np.float32), "hi": np.array(8000, np.float32)}
    _refused(rt, *_sized("MelWeightMatrix", inputs, feeds, 2), "sized")


@case("memory limit holds", "refused", on_ort=False, memory=BOUND)
def case_limit_dft_length(rt, tmp):
    """DFT of 16 samples with a dft_length of 64M given at run time."""
    inputs = [_vi("x", F, [1, "n", 1]), _vi("len", I64, [])]
    feeds = {"x": np.ones((1, 16, 1), np.float32), "len": _i64(64 * MB)}
    _refused(rt, *_sized("DFT", inputs, feeds, 3), "sized")


_ITER = [_vi("i", I64, []), _vi("c", TensorProto.BOOL, [])]
_COND = helper.make_node("Identity", ["c"], ["c_out"])
_C_OUT = _vi("c_out", TensorProto.BOOL, [])


def _loop(body_nodes, body_ins, body_outs, loop_ins, loop_outs, outputs, before=(),
          after=()) -> bytes:
    body = helper.make_graph([_COND, *body_nodes], "body", [*_ITER, *body_ins],
                             [_C_OUT, *body_outs])
    loop = helper.make_node("Loop", loop_ins, loop_outs, name="loop", body=body)
    return _model([*before, loop, *after], [_vi("m", I64, []), _vi("x", F, ["n"])], outputs)


@case("memory limit holds", "refused", on_ort=False, memory=BOUND)
def case_limit_concat_doubling_in_loop(rt, tmp):
    """A Loop whose body doubles its carried value with Concat(x, x), 40 times."""
    model = _loop([helper.make_node("Concat", ["xc", "xc"], ["xc_out"], name="doubling",
                                    axis=0)],
                  [_vi("xc", F, ["k"])], [_vi("xc_out", F, ["k2"])], ["m", "", "x"], ["y"],
                  [_vi("y", F, ["p"])])
    _refused(rt, model, {"m": _i64(40), "x": np.ones(1024, np.float32)}, "doubling")


@case("memory limit holds", "refused", on_ort=False, memory=BOUND)
def case_limit_loop_scan_outputs(rt, tmp):
    """A Loop stacking a fresh 4 MiB scan output per iteration, 10K iterations."""
    model = _loop([helper.make_node("Add", ["x", "x"], ["s"], name="fresh")], [],
                  [_vi("s", F, ["k"])], ["m", ""], ["y"], [_vi("y", F, ["p", "q"])])
    # the body's Add (its base holds the outputs stacked so far) or the Loop's own check
    _refused(rt, model, {"m": _i64(10_000), "x": np.ones(MB, np.float32)}, "fresh", "loop")


@case("memory limit holds", "refused", on_ort=False, memory=BOUND)
def case_limit_sequence_insert_in_loop(rt, tmp):
    """A Loop inserting a fresh 4 MiB tensor into a carried sequence, 10K iterations."""
    seq = helper.make_tensor_sequence_value_info
    model = _loop([helper.make_node("Add", ["x", "x"], ["s"], name="fresh"),
                   helper.make_node("SequenceInsert", ["seq", "s"], ["seq_out"], name="insert")],
                  [seq("seq", F, ["k"])], [seq("seq_out", F, ["k"])], ["m", "", "s0"], ["all"],
                  [_vi("y", I64, [])],
                  before=[helper.make_node("SequenceEmpty", [], ["s0"], dtype=F)],
                  after=[helper.make_node("SequenceLength", ["all"], ["y"])])
    _refused(rt, model, {"m": _i64(10_000), "x": np.ones(MB, np.float32)}, "insert")


@case("memory limit holds", "refused", on_ort=False, memory=BOUND)
def case_limit_plain_large_add(rt, tmp):
    """Add of two 24 MiB vectors: inputs plus output are over a 64 MiB limit."""
    node = helper.make_node("Add", ["a", "b"], ["y"], name="add")
    model = _model([node], [_vi("a", F, ["n"]), _vi("b", F, ["n"])], [_vi("y", F, ["n"])])
    vec = np.ones(6 * MB, np.float32)
    _refused(rt, model, {"a": vec, "b": vec.copy()}, "add")


@case("creation cost independent of tensor sizes", "ok", timeout=20, memory=BOUND)
def case_load_static_40m_input(rt, tmp):
    """A model of Add/Relu/Identity over a static float32[40000000] input: created at once."""
    n = 40_000_000
    nodes = [helper.make_node("Add", ["x", "x"], ["a"]), helper.make_node("Relu", ["a"], ["r"]),
             helper.make_node("Shape", ["x"], ["s"]),
             helper.make_node("ConstantOfShape", ["s"], ["z"]),
             helper.make_node("Add", ["r", "z"], ["w"]), helper.make_node("Identity", ["w"], ["y"])]
    model = _model(nodes, [_vi("x", F, [n])], [_vi("y", F, [n])])
    start = time.perf_counter()
    sess = rt.ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    took = time.perf_counter() - start
    assert sess.get_inputs()[0].shape == [n], sess.get_inputs()[0].shape
    assert took < 10, f"creation took {took:.1f} s"


def _forever() -> bytes:
    body = helper.make_graph(
        [_COND, helper.make_node("Identity", ["xc"], ["xc_out"])], "body",
        [*_ITER, _vi("xc", F, [1])], [_C_OUT, _vi("xc_out", F, [1])])
    loop = helper.make_node("Loop", ["", "cond", "x"], ["y"], name="forever", body=body)
    cond = helper.make_tensor("cond", TensorProto.BOOL, [], [True])
    return _model([loop], [_vi("x", F, [1])], [_vi("y", F, [1])], [cond])


@case("run timeout", "refused", on_ort=False, timeout=20)
def case_timeout_forever_loop(rt, tmp):
    """loop:forever (no trip count, cond always true) run with timeout=1: ends at ~1 s."""
    session = rt.kiln.InferenceSession.load_bytes(_forever())
    start = time.perf_counter()
    try:
        session.run({"x": np.zeros(1, np.float32)}, timeout=1.0)
    except rt.kiln.RunTimeoutError:
        took = time.perf_counter() - start
        assert took < 3, f"stopped after {took:.1f} s"
        raise


@case("run timeout", "refused", on_ort=False, timeout=20)
def case_timeout_forever_loop_run_options(rt, tmp):
    """The same Loop through RunOptions' config entry kiln.run.timeout_s = 1 (onnxruntime
    ignores the entry and runs forever)."""
    sess = rt.ort.InferenceSession(_forever(), providers=["CPUExecutionProvider"])
    options = rt.ort.RunOptions()
    options.add_run_config_entry("kiln.run.timeout_s", "1")
    start = time.perf_counter()
    try:
        sess.run(None, {"x": np.zeros(1, np.float32)}, options)
    except rt.kiln.RunTimeoutError:
        took = time.perf_counter() - start
        assert took < 3, f"stopped after {took:.1f} s"
        raise
