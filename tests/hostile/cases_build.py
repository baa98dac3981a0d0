"""Building a session: models onnx's C++ shape inference crashes on still load and run,
function-inlining bombs are refused before they inline, and a wide graph builds in a time
near-linear in its nodes.

The bombs are a few kilobytes whose functions each call the one below twice: 2^levels
nodes once inlined. onnxruntime inlines them as it loads (2^14 in about 6 s; the 2^16 and
2^30 ones did not finish in 120 s), so the refused ones are onnxkiln's only cases.
"""

from __future__ import annotations

import time

import numpy as np
from harness import case
from onnx import TensorProto, helper, numpy_helper

F = TensorProto.FLOAT


def _decision_path_tree():
    """A DecisionTreeClassifier converted by skl2onnx with `decision_path=True`, its data."""
    from skl2onnx import to_onnx
    from sklearn.tree import DecisionTreeClassifier

    rng = np.random.RandomState(0)
    x = rng.rand(64, 4).astype(np.float32)
    y = (x[:, 0] + x[:, 1] > 1).astype(np.int64)
    tree = DecisionTreeClassifier(max_depth=4, random_state=0).fit(x, y)
    model = to_onnx(tree, x[:1], options={id(tree): {"decision_path": True, "zipmap": False}},
                    target_opset=17)
    return model.SerializeToString(), tree, x


@case("crash", "ok", timeout=120)
def case_decision_path_tree(rt, tmp):
    """A skl2onnx tree with decision_path=True (onnx's C++ inference segfaults on it)."""
    data, tree, x = _decision_path_tree()
    label, proba, path = rt.ort.InferenceSession(
        data, providers=["CPUExecutionProvider"]).run(None, {"X": x})
    np.testing.assert_array_equal(label, tree.predict(x))
    np.testing.assert_allclose(proba, tree.predict_proba(x), rtol=1e-6)
    nodes = tree.decision_path(x).toarray()  # one string of 0/1 per sample, one char per node
    expected = np.array([["".join(str(v) for v in row)] for row in nodes], dtype=object)
    np.testing.assert_array_equal(path, expected)


def _bomb(levels: int) -> bytes:
    """f0 is a Neg; f_i calls f_(i-1) twice in a row; the graph calls f_levels once."""
    opsets = [helper.make_opsetid("", 18), helper.make_opsetid("local", 1)]
    functions = [helper.make_function("local", "f0", ["x"], ["y"],
                                      [helper.make_node("Neg", ["x"], ["y"])], opsets)]
    for i in range(1, levels + 1):
        calls = [helper.make_node(f"f{i - 1}", ["x"], ["t"], domain="local"),
                 helper.make_node(f"f{i - 1}", ["t"], ["y"], domain="local")]
        functions.append(helper.make_function("local", f"f{i}", ["x"], ["y"], calls, opsets))
    graph = helper.make_graph(
        [helper.make_node(f"f{levels}", ["x"], ["y"], domain="local")], "bomb",
        [helper.make_tensor_value_info("x", F, [1])], [helper.make_tensor_value_info("y", F, [1])])
    return helper.make_model(graph, functions=functions, opset_imports=opsets,
                             ir_version=10).SerializeToString()


def _refused_bomb(rt, levels: int, bound: str | None) -> None:
    builder = rt.kiln.InferenceSession.builder()
    if bound is not None:
        builder = builder.option("load.max_inlined_nodes", bound)
    start = time.perf_counter()
    try:
        builder.load_bytes(_bomb(levels))
    except rt.kiln.ModelLoadError as e:
        assert f"would make {2 ** levels} nodes" in str(e), str(e)
        assert f"'local::f{levels}'" in str(e), str(e)
        assert time.perf_counter() - start < 5, "the count took as long as inlining"
        raise
    raise AssertionError(f"a 2^{levels}-node inlining bomb loaded")


@case("inlining bomb", "refused", on_ort=False, timeout=30)
def case_inlining_bomb_2_30(rt, tmp):
    """Functions that call each other twice per level: 2^30 nodes once inlined."""
    _refused_bomb(rt, 30, None)


@case("inlining bomb", "refused", on_ort=False, timeout=30)
def case_inlining_bomb_2_16_bound(rt, tmp):
    """A 2^16-node inlining bomb, under a load.max_inlined_nodes bound set to 50000."""
    _refused_bomb(rt, 16, "50000")


@case("inlining bomb", "ok", timeout=120)
def case_inlining_2_14_under_the_bound(rt, tmp):
    """Doubling functions that inline to 2^14 nodes (under the default bound) load and run."""
    session = rt.ort.InferenceSession(_bomb(14), providers=["CPUExecutionProvider"])
    x = np.array([1.5], np.float32)
    np.testing.assert_array_equal(session.run(None, {"x": x})[0], x)  # an even count of Negs


_FANIN = 20_000


@case("quadratic build", "ok", timeout=120)
def case_fanin_sum_build(rt, tmp):
    """20,000 Add nodes feeding one Sum: the session builds in well under a minute."""
    inits = [numpy_helper.from_array(np.full(2, i % 3, np.float32), f"c{i}")
             for i in range(_FANIN)]
    nodes = [helper.make_node("Add", ["x", f"c{i}"], [f"t{i}"]) for i in range(_FANIN)]
    nodes.append(helper.make_node("Sum", [f"t{i}" for i in range(_FANIN)], ["y"]))
    graph = helper.make_graph(nodes, "fanin", [helper.make_tensor_value_info("x", F, [2])],
                              [helper.make_tensor_value_info("y", F, [2])], inits)
    data = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)],
                             ir_version=8).SerializeToString()
    start = time.perf_counter()
    session = rt.ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    seconds = time.perf_counter() - start
    x = np.array([1, 2], np.float32)
    (y,) = session.run(None, {"x": x})
    np.testing.assert_allclose(y, _FANIN * x + sum(i % 3 for i in range(_FANIN)), rtol=1e-6)
    assert seconds < 60, f"building took {seconds:.1f} s"
