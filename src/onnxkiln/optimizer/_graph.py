"""What every pass shares: the rewrite context, constant lookup, use checks, node rewriting.

Passes work in place on `onnx_ir` graphs. A rewrite builds its new nodes first, inserts them
before the node it replaces, repoints uses with `replace_value`, and removes the matched nodes
whose outputs nobody reads any more; the dead-node pass sweeps whatever is left.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import onnx_ir as ir

from onnxkiln.providers.base import KernelRegistry, normalize_domain

__all__ = [
    "FUSED_FROM",
    "MS",
    "OURS",
    "Context",
    "attr",
    "const_array",
    "const_scalar",
    "const_shape",
    "consumers",
    "fused_from",
    "graphs_of",
    "is_const",
    "is_onnx",
    "nodes_of",
    "other_input",
    "private",
    "producer",
    "record_fused_from",
    "replace_value",
    "same_dims",
    "sole_consumer",
    "static_shape",
]

MS = "com.microsoft"
OURS = "onnxkiln"
FUSED_FROM = "onnxkiln.fused_from"  # node metadata: the source node names, one a line


class Context:
    """One optimize() call: the model, the kernels fusions may target, fresh names, counts."""

    def __init__(self, model: ir.Model, registries: Sequence[KernelRegistry],
                 portable: bool = False) -> None:
        self.model = model
        self.registries = tuple(registries)
        self.portable = portable
        self.stats: Counter[str] = Counter()
        self._names: set[str] = set()
        for graph in graphs_of(model.graph):
            self._names.update(v.name for v in (*graph.inputs, *graph.initializers.values())
                               if v.name)
            for node in graph:
                self._names.update(v.name for v in node.outputs if v.name)
                if node.name:
                    self._names.add(node.name)
        self._serial = 0
        self.unfoldable: set[int] = set()  # ids of nodes constant folding already refused
        self._graphs: list[ir.Graph] | None = None

    def graphs(self) -> list[ir.Graph]:
        """The main graph and every subgraph (listed once: passes never add subgraphs)."""
        if self._graphs is None:
            self._graphs = list(graphs_of(self.model.graph))
        return self._graphs

    def opset(self, domain: str) -> int | None:
        """The model's opset for a domain ("" and "ai.onnx" alike), None when not imported."""
        domain = normalize_domain(domain)
        for d, v in self.model.opset_imports.items():
            if normalize_domain(d) == domain:
                return v
        return None

    def supports(self, domain: str, op_type: str) -> bool:
        """Whether a registry has a kernel for the op at the opset the rewrite would use (and,
        for a portable model, whether onnxruntime has one: no onnxkiln-domain ops)."""
        if self.portable and normalize_domain(domain) == OURS:
            return False
        version = self.opset(domain) or 1
        return any(r.resolve(domain, op_type, version) is not None for r in self.registries)

    def use_domain(self, domain: str) -> None:
        """Import a contrib/custom domain (version 1) the first time a rewrite emits it."""
        if self.opset(domain) is None:
            self.model.opset_imports[domain] = 1

    def name(self, base: str) -> str:
        """A value/node name not used anywhere in the model yet."""
        base = base or "v"
        candidate = base
        while candidate in self._names:
            self._serial += 1
            candidate = f"{base}__{self._serial}"
        self._names.add(candidate)
        return candidate

    def node(
        self,
        op_type: str,
        inputs: Sequence[ir.Value | None],
        attributes: Mapping[str, Any] | None = None,
        *,
        domain: str = "",
        like: Sequence[ir.Value] = (),
        num_outputs: int = 1,
        name: str = "",
    ) -> ir.Node:
        """A new node whose outputs copy type and shape from `like` (the values they replace)."""
        if domain:
            self.use_domain(domain)
        anchor = like[0].producer() if like else None
        scope = anchor.name.rsplit("/", 1)[0] if anchor is not None and anchor.name and \
            "/" in anchor.name else ""
        node_name = self.name(f"{scope}/{name or op_type}" if scope else (name or op_type))
        outputs = []
        for i in range(num_outputs):
            old = like[i] if i < len(like) else None
            outputs.append(ir.Value(
                name=self.name(f"{node_name}_output_{i}"),
                type=old.type if old is not None else None,
                shape=old.shape.copy() if old is not None and old.shape is not None else None,
            ))
        attrs = {k: v for k, v in (attributes or {}).items() if v is not None}
        inputs = list(inputs)
        while inputs and inputs[-1] is None:
            inputs.pop()
        return ir.node(op_type, inputs, attrs, domain=domain, outputs=outputs,
                       name=node_name)

    def initializer(self, graph: ir.Graph, base: str, array: np.ndarray) -> ir.Value:
        """Register a new initializer holding `array` (no copy) under a fresh name."""
        array = np.asarray(array)
        value = ir.Value(name=self.name(base), shape=ir.Shape(array.shape),
                         type=ir.TensorType(ir.DataType.from_numpy(array.dtype)),
                         const_value=ir.Tensor(array))
        graph.register_initializer(value)
        return value

    def replace(self, anchor: ir.Node, new_nodes: Sequence[ir.Node],
                mapping: Iterable[tuple[ir.Value, ir.Value]], remove: Iterable[ir.Node],
                stat: str) -> None:
        """Insert `new_nodes` before `anchor`, repoint each (old, new) pair, drop `remove`."""
        graph = anchor.graph
        assert graph is not None, "Pass developer: the anchor must be in a graph"
        graph.insert_before(anchor, list(new_nodes))
        for old, new in mapping:
            replace_value(old, new)
        remove = _dataflow_order(list(remove))
        drop_dead(graph, remove)
        record_fused_from(new_nodes, [n for n in remove if n.graph is None])
        self.stats[stat] += 1


def _dataflow_order(nodes: list[ir.Node]) -> list[ir.Node]:
    """`nodes` (a rewrite's handful) with producers before their consumers."""
    pending, ordered = nodes, []
    while len(pending) > 1:
        ready = next((n for n in pending if not any(
            i is not None and i.producer() in pending for i in n.inputs)), pending[0])
        pending = [n for n in pending if n is not ready]
        ordered.append(ready)
    return ordered + pending


def fused_from(node: ir.Node) -> tuple[str, ...]:
    """The model's node names a rewritten node stands for (empty for the model's own)."""
    names = node.metadata_props.get(FUSED_FROM)
    return tuple(names.split("\n")) if names else ()


def record_fused_from(new_nodes: Sequence[ir.Node], replaced: Sequence[ir.Node]) -> None:
    """Note on each new node which source nodes it replaced (a rewritten one's own sources)."""
    names = list(dict.fromkeys(
        name for n in replaced for name in (fused_from(n) or ((n.name or n.op_type),))))
    if names:
        for node in new_nodes:
            node.metadata_props[FUSED_FROM] = "\n".join(names)


def graphs_of(graph: ir.Graph) -> Iterator[ir.Graph]:
    """The graph and every subgraph nested in its nodes' attributes."""
    yield graph
    for node in graph:
        for a in node.attributes.values():
            if a.type == ir.AttributeType.GRAPH:
                yield from graphs_of(a.value)
            elif a.type == ir.AttributeType.GRAPHS:
                for g in a.value:
                    yield from graphs_of(g)


_UNARY = (1, 1, 1, 1)
_BINARY = (2, 2, 1, 1)
_MANY = 1 << 16
# op -> (min inputs, max inputs, min outputs, max outputs) of a well-formed node
_ARITY: dict[str, tuple[int, int, int, int]] = {
    **dict.fromkeys(("Add", "Sub", "Mul", "Div", "Pow", "MatMul", "Gather", "CastLike"),
                    _BINARY),
    **dict.fromkeys(("Erf", "Tanh", "Sqrt", "Reciprocal", "Relu", "Sigmoid", "Softmax",
                     "Transpose", "Identity", "Shape", "Size", "LeakyRelu", "HardSigmoid",
                     "Elu", "Cast"), _UNARY),
    "Clip": (1, 3, 1, 1), "Where": (3, 3, 1, 1), "Conv": (2, 3, 1, 1),
    "BatchNormalization": (5, 5, 1, 5), "LayerNormalization": (2, 3, 1, 3),
    "ReduceMean": (1, 2, 1, 1), "Gemm": (2, 3, 1, 1), "Dropout": (1, 3, 1, 2),
    "Slice": (1, 5, 1, 1), "Unsqueeze": (1, 2, 1, 1), "Concat": (1, _MANY, 1, 1),
    "Reshape": (1, 2, 1, 1), "Constant": (0, 0, 1, 1),
}


def nodes_of(graph: ir.Graph, *ops: str) -> list[ir.Node]:
    """The graph's nodes whose op_type is one of `ops` (any domain), listed now: passes
    rewrite the graph as they walk the list, and this cheap filter saves calling `is_onnx`
    on every node."""
    return [n for n in graph if n.op_type in ops]


def is_onnx(node: ir.Node, *ops: str) -> bool:
    """Whether node is one of the standard-domain ops, with that op's input and output
    counts (a malformed node matches nothing: the planner reports it)."""
    if node.domain not in ("", "ai.onnx") or node.op_type not in ops:
        return False
    arity = _ARITY.get(node.op_type)
    if arity is None:
        return True
    lo, hi, out_lo, out_hi = arity
    return lo <= len(node.inputs) <= hi and out_lo <= len(node.outputs) <= out_hi


def producer(value: ir.Value | None, *ops: str) -> ir.Node | None:
    """The node producing value when it is one of the standard `ops` (any op when none given)."""
    if value is None:
        return None
    node = value.producer()
    if node is None or (ops and not is_onnx(node, *ops)):
        return None
    return node


def consumers(value: ir.Value) -> list[ir.Node]:
    """Distinct nodes reading value (in any graph)."""
    seen: dict[int, ir.Node] = {}
    for use in value.uses():
        seen.setdefault(id(use.node), use.node)
    return list(seen.values())


def private(value: ir.Value, users: Iterable[ir.Node]) -> bool:
    """Whether value is not a graph output and only `users` read it."""
    if value.is_graph_output():
        return False
    allowed = {id(n) for n in users}
    return all(id(use.node) in allowed for use in value.uses())


def sole_consumer(value: ir.Value | None, *ops: str) -> ir.Node | None:
    """The one standard node (of `ops`, if given) reading value, when value is private to it."""
    if value is None or value.is_graph_output():
        return None
    users = consumers(value)
    if len(users) != 1:
        return None
    node = users[0]
    if ops and not is_onnx(node, *ops):
        return None
    if node.graph is not value.graph and value.graph is not None:
        return None  # read from inside a subgraph: not a fusion candidate
    return node


def other_input(node: ir.Node, value: ir.Value) -> ir.Value | None:
    """For a binary node reading value once, its other input."""
    ins = node.inputs
    if len(ins) != 2 or ins[0] is ins[1]:
        return None
    if ins[0] is value:
        return ins[1]
    if ins[1] is value:
        return ins[0]
    return None


def is_const(value: ir.Value | None) -> bool:
    """Whether the value is fixed (see const_array), without reading its data."""
    if value is None or value.is_graph_input():
        return False
    if value.const_value is not None:
        return True
    node = value.producer()
    return node is not None and is_onnx(node, "Constant")


def const_shape(value: ir.Value | None) -> tuple[int, ...] | None:
    """A fixed value's shape, without reading its data (None when not constant)."""
    if not is_const(value):
        return None
    tensor = value.const_value
    if tensor is not None:
        return tuple(int(d) for d in tensor.shape.numpy())
    arr = const_array(value)
    return None if arr is None else arr.shape


def const_array(value: ir.Value | None) -> np.ndarray | None:
    """The value's data when it is fixed: an initializer (not an overridable graph input) or
    the output of a Constant node with a tensor or number attribute."""
    if value is None or value.is_graph_input():
        return None
    tensor = value.const_value
    if tensor is not None:
        try:
            return tensor.numpy()
        except Exception:
            return None
    node = value.producer()
    if node is None or not is_onnx(node, "Constant") or len(node.attributes) != 1:
        return None
    return constant_attr_array(node)


def constant_attr_array(node: ir.Node) -> np.ndarray | None:
    """A Constant node's value as numpy (None for sparse_value, unknown attributes, and data
    that does not match its declared shape: the planner reports those)."""
    try:
        return _constant_attr_array(node)
    except (ValueError, TypeError, AttributeError):
        return None


def _constant_attr_array(node: ir.Node) -> np.ndarray | None:
    (name, a), = node.attributes.items()
    if a.is_ref():
        return None
    v = a.value
    if name == "value":
        return v.numpy()
    if name == "value_float":
        return np.array(v, np.float32)
    if name == "value_floats":
        return np.array(list(v), np.float32)
    if name == "value_int":
        return np.array(v, np.int64)
    if name == "value_ints":
        return np.array(list(v), np.int64)
    return None


def const_scalar(value: ir.Value | None) -> float | None:
    """A constant holding exactly one number (any shape of size 1), as a float."""
    shape = const_shape(value)
    if shape is None or math.prod(shape) != 1:
        return None
    arr = const_array(value)
    if arr is None or arr.size != 1 or arr.dtype.kind not in "fiu":
        return None
    return float(arr.reshape(()))


def close(a: float | None, b: float, rtol: float = 1e-6) -> bool:
    """Whether a constant matches an expected number to float32 precision."""
    return a is not None and math.isclose(a, b, rel_tol=rtol, abs_tol=0.0)


_KINDS = {
    int: (ir.AttributeType.INT,),
    float: (ir.AttributeType.FLOAT,),
    str: (ir.AttributeType.STRING,),
    list: (ir.AttributeType.INTS, ir.AttributeType.FLOATS, ir.AttributeType.STRINGS),
}


def attr(node: ir.Node, name: str, default: Any = None,
         kind: ir.AttributeType | None = None) -> Any:
    """An attribute's value (lists for repeated fields), or default when absent.

    The attribute must have the type `kind` (else the type of `default`): a malformed one
    reads as None, so a pattern needing it simply does not match.
    """
    a = node.attributes.get(name)
    if a is None:
        return default
    expected = (kind,) if kind is not None else _KINDS.get(type(default))
    if a.is_ref() or (expected is not None and a.type not in expected):
        return None
    if a.type in (ir.AttributeType.INTS, ir.AttributeType.FLOATS, ir.AttributeType.STRINGS):
        return list(a.value)
    return a.value


def static_shape(value: ir.Value | None) -> tuple[int, ...] | None:
    """The value's shape when every dim is a known int."""
    if value is None or value.shape is None:
        return None
    dims = tuple(value.shape)
    if all(isinstance(d, int) for d in dims):
        return dims  # type: ignore[return-value]
    return None


def rank(value: ir.Value | None) -> int | None:
    """The value's rank when known."""
    if value is None or value.shape is None:
        return None
    return len(value.shape)


def same_dims(a: ir.Value | None, b: ir.Value | None) -> bool:
    """Whether two values provably have equal shapes: same rank and, per dim, the same int or
    the same named symbol (symbols from shape inference name one runtime size each)."""
    if a is None or b is None or a.shape is None or b.shape is None:
        return False
    if len(a.shape) != len(b.shape):
        return False
    for x, y in zip(a.shape, b.shape):
        if isinstance(x, int) or isinstance(y, int):
            if x != y:
                return False
        elif x.value is None or x.value != y.value:
            return False
    return True


def float_dtype(value: ir.Value | None, *allowed: ir.DataType) -> bool:
    """Whether the value's element type is known and one of `allowed` (float32 by default)."""
    kinds = allowed or (ir.DataType.FLOAT,)
    return value is not None and value.dtype in kinds


def replace_value(old: ir.Value, new: ir.Value) -> None:
    """Repoint every use of old (graph outputs too) at new; a graph output keeps its name."""
    if new.type is None:
        new.type = old.type
    if new.shape is None and old.shape is not None:
        new.shape = old.shape.copy()
    if old.is_graph_output():
        name = old.name
        old.name = f"{name}__replaced"
        old.replace_all_uses_with(new, replace_graph_outputs=True)
        new.name = name
    else:
        old.replace_all_uses_with(new)


def drop_dead(graph: ir.Graph, nodes: Iterable[ir.Node]) -> int:
    """Remove those of `nodes` (and, transitively, their now-dead producers among them) whose
    outputs nobody reads; returns how many went."""
    pending = list({id(n): n for n in nodes if n.graph is graph}.values())
    removed = 0
    changed = True
    while changed:
        changed = False
        for node in list(pending):
            if any(v.uses() or v.is_graph_output() for v in node.outputs):
                continue
            graph.remove(node, safe=True)
            pending.remove(node)
            removed += 1
            changed = True
    return removed
