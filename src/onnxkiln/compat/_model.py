"""What the compat session reads from the ModelProto: NodeArgs, metadata, and the node
dependencies it prunes by when `run` asks for a subset of the outputs."""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import onnx

from onnxkiln import onnx_guard
from onnxkiln.compat._values import ModelMetadata, NodeArg, elem_name, type_string
from onnxkiln.types import IoMeta

__all__ = ["ModelInfo", "needed_nodes", "prune"]


@dataclass(frozen=True)
class ModelInfo:
    """The light part of a model the compat session keeps (no weights)."""

    inputs: list[NodeArg]          # graph inputs that are not initializers
    overridable: list[NodeArg]     # initializers listed as graph inputs (IR >= 4)
    outputs: list[NodeArg]
    metadata: ModelMetadata
    node_reads: tuple[tuple[str, ...], ...]   # per node: inputs and outer-scope names read
    node_writes: tuple[tuple[str, ...], ...]  # per node: outputs

    @classmethod
    def read(cls, proto: onnx.ModelProto, inputs: Sequence[IoMeta],
             outputs: Sequence[IoMeta]) -> ModelInfo:
        """Describe `proto`; `inputs`/`outputs` (the built session's) fill in types and
        shapes the file leaves out."""
        g = proto.graph
        metas = {m.name: m for m in (*inputs, *outputs)}
        inits = {t.name for t in g.initializer} | {s.values.name for s in g.sparse_initializer}
        args = [_node_arg(vi, metas.get(vi.name)) for vi in g.input]
        overridable = [a for a in args if a.name in inits] if proto.ir_version >= 4 else []
        meta = ModelMetadata(
            producer_name=proto.producer_name,
            graph_name=g.name,
            domain=proto.domain,
            description=proto.doc_string,
            graph_description=g.doc_string,
            version=proto.model_version if proto.HasField("model_version") else (1 << 63) - 1,
            custom_metadata_map={p.key: p.value for p in proto.metadata_props},
        )
        outs = list(g.output)
        if any(not _has_shape(vi.type) for vi in outs):
            inferred = _infer_outputs(proto)
            outs = [inferred.get(vi.name, vi) if not _has_shape(vi.type) else vi for vi in outs]
        return cls(
            inputs=[a for a in args if a.name not in inits],
            overridable=overridable,
            outputs=[_node_arg(vi, metas.get(vi.name)) for vi in outs],
            metadata=meta,
            node_reads=tuple((*(x for x in n.input if x), *_outer_reads(n)) for n in g.node),
            node_writes=tuple(tuple(x for x in n.output if x) for n in g.node),
        )


def needed_nodes(info: ModelInfo, outputs: Sequence[str]) -> list[int]:
    """Indices of the nodes that `outputs` depend on, in graph order."""
    producer = {name: i for i, outs in enumerate(info.node_writes) for name in outs}
    keep: set[int] = set()
    stack = list(outputs)
    seen: set[str] = set()
    while stack:
        name = stack.pop()
        if name in seen:
            continue
        seen.add(name)
        i = producer.get(name)
        if i is not None and i not in keep:
            keep.add(i)
            stack.extend(info.node_reads[i])
    return sorted(keep)


def prune(proto: onnx.ModelProto, info: ModelInfo, outputs: Sequence[str],
          keep: Sequence[int]) -> onnx.ModelProto:
    """`proto` cut down, in place, to the nodes `keep` and the graph outputs `outputs`.

    Every graph input stays (feeds are validated as for the whole model); initializers
    no kept node reads are dropped unless they are graph inputs or outputs.
    """
    g = proto.graph
    kept = set(keep)
    read = {name for i in keep for name in info.node_reads[i]}
    read.update(outputs)
    read.update(vi.name for vi in g.input)
    wanted = set(outputs)
    _filter(g.node, [i in kept for i in range(len(g.node))])
    _filter(g.output, [vi.name in wanted for vi in g.output])
    _filter(g.initializer, [t.name in read for t in g.initializer])
    _filter(g.sparse_initializer, [s.values.name in read for s in g.sparse_initializer])
    return proto


def _filter(field, flags: list[bool]) -> None:
    """Delete the entries whose flag is False, in place (no copy of kept weights)."""
    for i in reversed(range(len(flags))):
        if not flags[i]:
            del field[i]


def _node_arg(vi: onnx.ValueInfoProto, meta: IoMeta | None) -> NodeArg:
    t = vi.type
    kind = t.WhichOneof("value")
    type_str = type_string(t) if kind else None
    if type_str is None:
        type_str = _meta_type(meta)
    tensor = t.tensor_type if kind == "tensor_type" else None
    if kind == "optional_type" and t.optional_type.elem_type.WhichOneof("value") == "tensor_type":
        tensor = t.optional_type.elem_type.tensor_type
    if tensor is not None and tensor.HasField("shape"):
        shape = [d.dim_value if d.HasField("dim_value") and d.dim_value >= 0
                 else d.dim_param if d.HasField("dim_param") else None
                 for d in tensor.shape.dim]
    elif kind in (None, "tensor_type") and meta is not None and meta.kind == "tensor" \
            and meta.shape is not None:
        shape = list(meta.shape)
    else:
        shape = []
    return NodeArg(vi.name, type_str, shape)


def _has_shape(t: onnx.TypeProto) -> bool:
    """False when a tensor output says nothing of its type or shape."""
    kind = t.WhichOneof("value")
    return kind is not None and (kind != "tensor_type" or t.tensor_type.HasField("shape"))


def _infer_outputs(proto: onnx.ModelProto) -> dict[str, onnx.ValueInfoProto]:
    """Output types by onnx shape inference, as onnxruntime reports them, run on a copy
    whose large initializers become typed graph inputs (no weights are copied)."""
    skeleton = onnx.ModelProto(ir_version=proto.ir_version)
    skeleton.opset_import.extend(proto.opset_import)
    skeleton.functions.extend(proto.functions)
    g, src = skeleton.graph, proto.graph
    g.node.extend(src.node)
    g.input.extend(src.input)
    g.output.extend(src.output)
    declared = {vi.name for vi in src.input}
    for t in src.initializer:
        small = t.data_location != onnx.TensorProto.EXTERNAL and math.prod(t.dims) <= 64
        if small:
            g.initializer.append(t)
        elif t.name not in declared:
            g.input.append(onnx.helper.make_tensor_value_info(t.name, t.data_type, t.dims))
    try:
        inferred = onnx_guard.infer_shapes(skeleton, data_prop=True)
    except Exception:  # metadata only: an output without inferred type keeps what it had
        return {}
    found = {vi.name: vi for vi in (*inferred.graph.value_info, *inferred.graph.output)
             if _has_shape(vi.type)}
    for vi in found.values():  # onnx names the dims it cannot size unk__N; onnxruntime: None
        if vi.type.WhichOneof("value") == "tensor_type":
            for d in vi.type.tensor_type.shape.dim:
                if d.dim_param.startswith("unk__"):
                    d.ClearField("dim_param")
    return found


def _meta_type(meta: IoMeta | None) -> str:
    if meta is None:
        return "tensor(undefined)"
    elem = f"tensor({elem_name(int(meta.dtype))})"
    if meta.kind == "sequence":
        return f"seq({elem})"
    if meta.kind == "optional":
        return f"optional({elem})"
    return elem


def _outer_reads(node: onnx.NodeProto) -> Iterator[str]:
    """Names a node's subgraphs read from the enclosing scope."""
    for a in node.attribute:
        for sub in [a.g] if a.HasField("g") else list(a.graphs):
            local = {i.name for i in sub.input}
            local.update(t.name for t in sub.initializer)
            local.update(s.values.name for s in sub.sparse_initializer)
            for n in sub.node:
                local.update(n.output)
            for n in sub.node:
                yield from (x for x in n.input if x and x not in local)
                yield from (x for x in _outer_reads(n) if x not in local)
