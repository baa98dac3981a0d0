"""The numba `fast` kernels against their numpy fallbacks, one-node sessions, float32.

    python bench/fast_kernels.py [--threads 2] [--rounds 40]

Both sessions of a case are built first (numba switched on and off through
`_numba.ENABLED`, read at build), then timed in alternation; the 10th percentile is shown.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import onnx
from onnx import helper

from onnxkiln import InferenceSession
from onnxkiln.providers.cpu import _numba
from onnxkiln.testing import node_model, tensor_info

RNG = np.random.default_rng(0)


def _r(*shape: int) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


def _ms_model(op: str, feeds: dict, inits: dict) -> onnx.ModelProto:
    node = helper.make_node(op, [*feeds, *inits], ["y"], domain="com.microsoft")
    graph = helper.make_graph(
        [node], "g", [tensor_info(k, v.dtype, v.shape) for k, v in feeds.items()],
        [helper.make_value_info("y", onnx.TypeProto())],
        [onnx.numpy_helper.from_array(v, k) for k, v in inits.items()])
    return helper.make_model(graph, ir_version=8, opset_imports=[
        helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])


def _conv(x: tuple, w: tuple, **attrs) -> onnx.ModelProto:
    return node_model("Conv", {"x": _r(*x)}, opset=13, initializers={"w": _r(*w)},
                      pads=[1, 1, 1, 1], **attrs)


def _cases() -> list[tuple[str, onnx.ModelProto]]:
    return [
        ("depthwise 3x3 1x144x56x56", _conv((1, 144, 56, 56), (144, 1, 3, 3), group=144)),
        ("depthwise 3x3 s2 1x144x56x56",
         _conv((1, 144, 56, 56), (144, 1, 3, 3), group=144, strides=[2, 2])),
        ("depthwise 3x3 1x960x7x7", _conv((1, 960, 7, 7), (960, 1, 3, 3), group=960)),
        ("grouped 3x3 g32 1x128x56x56", _conv((1, 128, 56, 56), (128, 4, 3, 3), group=32)),
        ("LayerNorm 128x768", node_model("LayerNormalization", {"x": _r(128, 768)}, opset=17,
                                         initializers={"s": _r(768), "b": _r(768)})),
        ("SkipLayerNorm 1x128x768", _ms_model(
            "SkipLayerNormalization", {"x": _r(1, 128, 768), "s": _r(1, 128, 768)},
            {"g": _r(768), "be": _r(768), "bi": _r(768)})),
        ("Softmax 12x128x128", node_model("Softmax", {"x": _r(12, 128, 128)}, opset=13)),
        ("Gelu (ai.onnx) 128x3072", node_model("Gelu", {"x": _r(128, 3072)}, opset=20)),
        ("BiasGelu 1x128x3072", _ms_model("BiasGelu", {"x": _r(1, 128, 3072)}, {"b": _r(3072)})),
        ("FastGelu 1x128x3072", _ms_model("FastGelu", {"x": _r(1, 128, 3072)}, {"b": _r(3072)})),
    ]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=40)
    args = parser.parse_args()
    if _numba.disabled_reason() is not None:
        print(f"numba kernels unavailable: {_numba.disabled_reason()}")
        return 1
    print(f"{'kernel':32s} {'numpy ms':>9s} {'numba ms':>9s} {'speed-up':>8s}")
    for name, model in _cases():
        feeds = {i.name: _r(*[d.dim_value for d in i.type.tensor_type.shape.dim])
                 for i in model.graph.input}
        sessions = {}
        for on in (False, True):
            _numba.ENABLED = on
            sessions[on] = (InferenceSession.builder().intra_op_threads(args.threads)
                            .from_graph(model))
            sessions[on].run(feeds)
        _numba.ENABLED = True
        times: dict[bool, list[float]] = {False: [], True: []}
        for _ in range(args.rounds):
            for on in (False, True):
                start = time.perf_counter()
                sessions[on].run(feeds)
                times[on].append(time.perf_counter() - start)
        slow, fast = (float(np.percentile(times[on], 10)) * 1e3 for on in (False, True))
        print(f"{name:32s} {slow:9.3f} {fast:9.3f} {slow / fast:7.1f}x", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
