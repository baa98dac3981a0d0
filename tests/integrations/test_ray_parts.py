"""The Ray integration's parts that need no Ray: HTTP formats, batching, BatchPredictor."""

from __future__ import annotations

import io
import json
import zipfile

import numpy as np
import pytest
from conftest import rowwise_reference
from onnx import helper

from onnxkiln import InferenceSession, InputNotFoundError, InvalidInputError, ShapeError
from onnxkiln.cli import main
from onnxkiln.errors import InvalidOptionError, KernelError
from onnxkiln.integrations.ray import BatchPredictor, SessionConfig
from onnxkiln.integrations.ray._http import (
    Engine,
    HttpError,
    decode,
    encode,
    error_for,
    media_format,
    response_format,
)
from onnxkiln.testing import make_model, tensor_info

LIMIT = 1 << 20


@pytest.fixture(scope="module")
def session(rowwise):
    return InferenceSession.from_graph(rowwise)


@pytest.fixture(scope="module")
def single():
    """One input a [n, 2] float32, one output b = -a."""
    model = make_model([helper.make_node("Neg", ["a"], ["b"])],
                       [tensor_info("a", np.float32, ["n", 2])],
                       [tensor_info("b", np.float32, ["n", 2])])
    return InferenceSession.from_graph(model)


def _data(n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((n, 8)).astype(np.float32),
            rng.standard_normal((n, 1)).astype(np.float32))


def _npy(arr: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, arr)
    return buf.getvalue()


def _npz(**arrays: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    return buf.getvalue()


def _decode(session, body, ctype, query=None):
    return decode(body, ctype, session.inputs(), session.outputs(), LIMIT, query)


def _status(session, body, ctype) -> tuple[int, str]:
    with pytest.raises(HttpError) as info:
        _decode(session, body, ctype)
    return info.value.status, info.value.message


# --- request bodies ------------------------------------------------------------------------


def test_json_lists_become_the_declared_dtype_and_outputs_can_be_picked(session):
    body = json.dumps({"inputs": {"x": [[1, 2, 3, 4, 5, 6, 7, 8]], "s": [[0.5]]},
                       "outputs": ["label"]}).encode()
    req = _decode(session, body, "application/json; charset=utf-8")
    assert req.fmt == "json" and req.outputs == ["label"]
    assert req.feeds["x"].dtype == np.float32 and req.feeds["x"].shape == (1, 8)
    np.testing.assert_array_equal(req.feeds["s"], np.array([[0.5]], np.float32))


def test_json_explicit_dtype_is_kept_so_the_session_rejects_a_wrong_one(session):
    body = json.dumps({"inputs": {"x": [[1.0] * 8], "s": [[0.0]]},
                       "dtypes": {"x": "float64"}}).encode()
    req = _decode(session, body, "application/json")
    assert req.feeds["x"].dtype == np.float64
    with pytest.raises(InvalidInputError) as info:
        session.run(req.feeds)
    err = error_for(info.value)
    assert err.status == 422 and "expects float32" in err.message and "float64" in err.message


def test_json_floats_for_an_int_input_are_not_truncated():
    model = make_model([helper.make_node("Identity", ["i"], ["o"])],
                       [tensor_info("i", np.int64, ["n"])], [tensor_info("o", np.int64, ["n"])])
    s = InferenceSession.from_graph(model)
    feeds = decode(b'{"inputs": {"i": [1.5, 2]}}', "application/json", s.inputs(),
                   s.outputs(), LIMIT).feeds
    assert feeds["i"].dtype == np.float64  # left as parsed: the session says int64 expected
    with pytest.raises(InvalidInputError, match="int64"):
        s.run(feeds)
    ok = decode(b'{"inputs": {"i": [1, 2]}}', "application/json", s.inputs(), s.outputs(),
                LIMIT).feeds
    np.testing.assert_array_equal(s.run(ok)[0], [1, 2])


@pytest.mark.parametrize(("body", "needle"), [
    (b"{not json", "malformed JSON"),
    (b"\xff\xfe\x00", "malformed JSON"),
    (b"[1, 2]", "must be an object"),
    (b'{"x": [1]}', "must be an object"),
    (b'{"inputs": {"x": [[1, 2], [3]]}}', "not a rectangular"),
    (b'{"inputs": {"x": {"a": 1}}}', "must be a number"),
    (b'{"inputs": {"x": null}}', "must be a number"),
    (b'{"inputs": {"x": [1, "a", {}]}}', "not a rectangular"),
    (b'{"inputs": {"x": [1]}, "extra": 1}', "unknown key"),
    (b'{"inputs": {"x": [1]}, "dtypes": {"x": "floaty"}}', "unknown dtype"),
    (b'{"inputs": {"x": [1]}, "dtypes": {"y": "float32"}}', 'not in "inputs"'),
    (b'{"inputs": {"x": [1]}, "dtypes": {"x": "int8"}}', None),  # fine: 200-path
    (b'{"inputs": {"x": [300]}, "dtypes": {"x": "int8"}}', "cannot make a int8 array"),
    (b'{"inputs": {"x": [1]}, "outputs": "top"}', "list of output names"),
    (b"[" * 100000 + b"]" * 100000, "malformed JSON"),
])
def test_malformed_json_is_a_400(session, body, needle):
    if needle is None:
        assert _decode(session, body, "application/json").feeds["x"].dtype == np.int8
        return
    status, message = _status(session, body, "application/json")
    assert status == 400 and needle in message, message


def test_unknown_output_names_are_a_422_listing_the_outputs(session):
    status, message = _status(session, b'{"inputs": {}, "outputs": ["nope"]}', "application/json")
    assert status == 422 and "['scaled', 'top', 'label']" in message


def test_npz_and_npy_bodies_round_trip(session, single):
    x, s = _data(3)
    req = _decode(session, _npz(x=x, s=s), "application/x-npz")
    assert req.fmt == "npz"
    np.testing.assert_array_equal(req.feeds["x"], x)
    np.testing.assert_array_equal(req.feeds["s"], s)
    sniffed = _decode(session, _npz(x=x, s=s), "application/octet-stream")
    assert sniffed.fmt == "npz"
    one = single
    fortran = np.asfortranarray(np.arange(6, dtype=np.float32).reshape(3, 2))
    for ctype in ("application/x-npy", None):
        req = decode(_npy(fortran), ctype, one.inputs(), one.outputs(), LIMIT)
        assert req.fmt == "npy"
        np.testing.assert_array_equal(req.feeds["a"], fortran)


def test_bad_binary_bodies_are_400s_never_crashes(session, single):
    x, s = _data(2)
    good = _npy(x)
    cases = {
        "garbage npz": (b"PK\x03\x04 garbage", "application/x-npz", "not a valid .npz"),
        "no zip": (b"just bytes", "application/x-npz", "not a valid .npz"),
        "garbage npy": (b"\x93NUMPY garbage", "application/octet-stream", "not a valid .npy"),
        "npy, no header": (b"\x93NUMPY\x01\x00", "application/x-npy", "not a valid .npy"),
        "unknown bytes": (b"\x00\x01\x02", None, "cannot tell"),
    }
    for name, (body, ctype, needle) in cases.items():
        status, message = _status(single, body, ctype)
        assert status == 400 and needle in message, (name, message)
    huge = io.BytesIO()
    np.lib.format.write_array_header_1_0(
        huge, {"descr": "<f4", "fortran_order": False, "shape": (10**12,)})
    status, message = _status(single, huge.getvalue() + b"\0" * 8, "application/x-npy")
    assert status == 400 and "8 bytes follow" in message  # refused before allocating
    truncated = _npz_raw({"x.npy": good[:-4], "s.npy": _npy(s)})
    status, message = _status(session, truncated, "application/x-npz")
    assert status == 400 and "header says (2, 8)" in message
    status, message = _status(session, _npz_raw({"x.txt": b"hi"}), "application/x-npz")
    assert status == 400 and "not an .npy member" in message
    objects = np.array([{"a": 1}, None], dtype=object)
    buf = io.BytesIO()
    np.save(buf, objects, allow_pickle=True)
    status, message = _status(session, _npz_raw({"x.npy": buf.getvalue()}), "application/x-npz")
    assert status == 400 and "pickled" in message
    status, message = _status(session, good, "application/x-npy")
    assert status == 400 and "send an .npz" in message  # two inputs: npy cannot name them
    status, message = _status(session, good, "text/csv")
    assert status == 415


def _npz_raw(members: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as archive:
        for name, data in members.items():
            archive.writestr(name, data)
    return buf.getvalue()


def test_size_limits_are_413(session):
    x, s = _data(4)
    body = _npz(x=x, s=s)
    with pytest.raises(HttpError) as info:
        decode(body, "application/x-npz", session.inputs(), session.outputs(), len(body) - 1)
    assert info.value.status == 413
    bomb = io.BytesIO()
    with zipfile.ZipFile(bomb, "w", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("x.npy", b"\0" * (4 << 20))
    with pytest.raises(HttpError) as info:
        decode(bomb.getvalue(), "application/x-npz", session.inputs(), session.outputs(), LIMIT)
    assert info.value.status == 413 and "unpacks to" in info.value.message


def test_request_dtypes_and_sizes_are_checked_before_allocating(session):
    bomb = b'{"inputs": {"x": [[1]]}, "dtypes": {"x": "U100000000"}}'
    status, message = _status(session, bomb, "application/json")
    assert status == 422 and "'U100000000'" in message and "float32" in message
    for dtype in ("V1000000", "O", "datetime64[s]", "[('a', '<f4')]"):
        body = json.dumps({"inputs": {"x": [[1]]}, "dtypes": {"x": dtype}}).encode()
        assert _status(session, body, "application/json")[0] in (400, 422), dtype
    wide = json.dumps({"inputs": {"x": [0] * 70_000}, "dtypes": {"x": "complex128"}}).encode()
    status, message = _status(session, wide, "application/json")  # 210 KB -> 1.1 MB
    assert status == 413 and "70000 elements x 16 bytes" in message
    strings = json.dumps({"inputs": {"x": ["a" * 200_000] + [""] * 100_000}}).encode()
    status, message = _status(session, strings, "application/json")  # would be 80 GB as <U
    assert status == 400 and "holds strings" in message
    ok = json.dumps({"inputs": {"x": [[1] * 8]}, "dtypes": {"x": "float16"}}).encode()
    assert _decode(session, ok, "application/json").feeds["x"].dtype == np.float16


def test_string_inputs_take_str_dtypes_as_objects():
    model = make_model([helper.make_node("Identity", ["t"], ["o"])],
                       [tensor_info("t", np.str_, ["n"])], [tensor_info("o", np.str_, ["n"])])
    s = InferenceSession.from_graph(model)
    body = json.dumps({"inputs": {"t": ["ab", "c"]}, "dtypes": {"t": "U100000000"}}).encode()
    feeds = decode(body, "application/json", s.inputs(), s.outputs(), LIMIT).feeds
    assert feeds["t"].dtype == object and feeds["t"].tolist() == ["ab", "c"]
    assert s.run(feeds)[0].tolist() == ["ab", "c"]


# --- responses -----------------------------------------------------------------------------


def test_responses_follow_the_request_format_or_accept():
    assert response_format("json", None, 2) == "json"
    assert response_format("npz", "*/*", 2) == "npz"
    assert response_format("npz", "application/json, */*", 2) == "json"
    assert response_format("json", "application/x-npy", 1) == "npy"
    assert response_format("npy", None, 3) == "npz"  # npy holds one array
    assert media_format("application/problem+json", b"") == "json"


def test_encoded_responses_decode_to_the_same_arrays():
    arrays = [np.arange(6, dtype=np.float32).reshape(2, 3) / 7, np.array([3, 1]),
              np.array(["a", "bc"], dtype=object)]
    names = ["p", "q", "r"]
    body, ctype = encode(names, arrays, "json")
    doc = json.loads(body)
    assert ctype == "application/json" and doc["dtypes"] == {"p": "float32", "q": "int64",
                                                               "r": "object"}
    np.testing.assert_array_equal(np.asarray(doc["outputs"]["p"], np.float32), arrays[0])
    assert doc["outputs"]["r"] == ["a", "bc"] and doc["shapes"]["p"] == [2, 3]
    body, ctype = encode(names[:2], arrays[:2], "npz")
    loaded = np.load(io.BytesIO(body))
    assert ctype == "application/x-npz" and sorted(loaded.files) == ["p", "q"]
    np.testing.assert_array_equal(loaded["p"], arrays[0])
    body, ctype = encode(["q"], [arrays[1]], "npy")
    np.testing.assert_array_equal(np.load(io.BytesIO(body)), arrays[1])
    with pytest.raises(HttpError) as info:
        encode(["c"], [np.ones(2, np.complex64)], "json")
    assert info.value.status == 406


def test_errors_map_to_statuses_with_the_session_message():
    assert error_for(InputNotFoundError("unknown input 'xx'")).status == 422
    assert error_for(ShapeError("rank")).status == 422
    err = error_for(KernelError("node n failed"))
    assert (err.status, err.kind, err.message) == (500, "KernelError", "node n failed")
    assert error_for(ZeroDivisionError("x")).status == 500


# --- batching ------------------------------------------------------------------------------


def test_stacked_runs_give_each_request_its_own_rows(session, rowwise):
    engine = Engine(session, batching=True, model=rowwise)
    assert engine.batchable and "checked" in engine.reason
    sizes = [1, 5, 3, 2]
    data = [_data(n, seed=i) for i, n in enumerate(sizes)]
    results = engine.run_batch([{"x": x, "s": s} for x, s in data])
    for (x, s), got in zip(data, results):
        for a, b in zip(got, rowwise_reference(x, s)):
            np.testing.assert_array_equal(a, b)
    stats = engine.stats()
    assert stats["requests"] == 4 and stats["stacked_runs"] == 1 and stats["largest_stack"] == 4


def test_a_bad_request_in_a_batch_fails_alone(session, rowwise):
    engine = Engine(session, batching=True, model=rowwise)
    x, s = _data(2)
    requests = [{"x": x, "s": s}, {"x": x.astype(np.float64), "s": s}, {"xx": x, "s": s},
                {"x": x, "s": s}, {"x": x[:, :4].copy(), "s": s}]
    results = engine.run_batch(requests)
    for i in (0, 3):
        np.testing.assert_array_equal(results[i][0], rowwise_reference(x, s)[0])
    assert isinstance(results[1], InvalidInputError) and "float64" in str(results[1])
    assert isinstance(results[2], InputNotFoundError) and "did you mean 'x'" in str(results[2])
    assert isinstance(results[4], ShapeError)
    assert engine.stats()["errors"] == 3


def test_by_default_each_request_runs_alone(session):
    engine = Engine(session)
    assert not engine.batchable and "own" in engine.reason
    data = [_data(n, seed=i) for i, n in enumerate([2, 3])]
    results = engine.run_batch([{"x": x, "s": s} for x, s in data])
    for (x, s), got in zip(data, results):
        np.testing.assert_array_equal(got[0], rowwise_reference(x, s)[0])
    assert engine.stats()["runs"] == 2 and engine.stats()["stacked_runs"] == 0


def test_batching_a_model_that_mixes_rows_is_refused():
    total = make_model([helper.make_node("ReduceSum", ["a"], ["b"], keepdims=0)],
                       [tensor_info("a", np.float32, ["n", 2])], [tensor_info("b", np.float32, [])])
    s = InferenceSession.from_graph(total)
    with pytest.raises(InvalidOptionError, match=r"batching=True refused: .*ReduceSum.*all axes"):
        Engine(s, batching=True, model=total)
    with pytest.raises(InvalidOptionError, match="True or False"):
        Engine(s, batching=None)
    alone = Engine(s).run_batch([{"a": np.ones((2, 2), np.float32)},
                                 {"a": np.full((3, 2), 2, np.float32)}])
    assert [float(r[0]) for r in alone] == [4.0, 12.0]


# --- BatchPredictor (Ray Data's callable, used here without Ray) ------------------------------


def test_predictor_on_numpy_batches(rowwise):
    x, s = _data(64)
    p = BatchPredictor(rowwise, keep_columns=["id"], output_columns={"scaled": None,
                                                                     "top": "score"})
    out = p({"id": np.arange(64), "x": x.astype(np.float64), "s": s})  # float64 cast down
    ref = rowwise_reference(x, s)
    assert list(out) == ["id", "score", "label"]
    np.testing.assert_array_equal(out["score"], ref[1])
    np.testing.assert_array_equal(out["label"], ref[2])
    strict = BatchPredictor(rowwise, cast=None)
    with pytest.raises(InvalidInputError, match="float64"):
        strict({"x": x.astype(np.float64), "s": s})


def test_predictor_maps_columns_and_explains_missing_ones(rowwise):
    x, s = _data(16)
    batch = {f"f{j}": x[:, j] for j in range(8)} | {"bias": s[:, 0]}
    p = BatchPredictor(rowwise, input_columns={"x": [f"f{j}" for j in range(8)], "s": ["bias"]},
                       optimization="disabled", device="cpu", intra_op_threads=1)
    out = p(batch)
    np.testing.assert_array_equal(out["scaled"], rowwise_reference(x, s)[0])
    with pytest.raises(InputNotFoundError, match="no column 's'.*input_columns"):
        BatchPredictor(rowwise)({"x": x})
    with pytest.raises(InputNotFoundError, match="not inputs of the model"):
        BatchPredictor(rowwise, input_columns={"nope": "x"})
    with pytest.raises(InvalidOptionError, match="device"):
        BatchPredictor(rowwise, device="tpu")
    with pytest.raises(InvalidOptionError, match="optimization"):
        SessionConfig.of(optimization="max")


def test_predictor_on_pandas_batches(rowwise):
    pd = pytest.importorskip("pandas", reason="pandas comes with ray[data]")
    x, s = _data(10)
    frame = pd.DataFrame({"id": np.arange(10) + 100, "x": list(x), "s": s[:, 0]},
                         index=np.arange(10) + 5)
    try:  # Ray Data hands pandas batches with Arrow-backed columns
        import pyarrow as pa

        frame["s"] = frame["s"].astype(pd.ArrowDtype(pa.float32()))
    except ImportError:
        pass
    out = BatchPredictor(rowwise, input_columns={"s": ["s"]}, keep_columns=True)(frame)
    ref = rowwise_reference(x, s)
    assert isinstance(out, pd.DataFrame) and list(out.index) == list(frame.index)
    assert list(out.columns) == ["id", "x", "s", "scaled", "top", "label"]
    np.testing.assert_array_equal(np.stack(out["scaled"].to_numpy()), ref[0])
    np.testing.assert_array_equal(out["top"].to_numpy(), ref[1])


def test_serve_cli_reports_a_bad_model_before_starting_ray(tmp_path, capsys):
    code = main(["serve", str(tmp_path / "missing.onnx"), "--port", "1"])
    assert code == 1 and "does not exist" in capsys.readouterr().err
