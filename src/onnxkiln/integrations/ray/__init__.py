"""onnxkiln on Ray: batch inference with Ray Data, HTTP serving with Ray Serve.

Install with `pip install "onnxkiln[ray]"` (Ray Data and Serve).

Batch inference: `BatchPredictor` is a callable class for `Dataset.map_batches`; one
session per actor, loaded once. `predict(ds, model, ...)` wires it up:

    >>> import ray
    >>> from onnxkiln.integrations.ray import predict
    >>> ds = ray.data.read_parquet("features/")
    >>> out = predict(ds, "model.onnx", input_columns={"x": ["f0", "f1", "f2"]},
    ...               keep_columns=["id"], concurrency=4, batch_size=4096)
    >>> out.write_parquet("scores/")

Serving: `deployment(model, ...)` returns a Serve application; `serve_model` also
starts the HTTP proxy (what `onnxkiln serve MODEL` does):

    >>> from ray import serve
    >>> serve.run(deployment("model.onnx", num_replicas=2))

Each request runs on its own unless `batching=True`, which stacks concurrent requests
into one run after a static check that the model keeps rows apart (refused, naming the
node, when something reduces, sorts or normalizes over the batch axis; see
`onnxkiln.integrations.ray._batch_safety`).

Routes: POST /predict, GET /health, GET /metadata, GET / (the list), and FastAPI's
OpenAPI page at GET /docs (schema at /openapi.json). Request and response formats (JSON,
npz, npy), error statuses and the batching rules are described in
`onnxkiln.integrations.ray._http` (and on the OpenAPI page).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from onnxkiln.integrations.ray._batch import BatchPredictor
from onnxkiln.integrations.ray._config import SessionConfig
from onnxkiln.integrations.ray._http import JSON, NPY, NPZ

if TYPE_CHECKING:
    from onnxkiln.integrations.ray._serve import ModelServer, deployment, serve_model

__all__ = [
    "JSON",
    "NPY",
    "NPZ",
    "BatchPredictor",
    "ModelServer",
    "SessionConfig",
    "deployment",
    "predict",
    "serve_model",
]

_SERVE_NAMES = ("ModelServer", "deployment", "serve_model")
INSTALL_HINT = 'install Ray with `pip install "onnxkiln[ray]"` (or "ray[data,serve]")'


def __getattr__(name: str) -> Any:
    if name in _SERVE_NAMES:  # imported on first use: Serve is heavy and optional
        try:
            from onnxkiln.integrations.ray import _serve
        except ImportError as e:
            raise ImportError(f"onnxkiln.integrations.ray.{name} needs Ray Serve: "
                              f"{INSTALL_HINT} ({e})") from e
        return getattr(_serve, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def predict(ds: Any, model: Any, *, batch_size: int | None = 1024, concurrency: int = 1,
            num_cpus: float | None = None, num_gpus: float | None = None,
            batch_format: str = "numpy", check_path: bool = True,
            **predictor_kwargs: Any) -> Any:
    """`ds.map_batches(BatchPredictor, ...)` on a pool of `concurrency` actors.

    `predictor_kwargs` go to `BatchPredictor` (input_columns, output_columns,
    keep_columns, cast, device, providers, optimization, intra_op_threads, options);
    they are checked here, not in the actors, and so is a model path (unless
    `check_path=False`: a path only the cluster's nodes see). `num_gpus=1` gives each
    actor a GPU, and the session (device "auto") runs there. Returns the lazy result
    Dataset.

    Each actor holds its `num_cpus` (default 1) for the whole job; the tasks that read
    or prepare `ds` need CPUs too. When the pool takes every CPU of the cluster the job
    stalls, so on a small machine give actors `num_cpus=0.5`, run fewer actors than
    CPUs, or `ds.materialize()` first.
    """
    try:
        import ray.data
    except ImportError as e:
        raise ImportError(f"predict needs Ray Data: {INSTALL_HINT} ({e})") from e
    from onnxkiln.integrations.ray._config import model_source

    kwargs = dict(predictor_kwargs)
    session_keys = ("device", "providers", "optimization", "intra_op_threads", "options")
    config = SessionConfig.of(**{k: kwargs.pop(k) for k in session_keys if k in kwargs})
    kwargs["config"] = config
    kwargs["model"] = model_source(model, check_path)
    remote: dict[str, Any] = {}
    if num_cpus is not None:
        remote["num_cpus"] = num_cpus
    if num_gpus is not None:
        remote["num_gpus"] = num_gpus
    return ds.map_batches(BatchPredictor, fn_constructor_kwargs=kwargs, batch_size=batch_size,
                          batch_format=batch_format,
                          compute=ray.data.ActorPoolStrategy(size=concurrency), **remote)
