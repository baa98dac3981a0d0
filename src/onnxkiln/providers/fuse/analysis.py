"""Which nodes the fuse provider takes: maximal convex partitions of elementwise ops that may
end in one row-wise reduction, and the program (a JSON-able op list) each one computes.

A partition is convex when no path leaves it and re-enters it, so it can be replaced by one
node without a cycle. Row-wise reductions (Softmax, LayerNormalization, RMS norms over the
last axis) close a partition: nothing inside may consume their result.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
import onnx
import onnx_ir as ir

from onnxkiln import onnx_guard
from onnxkiln.providers.fuse.ops import OPS, REDUCTIONS
from onnxkiln.schema import schema_defaults

__all__ = ["Graphview", "build_program", "find_partitions", "is_convex"]

_FLOATS = {ir.DataType.FLOAT, ir.DataType.FLOAT16}
_CAST_FROM = _FLOATS | {ir.DataType.INT32, ir.DataType.INT64, ir.DataType.BOOL,
                        ir.DataType.INT8, ir.DataType.UINT8}
_MS = "com.microsoft"


class Graphview:
    """Node ids, consumers (subgraph readers mapped to their top-level node) and dtypes."""

    def __init__(self, graph: ir.Graph, opsets: dict[str, int]) -> None:
        self.graph = graph
        self.nodes = list(graph)
        self.opsets = opsets
        self.index = {n: i for i, n in enumerate(self.nodes)}
        for i, n in enumerate(self.nodes):
            for sub in _subgraphs(n):
                for inner in sub.all_nodes():
                    self.index[inner] = i
        self.outputs = set(graph.outputs)
        self.dtypes: dict[ir.Value, ir.DataType] = {}
        if any(v.dtype is None for n in self.nodes for v in n.outputs if v.name):
            self._infer_dtypes()

    def _infer_dtypes(self) -> None:
        """Element types of untyped values, from onnx type inference over a data-free copy."""
        g = self.graph
        inputs = [ir.serde.serialize_value(v) for v in g.inputs if v.type is not None]
        names = {v.name for v in g.inputs}
        for name, v in g.initializers.items():
            if name not in names and v.dtype is not None:
                shape = list(v.shape) if v.shape is not None else None
                inputs.append(onnx.helper.make_tensor_value_info(name, int(v.dtype), shape))
        proto = onnx.helper.make_model(
            onnx.helper.make_graph([ir.serde.serialize_node(n) for n in self.nodes], "types",
                                   inputs, []),
            opset_imports=[onnx.helper.make_opsetid(d, v) for d, v in self.opsets.items()])
        try:
            inferred = onnx_guard.infer_shapes(proto, strict_mode=False)
        except Exception:  # inference is a best effort: untyped values are declined
            return
        types = {vi.name: vi.type.tensor_type.elem_type for vi in inferred.graph.value_info
                 if vi.type.HasField("tensor_type") and vi.type.tensor_type.elem_type}
        for n in self.nodes:
            for v in n.outputs:
                if v.dtype is None and v.name in types:
                    self.dtypes[v] = ir.DataType(types[v.name])

    def users(self, value: ir.Value) -> set[int]:
        """Top-level ids of the nodes reading `value` (directly or inside a subgraph)."""
        return {self.index[u] for u, _ in value.uses() if u in self.index}

    def consumers(self, node_id: int) -> set[int]:
        out: set[int] = set()
        for v in self.nodes[node_id].outputs:
            out |= self.users(v)
        return out

    def producer(self, value: ir.Value | None) -> int | None:
        if value is None:
            return None
        p = value.producer()
        return self.index.get(p) if p is not None else None

    def dtype(self, value: ir.Value | None) -> ir.DataType | None:
        if value is None:
            return None
        return value.dtype if value.dtype is not None else self.dtypes.get(value)


def _subgraphs(node: ir.Node) -> Iterable[ir.Graph]:
    for attr in node.attributes.values():
        if attr.type == ir.AttributeType.GRAPH:
            yield attr.value
        elif attr.type == ir.AttributeType.GRAPHS:
            yield from attr.value


def node_attrs(node: ir.Node, keep: Sequence[str], opset: int) -> dict[str, Any]:
    """The attributes `keep` of a node, schema defaults filled in, as JSON values."""
    defaults = schema_defaults(node.op_type, "" if node.domain == "ai.onnx" else node.domain,
                               opset)
    out: dict[str, Any] = {}
    for name in keep:
        attr = node.attributes.get(name)
        value = attr.value if attr is not None else defaults.get(name)
        if isinstance(value, bytes):
            value = value.decode()
        out[name] = value.item() if isinstance(value, np.generic) else value
    return out


def classify(view: Graphview, node: ir.Node) -> tuple[str | None, str]:
    """("ew" | "reduce" | None, reason) for one node; records its output dtype."""
    domain = "" if node.domain == "ai.onnx" else node.domain
    op = node.op_type
    if node.attributes and any(a.type in (ir.AttributeType.GRAPH, ir.AttributeType.GRAPHS)
                               for a in node.attributes.values()):
        return None, "has subgraphs"
    ins = list(node.inputs)
    if (domain == "" and op in OPS) or (domain == _MS and op == "Gelu"):
        spec = OPS[op]
        present = [v for v in ins if v is not None]
        if not spec.arity[0] <= len(ins) <= spec.arity[1] or len(node.outputs) != 1:
            return None, f"{op} with {len(ins)} inputs"
        if op == "Cast":
            to = node.attributes.get("to")
            out_dt = ir.DataType(to.value) if to is not None else None
            if out_dt not in _FLOATS or view.dtype(ins[0]) not in _CAST_FROM:
                return None, "Cast other than to float32/float16"
        else:
            float_ins = present[1:] if op == "Where" else present
            if op == "Where" and view.dtype(ins[0]) != ir.DataType.BOOL:
                return None, "Where condition is not bool"
            dts = {view.dtype(v) for v in float_ins}
            if not dts or not dts <= _FLOATS:
                return None, f"dtypes {sorted(str(d) for d in dts)} are not float32/float16"
            out_dt = view.dtype(node.outputs[0]) or next(iter(dts))
        view.dtypes[node.outputs[0]] = out_dt
        return "ew", ""
    if op in REDUCTIONS and (domain == "" or (domain == _MS and op.startswith("Simplified"))):
        opset = view.opsets.get(domain, 1)
        if op == "Softmax" and opset < 13:
            return None, "Softmax before opset 13 flattens to 2-D"
        if any(v.name and (v.uses() or v in view.outputs) for v in node.outputs[1:]):
            return None, f"{op} statistics outputs are used"
        x = ins[0]
        axis = node_attrs(node, ("axis",), opset)["axis"]
        rank = len(x.shape) if x is not None and x.shape is not None else None
        if axis != -1 and (rank is None or axis != rank - 1):
            return None, f"{op} over axis {axis}, not the last"
        if not {view.dtype(v) for v in ins if v is not None} <= _FLOATS:
            return None, "dtypes are not float32/float16"
        view.dtypes[node.outputs[0]] = view.dtype(node.outputs[0]) or view.dtype(x)
        return "reduce", ""
    return None, "not an elementwise op or row reduction"


def is_convex(view: Graphview, ids: set[int]) -> bool:
    """No node outside `ids` both depends on `ids` and feeds `ids` (searched below max id)."""
    hi = max(ids)
    frontier = [c for i in ids for c in view.consumers(i) if c not in ids and c < hi]
    seen = set(frontier)
    while frontier:
        node_id = frontier.pop()
        for c in view.consumers(node_id):
            if c in ids:
                return False
            if c < hi and c not in seen:
                seen.add(c)
                frontier.append(c)
    return True


def find_partitions(view: Graphview, node_ids: Iterable[int] | None = None,
                    min_nodes: int = 2) -> list[list[int]]:
    """Greedy maximal convex partitions over `node_ids` (default: all), in graph order."""
    allowed = set(range(len(view.nodes)) if node_ids is None else node_ids)
    group_of: dict[int, int] = {}
    groups: dict[int, set[int]] = {}
    closed: set[int] = set()
    for i, node in enumerate(view.nodes):
        if i not in allowed:
            continue
        kind, _ = classify(view, node)
        if kind is None:
            continue
        if kind == "reduce":
            side = {view.producer(v) for v in node.inputs[1:]} - {None}
            p = view.producer(node.inputs[0])
            cands = [group_of[p]] if p in group_of and group_of[p] not in closed else []
            cands = [g for g in cands if not side & groups[g]]
        else:
            cands = sorted({group_of[p] for v in node.inputs
                            if (p := view.producer(v)) in group_of} - closed,
                           key=lambda g: -len(groups[g]))
        target = _merge(view, i, cands, groups)
        if target is None:
            target = i
            groups[target] = set()
        groups[target].add(i)
        for j in groups[target]:
            group_of[j] = target
        if kind == "reduce":
            closed.add(target)
    return [sorted(g) for _, g in sorted(groups.items()) if len(g) >= min_nodes]


def _merge(view: Graphview, i: int, cands: list[int], groups: dict[int, set[int]]) -> int | None:
    """Merge node i with all candidate groups if convex, else with the largest one that is."""
    if not cands:
        return None
    union = set().union(*(groups[g] for g in cands)) | {i}
    if len(cands) > 1 and is_convex(view, union):
        keep = cands[0]
        for g in cands[1:]:
            groups[keep] |= groups.pop(g)
        return keep
    for g in cands:
        if is_convex(view, groups[g] | {i}):
            return g
    return None


def build_program(view: Graphview, ids: Sequence[int]) -> tuple[dict, list[ir.Value],
                                                                  list[ir.Value]]:
    """(program, boundary inputs, boundary outputs) for a partition.

    Scalar float initializers are baked in as constants; other external values become
    inputs, in order of first use.
    """
    members = set(ids)
    temps: dict[ir.Value, int] = {}
    inputs: list[ir.Value] = []
    consts: list[dict] = []
    const_of: dict[ir.Value, int] = {}
    ops: list[dict] = []

    def ref(v: ir.Value | None) -> list:
        if v is None or not v.name:
            return ["n"]
        if v in temps:
            return ["t", temps[v]]
        if _bakeable(v):
            if v not in const_of:
                arr = v.const_value.numpy()
                const_of[v] = len(consts)
                consts.append({"value": float(arr.reshape(-1)[0]), "shape": list(arr.shape)})
            return ["c", const_of[v]]
        if v not in inputs:
            inputs.append(v)
        return ["i", inputs.index(v)]

    for i in ids:
        node = view.nodes[i]
        domain = "" if node.domain == "ai.onnx" else node.domain
        spec = REDUCTIONS.get(node.op_type) or OPS[node.op_type]
        args = [ref(v) for v in node.inputs]
        attrs = node_attrs(node, spec.attrs, view.opsets.get(domain, 1))
        ops.append({"op": node.op_type, "args": args, "attrs": attrs,
                    "reduce": node.op_type in REDUCTIONS})
        temps[node.outputs[0]] = len(ops) - 1
    outputs = [v for i in ids for v in view.nodes[i].outputs[:1]
               if v in view.outputs or view.users(v) - members]
    out_specs = []
    for v in outputs:
        deps_i, deps_c = _deps(ops, temps[v])
        out_specs.append({"name": v.name, "dtype": view.dtype(v).name, "temp": temps[v],
                          "deps_i": deps_i, "deps_c": deps_c})
    program = {
        "inputs": [{"name": v.name, "dtype": view.dtype(v).name if view.dtype(v) else None}
                   for v in inputs],
        "consts": consts,
        "ops": ops,
        "outputs": out_specs,
    }
    return program, inputs, outputs


def _bakeable(v: ir.Value) -> bool:
    t = v.const_value
    return (t is not None and v.is_initializer() and not v.is_graph_input()
            and v.dtype in _FLOATS and t.size == 1)


def _deps(ops: list[dict], k: int) -> tuple[list[int], list[int]]:
    """Inputs and constants temp k's shape depends on (a reduction: its X only)."""
    di: set[int] = set()
    dc: set[int] = set()
    stack = [k]
    seen = set()
    while stack:
        t = stack.pop()
        if t in seen:
            continue
        seen.add(t)
        args = ops[t]["args"][:1] if ops[t]["reduce"] else ops[t]["args"]
        for kind, *rest in args:
            if kind == "i":
                di.add(rest[0])
            elif kind == "c":
                dc.add(rest[0])
            elif kind == "t":
                stack.append(rest[0])
    return sorted(di), sorted(dc)
