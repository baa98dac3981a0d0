"""The compiled (numba) time loops of LSTM, GRU and RNN against onnxruntime and against the
numpy loop, on a grid of cases and on hypothesis-drawn ones; the variants traces name, the
fallbacks, and the product forms (BLAS and the dot loop)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from onnxkiln import InferenceSession
from onnxkiln.providers.base import NodeInfo, reported_variant
from onnxkiln.providers.cpu import _numba, rnn_fast
from onnxkiln.providers.cpu.registry import REGISTRY
from onnxkiln.testing import node_model, run_ort
from onnxkiln.trace import TraceContext

GATES = {"RNN": 1, "GRU": 3, "LSTM": 4}
RTOL, ATOL = 1e-5, 1e-6  # float32, outputs of magnitude <= 1


@pytest.fixture
def numba_on(monkeypatch):
    pytest.importorskip("numba", reason="numba (the `fast` extra) is not installed")
    monkeypatch.delenv(_numba.ENV, raising=False)
    monkeypatch.setattr(_numba, "ENABLED", True)
    assert _numba.disabled_reason() is None


def case(op, *, direction="forward", T=5, B=2, n_in=6, H=8, bias=True, seq=None, init=False,
         peep=False, layout=0, dtype=np.float32, consts=True, n_out=None, seed=0, **attrs):
    """(model, feeds) for one recurrent node; W, R, B, P initializers when `consts`."""
    rng = np.random.default_rng(seed)
    d = 2 if direction == "bidirectional" else 1
    g = GATES[op]
    s = 1 / np.sqrt(H)
    x_shape = (T, B, n_in) if layout == 0 else (B, T, n_in)
    state = (d, B, H) if layout == 0 else (B, d, H)
    values = {
        "X": rng.standard_normal(x_shape),
        "W": rng.uniform(-2 * s, 2 * s, (d, g * H, n_in)),
        "R": rng.uniform(-2 * s, 2 * s, (d, g * H, H)),
        "B": rng.uniform(-s, s, (d, 2 * g * H)) if bias else None,
        "L": None if seq is None else np.array(seq, np.int32),
        "h0": rng.standard_normal(state) if init else None,
        "c0": rng.standard_normal(state) if init and op == "LSTM" else None,
        "P": rng.uniform(-s, s, (d, 3 * H)) if peep and op == "LSTM" else None,
    }
    order = ["X", "W", "R", "B", "L", "h0"] + (["c0", "P"] if op == "LSTM" else [])
    names = [k if values[k] is not None else "" for k in order]
    while names[-1] == "":
        names.pop()
    cast = {k: v if k == "L" else v.astype(dtype) for k, v in values.items() if v is not None}
    fixed = {"W", "R", "B", "P"} if consts else set()
    feeds = {k: v for k, v in cast.items() if k not in fixed}
    inits = {k: v for k, v in cast.items() if k in fixed}
    if layout:
        attrs["layout"] = layout
    model = node_model(op, feeds, n_outputs=n_out or (3 if op == "LSTM" else 2), opset=14,
                       initializers=inits, input_names=names, hidden_size=H,
                       direction=direction, **attrs)
    return model, feeds


def session(model, trace=None):
    b = InferenceSession.builder().intra_op_threads(1)
    return (b.trace(trace) if trace is not None else b).from_graph(model)


def compiled(model, feeds, runs=3):
    """Outputs of `runs` runs (the later ones on the specialised plan) and each run's variant."""
    ctx = TraceContext.in_memory()
    s = session(model, ctx)
    outs = [s.run(dict(feeds)) for _ in range(runs)]
    variants = [(sp.attributes["kernel_variant"], sp.attributes.get("kernel_variant_reason"))
                for sp in ctx.spans if sp.category == "node"]
    return outs, variants


def numpy_loop(model, feeds, monkeypatch):
    monkeypatch.setattr(_numba, "ENABLED", False)
    try:
        return session(model).run(dict(feeds))
    finally:
        monkeypatch.setattr(_numba, "ENABLED", True)


def close(got, want, what, rtol=RTOL, atol=ATOL):
    assert len(got) == len(want), what
    for i, (a, b) in enumerate(zip(got, want)):
        b = np.asarray(b)
        assert a.dtype == b.dtype and a.shape == b.shape, (what, i, a.shape, b.shape)
        np.testing.assert_allclose(a, b, rtol=rtol, atol=atol, err_msg=f"{what}: output {i}")


def check(model, feeds, monkeypatch, ort=True, variant=None, atol=ATOL):
    """Compiled runs against onnxruntime (when it has the case) and the numpy loop."""
    runs, variants = compiled(model, feeds)
    slow = numpy_loop(model, feeds, monkeypatch)
    for out in runs:
        close(out, slow, "compiled vs numpy loop", atol=atol)
    if ort:
        close(runs[-1], run_ort(model, feeds), "compiled vs onnxruntime", atol=atol)
    for v, reason in variants:
        assert v == variant if variant else ".numba." in v, variants
        assert reason is None, variants
    return runs[-1]


# ----------------------------------------------------------------------------- the grid

GRID = [
    {},
    {"direction": "reverse"},
    {"direction": "bidirectional"},
    {"B": 1, "T": 1, "H": 1, "n_in": 1},
    {"bias": False},
    {"init": True},
    {"seq": [5, 2], "init": True},
    {"seq": [3, 0], "direction": "reverse", "init": True},
    {"seq": [1, 4], "direction": "bidirectional"},
    {"clip": 0.4, "init": True},
    {"clip": 0.4, "seq": [2, 5], "direction": "bidirectional"},
    {"B": 4, "T": 12, "H": 33, "n_in": 7, "direction": "bidirectional", "seq": [12, 3, 7, 1]},
    {"consts": False},
    {"consts": False, "direction": "bidirectional", "seq": [4, 5], "init": True},
]
IDS = ["plain", "reverse", "bidi", "tiny", "nobias", "init", "seqlens", "seq_zero_reverse",
       "seq_bidi", "clip", "clip_seq_bidi", "odd_sizes", "weights_as_inputs",
       "inputs_bidi_seq"]


@pytest.mark.parametrize("op", list(GATES))
@pytest.mark.parametrize("config", GRID, ids=IDS)
def test_grid(op, config, numba_on, monkeypatch):
    model, feeds = case(op, **config)
    check(model, feeds, monkeypatch)


@pytest.mark.parametrize("config", [{}, {"direction": "bidirectional", "seq": [3, 5]},
                                    {"clip": 0.3, "init": True}, {"consts": False}])
@pytest.mark.parametrize("input_forget", [0, 1])
def test_lstm_peepholes_input_forget(config, input_forget, numba_on, monkeypatch):
    model, feeds = case("LSTM", peep=True, input_forget=input_forget, **config)
    check(model, feeds, monkeypatch)


@pytest.mark.parametrize("config", [{}, {"direction": "bidirectional", "seq": [4, 1]},
                                    {"clip": 0.3, "init": True}, {"bias": False},
                                    {"consts": False, "direction": "reverse"}])
def test_gru_linear_before_reset(config, numba_on, monkeypatch):
    model, feeds = case("GRU", linear_before_reset=1, **config)
    check(model, feeds, monkeypatch)


@pytest.mark.parametrize("op", list(GATES))
@pytest.mark.parametrize("direction", ["forward", "bidirectional"])
def test_layout1(op, direction, numba_on, monkeypatch):
    # onnxruntime has no layout 1: against our compiled layout 0 on transposed data
    kw = {"direction": direction, "seq": [2, 5, 4], "init": True, "B": 3}
    model1, feeds1 = case(op, layout=1, **kw)
    model0, _ = case(op, **kw)
    feeds0 = {k: (v.transpose(1, 0, 2) if k in ("X", "h0", "c0") else v)
              for k, v in feeds1.items()}
    out1 = check(model1, feeds1, monkeypatch, ort=False)
    out0 = compiled(model0, feeds0)[0][-1]
    np.testing.assert_allclose(out1[0], out0[0].transpose(2, 0, 1, 3), rtol=RTOL, atol=ATOL)
    for a, b in zip(out1[1:], out0[1:]):
        np.testing.assert_allclose(a, b.transpose(1, 0, 2), rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize(("op", "acts"), [
    ("RNN", ["Relu"]), ("RNN", ["Sigmoid", "Relu"]),
    ("LSTM", ["Tanh", "Relu", "Sigmoid"]), ("GRU", ["Relu", "Sigmoid", "Tanh", "Tanh"]),
])
def test_other_compiled_activations(op, acts, numba_on, monkeypatch):
    direction = "bidirectional" if len(acts) == 2 * {"RNN": 1, "GRU": 2, "LSTM": 3}[op] \
        else "forward"
    model, feeds = case(op, direction=direction, init=True, seq=[5, 3], activations=acts)
    check(model, feeds, monkeypatch)


# ------------------------------------------------------------------- the product forms


@pytest.mark.parametrize("op", list(GATES))
@pytest.mark.parametrize("config", [{}, {"direction": "bidirectional", "seq": [5, 1, 3]},
                                    {"clip": 0.5, "init": True}])
def test_dot_loop(op, config, numba_on, monkeypatch):
    # the dot loop forced at small sizes (it is chosen for several rows and a large R)
    monkeypatch.setattr(rnn_fast, "product_mode", lambda batch, r_bytes: 1)
    extra = {"linear_before_reset": 1} if op == "GRU" and config else {}
    model, feeds = case(op, B=3, H=9, **config, **extra)
    check(model, feeds, monkeypatch, variant=f"{op.lower()}.numba.dot")


def test_dot_loop_chosen_for_large_weights(numba_on, monkeypatch):
    # R of 1 MB: the dot loop; W of 320 KB: the projection reads W itself
    model, feeds = case("LSTM", B=4, T=3, H=256, n_in=80, seq=[3, 1, 2, 3])
    check(model, feeds, monkeypatch, variant="lstm.numba.dot")


@pytest.mark.parametrize("op", list(GATES))
def test_large_input_weights(op, numba_on, monkeypatch):
    # W read in place (a transposed projection GEMM), R small: BLAS. Sums of 600 products
    # of magnitude ~1 differ by a few 1e-7 between BLAS builds: a wider absolute margin
    model, feeds = case(op, direction="bidirectional", T=4, H=40, n_in=600, seq=[4, 2])
    check(model, feeds, monkeypatch, variant=f"{op.lower()}.numba.blas", atol=1e-5)


def test_product_mode_thresholds():
    mb = 1 << 20
    assert rnn_fast.product_mode(1, mb - 4) == 0
    assert rnn_fast.product_mode(4, mb - 4) == 0
    assert rnn_fast.product_mode(1, mb) == 1
    assert rnn_fast.product_mode(8, 768 << 10) == 1
    assert rnn_fast.product_mode(8, 512 << 10) == 0


@pytest.mark.parametrize("op", list(GATES))
def test_large_weights_are_not_copied(op):
    # W read in place by the projection, R^T not laid out (the dot loop reads R itself)
    g = GATES[op]
    h = {"RNN": 512, "GRU": 384, "LSTM": 256}[op]  # one direction's R of 1 MB or more
    w = np.ones((1, g * h, 300), np.float32)
    r = np.ones((1, g * h, h), np.float32)
    wts = rnn_fast.prepare(op, w, r, None, None, 0, 1, None, np.dtype(np.float32))
    wt, _, rc, rt = wts.args[:4]
    assert wts.w_rows and np.shares_memory(wt, w) and np.shares_memory(rc, r)
    assert rt.size == 1 and rnn_fast.product_mode(1, wts.r_bytes) == 1


# ---------------------------------------------------------------------- hypothesis


@st.composite
def cases(draw):
    op = draw(st.sampled_from(list(GATES)))
    direction = draw(st.sampled_from(["forward", "reverse", "bidirectional"]))
    b, t = draw(st.integers(1, 4)), draw(st.integers(1, 9))
    kw = {"direction": direction, "B": b, "T": t, "H": draw(st.integers(1, 40)),
          "n_in": draw(st.integers(1, 12)), "bias": draw(st.booleans()),
          "init": draw(st.booleans()), "consts": draw(st.booleans()),
          "seed": draw(st.integers(0, 1000))}
    if draw(st.booleans()):
        kw["seq"] = draw(st.lists(st.integers(0, t), min_size=b, max_size=b))
    if draw(st.booleans()):
        kw["clip"] = draw(st.floats(0.1, 3.0))
    if op == "LSTM":
        kw["peep"] = draw(st.booleans())
        kw["input_forget"] = int(draw(st.booleans()))
    if op == "GRU":
        kw["linear_before_reset"] = int(draw(st.booleans()))
    return op, kw


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                  HealthCheck.function_scoped_fixture])
@given(drawn=cases())
def test_drawn_cases(drawn, numba_on, monkeypatch):
    op, kw = drawn
    model, feeds = case(op, **kw)
    check(model, feeds, monkeypatch)


# ------------------------------------------------------------- dtypes, outputs, inputs


@pytest.mark.parametrize("op", list(GATES))
def test_float64(op, numba_on, monkeypatch):
    kw = {"direction": "bidirectional", "seq": [5, 2], "init": True}
    model64, feeds64 = case(op, dtype=np.float64, **kw)
    model32, feeds32 = case(op, **kw)
    out64 = check(model64, feeds64, monkeypatch, ort=False)
    assert all(a.dtype == np.float64 for a in out64)
    for a, b in zip(out64, run_ort(model32, feeds32)):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


SUBSETS = [(op, keep) for op in GATES
           for keep in [(0,), (1,), (0, 1), (1, 2), (2,)] if max(keep) < (3 if op == "LSTM" else 2)]


@pytest.mark.parametrize(("op", "keep"), SUBSETS)
def test_output_subsets(op, keep, numba_on, monkeypatch):
    n_out = 3 if op == "LSTM" else 2
    model, feeds = case(op, seq=[5, 3], init=True)
    full = compiled(model, feeds)[0][-1]
    node = model.graph.node[0]
    for i in range(n_out):
        if i not in keep:
            node.output[i] = ""
    kept = [o for o in model.graph.output if o.name in set(node.output)]
    del model.graph.output[:]
    model.graph.output.extend(kept)
    for out in compiled(model, feeds)[0]:
        close(out, [full[i] for i in keep], f"outputs {keep}")


def test_inputs_not_modified(numba_on):
    model, feeds = case("LSTM", init=True, peep=True, seq=[5, 2], consts=False)
    copies = {k: v.copy() for k, v in feeds.items()}
    compiled(model, feeds)
    for k in feeds:
        np.testing.assert_array_equal(feeds[k], copies[k])


def test_nan_propagates_like_the_numpy_loop(numba_on, monkeypatch):
    model, feeds = case("GRU", direction="bidirectional", T=4)
    feeds["X"][2, 0, 1] = np.nan
    fast = compiled(model, feeds)[0][-1]
    slow = numpy_loop(model, feeds, monkeypatch)
    for a, b in zip(fast, slow):
        np.testing.assert_array_equal(np.isnan(a), np.isnan(b))
        assert np.isnan(a).any()


# ------------------------------------------------------------------------ fallbacks


def test_numba_switched_off_runs_the_numpy_loop(numba_on, monkeypatch):
    model, feeds = case("LSTM")
    monkeypatch.setattr(_numba, "ENABLED", False)
    _, variants = compiled(model, feeds, runs=2)
    assert {v for v, _ in variants} == {"lstm.numpy"}
    assert all("ENABLED = False" in reason for _, reason in variants)


def test_other_activations_run_the_numpy_loop(numba_on, monkeypatch):
    model, feeds = case("GRU", activations=["HardSigmoid", "Tanh"])
    runs, variants = compiled(model, feeds)
    assert {v for v, _ in variants} == {"gru.numpy"}
    assert "sigmoid, tanh or relu" in variants[0][1]
    close(runs[-1], run_ort(model, feeds), "numpy loop vs onnxruntime", rtol=1e-4, atol=1e-5)


def test_float16_runs_the_numpy_loop(numba_on):
    model, feeds = case("RNN", dtype=np.float16)
    _, variants = compiled(model, feeds)
    assert variants[0][0] == "rnn.numpy" and "float16" in variants[0][1]


def gru_kernel():
    n = 6
    info = NodeInfo(name="n", op_type="GRU", domain="", opset=22,
                    attrs={"direction": "forward", "layout": 0, "linear_before_reset": 0,
                           "hidden_size": None},
                    n_inputs=n, n_outputs=2, input_present=(True,) * n,
                    output_present=(True, True))
    return REGISTRY.resolve("", "GRU", 22).build(info)


@pytest.mark.parametrize(("change", "match"), [
    ({"R": np.zeros((1, 24, 7), np.float32)}, "R must have shape"),
    ({"W": np.zeros((1, 24, 5), np.float32)}, "W must have"),
    ({"W": np.zeros((1, 21, 6), np.float32)}, "W must have"),
    ({"B": np.zeros((1, 30), np.float32)}, "B must have"),
    ({"L": np.array([6, 1], np.int32)}, "sequence_lens"),
    ({"L": np.array([5], np.int32)}, "sequence_lens"),
    ({"h0": np.zeros((1, 3, 8), np.float32)}, "initial state"),
    ({"X": np.zeros((5, 2), np.float32)}, "X must be 3-D"),
])
def test_bad_shapes(change, match, numba_on):
    _, feeds = case("GRU", init=True, seq=[5, 5], consts=False)
    run = gru_kernel()
    args = ("X", "W", "R", "B", "L", "h0")
    run(*(feeds[k] for k in args))
    assert reported_variant() == ("gru.numba.blas", None)
    feeds.update(change)
    with pytest.raises(ValueError, match=match):
        run(*(feeds[k] for k in args))


_BUILD_THEN_RUN = """
import json, sys
import numpy as np
from onnxkiln import InferenceSession
from onnxkiln.testing import node_model
rng = np.random.default_rng(0)
feeds = {"X": rng.standard_normal((4, 2, 3)).astype(np.float32)}
inits = {"W": rng.standard_normal((1, 20, 3)).astype(np.float32),
         "R": rng.standard_normal((1, 20, 5)).astype(np.float32)}
model = node_model("LSTM", feeds, n_outputs=3, opset=14, initializers=inits, hidden_size=5)
s = InferenceSession.builder().from_graph(model)
built = [m for m in ("numba", "scipy") if m in sys.modules]
y = s.run(feeds)[0]
print(json.dumps({"built": built, "ran": "numba" in sys.modules, "shape": list(y.shape)}))
"""


def test_building_a_session_loads_no_numba(numba_on):
    # the kernels load on the first run that needs them (a fresh interpreter)
    import json
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != _numba.ENV}
    proc = subprocess.run([sys.executable, "-c", _BUILD_THEN_RUN], capture_output=True,
                          text=True, env=env, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    found = json.loads(proc.stdout.strip().splitlines()[-1])
    assert found == {"built": [], "ran": True, "shape": [4, 1, 2, 5]}
