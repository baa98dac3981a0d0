"""The Ray Serve deployment: a FastAPI app over one session per replica, `@serve.batch`."""

# No `from __future__ import annotations`: Serve copies the routes by value, and the copies
# could not resolve `Request` in a string annotation.
import asyncio
import os
from collections.abc import Mapping, Sequence
from dataclasses import asdict
from typing import Any

import onnx
from fastapi import FastAPI
from ray import serve
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response

from onnxkiln import __version__
from onnxkiln.errors import InvalidOptionError
from onnxkiln.integrations.ray import _http
from onnxkiln.integrations.ray._batch_safety import require_independent_rows
from onnxkiln.integrations.ray._config import (
    ModelSource,
    SessionConfig,
    as_written,
    model_source,
)
from onnxkiln.integrations.ray._http import (
    JSON,
    NPY,
    NPZ,
    Engine,
    HttpError,
    decode,
    encode,
    error_body,
    error_for,
    response_format,
)
from onnxkiln.types import IoMeta

__all__ = ["ModelServer", "deployment", "serve_model"]

ROUTES = {
    "POST /predict": "run the model (JSON, npz or npy body; see onnxkiln.integrations.ray)",
    "GET /health": "200 when the replica's session is loaded",
    "GET /metadata": "inputs, outputs, model metadata, device, batching and counters",
    "GET /docs": "this API's OpenAPI page",
    "GET /openapi.json": "this API's OpenAPI schema",
    "GET /": "this list",
}
_BINARY = {"schema": {"type": "string", "format": "binary"}}
_PREDICT_DOC = {  # documented here, read by hand: FastAPI would read the body before the limit
    "parameters": [{"name": "outputs", "in": "query", "schema": {"type": "string"},
                    "description": "the outputs to return, comma-separated (default all)"}],
    "requestBody": {"required": True, "content": {
        JSON: {"schema": {"type": "object", "required": ["inputs"], "properties": {
            "inputs": {"type": "object"}, "dtypes": {"type": "object"},
            "outputs": {"type": "array", "items": {"type": "string"}}}}},
        NPZ: _BINARY, NPY: _BINARY}}}

api = FastAPI(title="onnxkiln", version=__version__,
              description=_http.__doc__.partition("\n\n")[2])  # the formats, errors, batching


@api.exception_handler(HttpError)
async def _refused(request: Request, e: HttpError) -> Response:
    return _error(e)


@api.exception_handler(HTTPException)
async def _no_route(request: Request, e: HTTPException) -> Response:
    """The router's own 404 and 405, in the body every error has."""
    if e.status_code == 405:
        allowed = sorted(e.headers["Allow"].split(", "))
        return _error(HttpError(405, f"{request.url.path} takes {' or '.join(allowed)}, not "
                                f"{request.method}", "MethodNotAllowed",
                                {"Allow": ", ".join(allowed)}))
    if e.status_code == 404:
        return _error(HttpError(404, f"no route {_route(request)}; routes: {list(ROUTES)}",
                                "NotFound"))
    return _error(HttpError(e.status_code, str(e.detail), "BadRequest", e.headers))


@api.exception_handler(Exception)
async def _failed(request: Request, e: Exception) -> Response:
    """A bug: answer 500 (Serve logs the traceback) and keep serving."""
    return _error(error_for(e))


# Above the class: `serve.ingress` copies `api` by value as it wraps the class: its routes,
# handlers and the names they use must exist by then.
def _route(request: Request) -> str:
    path = request.url.path
    root = request.scope.get("root_path") or ""
    if root and path.startswith(root):
        path = path[len(root):]
    return "/" + path.strip("/")


async def _read_body(request: Request, limit: int) -> bytes:
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise HttpError(413, f"the body has {declared} bytes, over the server's limit of "
                        f"{limit}", "PayloadTooLarge")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise HttpError(413, f"the body is over the server's limit of {limit} bytes",
                            "PayloadTooLarge")
        chunks.append(chunk)
    return b"".join(chunks)


def _io(meta: IoMeta) -> dict[str, Any]:
    return {"name": meta.name, "dtype": str(meta.dtype), "kind": meta.kind,
            "shape": list(meta.shape) if meta.shape is not None else None,
            "optional": meta.optional}


def _error(e: HttpError) -> Response:
    return Response(error_body(e.status, e.kind, e.message), status_code=e.status,
                    media_type=JSON, headers=e.headers)


@serve.deployment(name="onnxkiln")
@serve.ingress(api)
class ModelServer:
    """One replica: loads the model once, answers the routes in `ROUTES`."""

    def __init__(self, model: ModelSource, config: SessionConfig, batching: bool,
                 max_batch_size: int, batch_wait_timeout_s: float,
                 max_request_bytes: int) -> None:
        self.session = config.load(model)
        self.engine = Engine(self.session, batching, as_written(model) if batching else None)
        self._inputs = self.session.inputs()
        self._outputs = self.session.outputs()
        self._max_bytes = max_request_bytes
        self._batched = batching and max_batch_size > 1
        self._max_batch_size = max_batch_size
        self._wait = batch_wait_timeout_s
        self._predict_batched.set_max_batch_size(max_batch_size)
        self._predict_batched.set_batch_wait_timeout_s(batch_wait_timeout_s)

    @api.post("/predict", summary=ROUTES["POST /predict"], openapi_extra=_PREDICT_DOC)
    async def predict(self, request: Request) -> Response:
        """The formats are in the description above."""
        body = await _read_body(request, self._max_bytes)
        req = decode(body, request.headers.get("content-type"), self._inputs, self._outputs,
                     self._max_bytes, request.query_params.get("outputs"))
        if self._batched:
            result = await self._predict_batched(req.feeds)
        else:
            result = await asyncio.to_thread(self.engine.run, req.feeds)
        if isinstance(result, BaseException):
            raise error_for(result)
        names = [m.name for m in self._outputs]
        picked = [names.index(n) for n in req.outputs] if req.outputs is not None else None
        if picked is not None:
            names, result = [names[i] for i in picked], [result[i] for i in picked]
        fmt = response_format(req.fmt, request.headers.get("accept"), len(names))
        content, media = encode(names, result, fmt)
        return Response(content, media_type=media)

    @api.api_route("/health", methods=["GET", "HEAD"], summary=ROUTES["GET /health"])
    def health(self) -> dict[str, str]:
        return {"status": "ok", "device": str(self.session.device_id())}

    @api.api_route("/metadata", methods=["GET", "HEAD"], summary=ROUTES["GET /metadata"])
    def metadata(self) -> dict[str, Any]:
        """What GET /metadata returns."""
        return {
            "inputs": [_io(m) for m in self._inputs],
            "outputs": [_io(m) for m in self._outputs],
            "model": asdict(self.session.model_metadata()),
            "device": str(self.session.device_id()),
            "batching": {"enabled": self._batched, "stacking": self.engine.reason,
                         "max_batch_size": self._max_batch_size,
                         "batch_wait_timeout_s": self._wait},
            "stats": self.engine.stats(),
        }

    @api.api_route("/", methods=["GET", "HEAD"], summary=ROUTES["GET /"])
    def routes(self) -> dict[str, dict[str, str]]:
        return {"routes": ROUTES}

    def check_health(self) -> None:
        """Serve's periodic replica check: the session must be there."""
        if self.session is None:
            raise RuntimeError("the model session is not loaded")

    @serve.batch(max_batch_size=32, batch_wait_timeout_s=0.005)
    async def _predict_batched(self, requests: list[dict[str, Any]]) -> list[Any]:
        return await asyncio.to_thread(self.engine.run_batch, requests)


def deployment(
    model: str | os.PathLike | bytes | onnx.ModelProto,
    *,
    name: str = "onnxkiln",
    num_replicas: int = 1,
    batching: bool = False,
    max_batch_size: int = 32,
    batch_wait_timeout_s: float = 0.005,
    max_request_bytes: int = 64 << 20,
    max_ongoing_requests: int | None = None,
    ray_actor_options: Mapping[str, Any] | None = None,
    device: str = "auto",
    providers: Sequence[str] | None = None,
    optimization: str = "all",
    intra_op_threads: int | None = None,
    options: Mapping[str, str] | None = None,
    check_path: bool = True,
) -> serve.Application:
    """A Serve application serving `model` over HTTP; run it with `serve.run(app)`.

    Each of `num_replicas` replicas loads the model once. By default each request runs
    on its own. `batching=True` says the model treats rows independently: requests are
    then queued by `@serve.batch` (up to `max_batch_size` requests or
    `batch_wait_timeout_s`) and compatible ones are stacked along axis 0 into one run
    (see `onnxkiln.integrations.ray._http`), but only after a static check of the graph
    (`onnxkiln.integrations.ray._batch_safety`: nothing reduces, sorts, scans, normalizes
    or contracts over the batch axis) passes; a model that fails it raises
    `InvalidOptionError` naming the node, here when this machine can read the model,
    else when the replicas start.
    `ray_actor_options` are the replicas' (e.g. {"num_gpus": 1} with device "cuda");
    `device`, `providers`, `optimization`, `intra_op_threads` and `options` go to
    `InferenceSession.builder()`. Bad settings raise here, before anything is deployed;
    so does a model path missing on this machine, unless `check_path=False` (a path only
    the cluster's nodes see).

    Example:
        >>> from ray import serve
        >>> serve.run(deployment("model.onnx", num_replicas=2), route_prefix="/")
        >>> # curl -d '{"inputs": {"x": [[1, 2, 3]]}}' -H 'content-type: application/json' \\
        >>> #      localhost:8000/predict
    """
    config = SessionConfig.of(device, providers, optimization, intra_op_threads, options)
    source = model_source(model, check_path)
    for what, value in (("num_replicas", num_replicas), ("max_batch_size", max_batch_size),
                        ("max_request_bytes", max_request_bytes)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise InvalidOptionError(f"{what} must be an int >= 1, got {value!r}")
    if not isinstance(batch_wait_timeout_s, int | float) or batch_wait_timeout_s < 0:
        raise InvalidOptionError(
            f"batch_wait_timeout_s must be a number >= 0, got {batch_wait_timeout_s!r}")
    if batching not in (True, False):
        raise InvalidOptionError(f"batching must be True or False, got {batching!r}")
    if batching and (isinstance(source, bytes) or os.path.isfile(source)):
        require_independent_rows(as_written(source))
    settings: dict[str, Any] = {
        "name": name,
        "num_replicas": num_replicas,
        "max_ongoing_requests": max_ongoing_requests or max(2 * max_batch_size, 16),
    }
    if ray_actor_options is not None:
        settings["ray_actor_options"] = dict(ray_actor_options)
    return ModelServer.options(**settings).bind(
        source, config, batching, max_batch_size, float(batch_wait_timeout_s),
        max_request_bytes)


def serve_model(
    model: str | os.PathLike | bytes | onnx.ModelProto,
    *,
    host: str = "127.0.0.1",
    port: int = 8000,
    route_prefix: str = "/",
    app_name: str = "onnxkiln",
    **kwargs: Any,
) -> str:
    """Start Serve's HTTP proxy on host:port (Ray must be up, or starts locally), run
    `deployment(model, **kwargs)` under `route_prefix` and return its base URL.

    When Serve already runs on the cluster its proxy keeps its own host and port (Serve
    cannot change them while running); the app is added to it."""
    app = deployment(model, **kwargs)
    serve.start(http_options={"host": host, "port": port})
    serve.run(app, name=app_name, route_prefix=route_prefix, blocking=False)
    shown = "127.0.0.1" if host in ("0.0.0.0", "::") else host
    return f"http://{shown}:{port}{route_prefix.rstrip('/')}"
