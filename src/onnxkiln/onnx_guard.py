"""onnx's C++ checker and shape inference, called so that a crash cannot end this process.

Some of onnx's C++ inference functions dereference a type they never checked: the
ai.onnx.ml ones are fragile that way (a `LabelEncoder` reading the untyped output of a
`TreeEnsembleRegressor`, as skl2onnx writes with `decision_path=True`, is a segfault). A
model with a node of a fragile domain (in any graph or function) goes to a worker
subprocess, started once and reused; others, where the cost of a copy across a pipe would
buy nothing, are checked in this process. A crash or a hang of the worker is an
`OnnxCrashError` (the worker restarts on the next call), like any exception of onnx: the
callers treat inference as a best effort and go on without it.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import logging
import os
import struct
import subprocess
import sys
import threading
from typing import IO, Any

__all__ = ["FRAGILE_DOMAINS", "MAX_GUARDED_BYTES", "OnnxCrashError", "check_model",
           "infer_shapes", "is_fragile"]

logger = logging.getLogger(__name__)

FRAGILE_DOMAINS = frozenset({"ai.onnx.ml"})
MAX_GUARDED_BYTES = 256 << 20  # a larger model is not sent to the worker: inference skipped
CALL_SECONDS = 60.0  # a worker call still going this long is a hang: the worker is killed


class OnnxCrashError(RuntimeError):
    """onnx's C++ code died, hung or was not run on a model (a best-effort step skips)."""


def is_fragile(model: Any) -> bool:
    """Whether `model` (a ModelProto) has a node of a domain whose C++ inference can crash."""
    pending = [model.graph.node, *(f.node for f in model.functions)]
    while pending:
        for node in pending.pop():
            if node.domain in FRAGILE_DOMAINS:
                return True
            for a in node.attribute:
                if a.HasField("g"):
                    pending.append(a.g.node)
                pending.extend(g.node for g in a.graphs)
    return False


MAX_PROPAGATED_LENGTH = 4096
"""onnx's data propagation (`data_prop=True`) treats every 1-D tensor fed to Add, Mul,
ConstantOfShape, Expand... as a shape and builds one dim per element: a 40M-element vector
costs ~20 s and gigabytes. A model declaring a longer vector is inferred without it."""


def _has_long_vector(model: Any) -> bool:
    graph = model.graph
    for vi in (*graph.input, *graph.output, *graph.value_info):
        t = vi.type.tensor_type
        if (vi.type.HasField("tensor_type") and t.HasField("shape") and len(t.shape.dim) == 1
                and t.shape.dim[0].dim_value > MAX_PROPAGATED_LENGTH):
            return True
    return False


def infer_shapes(model: Any, **kwargs: Any) -> Any:
    """`onnx.shape_inference.infer_shapes(model, **kwargs)`, guarded when `model` is fragile;
    without data propagation when the model declares a long vector (MAX_PROPAGATED_LENGTH)."""
    if kwargs.get("data_prop") and _has_long_vector(model):
        kwargs = {**kwargs, "data_prop": False}
    if not is_fragile(model):
        import onnx

        return onnx.shape_inference.infer_shapes(model, **kwargs)
    import onnx

    return onnx.load_model_from_string(_call("infer_shapes", model, kwargs))


def check_model(model: Any, **kwargs: Any) -> None:
    """`onnx.checker.check_model(model, **kwargs)`, guarded when `model` is fragile."""
    if not is_fragile(model):
        import onnx

        onnx.checker.check_model(model, **kwargs)
        return
    _call("check_model", model, kwargs)


# run by path, not as `-m onnxkiln...` (no package import) nor as a script (its folder would
# come first on sys.path, and this package's `types.py` would shadow the standard one)
_WORKER = "import runpy, sys; runpy.run_path(sys.argv[1], run_name='__main__')"
_lock = threading.Lock()
_worker: subprocess.Popen[bytes] | None = None
_owner = os.getpid()  # the process that started _worker


def _call(what: str, model: Any, kwargs: dict[str, Any]) -> bytes:
    data = model.SerializeToString()
    if len(data) > MAX_GUARDED_BYTES:
        raise OnnxCrashError(f"onnx {what} skipped: a {len(data)}-byte model with ai.onnx.ml "
                             f"nodes is over the {MAX_GUARDED_BYTES}-byte bound of the worker")
    header = json.dumps({"what": what, "kwargs": kwargs}).encode()
    with _lock:
        worker = _start()
        assert worker.stdin is not None and worker.stdout is not None
        timer = threading.Timer(CALL_SECONDS, worker.kill)
        timer.start()
        try:
            _send(worker.stdin, header)
            _send(worker.stdin, data)
            status = worker.stdout.read(1)
            payload = _receive(worker.stdout) if status else b""
        except OSError:
            status = b""
        finally:
            timer.cancel()
        if not status:
            _stop(worker)
            raise OnnxCrashError(f"onnx's C++ {what} crashed or hung on this model "
                                 f"(worker exit status {worker.returncode})")
    if status == b"e":
        kind, _, message = payload.decode("utf-8", "replace").partition("\0")
        raise _error_class(kind)(message)
    return payload


def _start() -> subprocess.Popen[bytes]:
    global _worker, _owner
    if _owner != os.getpid():  # a forked child: the parent's worker and pipes are not its own
        _worker, _owner = None, os.getpid()
    if _worker is None or _worker.poll() is not None:
        _worker = subprocess.Popen([sys.executable, "-c", _WORKER, os.path.abspath(__file__)],
                                   stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                   stderr=subprocess.DEVNULL)
    return _worker


def _stop(worker: subprocess.Popen[bytes]) -> None:
    global _worker
    worker.kill()
    worker.wait()
    for stream in (worker.stdin, worker.stdout):
        if stream is not None:
            stream.close()
    logger.debug("onnx worker ended with status %s", worker.returncode)
    _worker = None


@atexit.register
def _close() -> None:
    """At exit: the worker ends when its stdin closes (killed if it does not in a second)."""
    worker = _worker
    if worker is None or worker.poll() is not None:
        return
    with contextlib.suppress(OSError):
        worker.stdin.close()  # type: ignore[union-attr]
    try:
        worker.wait(timeout=1.0)
    except subprocess.TimeoutExpired:
        worker.kill()
        worker.wait()
    if worker.stdout is not None:
        worker.stdout.close()


def _error_class(kind: str) -> type[Exception]:
    import onnx

    known = {"ValidationError": onnx.checker.ValidationError,
             "InferenceError": onnx.shape_inference.InferenceError}
    return known.get(kind, OnnxCrashError)


def _send(stream: IO[bytes], data: bytes) -> None:
    stream.write(struct.pack("<Q", len(data)))
    stream.write(data)
    stream.flush()


def _receive(stream: IO[bytes]) -> bytes:
    size = stream.read(8)
    if len(size) < 8:
        raise OSError("the worker's reply ended early")
    (n,) = struct.unpack("<Q", size)
    data = stream.read(n)
    if len(data) < n:
        raise OSError("the worker's reply ended early")
    return data


def _serve() -> None:
    """The worker's loop: requests on stdin, replies on stdout, until stdin closes."""
    import onnx

    requests, replies = sys.stdin.buffer, sys.stdout.buffer
    while True:
        try:
            header = json.loads(_receive(requests))
            data = _receive(requests)
        except OSError:
            return
        try:
            model = onnx.load_model_from_string(data)
            if header["what"] == "check_model":
                onnx.checker.check_model(model, **header["kwargs"])
                out = b""
            else:
                out = onnx.shape_inference.infer_shapes(model, **header["kwargs"])
                out = out.SerializeToString()
            replies.write(b"o")
        except Exception as e:
            out = f"{type(e).__name__}\0{e}".encode()
            replies.write(b"e")
        _send(replies, out)


if __name__ == "__main__":
    _serve()
