"""Changes SessionOptions make to a model before it is built: initializers given with
`add_initializer` / `add_external_initializers`, external-data files given in memory,
free dimensions fixed by name or denotation, and `ORT_LOAD_CONFIG_FROM_MODEL`."""

from __future__ import annotations

import json
import os
import warnings
from typing import Any

import numpy as np
import onnx
from onnx import numpy_helper

from onnxkiln.errors import InvalidOptionError, ModelLoadError

__all__ = ["LOAD_CONFIG_ENV", "apply_model_config", "edit_model", "has_edits"]

LOAD_CONFIG_ENV = "ORT_LOAD_CONFIG_FROM_MODEL"
_CONFIG_KEY = "ort_config"  # the metadata_props entry onnxruntime reads with the variable
_SETTABLE = ("intra_op_num_threads", "inter_op_num_threads", "graph_optimization_level",
             "execution_mode", "execution_order", "enable_profiling", "profile_file_prefix",
             "log_severity_level", "log_verbosity_level", "logid", "enable_cpu_mem_arena",
             "enable_mem_pattern", "enable_mem_reuse", "use_deterministic_compute",
             "optimized_model_filepath")


def has_edits(so: Any) -> bool:
    """True when `so` asks for any change to the model."""
    return bool(so._initializers or so._external_files or so._dim_names
                or so._dim_denotations)


def edit_model(proto: onnx.ModelProto, so: Any) -> onnx.ModelProto:
    """`proto`, changed in place as the options `so` ask."""
    g = proto.graph
    if so._external_files:
        _embed_external(g, so._external_files)
    if so._initializers:
        _replace_initializers(g, so._initializers)
    if so._dim_names or so._dim_denotations:
        _fix_dims(g, dict(so._dim_names), dict(so._dim_denotations))
    return proto


def apply_model_config(proto: onnx.ModelProto, so: Any) -> None:
    """With ORT_LOAD_CONFIG_FROM_MODEL=1, set the session options the model's "ort_config"
    metadata names ({"session_options": {...}}) on `so`; they win over the caller's."""
    if os.environ.get(LOAD_CONFIG_ENV) != "1":
        return
    text = next((p.value for p in proto.metadata_props if p.key == _CONFIG_KEY), None)
    if text is None:
        return
    try:
        config = json.loads(text)
    except ValueError as e:
        raise ModelLoadError(f"{LOAD_CONFIG_ENV}=1: the model's '{_CONFIG_KEY}' metadata is "
                             f"not JSON ({e})") from None
    options = config.get("session_options", {}) if isinstance(config, dict) else None
    if not isinstance(options, dict):
        raise ModelLoadError(f"{LOAD_CONFIG_ENV}=1: '{_CONFIG_KEY}' must be a JSON object "
                             "with a 'session_options' object")
    for key, value in options.items():
        if key not in _SETTABLE:
            raise InvalidOptionError(
                f"{LOAD_CONFIG_ENV}=1: the model's '{_CONFIG_KEY}' sets unknown session "
                f"option {key!r}; known: {list(_SETTABLE)}")
        setattr(so, key, value)


def _replace_initializers(g: onnx.GraphProto, values: dict[str, np.ndarray]) -> None:
    index = {t.name: i for i, t in enumerate(g.initializer)}
    for name, array in values.items():
        i = index.get(name)
        if i is None:
            warnings.warn(f"SessionOptions.add_initializer: the model has no initializer "
                          f"named {name!r}; the value is not used", stacklevel=6)
            continue
        old = g.initializer[i]
        new = numpy_helper.from_array(np.ascontiguousarray(array), name)
        if new.data_type != old.data_type:
            raise InvalidOptionError(
                f"SessionOptions.add_initializer({name!r}): the value is "
                f"{onnx.TensorProto.DataType.Name(new.data_type)}, the model's initializer "
                f"{onnx.TensorProto.DataType.Name(old.data_type)}")
        g.initializer[i].CopyFrom(new)


def _embed_external(g: onnx.GraphProto, files: dict[str, memoryview]) -> None:
    for t in g.initializer:
        if t.data_location != onnx.TensorProto.EXTERNAL:
            continue
        info = {e.key: e.value for e in t.external_data}
        buf = files.get(info.get("location", ""))
        if buf is None:
            continue
        try:
            offset = int(info.get("offset", "0"))
            length = int(info["length"]) if "length" in info else len(buf) - offset
        except ValueError:
            raise ModelLoadError(f"initializer {t.name!r}: bad external data offset/length "
                                 f"{info}") from None
        if offset < 0 or length < 0 or offset + length > len(buf):
            raise ModelLoadError(
                f"initializer {t.name!r}: external data {info.get('location')!r} bytes "
                f"[{offset}, {offset + length}) are outside the {len(buf)} bytes given to "
                "add_external_initializers_from_files_in_memory")
        t.raw_data = bytes(buf[offset:offset + length])
        del t.external_data[:]
        t.data_location = onnx.TensorProto.DEFAULT


def _fix_dims(g: onnx.GraphProto, by_name: dict[str, int], by_denotation: dict[str, int]
              ) -> None:
    """Free dims become static: those named in `by_name` everywhere in the graph's
    signature, those whose denotation is in `by_denotation` on the inputs (and their
    symbol with them)."""
    for vi in g.input:
        for d in _dims(vi):
            if d.denotation in by_denotation and not d.HasField("dim_value"):
                if d.dim_param:
                    by_name.setdefault(d.dim_param, by_denotation[d.denotation])
                d.dim_value = by_denotation[d.denotation]
    for vi in (*g.input, *g.output, *g.value_info):
        for d in _dims(vi):
            if d.HasField("dim_param") and d.dim_param in by_name:
                d.dim_value = by_name[d.dim_param]


def _dims(vi: onnx.ValueInfoProto) -> list[onnx.TensorShapeProto.Dimension]:
    t = vi.type
    if t.WhichOneof("value") == "tensor_type" and t.tensor_type.HasField("shape"):
        return list(t.tensor_type.shape.dim)
    return []
