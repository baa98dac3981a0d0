"""The `fuse` provider: compiles chains of elementwise ops (ending, optionally, in a row-wise
Softmax or layer norm) into one generated kernel each, on the host.

It is a compiling provider: `compile` claims partitions of a graph,
`save_context`/`load_context` turn a compiled partition into a context blob and back.
Its registry holds one op, `onnxkiln.fuse::FusedPartition`, the node each partition is
rewritten into; the rest of the graph runs on the next provider (cpu).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import onnx_ir as ir

from onnxkiln.ep_context import CompiledPartition
from onnxkiln.ep_context_load import loaded_kernel
from onnxkiln.providers.base import HostProvider, KernelRegistry, NodeInfo
from onnxkiln.providers.fuse import codegen
from onnxkiln.providers.fuse.analysis import Graphview, build_program, find_partitions

__all__ = ["DOMAIN", "KERNEL_META", "OP_TYPE", "REGISTRY", "SOURCE_KEY", "FuseProvider"]

DOMAIN = "onnxkiln.fuse"
OP_TYPE = "FusedPartition"
SOURCE_KEY = "onnxkiln.fuse"
KERNEL_META = "onnxkiln.fuse.kernel"  # node.meta key: the kernel built when the node was made
REGISTRY = KernelRegistry("fuse", default_variant="fuse")


@REGISTRY.kernel(OP_TYPE, domain=DOMAIN, factory=True, multi_output=True, variant="fuse")
def fused_partition(info: NodeInfo) -> Any:
    """The partition's generated kernel: the one made with the node, else loaded from its
    `context` attribute (a context blob; nothing is analysed or generated again)."""
    kernel = loaded_kernel(info, KERNEL_META)
    if kernel is None:
        context = info.attrs.get("context")
        if not context:
            raise ValueError("FusedPartition node has no 'context' attribute")
        use_numba = info.attrs.get("backend", "numba") != "numpy"
        kernel = codegen.FusedKernel(codegen.loads(context), use_numba)
    return kernel


class FuseProvider(HostProvider):
    """Host provider that compiles elementwise partitions (numba loops, else numpy code).

    `backend`: "numba", "numpy", or None (numba when installed, else numpy).
    """

    name = "fuse"
    registry = REGISTRY
    context_op = (DOMAIN, OP_TYPE)
    kernel_meta = KERNEL_META

    def __init__(self, backend: str | None = None) -> None:
        if backend not in (None, "numba", "numpy"):
            raise ValueError(f"fuse backend must be 'numba', 'numpy' or None, got {backend!r}")
        if backend == "numba" and codegen.numba_available() is not None:
            raise ValueError(f"fuse backend 'numba': {codegen.numba_available()}")
        if backend is None:
            backend = "numba" if codegen.numba_available() is None else "numpy"
        self.backend = backend

    # compiling-provider protocol -----------------------------------------------------------
    def compile(self, graph: ir.Graph, node_ids: Iterable[int] | None = None
                ) -> list[CompiledPartition]:
        """Claim maximal convex partitions among `node_ids` (default all) and generate code."""
        opsets = {("" if d == "ai.onnx" else d): v for d, v in graph.opset_imports.items()}
        view = Graphview(graph, opsets)
        parts = []
        for k, ids in enumerate(find_partitions(view, node_ids)):
            program, inputs, outputs = build_program(view, ids)
            blob = codegen.generate(program, self.backend)
            parts.append(CompiledPartition(
                self.name, f"fuse_{k}", tuple(ids),
                inputs=tuple(v.name for v in inputs), outputs=tuple(v.name for v in outputs),
                payload=blob))
        return parts

    def save_context(self, partition: CompiledPartition) -> tuple[bytes, str]:
        """The partition's blob (generated source, signature, version) and SDK string."""
        blob = partition.payload
        return codegen.dumps(blob), f"{codegen.FORMAT} {codegen.VERSION} ({blob['backend']})"

    def context_source_keys(self) -> list[str]:
        """The `source` values this provider loads (the first is the one it writes)."""
        return [SOURCE_KEY]

    def load_context(self, attributes: dict[str, Any], blob: bytes) -> codegen.FusedKernel:
        """The kernel of a saved partition, from its blob alone."""
        return codegen.FusedKernel(codegen.loads(blob), use_numba=self.backend == "numba")

    def make_kernel(self, partition: CompiledPartition) -> codegen.FusedKernel:
        """The kernel of a partition compiled in this process."""
        return codegen.FusedKernel(partition.payload, use_numba=self.backend == "numba")
