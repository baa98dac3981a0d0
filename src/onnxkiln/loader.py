"""Model bytes or paths -> a checked, topologically sorted `onnx_ir.Model`.

Checks made here, each failing with `ModelLoadError` naming the problem: the
protobuf parses and has a graph; subgraphs nest at most `MAX_SUBGRAPH_DEPTH` levels;
every tensor holds the data it declares and external data stays inside the model's
folder (`tensor_data`, which also makes sparse tensors dense); every node input is
defined; the graph has no cycle; every opset a node uses is imported.
"""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import onnx
import onnx_ir as ir
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import DecodeError, Message

from onnxkiln import tensor_data
from onnxkiln.dtypes import DataType
from onnxkiln.errors import ModelLoadError
from onnxkiln.inlining import MAX_INLINED_NODES, check_inlined_size, inline_functions
from onnxkiln.types import IoMeta

__all__ = [
    "MAP_TYPES",
    "MAX_SUBGRAPH_DEPTH",
    "from_graph",
    "io_meta",
    "load_bytes",
    "load_path",
    "map_io_kind",
]

MAP_TYPES = "onnxkiln.map_types"  # model.meta key: value name -> TypeProto holding a map
# Graph attributes (If/Loop/Scan bodies) inside graph attributes: each level costs Python
# stack frames at load, plan build and run, so hostile nesting must stop before recursion.
MAX_SUBGRAPH_DEPTH = 64

logger = logging.getLogger(__name__)


def load_path(path: str | os.PathLike, max_inlined_nodes: int = MAX_INLINED_NODES) -> ir.Model:
    """Read and check a model file; external data resolves beside it."""
    p = Path(path)
    if not p.exists():
        raise ModelLoadError(f"model file '{p}' does not exist")
    if p.is_dir():
        raise ModelLoadError(f"'{p}' is a folder; give the path of the .onnx file")
    try:
        data = p.read_bytes()
    except OSError as e:
        raise ModelLoadError(f"cannot read model file '{p}': {e}") from e
    proto = _parse(data, str(p))
    del data  # the file's bytes: the parsed message holds its own copy
    return _from_proto(proto, p.resolve().parent, str(p), max_inlined_nodes)


def load_bytes(
    data: bytes | bytearray | memoryview,
    external_data_dir: str | os.PathLike | None = None,
    source: str = "<bytes>",
    max_inlined_nodes: int = MAX_INLINED_NODES,
) -> ir.Model:
    """Parse and check a serialized ModelProto."""
    if not isinstance(data, bytes | bytearray | memoryview):
        raise ModelLoadError(f"load_bytes expects bytes, got {type(data).__name__}")
    proto = _parse(data, source)
    base = Path(external_data_dir).resolve() if external_data_dir is not None else None
    return _from_proto(proto, base, source, max_inlined_nodes)


def _parse(data: bytes | bytearray | memoryview, source: str) -> onnx.ModelProto:
    if len(data) == 0:
        raise ModelLoadError(f"{source}: the model is empty (0 bytes)")
    proto = onnx.ModelProto()
    try:
        proto.ParseFromString(bytes(data))
    except (DecodeError, ValueError, RuntimeError) as e:
        hint = ""
        if "MaxDepth" in str(e) or "recursion" in str(e).lower():
            hint = ("; its messages nest deeper than protobuf's parse limit (100 levels, about "
                    "30 levels of nested subgraphs)")
        raise ModelLoadError(f"{source}: not a valid ONNX protobuf ({e}){hint}") from e
    return proto


def from_graph(graph: ir.Graph | ir.Model | onnx.ModelProto | onnx.GraphProto,
               max_inlined_nodes: int = MAX_INLINED_NODES) -> ir.Model:
    """Wrap an in-memory graph or model; weights are read from its in-memory tensors."""
    if isinstance(graph, onnx.ModelProto):
        return _from_proto(graph, None, "<ModelProto>", max_inlined_nodes)
    if isinstance(graph, onnx.GraphProto):
        return _from_proto(onnx.helper.make_model(graph), None, "<GraphProto>",
                           max_inlined_nodes)
    if isinstance(graph, ir.Model):
        return from_graph(ir.serde.serialize_model(graph), max_inlined_nodes)
    if isinstance(graph, ir.Graph):
        model = ir.Model(graph, ir_version=10)
        return from_graph(ir.serde.serialize_model(model), max_inlined_nodes)
    raise ModelLoadError(
        f"from_graph expects onnx_ir.Graph, onnx_ir.Model or onnx.ModelProto, "
        f"got {type(graph).__name__}"
    )


def _from_proto(proto: onnx.ModelProto, base: Path | None, source: str,
                max_inlined_nodes: int = MAX_INLINED_NODES) -> ir.Model:
    if not proto.HasField("graph"):
        raise ModelLoadError(f"{source}: the model has no graph (is this an ONNX file?)")
    if not proto.opset_import and proto.ir_version >= 3:
        raise ModelLoadError(f"{source}: the model imports no opset")
    _check_depth(proto, source)
    _check_text(proto, source)
    for tensor, where in tensor_data.model_tensors(proto):
        tensor_data.check_tensor(tensor, where, base, source)
    tensor_data.densify_sparse(proto, base, source)
    _sort_graph(proto.graph, set(), source)
    for func in proto.functions:
        _check_function_defined(func, source)
    map_types = _strip_map_types(proto.graph)
    _check_map_inputs(proto, map_types, source)
    try:
        model = ir.serde.deserialize_model(proto)
    except Exception as e:
        raise ModelLoadError(f"{source}: cannot read the model: {e}") from e
    model.meta[MAP_TYPES] = map_types
    if model.functions:
        check_inlined_size(proto, max_inlined_nodes, source)
        try:
            inline_functions(model)
        except Exception as e:  # recursive functions, call sites not matching the signature
            raise ModelLoadError(
                f"{source}: cannot inline the model-local functions: {type(e).__name__}: {e}"
            ) from e
    tensor_data.bind_external(model, base, source)  # after inlining: its copies too
    _check_opsets(model, source)
    _detach_from_proto(model, source)
    return model


def _detach_from_proto(model: ir.Model, source: str) -> None:
    """Give every initializer and tensor attribute its own numpy array, so the parsed
    protobuf (which otherwise stays alive behind them, a second copy of all the weights) is
    freed once loading returns. Memory-mapped external data is left as it is. Raw data of
    another length than the dims need is refused here, where it is read anyway."""

    def own(tensor: Any, where: str) -> Any:
        if not isinstance(tensor, ir.TensorProtoTensor) or tensor.dtype == ir.DataType.STRING:
            return tensor
        try:
            array = tensor.numpy()
        except Exception:  # unreadable data: planning reports it with the initializer's name
            proto = tensor.raw
            if proto.HasField("raw_data") and (
                    problem := tensor_data.embedded_size_problem(proto)):
                raise ModelLoadError(f"{source}: {where} {problem}") from None
            return tensor
        return ir.Tensor(array, dtype=tensor.dtype, name=tensor.name,
                         doc_string=tensor.doc_string)

    for graph in model.graphs():
        for name, value in graph.initializers.items():
            value.const_value = own(value.const_value,
                                    f"initializer '{name}' of graph '{graph.name}'")
        for node in graph:
            for name, attr in list(node.attributes.items()):
                if attr.type == ir.AttributeType.TENSOR and isinstance(
                        attr.value, ir.TensorProtoTensor):
                    where = (f"attribute '{name}' of node '{node.name or '<unnamed>'}' "
                             f"({node.domain or 'ai.onnx'}::{node.op_type})")
                    node.attributes[name] = ir.AttrTensor(name, own(attr.value, where))


def _check_depth(proto: onnx.ModelProto, source: str) -> None:
    """Refuse subgraphs nested deeper than MAX_SUBGRAPH_DEPTH (iteratively: no recursion)."""
    pending: list[tuple[onnx.GraphProto, int]] = [(proto.graph, 0)]
    pending.extend((g, 1) for f in proto.functions for n in f.node
                   for a in n.attribute for g in ([a.g] if a.HasField("g") else a.graphs))
    while pending:
        graph, depth = pending.pop()
        for node in graph.node:
            for a in node.attribute:
                for sub in [a.g] if a.HasField("g") else a.graphs:
                    if depth + 1 > MAX_SUBGRAPH_DEPTH:
                        raise ModelLoadError(
                            f"{source}: subgraphs nest more than {MAX_SUBGRAPH_DEPTH} levels "
                            f"deep (attribute '{a.name}' of node {_node_label(node)} in graph "
                            f"'{graph.name}' is at depth {depth + 1}); flatten the control flow"
                        )
                    pending.append((sub, depth + 1))


def _check_text(proto: onnx.ModelProto, source: str) -> None:
    """Every string field is UTF-8: protobuf hands back bytes for proto2 strings that are
    not, and names must be text. Reads only string and message fields (reading a bytes
    field such as raw_data would copy the weights)."""
    pending: list[Message] = [proto]
    while pending:
        msg = pending.pop()
        strings, messages = _text_fields(msg.DESCRIPTOR)
        for name, repeated in strings:
            for text in getattr(msg, name) if repeated else (getattr(msg, name),):
                if not isinstance(text, str):
                    raise ModelLoadError(
                        f"{source}: field '{msg.DESCRIPTOR.name}.{name}' holds "
                        f"{bytes(text)[:40]!r}, which is not UTF-8 text"
                    )
        for name, repeated in messages:
            if repeated:
                pending.extend(getattr(msg, name))
            elif msg.HasField(name):
                pending.append(getattr(msg, name))


@functools.cache
def _text_fields(descriptor: Descriptor) -> tuple[tuple[tuple[str, bool], ...], ...]:
    """(string fields, message fields) of a message type as (name, repeated) pairs."""
    strings, messages = [], []
    for field in descriptor.fields:
        flag = getattr(field, "is_repeated", None)  # protobuf >= 6; `label` went away in 7
        repeated = bool(flag) if flag is not None else field.label == field.LABEL_REPEATED
        if field.type == FieldDescriptor.TYPE_STRING:
            strings.append((field.name, repeated))
        elif field.type == FieldDescriptor.TYPE_MESSAGE:
            messages.append((field.name, repeated))
    return tuple(strings), tuple(messages)


def _sort_graph(graph: onnx.GraphProto, outer: set[str], source: str) -> None:
    """Topologically sort `graph.node` in place; undefined inputs and cycles are errors."""
    known = set(outer)
    known.update(i.name for i in graph.input)
    known.update(t.name for t in graph.initializer)
    producer: dict[str, int] = {}
    own = known - outer  # this graph's inputs and initializers
    for idx, node in enumerate(graph.node):
        for out in node.output:
            if not out:
                continue
            if out in producer or out in own:
                raise ModelLoadError(
                    f"{source}: value '{out}' is defined twice (node "
                    f"{_node_label(node)} and an earlier definition)"
                )
            producer[out] = idx
    deps: list[set[int]] = []
    for node in graph.node:
        needed: set[int] = set()
        for name in [*node.input, *_implicit_inputs(node)]:
            if not name or (name in known and name not in producer):
                continue
            if name in producer:
                needed.add(producer[name])
            else:
                raise ModelLoadError(
                    f"{source}: node {_node_label(node)} uses value '{name}', which no node "
                    "produces and is neither a graph input nor an initializer "
                    "(undefined value or missing initializer)"
                )
        deps.append(needed)
    order = _kahn(deps)
    if order is None:
        stuck = [_node_label(graph.node[i]) for i, d in enumerate(deps) if d]
        raise ModelLoadError(
            f"{source}: the graph has a cycle through nodes {', '.join(stuck[:8])}"
        )
    for out in graph.output:
        if out.name not in producer and out.name not in known:
            raise ModelLoadError(f"{source}: graph output '{out.name}' is never produced")
    if order != list(range(len(order))):
        nodes = [graph.node[i] for i in order]  # stay valid once removed: extend copies them
        del graph.node[:]
        graph.node.extend(nodes)
    scope = known | set(producer)
    for node in graph.node:
        for a in node.attribute:
            for sub in [a.g] if a.HasField("g") else list(a.graphs):
                _sort_graph(sub, scope, source)


def _implicit_inputs(node: onnx.NodeProto) -> Iterator[str]:
    """Outer-scope names a node's subgraphs read (they make the node depend on them)."""
    for a in node.attribute:
        for sub in [a.g] if a.HasField("g") else list(a.graphs):
            inner = {i.name for i in sub.input} | {t.name for t in sub.initializer}
            for n in sub.node:
                inner.update(n.output)
            for n in sub.node:
                yield from (x for x in n.input if x and x not in inner)
                yield from (x for x in _implicit_inputs(n) if x not in inner)
            yield from (o.name for o in sub.output if o.name and o.name not in inner)


def _kahn(deps: list[set[int]]) -> list[int] | None:
    users: list[list[int]] = [[] for _ in deps]
    missing = [len(d) for d in deps]
    for i, d in enumerate(deps):
        for j in d:
            users[j].append(i)
    ready = [i for i, m in enumerate(missing) if m == 0]
    ready.reverse()
    order: list[int] = []
    while ready:
        i = ready.pop()
        order.append(i)
        for u in reversed(users[i]):
            missing[u] -= 1
            if missing[u] == 0:
                ready.append(u)
    return order if len(order) == len(deps) else None


def _check_function_defined(func: onnx.FunctionProto, source: str) -> None:
    known = set(func.input)
    for node in func.node:
        for name in node.input:
            if name and name not in known:
                raise ModelLoadError(
                    f"{source}: function '{func.domain}::{func.name}' node "
                    f"{_node_label(node)} uses undefined value '{name}'"
                )
        known.update(node.output)


def _check_opsets(model: ir.Model, source: str) -> None:
    opsets = model.opset_imports
    for domain, version in opsets.items():
        if not 0 <= version < 1 << 31:
            raise ModelLoadError(
                f"{source}: opset import '{domain or 'ai.onnx'}' has version {version}; "
                "versions are between 1 and 2^31 - 1"
            )
    for node in model.graph.all_nodes():
        domain = "" if node.domain == "ai.onnx" else node.domain
        if domain not in opsets and not (domain == "" and "ai.onnx" in opsets):
            raise ModelLoadError(
                f"{source}: node '{node.name}' ({domain or 'ai.onnx'}::{node.op_type}) uses "
                f"domain '{domain or 'ai.onnx'}', which the model does not import "
                f"(imported: {dict(opsets)})"
            )


def _node_label(node: onnx.NodeProto) -> str:
    return f"'{node.name or '<unnamed>'}' ({node.domain or 'ai.onnx'}::{node.op_type})"


def _has_map(t: onnx.TypeProto) -> bool:
    kind = t.WhichOneof("value")
    if kind == "map_type":
        return True
    if kind == "sequence_type":
        return _has_map(t.sequence_type.elem_type)
    if kind == "optional_type":
        return _has_map(t.optional_type.elem_type)
    return False


def _strip_map_types(graph: onnx.GraphProto) -> dict[str, onnx.TypeProto]:
    """onnx_ir cannot hold map types: blank them and keep them in a side table by name."""
    table: dict[str, onnx.TypeProto] = {}
    for vi in [*graph.input, *graph.output, *graph.value_info]:
        if vi.HasField("type") and _has_map(vi.type):
            kept = onnx.TypeProto()
            kept.CopyFrom(vi.type)
            table[vi.name] = kept
            vi.ClearField("type")
    return table


def _schema_type(t: onnx.TypeProto, in_map: bool = False) -> str | None:
    """`t` as op schemas write it: map(string, int64), seq(map(int64, float))."""
    kind = t.WhichOneof("value")
    if kind == "tensor_type":
        elem = onnx.TensorProto.DataType.Name(t.tensor_type.elem_type).lower()
        return elem if in_map else f"tensor({elem})"
    if kind == "map_type":
        key = onnx.TensorProto.DataType.Name(t.map_type.key_type).lower()
        value = _schema_type(t.map_type.value_type, in_map=True)
        return None if value is None else f"map({key}, {value})"
    if kind == "sequence_type":
        inner = _schema_type(t.sequence_type.elem_type)
        return None if inner is None else f"seq({inner})"
    return None


def _check_map_inputs(proto: onnx.ModelProto, map_types: dict[str, onnx.TypeProto],
                      source: str) -> None:
    """An ai.onnx.ml node fed a map-typed graph value must take that map type by its schema:
    onnxruntime refuses the model otherwise (DictVectorizer of a map(string, bool)), and
    onnxkiln's kernels would read it as some other type."""
    versions = {o.domain: o.version for o in proto.opset_import}
    for node in proto.graph.node if map_types else ():
        if node.domain != "ai.onnx.ml":
            continue
        try:
            schema = onnx.defs.get_schema(node.op_type, versions.get(node.domain, 1), node.domain)
        except onnx.defs.SchemaError:
            continue  # the kernel registry says what is unknown
        allowed = {c.type_param_str: c.allowed_type_strs for c in schema.type_constraints}
        for formal, name in zip(schema.inputs, node.input, strict=False):
            given = _schema_type(map_types[name]) if name in map_types else None
            if given is not None and given not in allowed.get(formal.type_str, [given]):
                raise ModelLoadError(
                    f"{source}: this is an invalid model: Type Error: Type '{given}' of input "
                    f"parameter ({name}) of operator ({node.op_type}) in node ({node.name}) is "
                    f"invalid; {node.op_type} takes {', '.join(allowed[formal.type_str])}")


def map_io_kind(model: ir.Model, name: str) -> tuple[str, int] | None:
    """("map" | "sequence" | "optional", element type) for a map-typed graph input or output."""
    t = model.meta.get(MAP_TYPES, {}).get(name)
    if t is None:
        return None
    kind = {"map_type": "map", "sequence_type": "sequence", "optional_type": "optional"}
    outer = kind[t.WhichOneof("value")]
    inner = t
    while inner.WhichOneof("value") != "map_type":
        inner = getattr(inner, inner.WhichOneof("value")).elem_type
    value = inner.map_type.value_type
    elem = value.tensor_type.elem_type if value.HasField("tensor_type") else 0
    return outer, elem


def io_meta(model: ir.Model, value: ir.Value, optional: bool = False) -> IoMeta:
    """What `inputs()`/`outputs()` report for graph input or output `value`."""
    mapped = map_io_kind(model, value.name or "")
    if mapped is not None:  # map types live beside the IR (onnx_ir cannot hold them)
        kind, elem = mapped
        return IoMeta(value.name or "", DataType(elem), None, kind, optional or kind == "optional")
    t = value.type
    kind = "tensor"
    if isinstance(t, ir.SequenceType):
        kind = "sequence"
    elif isinstance(t, ir.OptionalType):
        kind, optional = "optional", True
    dtype = DataType(value.dtype) if value.dtype is not None else DataType.UNDEFINED
    shape = None
    if value.shape is not None and kind == "tensor":
        shape = tuple((d if d >= 0 else None) if isinstance(d, int) else d.value
                      for d in value.shape)  # negative: any size, as onnxruntime reads it
    return IoMeta(value.name or "", dtype, shape, kind, optional)
