"""EPContext import and the compile-and-rewrite step (the export half and the
blob format are in onnxkiln.ep_context).

- `load_with_contexts(model, model_dir, providers)`: each com.microsoft::EPContext node of a
  dumped context model goes to the provider whose `context_source_keys()` hold its `source`;
  the provider's `load_context(attributes, blob)` returns the kernel, and the node becomes
  one the planner runs (the provider's `context_op`, or `onnxkiln.ep_context::
  LoadedPartition` served by `ContextProvider`). Nothing is analysed or compiled again.
- `apply_fuse(model, provider, config, model_path)`: a compiling provider's partitions are
  compiled, dumped when `ep.context_enable=1`, and each rewritten into one node.
"""

from __future__ import annotations

import contextlib
import uuid
import weakref
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import onnx_ir as ir

from onnxkiln.ep_context import (
    MS_DOMAIN,
    CompiledPartition,
    EpContextDumpConfig,
    boundary_values,
    export_ep_context,
    unpack_blobs,
)
from onnxkiln.errors import EpContextError
from onnxkiln.providers.base import HostProvider, KernelRegistry, NodeInfo
from onnxkiln.tensor_data import OutsideFolderError, file_in_folder

__all__ = [
    "CONTEXT_REGISTRY",
    "ContextProvider",
    "apply_fuse",
    "has_ep_context",
    "load_with_contexts",
    "loaded_kernel",
    "remember_kernel",
    "resolve_ep_context",
]

CONTEXT_DOMAIN = "onnxkiln.ep_context"
CONTEXT_KERNEL_META = "onnxkiln.ep_context.kernel"
LOADED_META = "onnxkiln.ep_context.loaded"  # model.meta flag: built from a context model
_KERNELS: weakref.WeakValueDictionary[str, Any] = weakref.WeakValueDictionary()

# -------------------------------------------------------------------------------- import

def has_ep_context(model: ir.Model) -> bool:
    """Whether the graph holds com.microsoft::EPContext nodes."""
    return any(_is_context_node(n) for n in model.graph)


def _is_context_node(node: ir.Node) -> bool:
    return node.domain == MS_DOMAIN and node.op_type == "EPContext"


def _attrs(node: ir.Node) -> dict[str, Any]:
    out = {name: a.value for name, a in node.attributes.items()}
    out.setdefault("main_context", 1)
    out.setdefault("embed_mode", 1)
    out.setdefault("ep_cache_context", b"")
    out.setdefault("source", "")
    out.setdefault("partition_name", node.name or "")
    return out


def _as_bytes(value: Any) -> bytes:
    return value.encode("utf-8", "surrogateescape") if isinstance(value, str) else bytes(value)


def _read_context_file(rel: str, model_dir: str | Path | None, what: str) -> bytes:
    """A blob file named relative to the model's folder; never outside it."""
    if model_dir is None:
        raise EpContextError(f"{what}: its blob is in file '{rel}' (embed_mode=0), but the model "
                             "was not loaded from a file: load it from its path")
    if not rel:
        raise EpContextError(f"{what}: its blob file name is empty")
    try:
        target, _ = file_in_folder(rel, Path(model_dir))
    except OutsideFolderError as e:
        raise EpContextError(f"{what}: blob file {rel[:200]!r}{e}") from None
    try:
        return target.read_bytes()
    except OSError as e:
        raise EpContextError(f"{what}: cannot read blob file '{rel}': {e}") from e


def _describe(node: ir.Node, a: Mapping[str, Any]) -> str:
    return (f"EPContext node '{node.name}' (source '{_text(a['source'])}', partition_name "
            f"'{_text(a['partition_name'])}')")


def _text(v: Any) -> str:
    return v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v)


def _raw_blob(node: ir.Node, a: Mapping[str, Any], model_dir: Any) -> bytes:
    if int(a["embed_mode"]) == 1:
        return _as_bytes(a["ep_cache_context"])
    return _read_context_file(_text(a["ep_cache_context"]), model_dir, _describe(node, a))


def _blob(node: ir.Node, a: Mapping[str, Any], primaries: Mapping[str, list],
          model_dir: Any, cache: dict[int, bytes]) -> bytes:
    name = _text(a["partition_name"])
    if int(a["main_context"]) == 1:
        raw = _raw_blob(node, a, model_dir)
        parts = unpack_blobs(raw)
        if parts is None:
            return raw
        if name not in parts:
            raise EpContextError(f"{_describe(node, a)}: its blob container has no partition "
                                 f"'{name}' (it holds {sorted(parts)})")
        return parts[name]
    source = _text(a["source"])
    for prim, pa in primaries.get(source, []):
        if id(prim) not in cache:
            cache[id(prim)] = _raw_blob(prim, pa, model_dir)
        parts = unpack_blobs(cache[id(prim)])
        if parts is not None and name in parts:
            return parts[name]
    raise EpContextError(f"{_describe(node, a)} has main_context=0, but no main_context=1 node "
                         f"of source '{source}' holds a blob for partition '{name}'")


def resolve_ep_context(model: ir.Model, model_dir: str | Path | None, providers: Sequence[Any]
                       ) -> ir.Model:
    """Replace every EPContext node by a runnable node whose kernel its provider loaded."""
    ctx_nodes = [n for n in model.graph if _is_context_node(n)]
    if not ctx_nodes:
        return model
    keyed = [(p, list(p.context_source_keys())) for p in providers
             if hasattr(p, "context_source_keys") and hasattr(p, "load_context")]
    claims, unclaimed = [], []
    for node in ctx_nodes:
        a = _attrs(node)
        owner = next((p for p, keys in keyed if _text(a["source"]) in keys), None)
        (unclaimed if owner is None else claims).append((node, a, owner))
    if unclaimed:
        asked = ", ".join(f"{p.name} ({keys})" for p, keys in keyed) or "none"
        raise EpContextError(
            f"{len(unclaimed)} EPContext node(s) are claimed by no provider of this session:\n  "
            + "\n  ".join(_describe(n, a) for n, a, _ in unclaimed)
            + f"\ncompiling providers asked (source keys): {asked}")
    primaries: dict[str, list] = {}
    for node, a, _ in claims:
        if int(a["main_context"]) == 1:
            primaries.setdefault(_text(a["source"]), []).append((node, a))
    cache: dict[int, bytes] = {}
    for node, a, provider in claims:
        blob = _blob(node, a, primaries, model_dir, cache)
        try:
            kernel = provider.load_context(dict(a), blob)
        except EpContextError:
            raise
        except Exception as e:
            raise EpContextError(f"{_describe(node, a)}: provider '{provider.name}' cannot load "
                                 f"its context: {type(e).__name__}: {e}") from e
        _replace_with_kernel(model, node, provider, kernel, blob, a)
    model.meta[LOADED_META] = True
    return model


def load_with_contexts(model: ir.Model, model_dir: str | Path | None,
                       providers: Sequence[Any]) -> ir.Model:
    """`resolve_ep_context`, for sessions: a model without EPContext nodes is returned as is."""
    if not has_ep_context(model):
        return model
    return resolve_ep_context(model, model_dir, providers)


def _replace_with_kernel(model: ir.Model, node: ir.Node, provider: Any, kernel: Any,
                         blob: bytes, a: Mapping[str, Any]) -> None:
    domain, op_type = getattr(provider, "context_op", (CONTEXT_DOMAIN, "LoadedPartition"))
    attrs = [ir.AttrString("partition_name", _text(a["partition_name"])),
             ir.AttrString("source", _text(a["source"]))]
    if hasattr(provider, "context_op"):
        with contextlib.suppress(UnicodeDecodeError):
            attrs.append(ir.AttrString("context", blob.decode("utf-8")))
    else:
        kernel = _tuple_kernel(kernel)
    meta_key = getattr(provider, "kernel_meta", CONTEXT_KERNEL_META)
    attrs.append(ir.AttrString("kernel_token", remember_kernel(kernel)))
    _swap(model, [node], list(node.inputs), list(node.outputs), domain, op_type, attrs,
          node.name, {meta_key: kernel})


def remember_kernel(kernel: Any) -> str:
    """A token naming `kernel` while something holds it (the node's meta, a plan), so a
    copy of the model (from_graph serializes it) still finds the loaded kernel."""
    token = uuid.uuid4().hex
    _KERNELS[token] = kernel
    return token


def loaded_kernel(info: NodeInfo, meta_key: str) -> Any:
    """The kernel stored with a rewritten node (its meta, else its kernel_token), or None."""
    kernel = info.node.meta.get(meta_key) if info.node is not None else None
    if kernel is None and info.attrs.get("kernel_token"):
        kernel = _KERNELS.get(info.attrs["kernel_token"])
    return kernel


def _tuple_kernel(kernel: Callable[..., Any]) -> Callable[..., tuple]:
    def run(*xs: Any) -> tuple:
        out = kernel(*xs)
        return tuple(out) if isinstance(out, tuple | list) else (out,)

    run.variant = getattr(kernel, "variant", "ep_context")
    return run


def _swap(model: ir.Model, old_nodes: list[ir.Node], inputs: list[ir.Value],
          old_outputs: list[ir.Value], domain: str, op_type: str, attrs: list[ir.Attr],
          name: str | None, meta: Mapping[str, Any]) -> ir.Node:
    """Replace `old_nodes` by one node computing `old_outputs` (same names and types)."""
    new = ir.Node(domain, op_type, inputs, attributes=attrs, num_outputs=len(old_outputs),
                  name=name)
    for old, v in zip(old_outputs, new.outputs):
        v.name, v.type, v.shape = old.name, old.type, old.shape
    new.meta.update(meta)
    graph = model.graph
    ir.convenience.replace_nodes_and_values(graph, old_nodes[-1], old_nodes, [new],
                                            old_outputs, list(new.outputs))
    model.opset_imports.setdefault(domain, 1)
    return new


# ---------------------------------------------------------------------- compile + rewrite

def apply_fuse(model: ir.Model, provider: Any, config: EpContextDumpConfig,
               model_path: str | Path | None = None
               ) -> tuple[ir.Model, list[CompiledPartition]]:
    """Compile `provider`'s partitions, dump the context model when enabled, and rewrite each
    partition into one `provider.context_op` node carrying its kernel. A model built from a
    context model is returned as it is (its partitions are already compiled)."""
    if model.meta.get(LOADED_META):
        return model, []
    parts = provider.compile(model.graph)
    if config.enable:
        export_ep_context(model, model_path, parts, [provider], config)
    nodes = list(model.graph)
    domain, op_type = provider.context_op
    plans = [(p, *boundary_values(model.graph, nodes, p)) for p in parts]
    moved: dict[ir.Value, ir.Value] = {}  # outputs of partitions already rewritten
    for p, ins, outs in plans:
        blob, _ = provider.save_context(p)
        attrs = [ir.AttrString("partition_name", p.partition_name),
                 ir.AttrString("source", provider.context_source_keys()[0]),
                 ir.AttrString("context", blob.decode("utf-8"))]
        kernel = provider.make_kernel(p)
        attrs.append(ir.AttrString("kernel_token", remember_kernel(kernel)))
        new = _swap(model, [nodes[i] for i in p.covered_nodes], [moved.get(v, v) for v in ins],
                    outs, domain, op_type, attrs, f"{config.node_name_prefix}{p.partition_name}",
                    {provider.kernel_meta: kernel})
        moved.update(zip(outs, new.outputs))
    if parts:
        model.graph.sort()
    return model, parts


# ----------------------------------------------------- the host provider of LoadedPartition

CONTEXT_REGISTRY = KernelRegistry("ep_context", default_variant="ep_context")


@CONTEXT_REGISTRY.kernel("LoadedPartition", domain=CONTEXT_DOMAIN, factory=True,
                         multi_output=True, variant="ep_context")
def _loaded_partition(info: NodeInfo) -> Any:
    """The kernel a compiling provider loaded from an EPContext node."""
    kernel = loaded_kernel(info, CONTEXT_KERNEL_META)
    if kernel is None:
        raise ValueError("LoadedPartition node carries no loaded kernel; load the model "
                         "through ep_context_load.resolve_ep_context")
    return kernel


class ContextProvider(HostProvider):
    """Host provider serving `onnxkiln.ep_context::LoadedPartition` nodes (the kernels of
    compiling providers that have no registry op of their own)."""

    name = "ep_context"
    registry = CONTEXT_REGISTRY
