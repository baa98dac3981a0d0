"""Hostile requests to the Serve deployment's request path, without Ray: bodies that ask
for huge arrays, and requests batched with others on a model whose answers depend on the
whole batch. The server's parts are called directly (`decode`, `Engine.run_batch`)."""

from __future__ import annotations

import io
import json

from harness import case

LIMIT = 64 << 20  # the deployment's default body limit


def _centering():
    """y = x - mean(x over axis 0): each row's answer depends on every row of the run."""
    import numpy as np
    from onnx import helper

    from onnxkiln.testing import make_model, tensor_info

    return make_model([helper.make_node("ReduceMean", ["x", "axes"], ["m"]),
                       helper.make_node("Sub", ["x", "m"], ["y"])],
                      [tensor_info("x", np.float32, ["n", 4])],
                      [tensor_info("y", np.float32, ["n", 4])],
                      {"axes": np.array([0], np.int64)}, opset=18)


def _refused(body: bytes, ctype: str, statuses: tuple[int, ...], limit: int = LIMIT) -> str:
    """Decode `body` for `model` (default: the centering model); it must be refused."""
    from onnxkiln import InferenceSession
    from onnxkiln.integrations.ray._http import HttpError, decode

    session = InferenceSession.from_graph(_centering())
    try:
        decode(body, ctype, session.inputs(), session.outputs(), limit)
    except HttpError as e:
        assert e.status in statuses, (e.status, e.message)
        return e.message
    raise AssertionError("the request was accepted")


@case("serve", "ok", on_ort=False, memory=512 << 20, timeout=30)
def case_serve_json_dtype_bomb(rt, tmp):
    """A 72-byte JSON body asking for a 400 MB-per-element string dtype: a 422, no alloc."""
    body = b'{"inputs": {"x": [[1, 2, 3, 4]]}, "dtypes": {"x": "U100000000"}}'
    assert "U100000000" in _refused(body, "application/json", (422,))


@case("serve", "ok", on_ort=False, memory=512 << 20, timeout=30)
def case_serve_json_string_width_bomb(rt, tmp):
    """One long string among many empty ones (fixed-width, 80 GB): a 400, no alloc."""
    body = json.dumps({"inputs": {"x": ["a" * 200_000] + [""] * 100_000}}).encode()
    assert "holds strings" in _refused(body, "application/json", (400,))


@case("serve", "ok", on_ort=False, memory=512 << 20, timeout=30)
def case_serve_json_wide_dtype_over_limit(rt, tmp):
    """A body of zeros asking for complex128 arrays 5x its size, over the limit: a 413."""
    body = json.dumps({"inputs": {"x": [0] * 100_000}, "dtypes": {"x": "complex128"}})
    assert "over the server's limit" in _refused(body.encode(), "application/json", (413,),
                                                 limit=1 << 20)


@case("serve", "ok", on_ort=False, memory=512 << 20, timeout=30)
def case_serve_npy_header_bomb(rt, tmp):
    """An .npy header declaring 10**12 floats over 8 bytes of data: a 400, no alloc."""
    import numpy as np

    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(
        buf, {"descr": "<f4", "fortran_order": False, "shape": (10**12, 4)})
    assert "bytes follow" in _refused(buf.getvalue() + b"\0" * 8, "application/x-npy", (400,))


@case("serve", "ok", on_ort=False, timeout=60)
def case_serve_batch_dependent_requests_are_not_mixed(rt, tmp):
    """Concurrent requests to a batch-dependent model each get their lone answer."""
    import numpy as np

    from onnxkiln import InferenceSession
    from onnxkiln.integrations.ray._http import Engine

    model = _centering()
    session = InferenceSession.from_graph(model)
    rng = np.random.default_rng(5)
    requests = [{"x": rng.standard_normal((1 + i % 3, 4)).astype(np.float32) * (i + 1)}
                for i in range(32)]
    answers = Engine(session).run_batch(requests)  # how the Serve batch queue calls it
    for feeds, got in zip(requests, answers):
        assert not isinstance(got, BaseException), got
        np.testing.assert_allclose(got[0], session.run(feeds)[0], rtol=1e-6, atol=1e-6)


@case("serve", "refused", on_ort=False, timeout=60)
def case_serve_batching_a_batch_dependent_model(rt, tmp):
    """batching=True for a model that reduces over the batch axis: refused, naming it."""
    import numpy as np

    from onnxkiln import InferenceSession
    from onnxkiln.integrations.ray._http import Engine

    model = _centering()
    engine = Engine(InferenceSession.from_graph(model), batching=True, model=model)
    a, b = np.ones((2, 4), np.float32), np.arange(12, dtype=np.float32).reshape(3, 4)
    got = engine.run_batch([{"x": a}, {"x": b}])
    np.testing.assert_allclose(got[0][0], np.zeros((2, 4)))  # only if stacking was allowed
