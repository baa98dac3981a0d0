"""Session settings that travel to Ray actors and replicas, checked on the driver."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import onnx
import onnx_ir as ir

from onnxkiln import loader
from onnxkiln.errors import InvalidOptionError, ModelLoadError
from onnxkiln.session import InferenceSession, SessionBuilder

__all__ = ["ModelSource", "SessionConfig", "as_written", "model_source"]

ModelSource = str | bytes
"""A model as it travels: an absolute file path, or serialized model bytes."""


@dataclass(frozen=True)
class SessionConfig:
    """What `InferenceSession.builder()` is told in each actor or replica.

    `device`: "auto" (CUDA when the actor sees a GPU, e.g. `num_gpus=1`), "cpu", "cuda" or
    "cuda:N"; `providers` overrides it. `optimization`: "disabled" | "basic" | "extended" |
    "all". `intra_op_threads`: BLAS threads per op (match the actor's `num_cpus`).
    `options`: string session options (`SessionBuilder.option`).
    """

    device: str = "auto"
    providers: tuple[str, ...] | None = None
    optimization: str = "all"
    intra_op_threads: int | None = None
    options: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def of(cls, device: str = "auto", providers: Sequence[str] | None = None,
           optimization: str = "all", intra_op_threads: int | None = None,
           options: Mapping[str, str] | None = None) -> SessionConfig:
        """A checked config: bad values raise `InvalidOptionError` here, not in an actor."""
        config = cls(device, tuple(providers) if providers is not None else None, optimization,
                     intra_op_threads, dict(options or {}))
        config.builder()
        return config

    def builder(self) -> SessionBuilder:
        """A builder with these settings (each setter checks its value)."""
        b = InferenceSession.builder().device(self.device).optimization(self.optimization)
        if self.providers is not None:
            b.providers(list(self.providers))
        if self.intra_op_threads is not None:
            b.intra_op_threads(self.intra_op_threads)
        for key, value in self.options.items():
            b.option(key, value)
        return b

    def load(self, model: ModelSource) -> InferenceSession:
        """Build the session from a path or model bytes."""
        if isinstance(model, bytes):
            return self.builder().load_bytes(model)
        return self.builder().load(model)


def model_source(model: str | os.PathLike | bytes | bytearray | onnx.ModelProto,
                 check_path: bool = False) -> ModelSource:
    """The model in a form to ship to actors: paths made absolute, protos serialized.

    A path is shipped, not the file: every node that runs an actor must see it at that
    path (shared storage), or pass the model's bytes instead. `check_path`: a path that
    does not exist on this machine raises `ModelLoadError` here, rather than failing
    in every actor.
    """
    if isinstance(model, onnx.ModelProto):
        return model.SerializeToString()
    if isinstance(model, bytes | bytearray | memoryview):
        return bytes(model)
    if isinstance(model, str | os.PathLike):
        path = Path(model).expanduser().absolute()
        if check_path and not path.is_file():
            raise ModelLoadError(
                f"model file '{path}' does not exist on this machine; pass check_path=False "
                "if only the cluster's nodes see it")
        return str(path)
    raise InvalidOptionError(
        f"model must be a file path, model bytes or an onnx.ModelProto, got {type(model).__name__}"
    )



def as_written(model: ModelSource) -> ir.Model:
    """The model as its file or bytes hold it, checked by the loader but not optimized
    (what the batching check reads)."""
    return loader.load_bytes(model) if isinstance(model, bytes) else loader.load_path(model)
