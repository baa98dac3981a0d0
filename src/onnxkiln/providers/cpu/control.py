"""CPU kernels: control flow (If, Loop, Scan) over compiled subgraphs."""

from __future__ import annotations

from onnxkiln.providers.base import NodeInfo
from onnxkiln.providers.cpu.registry import kernel


@kernel("If", since=1, factory=True, multi_output=True, variant="if.subgraph")
def if_(info: NodeInfo):
    """Run then_branch or else_branch on the captured outer values."""
    then_branch = info.subgraphs["then_branch"]
    else_branch = info.subgraphs["else_branch"]

    def run(cond, *captured):
        if cond is None or getattr(cond, "size", 1) != 1:
            raise ValueError(f"If: cond must hold exactly one element, got {cond!r}")
        branch = then_branch if bool(cond.reshape(())) else else_branch
        return branch((), captured)

    return run
