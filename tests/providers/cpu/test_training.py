"""ai.onnx.preview.training: Adagrad, Adam, Momentum against numpy; Gradient on small graphs.

onnxruntime's default build has none of these ops, so references are numpy transcriptions
of the spec's pseudo code (Gradient: analytic derivatives and finite differences).
"""

from __future__ import annotations

import glob
import os

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

from onnxkiln import InferenceSession
from onnxkiln.testing import make_model, node_model, tensor_info

TRAINING = "ai.onnx.preview.training"
RNG = np.random.default_rng(99)


def run(model, feeds):
    return InferenceSession.builder().from_graph(model).run(dict(feeds))


def optimizer_model(op, n_vars, groups, shapes, dtype, **attrs):
    feeds = {"R": np.array(0.1, np.float32), "T": np.array(0, np.int64)}
    for g in groups:
        for i in range(n_vars):
            feeds[f"{g}{i}"] = RNG.standard_normal(shapes[i]).astype(dtype)
    n_out = n_vars * (len(groups) - 1)
    model = node_model(op, feeds, n_outputs=n_out, domain=TRAINING, opset=21, **attrs)
    return model, feeds


# ----------------------------------------------------------------------------- Adagrad


def ref_adagrad(r, t, x, g, h, norm, eps, decay):
    rate = r / (1 + t * decay)
    g_reg = norm * x + g
    h_new = h + g_reg * g_reg
    return x - rate * g_reg / (np.sqrt(h_new) + eps), h_new


@pytest.mark.parametrize("n_vars", [1, 3])
@pytest.mark.parametrize("t", [0, 5])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_adagrad(n_vars, t, dtype):
    shapes = [(2,), (3, 2), ()][:n_vars]
    attrs = {"norm_coefficient": 0.01, "epsilon": 1e-5, "decay_factor": 0.1}
    model, feeds = optimizer_model("Adagrad", n_vars, "XGH", shapes, dtype, **attrs)
    for i in range(n_vars):
        feeds[f"H{i}"] = np.abs(feeds[f"H{i}"])
    feeds["T"] = np.array(t, np.int64)
    got = run(model, feeds)
    for i in range(n_vars):
        x_new, h_new = ref_adagrad(0.1, t, *(feeds[f"{g}{i}"].astype(np.float64)
                                             for g in "XGH"), 0.01, 1e-5, 0.1)
        assert got[i].dtype == dtype and got[i].shape == shapes[i]
        np.testing.assert_allclose(got[i], x_new, rtol=1e-5)
        np.testing.assert_allclose(got[n_vars + i], h_new, rtol=1e-5)


# ----------------------------------------------------------------------------- Adam


def ref_adam(r, t, x, g, v, h, norm, norm_post, alpha, beta, eps):
    g_reg = norm * x + g
    v_new = alpha * v + (1 - alpha) * g_reg
    h_new = beta * h + (1 - beta) * g_reg * g_reg
    rate = r * np.sqrt(1 - beta**t) / (1 - alpha**t) if t > 0 else r
    x_new = x - rate * v_new / (np.sqrt(h_new) + eps)
    return (1 - norm_post) * x_new, v_new, h_new


@pytest.mark.parametrize("n_vars", [1, 2])
@pytest.mark.parametrize("t", [0, 3])
@pytest.mark.parametrize("norm_post", [0.0, 0.02])
def test_adam(n_vars, t, norm_post):
    shapes = [(3,), (2, 2)][:n_vars]
    attrs = {"norm_coefficient": 0.001, "norm_coefficient_post": norm_post, "alpha": 0.95,
             "beta": 0.85, "epsilon": 1e-7}
    model, feeds = optimizer_model("Adam", n_vars, "XGVH", shapes, np.float32, **attrs)
    for i in range(n_vars):
        feeds[f"H{i}"] = np.abs(feeds[f"H{i}"])
    feeds["T"] = np.array(t, np.int64)
    got = run(model, feeds)
    for i in range(n_vars):
        want = ref_adam(0.1, t, *(feeds[f"{g}{i}"].astype(np.float64) for g in "XGVH"),
                        0.001, norm_post, 0.95, 0.85, 1e-7)
        for k, w in enumerate(want):
            assert got[k * n_vars + i].dtype == np.float32
            np.testing.assert_allclose(got[k * n_vars + i], w, rtol=1e-5, atol=1e-6)


def test_adam_defaults():
    model, feeds = optimizer_model("Adam", 1, "XGVH", [(4,)], np.float32)
    feeds["H0"] = np.abs(feeds["H0"])
    got = run(model, feeds)
    want = ref_adam(0.1, 0, *(feeds[f"{g}0"].astype(np.float64) for g in "XGVH"),
                    0.0, 0.0, 0.9, 0.999, 1e-6)
    for a, b in zip(got, want):
        np.testing.assert_allclose(a, b, rtol=1e-5)


# ----------------------------------------------------------------------------- Momentum


def ref_momentum(r, t, x, g, v, norm, alpha, beta, nesterov):
    g_reg = norm * x + g
    v_new = alpha * v + (beta if t > 0 else 1.0) * g_reg
    step = g_reg + alpha * v_new if nesterov else v_new
    return x - r * step, v_new


@pytest.mark.parametrize("mode", ["standard", "nesterov"])
@pytest.mark.parametrize("n_vars", [1, 2])
@pytest.mark.parametrize("t", [0, 1])
def test_momentum(mode, n_vars, t):
    shapes = [(3,), (2, 3)][:n_vars]
    attrs = {"norm_coefficient": 0.001, "alpha": 0.95, "beta": 0.1, "mode": mode}
    model, feeds = optimizer_model("Momentum", n_vars, "XGV", shapes, np.float32, **attrs)
    feeds["T"] = np.array(t, np.int64)
    got = run(model, feeds)
    for i in range(n_vars):
        want = ref_momentum(0.1, t, *(feeds[f"{g}{i}"].astype(np.float64) for g in "XGV"),
                            0.001, 0.95, 0.1, mode == "nesterov")
        for k, w in enumerate(want):
            np.testing.assert_allclose(got[k * n_vars + i], w, rtol=1e-5, atol=1e-7)


def test_momentum_bad_mode():
    model, feeds = optimizer_model("Momentum", 1, "XGV", [(2,)], np.float32,
                                   norm_coefficient=0.0, alpha=0.9, beta=1.0, mode="heavy")
    with pytest.raises(Exception, match="mode"):
        run(model, feeds)


def test_optimizer_bad_group_count():
    feeds = {"R": np.array(0.1, np.float32), "T": np.array(0, np.int64),
             "X": np.ones(2, np.float32), "G": np.ones(2, np.float32)}
    model = node_model("Adagrad", feeds, n_outputs=1, domain=TRAINING, opset=21)
    with pytest.raises(Exception, match="3 tensors per optimized variable"):
        run(model, feeds)


def test_optimizer_inputs_not_modified():
    model, feeds = optimizer_model("Adam", 2, "XGVH", [(3,), (2,)], np.float32)
    feeds["H0"], feeds["H1"] = np.abs(feeds["H0"]), np.abs(feeds["H1"])
    copies = {k: v.copy() for k, v in feeds.items()}
    run(model, feeds)
    for k, v in feeds.items():
        np.testing.assert_array_equal(v, copies[k])


# ----------------------------------------------------------------------------- Gradient


def backend_case_dirs():
    from onnx.backend.test.loader import DATA_DIR

    return sorted(glob.glob(os.path.join(DATA_DIR, "simple", "test_gradient_*")))


@pytest.mark.parametrize("case_dir", backend_case_dirs(), ids=os.path.basename)
def test_gradient_backend_cases(case_dir):
    model = onnx.load(os.path.join(case_dir, "model.onnx"))
    names = [i.name for i in model.graph.input]
    for ds in sorted(glob.glob(os.path.join(case_dir, "test_data_set_*"))):
        inputs = [numpy_helper.to_array(onnx.load_tensor(p))
                  for p in sorted(glob.glob(os.path.join(ds, "input_*.pb")))]
        expected = [numpy_helper.to_array(onnx.load_tensor(p))
                    for p in sorted(glob.glob(os.path.join(ds, "output_*.pb")))]
        got = run(model, dict(zip(names, inputs)))
        for a, b in zip(got, expected):
            assert a.dtype == b.dtype and a.shape == b.shape
            np.testing.assert_allclose(a, b, rtol=1e-6)


def gradient_model(nodes, inputs, outputs, xs, zs, y, grad_inputs=None, initializers=None):
    attrs = {"zs": zs} if zs else {}
    grad_inputs = grad_inputs or [*xs, *zs]
    grad = helper.make_node("Gradient", grad_inputs, [f"d_{x}" for x in xs],
                            domain=TRAINING, xs=xs, y=y, **attrs)
    shapes = {i.name: [d.dim_value for d in i.type.tensor_type.shape.dim] for i in inputs}
    outs = [*outputs, *(tensor_info(f"d_{x}", np.float32, shapes[g])
                        for x, g in zip(xs, grad_inputs))]
    return make_model([*nodes, grad], inputs, outs, initializers=initializers, opset=17,
                      extra_opsets={TRAINING: 1})


def numeric_grad(f, x, eps=1e-6):
    x = x.astype(np.float64)
    g = np.zeros_like(x)
    for i in range(x.size):
        d = np.zeros_like(x)
        d.flat[i] = eps
        g.flat[i] = (f(x + d) - f(x - d)) / (2 * eps)
    return g


def test_gradient_mlp():
    # loss = ReduceSum(Sigmoid(Relu(X @ W + b) * 2 - 1)^2 / 3), d/dW, d/db with X as zs
    nodes = [
        helper.make_node("MatMul", ["X", "W"], ["xw"]),
        helper.make_node("Add", ["xw", "b"], ["z"]),
        helper.make_node("Relu", ["z"], ["r"]),
        helper.make_node("Mul", ["r", "two"], ["r2"]),
        helper.make_node("Sub", ["r2", "one"], ["s"]),
        helper.make_node("Sigmoid", ["s"], ["sg"]),
        helper.make_node("Pow", ["sg", "two"], ["sq"]),
        helper.make_node("Div", ["sq", "three"], ["q"]),
        helper.make_node("ReduceSum", ["q"], ["loss"], keepdims=0),
    ]
    consts = {"two": np.array(2, np.float32), "one": np.array(1, np.float32),
              "three": np.array(3, np.float32)}
    inputs = [tensor_info("X", np.float32, [4, 3]), tensor_info("W", np.float32, [3, 2]),
              tensor_info("b", np.float32, [2])]
    model = gradient_model(nodes, inputs, [tensor_info("loss", np.float32, [])],
                           ["W", "b"], ["X"], "loss", initializers=consts)
    x = RNG.standard_normal((4, 3)).astype(np.float32)
    w = RNG.standard_normal((3, 2)).astype(np.float32)
    b = RNG.standard_normal(2).astype(np.float32)
    loss, dw, db = run(model, {"X": x, "W": w, "b": b})

    def f(w_, b_):
        z = np.maximum(x.astype(np.float64) @ w_ + b_, 0)
        return np.sum((1 / (1 + np.exp(-(2 * z - 1)))) ** 2 / 3)

    np.testing.assert_allclose(loss, f(w, b), rtol=1e-5)
    np.testing.assert_allclose(dw, numeric_grad(lambda v: f(v, b), w), rtol=1e-3, atol=1e-5)
    np.testing.assert_allclose(db, numeric_grad(lambda v: f(w, v), b), rtol=1e-3, atol=1e-5)
    assert dw.dtype == np.float32 and dw.shape == w.shape


def test_gradient_gemm_tanh_transpose_mean():
    nodes = [
        helper.make_node("Gemm", ["A", "B", "C"], ["g"], transB=1, alpha=0.5, beta=2.0),
        helper.make_node("Tanh", ["g"], ["t"]),
        helper.make_node("Transpose", ["t"], ["tt"], perm=[1, 0]),
        helper.make_node("Exp", ["tt"], ["e"]),
        helper.make_node("ReduceMean", ["e"], ["m"], axes=[1], keepdims=1),
        helper.make_node("Reshape", ["m", "shape"], ["flat"]),
        helper.make_node("ReduceSum", ["flat"], ["y"], keepdims=0),
    ]
    inputs = [tensor_info("A", np.float32, [3, 4]), tensor_info("B", np.float32, [2, 4]),
              tensor_info("C", np.float32, [2])]
    model = gradient_model(nodes, inputs, [tensor_info("y", np.float32, [])],
                           ["A", "B", "C"], [], "y",
                           initializers={"shape": np.array([-1], np.int64)})
    a = RNG.standard_normal((3, 4)).astype(np.float32) * 0.5
    b = RNG.standard_normal((2, 4)).astype(np.float32) * 0.5
    c = RNG.standard_normal(2).astype(np.float32)
    _, da, db, dc = run(model, {"A": a, "B": b, "C": c})

    def f(a_, b_, c_):
        return np.sum(np.mean(np.exp(np.tanh(0.5 * a_ @ b_.T + 2 * c_).T), axis=1))

    a64, b64, c64 = (v.astype(np.float64) for v in (a, b, c))
    np.testing.assert_allclose(da, numeric_grad(lambda v: f(v, b64, c64), a), rtol=1e-3,
                               atol=1e-5)
    np.testing.assert_allclose(db, numeric_grad(lambda v: f(a64, v, c64), b), rtol=1e-3,
                               atol=1e-5)
    np.testing.assert_allclose(dc, numeric_grad(lambda v: f(a64, b64, v), c), rtol=1e-3,
                               atol=1e-5)


def test_gradient_wrt_intermediate_value():
    # y = H * Z with H = A + B; Gradient(xs=[H, Z]) fed a different H value H1
    nodes = [helper.make_node("Add", ["A", "B"], ["H"]),
             helper.make_node("Mul", ["H", "Z"], ["y"])]
    inputs = [tensor_info(n, np.float32, [3]) for n in ("A", "B", "Z", "H1")]
    model = gradient_model(nodes, inputs, [tensor_info("y", np.float32, [3])], ["H", "Z"],
                           [], "y", grad_inputs=["H1", "Z"])
    feeds = {n: RNG.standard_normal(3).astype(np.float32) for n in ("A", "B", "Z", "H1")}
    _, dh, dz = run(model, feeds)
    np.testing.assert_allclose(dh, feeds["Z"], rtol=1e-6)
    np.testing.assert_allclose(dz, feeds["H1"], rtol=1e-6)


def test_gradient_broadcast_and_unused_x():
    nodes = [helper.make_node("Mul", ["A", "s"], ["m"]),
             helper.make_node("Sum", ["m", "A", "c"], ["y"])]
    inputs = [tensor_info("A", np.float32, [2, 3]), tensor_info("s", np.float32, [1, 3]),
              tensor_info("c", np.float32, []), tensor_info("u", np.float32, [4])]
    model = gradient_model(nodes, inputs, [tensor_info("y", np.float32, [2, 3])],
                           ["A", "s", "c", "u"], [], "y")
    feeds = {"A": RNG.standard_normal((2, 3)).astype(np.float32),
             "s": RNG.standard_normal((1, 3)).astype(np.float32),
             "c": np.array(0.5, np.float32), "u": np.ones(4, np.float32)}
    _, da, ds, dc, du = run(model, feeds)
    np.testing.assert_allclose(da, np.broadcast_to(feeds["s"] + 1, (2, 3)), rtol=1e-6)
    np.testing.assert_allclose(ds, feeds["A"].sum(axis=0, keepdims=True), rtol=1e-6)
    assert dc.shape == () and dc == 6
    np.testing.assert_array_equal(du, np.zeros(4, np.float32))


def test_gradient_unsupported_op():
    nodes = [helper.make_node("Sin", ["A"], ["y"])]
    model = gradient_model(nodes, [tensor_info("A", np.float32, [2])],
                           [tensor_info("y", np.float32, [2])], ["A"], [], "y")
    with pytest.raises(Exception, match="no differentiation rule for Sin"):
        run(model, {"A": np.ones(2, np.float32)})


def test_gradient_free_input_not_in_xs_zs():
    nodes = [helper.make_node("Mul", ["A", "B"], ["y"])]
    inputs = [tensor_info("A", np.float32, [2]), tensor_info("B", np.float32, [2])]
    model = gradient_model(nodes, inputs, [tensor_info("y", np.float32, [2])], ["A"], [], "y")
    with pytest.raises(Exception, match="neither in xs/zs nor a constant"):
        run(model, {"A": np.ones(2, np.float32), "B": np.ones(2, np.float32)})
