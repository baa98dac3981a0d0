"""EPContext: dump compiled partitions as `com.microsoft::EPContext` nodes, load them.

The seam, in the order a session uses it (after the graph optimizer, before planning):

- `ep_context_config(options, model_path)` reads the `ep.context_*` options.
Loading lives in onnxkiln.ep_context_load:
- `load_with_contexts(model, model_dir, providers)`: a model that contains EPContext nodes
  (a dumped context model) has each node handed to the provider whose
  `context_source_keys()` holds its `source`; the provider's `load_context(attributes, blob)`
  returns the kernel, and the node is replaced by one the planner runs: the provider's
  `context_op` (fuse: `onnxkiln.fuse::FusedPartition`) or `onnxkiln.ep_context::
  LoadedPartition` (kernel in `CONTEXT_REGISTRY`, served by `ContextProvider`), with the
  kernel stored in the node's `meta`. Nothing is analysed or compiled again.
- `apply_fuse(model, provider, config, model_path)`: a compiling provider's `compile(graph,
  node_ids)` returns `CompiledPartition`s (covered node ids = positions in the graph's node
  order); with `ep.context_enable=1` `export_ep_context` writes the context model, then each
  partition is rewritten into one node of the provider's `context_op`.

Context blobs: embed mode 1 stores each partition's blob inline (`main_context=1` on every
node). Embed mode 0 writes one `<context model stem>_<provider>.bin` per provider beside the
context model: a container of every partition's blob indexed by `partition_name`. The first
node of that provider is its primary (`main_context=1`, `ep_cache_context` = the file's path
relative to the model's folder); the provider's other nodes have `main_context=0` and are
resolved against the primary with the same `source`, by their `partition_name`.
"""

from __future__ import annotations

import json
import platform
import struct
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnx_ir as ir
from onnx import helper

from onnxkiln import onnx_guard
from onnxkiln.errors import EpContextError
from onnxkiln.options import SessionConfig

__all__ = [
    "CompiledPartition",
    "EpContextDumpConfig",
    "boundary_values",
    "default_context_path",
    "ep_context_config",
    "export_ep_context",
    "partition_boundary",
    "unpack_blobs",
]

MS_DOMAIN = "com.microsoft"
_MAGIC = b"ONNXKILN-EPCTX1\n"


@dataclass(frozen=True)
class EpContextDumpConfig:
    """The `ep.context_*` options, resolved."""

    enable: bool = False
    file_path: Path | None = None
    embed_mode: int = 1
    node_name_prefix: str = ""


def default_context_path(model_path: str | Path) -> Path:
    """`<model path without extension>_ctx.onnx`."""
    p = Path(model_path)
    return p.with_name(f"{p.stem}_ctx.onnx")


def ep_context_config(options: SessionConfig, model_path: str | Path | None = None
                      ) -> EpContextDumpConfig:
    """The dump configuration from session options; bad combinations are EpContextErrors."""
    enable = options.ep_context_enable
    embed = options.ep_context_embed_mode
    prefix = options.ep_context_node_name_prefix
    given = options.ep_context_file_path
    if given:
        path = Path(given)
        if path.is_dir() or given.endswith(("/", "\\")):
            raise EpContextError(
                f"ep.context_file_path '{given}' is a folder; it must name the context model "
                "file to write (e.g. model_ctx.onnx)")
    elif model_path is not None:
        path = default_context_path(model_path)
    else:
        path = None
        if enable:
            raise EpContextError(
                "ep.context_enable=1 needs a file to write, and a model loaded from bytes or "
                "a graph has no path to derive it from: set ep.context_file_path")
    return EpContextDumpConfig(enable, path, embed, prefix)


@dataclass(frozen=True)
class CompiledPartition:
    """Nodes a compiling provider took: `covered_nodes` are ids (positions in the graph's
    node order). `inputs`/`outputs` optionally fix the boundary (value names, in the
    kernel's argument/result order); by default every external input (in order of first
    use) and every value read outside the partition. `payload` is the provider's own."""

    provider: str
    partition_name: str
    covered_nodes: tuple[int, ...]
    inputs: tuple[str, ...] | None = None
    outputs: tuple[str, ...] | None = None
    payload: Any = field(default=None, compare=False, repr=False)


# ------------------------------------------------------------------------- graph helpers

def _subgraphs(node: ir.Node) -> Iterable[ir.Graph]:
    for attr in node.attributes.values():
        if attr.type == ir.AttributeType.GRAPH:
            yield attr.value
        elif attr.type == ir.AttributeType.GRAPHS:
            yield from attr.value


def _top_index(nodes: Sequence[ir.Node]) -> dict[ir.Node, int]:
    """Node -> top-level id, nodes inside subgraphs mapped to the node that holds them."""
    index = {}
    for i, n in enumerate(nodes):
        index[n] = i
        for sub in _subgraphs(n):
            for inner in sub.all_nodes():
                index[inner] = i
    return index


def partition_boundary(graph: ir.Graph, ids: Iterable[int]
                       ) -> tuple[list[ir.Value], list[ir.Value]]:
    """(inputs, outputs) of a node set: external values read (first use order, initializers
    included) and values produced inside that are read outside or are graph outputs."""
    nodes = list(graph)
    index = _top_index(nodes)
    members = set(ids)
    produced = {v for i in members for v in nodes[i].outputs}
    inputs: list[ir.Value] = []
    for i in sorted(members):
        reads = list(nodes[i].inputs)
        for sub in _subgraphs(nodes[i]):
            reads += [v for n in sub.all_nodes() for v in n.inputs
                      if v is not None and v.graph is not sub and v.graph is graph]
        for v in reads:
            if v is not None and v.name and v not in produced and v not in inputs:
                inputs.append(v)
    graph_outputs = set(graph.outputs)
    outputs = [v for i in sorted(members) for v in nodes[i].outputs
               if v.name and (v in graph_outputs
                              or any(index.get(u) not in members for u, _ in v.uses()))]
    return inputs, outputs


def _check_partitions(graph: ir.Graph, partitions: Sequence[CompiledPartition]) -> None:
    nodes = list(graph)
    index = _top_index(nodes)
    owner: dict[int, str] = {}
    names: set[str] = set()
    for p in partitions:
        if p.partition_name in names:
            raise EpContextError(f"two partitions are named '{p.partition_name}'")
        names.add(p.partition_name)
        if not p.covered_nodes:
            raise EpContextError(f"partition '{p.partition_name}' covers no nodes")
        for i in p.covered_nodes:
            if not isinstance(i, int | np.integer) or not 0 <= i < len(nodes):
                raise EpContextError(f"partition '{p.partition_name}': node id {i!r} is not in "
                                     f"the graph (0..{len(nodes) - 1})")
            if i in owner:
                raise EpContextError(f"node {i} ('{nodes[i].name}') is in partitions "
                                     f"'{owner[i]}' and '{p.partition_name}'")
            owner[i] = p.partition_name
        bad = _non_convex(nodes, index, set(p.covered_nodes))
        if bad is not None:
            raise EpContextError(
                f"partition '{p.partition_name}' of provider '{p.provider}' is not a convex "
                f"subgraph: node {bad} ('{nodes[bad].name}', {nodes[bad].op_type}) lies outside "
                "it on a path that leaves the partition and re-enters it")


def _non_convex(nodes: Sequence[ir.Node], index: dict[ir.Node, int], ids: set[int]
                ) -> int | None:
    """A node outside `ids` on a path from `ids` back into `ids`, or None."""
    def consumers(i: int) -> set[int]:
        return {index[u] for v in nodes[i].outputs for u, _ in v.uses() if u in index}

    hi = max(ids)
    frontier = [c for i in ids for c in consumers(i) if c not in ids and c < hi]
    reach = {c: c for c in frontier}  # outside node -> the first outside node on its way
    while frontier:
        n = frontier.pop()
        for c in consumers(n):
            if c in ids:
                return reach[n]
            if c < hi and c not in reach:
                reach[c] = reach[n]
                frontier.append(c)
    return None


# -------------------------------------------------------------------------------- export

def _provider_map(providers: Any) -> dict[str, Any]:
    if isinstance(providers, Mapping):
        return dict(providers)
    return {p.name: p for p in providers}


def export_ep_context(model: ir.Model, orig_path: str | Path | None,
                      partitions: Sequence[CompiledPartition], providers: Any,
                      config: EpContextDumpConfig) -> Path | None:
    """Write the context model for `partitions` of `model`'s graph; return its path.

    Disabled config: nothing is written and the would-be path is returned.
    """
    path = config.file_path or (default_context_path(orig_path) if orig_path else None)
    if not config.enable:
        return path
    if path is None:
        raise EpContextError("no context model path: set ep.context_file_path")
    if path.exists():
        raise EpContextError(f"context model '{path}' already exists; remove it or set "
                             "ep.context_file_path to a new file")
    if not path.parent.is_dir():
        raise EpContextError(f"cannot write context model '{path}': folder "
                             f"'{path.parent}' does not exist")
    by_name = _provider_map(providers)
    _check_partitions(model.graph, partitions)
    nodes = list(model.graph)
    blobs = []
    for p in partitions:
        provider = by_name.get(p.provider)
        if provider is None or not hasattr(provider, "save_context"):
            raise EpContextError(f"partition '{p.partition_name}': provider '{p.provider}' is "
                                 "not a compiling provider of this session")
        blob, sdk = provider.save_context(p)
        blobs.append((bytes(blob), str(sdk), provider.context_source_keys()[0]))
    bins = _bin_files(path, partitions, blobs) if config.embed_mode == 0 else {}
    for f in bins:
        if f.exists():
            raise EpContextError(f"context blob file '{f}' already exists; remove it first")
    proto = ir.serde.serialize_model(model)
    graph = proto.graph
    first_of = {min(p.covered_nodes): k for k, p in enumerate(partitions)}
    covered = {i for p in partitions for i in p.covered_nodes}
    primaries: set[str] = set()
    new_nodes = []
    typed: list[ir.Value] = []
    for i, node in enumerate(graph.node):
        if i in first_of:
            k = first_of[i]
            p = partitions[k]
            ins, outs = boundary_values(model.graph, nodes, p)
            typed += ins + outs
            new_nodes.append(_context_node(p, ins, outs, blobs[k], config, path, primaries))
        elif i not in covered:
            new_nodes.append(node)
    inferred = _inferred_types(proto, [v for v in typed if v.type is None])
    del graph.node[:]
    graph.node.extend(_topo_sort(new_nodes, graph))
    _prune_initializers(graph)
    _add_value_info(graph, typed, inferred)
    if not any(o.domain == MS_DOMAIN for o in proto.opset_import):
        proto.opset_import.append(helper.make_opsetid(MS_DOMAIN, 1))
    for f, data in bins.items():
        f.write_bytes(data)
    try:
        onnx.save_model(proto, path)
    except (OSError, ValueError) as e:
        raise EpContextError(f"cannot write context model '{path}': {e}") from e
    return path


def boundary_values(graph: ir.Graph, nodes: list[ir.Node], p: CompiledPartition
                     ) -> tuple[list[ir.Value], list[ir.Value]]:
    ins, outs = partition_boundary(graph, p.covered_nodes)
    if p.inputs is not None:
        by_name = {v.name: v for v in ins}
        missing = [n for n in p.inputs if n not in by_name]
        if missing:
            raise EpContextError(f"partition '{p.partition_name}' declares inputs {missing} "
                                 "that are not read from outside it")
        ins = [by_name[n] for n in p.inputs]
    if p.outputs is not None:
        produced = {v.name: v for i in p.covered_nodes for v in nodes[i].outputs}
        need = {v.name for v in outs} - set(p.outputs)
        if need or any(n not in produced for n in p.outputs):
            raise EpContextError(f"partition '{p.partition_name}' declares outputs "
                                 f"{list(p.outputs)}; it must produce exactly the values read "
                                 f"outside it (missing {sorted(need)})")
        outs = [produced[n] for n in p.outputs]
    return ins, outs


def _bin_files(path: Path, partitions: Sequence[CompiledPartition], blobs: list
               ) -> dict[Path, bytes]:
    """Embed mode 0: one container file per provider, blobs indexed by partition name."""
    groups: dict[str, dict[str, bytes]] = {}
    for p, (blob, _, _) in zip(partitions, blobs):
        groups.setdefault(p.provider, {})[p.partition_name] = blob
    return {path.with_name(f"{path.stem}_{prov}.bin"): _pack(parts)
            for prov, parts in groups.items()}


def _pack(parts: Mapping[str, bytes]) -> bytes:
    index, offset = {}, 0
    for name, blob in parts.items():
        index[name] = [offset, len(blob)]
        offset += len(blob)
    header = json.dumps({"partitions": index}).encode()
    return _MAGIC + struct.pack("<Q", len(header)) + header + b"".join(parts.values())


def unpack_blobs(data: bytes) -> dict[str, bytes] | None:
    """The container's blobs by partition name, or None when `data` is not a container."""
    if not data.startswith(_MAGIC):
        return None
    try:
        start = len(_MAGIC) + 8
        (n,) = struct.unpack_from("<Q", data, len(_MAGIC))
        index = json.loads(data[start:start + n])["partitions"]
        base = start + n
        return {name: data[base + o: base + o + ln] for name, (o, ln) in index.items()}
    except (ValueError, KeyError, struct.error, TypeError) as e:
        raise EpContextError(f"EPContext blob container is corrupt: {e}") from e


def _context_node(p: CompiledPartition, ins: list[ir.Value], outs: list[ir.Value],
                  blob: tuple[bytes, str, str], config: EpContextDumpConfig, path: Path,
                  primaries: set[str]) -> onnx.NodeProto:
    data, sdk, source = blob
    if config.embed_mode == 1:
        main, cache = 1, data
    else:
        main = 0 if p.provider in primaries else 1
        primaries.add(p.provider)
        cache = f"{path.stem}_{p.provider}.bin".encode()
    return helper.make_node(
        "EPContext", [v.name for v in ins], [v.name for v in outs],
        name=f"{config.node_name_prefix}{p.partition_name}", domain=MS_DOMAIN,
        main_context=main, ep_cache_context=cache, embed_mode=config.embed_mode,
        ep_sdk_version=sdk, partition_name=p.partition_name, source=source,
        hardware_architecture=platform.machine() or "unknown",
        notes=f"onnxkiln: {len(p.covered_nodes)} nodes compiled by provider '{p.provider}'")


def _reads(node: onnx.NodeProto) -> set[str]:
    names = {n for n in node.input if n}
    for attr in node.attribute:
        for g in ([attr.g] if attr.type == onnx.AttributeProto.GRAPH else list(attr.graphs)):
            for inner in g.node:
                names |= _reads(inner)
    return names


def _topo_sort(nodes: list[onnx.NodeProto], graph: onnx.GraphProto) -> list[onnx.NodeProto]:
    """Stable topological order (the original order where dependencies allow)."""
    producer = {o: k for k, n in enumerate(nodes) for o in n.output if o}
    deps = [{producer[r] for r in _reads(n) if r in producer and producer[r] != k}
            for k, n in enumerate(nodes)]
    done: set[int] = set()
    order: list[int] = []

    def visit(k: int, stack: set[int]) -> None:
        if k in done:
            return
        if k in stack:
            raise EpContextError("the context model would contain a cycle")
        stack.add(k)
        for d in sorted(deps[k]):
            visit(d, stack)
        stack.discard(k)
        done.add(k)
        order.append(k)

    for k in range(len(nodes)):
        visit(k, set())
    return [nodes[k] for k in order]


def _prune_initializers(graph: onnx.GraphProto) -> None:
    used = set().union(*(_reads(n) for n in graph.node)) if graph.node else set()
    used |= {v.name for v in graph.input} | {v.name for v in graph.output}
    keep = [t for t in graph.initializer if t.name in used]
    del graph.initializer[:]
    graph.initializer.extend(keep)
    keep_sparse = [t for t in graph.sparse_initializer if t.values.name in used]
    del graph.sparse_initializer[:]
    graph.sparse_initializer.extend(keep_sparse)


def _inferred_types(proto: onnx.ModelProto, untyped: list[ir.Value]
                    ) -> dict[str, onnx.ValueInfoProto]:
    """Value infos onnx's type inference gives the boundary values the model leaves untyped."""
    if not untyped:
        return {}
    try:
        done = onnx_guard.infer_shapes(proto, strict_mode=False)
    except Exception:  # a best effort: such values go without value_info
        return {}
    want = {v.name for v in untyped}
    return {vi.name: vi for vi in done.graph.value_info if vi.name in want}


def _add_value_info(graph: onnx.GraphProto, values: Iterable[ir.Value],
                    inferred: Mapping[str, onnx.ValueInfoProto]) -> None:
    produced = {o for n in graph.node for o in n.output}
    io = {v.name for v in graph.input} | {v.name for v in graph.output}
    kept = [vi for vi in graph.value_info if vi.name in produced and vi.name not in io]
    have = {vi.name for vi in kept}
    for v in values:
        if v.name in have or v.name in io or v.name not in produced:
            continue
        if v.type is not None:
            kept.append(ir.serde.serialize_value(v))
        elif v.name in inferred:
            kept.append(inferred[v.name])
        else:
            continue
        have.add(v.name)
    del graph.value_info[:]
    graph.value_info.extend(kept)
