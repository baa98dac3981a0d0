"""Model-local functions inlined, with their size counted first.

A function that calls another twice, level after level, is a few kilobytes that inline to
2^levels nodes. Each function's expanded size is counted once (memoised), so the count costs
one walk of the functions, and a model past the bound is refused before any node is built.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterable, Iterator

import onnx
import onnx_ir as ir
from onnx_ir.passes.common import InlinePass, inliner

from onnxkiln.errors import ModelLoadError

__all__ = ["MAX_INLINED_NODES", "check_inlined_size", "inline_functions", "inlined_size"]

MAX_INLINED_NODES = 1_000_000  # default of the session option "load.max_inlined_nodes"

FunctionKey = tuple[str, str, str]


def check_inlined_size(proto: onnx.ModelProto, bound: int, source: str) -> None:
    """Refuse `proto` with a ModelLoadError if inlining its functions makes over `bound` nodes."""
    try:
        total, sizes = inlined_size(proto)
    except ModelLoadError as e:
        raise ModelLoadError(f"{source}: {e}") from None
    if total <= bound:
        return
    key, size = max(sizes.items(), key=lambda kv: kv[1])
    raise ModelLoadError(
        f"{source}: inlining the model-local functions would make {total} nodes, over the "
        f"bound of {bound} (function '{key[0]}::{key[1]}' alone expands to {size} nodes); "
        f"raise the session option 'load.max_inlined_nodes' if the model is meant to be so "
        f"large")


def inlined_size(proto: onnx.ModelProto) -> tuple[int, dict[FunctionKey, int]]:
    """(nodes of the main graph once inlined, expanded node count of each function it reaches).

    A function that calls itself, directly or not, is a ModelLoadError naming it.
    """
    functions = {(f.domain, f.name, f.overload): f for f in proto.functions}
    calls: dict[FunctionKey, tuple[int, Counter[FunctionKey]]] = {}

    def calls_of(nodes: Iterable[onnx.NodeProto]) -> tuple[int, Counter[FunctionKey]]:
        plain, callees = 0, Counter[FunctionKey]()
        for node in _all_nodes(nodes):
            key = (node.domain, node.op_type, node.overload)
            if key in functions:
                callees[key] += 1
            else:
                plain += 1
        return plain, callees

    main_plain, main_calls = calls_of(proto.graph.node)
    sizes: dict[FunctionKey, int] = {}
    expanding: list[FunctionKey] = []
    stack = [(key, False) for key in main_calls]
    while stack:  # depth first over the call graph; a function's size once its callees' are
        key, done = stack.pop()
        if done:
            plain, callees = calls[key]
            sizes[key] = plain + sum(n * sizes[c] for c, n in callees.items())
            expanding.pop()
            continue
        if key in sizes:
            continue
        if key in expanding:
            raise ModelLoadError(
                f"function '{key[0]}::{key[1]}' calls itself "
                f"({' -> '.join(k[1] for k in [*expanding[expanding.index(key):], key])}): "
                f"recursive functions cannot be inlined")
        calls[key] = calls_of(functions[key].node)
        expanding.append(key)
        stack.append((key, True))
        stack.extend((c, False) for c in calls[key][1])
    total = main_plain + sum(n * sizes[c] for c, n in main_calls.items())
    return total, sizes


def _all_nodes(nodes: Iterable[onnx.NodeProto]) -> Iterator[onnx.NodeProto]:
    """`nodes` and the nodes of their subgraphs, at any depth."""
    pending = [iter(nodes)]
    while pending:
        for node in pending.pop():
            yield node
            for a in node.attribute:
                if a.HasField("g"):
                    pending.append(iter(a.g.node))
                pending.extend(iter(g.node) for g in a.graphs)


_inline_lock = threading.Lock()


def inline_functions(model: ir.Model) -> None:
    """onnx_ir's InlinePass on `model`, with its search for unique names made linear.

    The pass names the k-th copy of a value `t` by trying t, t_2, ... t_k in turn: quadratic
    in the copies (65,536 copies of a function took minutes). The same names come out when
    each name's search starts where its previous one ended (what it skips is taken already).
    """
    last: dict[tuple[int, str], int] = {}

    def unique_name(name: str, callstack: list[str], used: set[str]) -> str:
        i = last.get((id(used), name), 1)
        candidate = name if i == 1 else f"{name}_{i}"
        while candidate in used:
            i += 1
            candidate = f"{name}_{i}"
        last[(id(used), name)] = i
        used.add(candidate)
        return candidate

    _align_function_opsets(model)
    with _inline_lock:
        original = inliner._make_unique_name
        inliner._make_unique_name = unique_name
        try:
            InlinePass()(model)
        finally:
            inliner._make_unique_name = original


def _align_function_opsets(model: ir.Model) -> None:
    """A function importing a domain at another version than the model (skl2onnx writes
    ai.onnx 21 functions into opset 22 models) takes the model's version: inlined, its
    nodes run at the model's opset, as onnxruntime runs them. onnx_ir's pass refuses the
    mismatch otherwise."""
    for function in model.functions.values():
        for domain, version in list(function.opset_imports.items()):
            model_version = model.opset_imports.get(domain)
            if model_version is not None and model_version != version:
                function.opset_imports[domain] = model_version
