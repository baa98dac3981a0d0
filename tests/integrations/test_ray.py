"""onnxkiln on a local Ray: a Ray Data batch job and a Ray Serve app over HTTP.

One Ray instance (2 CPUs) and one Serve app serve the whole module; both are shut down
at the end. Actors and replicas ask for fractions of a CPU so that all fit at once.
"""

from __future__ import annotations

import http.client
import io
import json
import socket
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from conftest import build_rowwise, rowwise_reference
from onnx import helper

ray = pytest.importorskip("ray", reason="needs Ray: pip install 'onnxkiln[ray]'")
pytest.importorskip("ray.data", reason="needs Ray Data: pip install 'onnxkiln[ray]'")
serve = pytest.importorskip("ray.serve", reason="needs Ray Serve: pip install 'onnxkiln[ray]'")

from onnxkiln import InferenceSession  # noqa: E402
from onnxkiln.cli import main  # noqa: E402
from onnxkiln.errors import InvalidOptionError  # noqa: E402
from onnxkiln.integrations.ray import _cli, deployment, predict  # noqa: E402
from onnxkiln.testing import make_model, tensor_info  # noqa: E402

ROWS = 10_000
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning:ray.data.context")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def cluster():
    ray.init(address="local", num_cpus=2, include_dashboard=False, logging_level="warning")
    ray.data.DataContext.get_current().enable_progress_bars = False
    try:
        yield
    finally:
        serve.shutdown()
        ray.shutdown()


@pytest.fixture(scope="module")
def server(cluster, rowwise_x_path):
    """The one-input rowwise model served at /m; returns (base URL, port)."""
    port = _free_port()
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    app = deployment(rowwise_x_path, batching=True, max_batch_size=16, batch_wait_timeout_s=0.05,
                     ray_actor_options={"num_cpus": 0.5}, intra_op_threads=1)
    serve.run(app, name="onnxkiln-test", route_prefix="/m")
    try:
        yield f"http://127.0.0.1:{port}/m", port
    finally:
        serve.shutdown()


def _http(url: str, body: bytes | None = None, ctype: str | None = None,
          accept: str | None = None) -> tuple[int, str, bytes]:
    headers = {k: v for k, v in (("Content-Type", ctype), ("Accept", accept)) if v}
    request = urllib.request.Request(url, data=body, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=60) as resp:
            return resp.status, resp.headers.get("Content-Type"), resp.read()
    except urllib.error.HTTPError as e:
        return e.code, e.headers.get("Content-Type"), e.read()


def _json_predict(base: str, doc: dict) -> tuple[int, dict]:
    status, _, body = _http(f"{base}/predict", json.dumps(doc).encode(), "application/json")
    return status, json.loads(body)


def _feature_fn():
    def features(batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Exact, deterministic features from the row id (same result in any batch)."""
        ids = batch["id"].astype(np.int64)
        grid = (ids[:, None] * 37 + np.arange(8) * 11) % 101
        return {"id": ids, "x": (grid / 25.0 - 2.0).astype(np.float32),
                "s": ((ids % 13) / 8.0 - 0.75).astype(np.float32)[:, None]}

    return features  # a local function: Ray ships it by value (workers cannot import tests)


# --- Ray Data ---------------------------------------------------------------------------------


def test_map_batches_on_two_actors_matches_one_process_run(cluster):
    model = build_rowwise()
    _features = _feature_fn()
    ds = ray.data.range(ROWS, override_num_blocks=4).map_batches(_features, num_cpus=0.25)
    out = predict(ds, model, keep_columns=["id"], concurrency=2, num_cpus=0.5,
                  batch_size=1000, intra_op_threads=1).take_batch(ROWS + 1)
    assert len(out["id"]) == ROWS
    order = np.argsort(out["id"])
    np.testing.assert_array_equal(out["id"][order], np.arange(ROWS))
    feeds = _features({"id": np.arange(ROWS)})
    expected = InferenceSession.from_graph(model).run({"x": feeds["x"], "s": feeds["s"]})
    for name, ref in zip(["scaled", "top", "label"], expected):
        assert out[name].dtype == ref.dtype
        np.testing.assert_array_equal(out[name][order], ref)  # identical, not close


# --- Ray Serve --------------------------------------------------------------------------------


def test_health_and_metadata_routes(server):
    base, _ = server
    status, ctype, body = _http(f"{base}/health")
    assert (status, ctype, json.loads(body)) == (200, "application/json",
                                                 {"status": "ok", "device": "cpu"})
    status, _, body = _http(f"{base}/metadata")
    meta = json.loads(body)
    assert status == 200
    assert meta["inputs"] == [{"name": "x", "dtype": "float32", "kind": "tensor",
                               "shape": ["batch", 8], "optional": False}]
    assert [(o["name"], o["dtype"]) for o in meta["outputs"]] == [
        ("scaled", "float32"), ("top", "float32"), ("label", "int64")]
    assert meta["model"]["graph_name"] == "rowwise" and meta["model"]["opset_imports"]
    assert meta["batching"]["enabled"] and meta["batching"]["max_batch_size"] == 16
    status, _, body = _http(f"{base}/")
    assert status == 200 and "POST /predict" in json.loads(body)["routes"]
    status, _, body = _http(f"{base}/nope")
    assert status == 404 and "no route /nope" in json.loads(body)["error"]["message"]
    assert json.loads(body)["error"]["type"] == "NotFound"


def test_wrong_methods_are_405_with_allow_and_the_json_error_body(server):
    base, _ = server
    for method, route, allowed in [("GET", "predict", "POST"), ("PUT", "predict", "POST"),
                                   ("POST", "health", "GET, HEAD"),
                                   ("DELETE", "metadata", "GET, HEAD")]:
        request = urllib.request.Request(f"{base}/{route}", method=method,
                                         data=b"{}" if method in ("POST", "PUT") else None)
        with pytest.raises(urllib.error.HTTPError) as info:
            urllib.request.urlopen(request, timeout=60)
        assert (info.value.code, info.value.headers["Allow"]) == (405, allowed)
        assert json.loads(info.value.read())["error"] == {
            "status": 405, "type": "MethodNotAllowed",
            "message": f"/m/{route} takes {allowed.replace(', ', ' or ')}, not {method}"}


def test_openapi_page_and_schema_describe_predict(server):
    base, _ = server
    status, ctype, body = _http(f"{base}/openapi.json")
    doc = json.loads(body)
    assert (status, ctype) == (200, "application/json")
    assert set(doc["paths"]) == {"/predict", "/health", "/metadata", "/"}
    predict = doc["paths"]["/predict"]["post"]
    assert set(predict["requestBody"]["content"]) == {
        "application/json", "application/x-npz", "application/x-npy"}
    assert [p["name"] for p in predict["parameters"]] == ["outputs"]
    assert "Request formats" in doc["info"]["description"]
    status, ctype, body = _http(f"{base}/docs")
    assert (status, ctype) == (200, "text/html; charset=utf-8")
    assert b"/m/openapi.json" in body  # the page finds the schema under the route prefix
    routes = json.loads(_http(f"{base}/")[2])["routes"]
    assert {"GET /docs", "GET /openapi.json"} <= set(routes)


def test_json_npy_and_npz_requests_give_correct_results(server):
    base, _ = server
    x = np.random.default_rng(1).standard_normal((3, 8)).astype(np.float32)
    expected = rowwise_reference(x)
    status, doc = _json_predict(base, {"inputs": {"x": x.tolist()}})
    assert status == 200 and doc["dtypes"]["label"] == "int64"
    for name, ref in zip(["scaled", "top", "label"], expected):
        np.testing.assert_array_equal(np.asarray(doc["outputs"][name], ref.dtype), ref)
    buf = io.BytesIO()
    np.save(buf, x)
    status, ctype, body = _http(f"{base}/predict", buf.getvalue(), "application/x-npy")
    assert status == 200 and ctype == "application/x-npz"  # three outputs: npz
    got = np.load(io.BytesIO(body))
    for name, ref in zip(["scaled", "top", "label"], expected):
        np.testing.assert_array_equal(got[name], ref)
    status, ctype, body = _http(f"{base}/predict?outputs=label", buf.getvalue(),
                                "application/octet-stream")
    assert (status, ctype) == (200, "application/x-npy")
    np.testing.assert_array_equal(np.load(io.BytesIO(body)), expected[2])
    buf = io.BytesIO()
    np.savez(buf, x=x)
    status, ctype, body = _http(f"{base}/predict", buf.getvalue(), "application/x-npz",
                                accept="application/json")
    assert (status, ctype) == (200, "application/json")
    np.testing.assert_array_equal(json.loads(body)["outputs"]["top"], expected[1])


def test_bad_requests_get_4xx_with_the_session_message_and_serving_goes_on(server):
    base, _ = server
    x = np.ones((2, 8), np.float32)
    status, doc = _json_predict(base, {"inputs": {"X": x.tolist()}})
    assert status == 422 and doc["error"]["type"] == "InputNotFoundError"
    assert doc["error"]["message"] == ("unknown input 'X'; the model's inputs are ['x']; "
                                        "did you mean 'x'?")
    status, doc = _json_predict(base, {"inputs": {"x": x.tolist()}, "dtypes": {"x": "float64"}})
    assert status == 422 and doc["error"]["type"] == "InvalidInputError"
    assert "expects float32" in doc["error"]["message"]
    assert "x.astype(np.float32)" in doc["error"]["message"]
    buf = io.BytesIO()
    np.save(buf, x.astype(np.int32))
    status, _, body = _http(f"{base}/predict", buf.getvalue(), "application/x-npy")
    assert status == 422 and "expects float32" in json.loads(body)["error"]["message"]
    status, doc = _json_predict(base, {"inputs": {"x": [[1.0] * 5]}})
    assert status == 422 and doc["error"]["type"] == "ShapeError"
    for body, ctype in [(b"{broken", "application/json"), (b"\x93NUMPY\x01\x00zz", None),
                        (b"PK\x03\x04\x00\x00", "application/x-npz"), (b"", "application/json"),
                        (b"\x00" * 64, "application/x-npy")]:
        status, _, reply = _http(f"{base}/predict", body, ctype)
        assert status == 400, (body, reply)
        assert json.loads(reply)["error"]["message"]
    status, _, _ = _http(f"{base}/predict", b"a,b", "text/csv")
    assert status == 415
    status, _, _ = _http(f"{base}/predict")  # GET
    assert status == 405
    status, doc = _json_predict(base, {"inputs": {"x": x.tolist()}})
    assert status == 200
    np.testing.assert_array_equal(doc["outputs"]["top"], rowwise_reference(x)[1])
    status, _, _ = _http(f"{base}/health")
    assert status == 200


def test_concurrent_requests_are_batched_and_each_gets_its_rows(server):
    base, _ = server
    rng = np.random.default_rng(7)
    inputs = [rng.standard_normal((1 + i % 4, 8)).astype(np.float32) for i in range(24)]
    before = json.loads(_http(f"{base}/metadata")[2])["stats"]
    bad = {"inputs": {"x": [[1.0] * 3]}}  # wrong shape, sent among the good ones

    def call(i: int):
        if i == 5:
            return _json_predict(base, bad)
        return _json_predict(base, {"inputs": {"x": inputs[i].tolist()}})

    with ThreadPoolExecutor(12) as pool:
        replies = list(pool.map(call, range(len(inputs))))
    for i, (status, doc) in enumerate(replies):
        if i == 5:
            assert status == 422 and doc["error"]["type"] == "ShapeError"
            continue
        assert status == 200, doc
        for name, ref in zip(["scaled", "top", "label"], rowwise_reference(inputs[i])):
            np.testing.assert_array_equal(np.asarray(doc["outputs"][name], ref.dtype), ref)
    after = json.loads(_http(f"{base}/metadata")[2])["stats"]
    assert after["requests"] - before["requests"] == len(inputs)
    assert after["stacked_runs"] > before["stacked_runs"]  # some requests shared a run
    assert after["largest_stack"] >= 2


def _centering():
    """y = x - mean of x over the batch axis: an answer depends on every row it runs with."""
    return make_model([helper.make_node("ReduceMean", ["x", "axes"], ["m"]),
                       helper.make_node("Sub", ["x", "m"], ["y"])],
                      [tensor_info("x", np.float32, ["n", 4])],
                      [tensor_info("y", np.float32, ["n", 4])],
                      {"axes": np.array([0], np.int64)}, opset=18)


def test_concurrent_clients_of_a_batch_dependent_model_get_their_lone_answers(server):
    _, port = server
    model = _centering()
    with pytest.raises(InvalidOptionError, match=r"batching=True refused: .*ReduceMean"):
        deployment(model, batching=True)
    serve.run(deployment(model, max_batch_size=16, batch_wait_timeout_s=0.05,
                         ray_actor_options={"num_cpus": 0.25}, intra_op_threads=1),
              name="centering", route_prefix="/center")
    base = f"http://127.0.0.1:{port}/center"
    try:
        rng = np.random.default_rng(11)
        inputs = [rng.standard_normal((1 + i % 3, 4)).astype(np.float32) * (i + 1)
                  for i in range(48)]
        lone = InferenceSession.from_graph(model)

        def call(x):
            return _json_predict(base, {"inputs": {"x": x.tolist()}})

        with ThreadPoolExecutor(48) as pool:
            replies = list(pool.map(call, inputs))
        for x, (status, doc) in zip(inputs, replies):
            assert status == 200, doc
            np.testing.assert_allclose(np.asarray(doc["outputs"]["y"], np.float32),
                                       lone.run({"x": x})[0], rtol=1e-6, atol=1e-6)
        meta = json.loads(_http(f"{base}/metadata")[2])
        assert not meta["batching"]["enabled"]
        assert meta["stats"]["requests"] == 48 and meta["stats"]["stacked_runs"] == 0
    finally:
        serve.delete("centering")


def test_bodies_over_the_limit_are_413_by_length_or_by_count(server, rowwise_x_path):
    _, port = server
    serve.run(deployment(rowwise_x_path, max_request_bytes=4096,
                         ray_actor_options={"num_cpus": 0.25}, intra_op_threads=1),
              name="small", route_prefix="/small")
    try:
        status, _, body = _http(f"http://127.0.0.1:{port}/small/predict", b"0" * 5000,
                                "application/json")
        assert status == 413
        assert json.loads(body)["error"] == {
            "status": 413, "type": "PayloadTooLarge",
            "message": "the body has 5000 bytes, over the server's limit of 4096"}
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        chunks = (b"1" * 1000 for _ in range(10))  # chunked: no Content-Length to check
        conn.request("POST", "/small/predict", body=chunks, encode_chunked=True,
                     headers={"Content-Type": "application/json"})
        reply = conn.getresponse()
        assert reply.status == 413
        assert json.loads(reply.read())["error"]["message"] == (
            "the body is over the server's limit of 4096 bytes")
        conn.close()
        x = np.ones((2, 8), np.float32)
        status, doc = _json_predict(f"http://127.0.0.1:{port}/small",
                                    {"inputs": {"x": x.tolist()}})
        assert status == 200
        np.testing.assert_array_equal(doc["outputs"]["top"], rowwise_reference(x)[1])
    finally:
        serve.delete("small")


def test_serve_cli_serves_until_interrupted(server, rowwise_x_path, monkeypatch, capsys):
    _, port = server  # Serve is already up: the command adds its app and removes it after
    seen = {}

    def interrupt() -> None:
        seen["health"] = _http(f"http://127.0.0.1:{port}/cli/health")[0]
        x = np.full((1, 8), 2.0, np.float32)
        seen["predict"] = _json_predict(f"http://127.0.0.1:{port}/cli",
                                        {"inputs": {"x": x.tolist()}})
        seen["expected"] = rowwise_reference(x)[1].tolist()
        raise KeyboardInterrupt

    monkeypatch.setattr(_cli, "wait_for_interrupt", interrupt)
    code = main(["serve", str(rowwise_x_path), "--port", str(port), "--route-prefix", "/cli",
                 "--name", "cli-test", "--replica-cpus", "0.25", "--max-batch-size", "1"])
    out = capsys.readouterr().out
    assert code == 0 and f"http://127.0.0.1:{port}/cli" in out and "stopping" in out
    assert seen["health"] == 200
    status, doc = seen["predict"]
    assert status == 200 and doc["outputs"]["top"] == seen["expected"]
    assert "cli-test" not in serve.status().applications
    assert _http(f"http://127.0.0.1:{port}/m/health")[0] == 200  # the other app is untouched


def test_bad_settings_fail_on_the_driver_before_anything_starts(tmp_path, rowwise_x_path):
    from onnxkiln.errors import InvalidOptionError, ModelLoadError

    with pytest.raises(ModelLoadError, match="does not exist on this machine"):
        deployment(tmp_path / "missing.onnx")
    with pytest.raises(ModelLoadError, match="does not exist on this machine"):
        predict(None, tmp_path / "missing.onnx")
    with pytest.raises(InvalidOptionError, match="device"):
        deployment(rowwise_x_path, device="tpu")
    with pytest.raises(InvalidOptionError, match="max_batch_size"):
        deployment(rowwise_x_path, max_batch_size=0)
    app = deployment(tmp_path / "elsewhere.onnx", check_path=False)  # only the nodes see it
    assert type(app).__name__ == "Application"
