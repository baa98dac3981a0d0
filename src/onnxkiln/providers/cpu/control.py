"""CPU kernels: control flow (If, Loop, Scan) over compiled subgraphs, on numpy arrays.

The drivers live in onnxkiln.ops.control_flow, shared with the device provider; the
helpers re-exported here serve the CPU's other subgraph ops (sequence.py, generation).
"""

from __future__ import annotations

from onnxkiln.ops.control_flow import (
    body_may_alias,
    body_output_meta,
    if_kernel,
    loop_kernel,
    own,
    scan8_kernel,
    scan_kernel,
    truth,
    unbuilt,
)
from onnxkiln.providers.cpu.registry import kernel

__all__ = ["body_may_alias", "body_output_meta", "if_", "loop", "own", "scan", "scan8",
           "truth", "unbuilt"]

if_ = kernel("If", since=1, factory=True, multi_output=True, variant="if.subgraph")(if_kernel)
loop = kernel("Loop", since=1, factory=True, multi_output=True,
              variant="loop.subgraph")(loop_kernel)
scan = kernel("Scan", since=9, factory=True, multi_output=True,
              variant="scan.subgraph")(scan_kernel)
scan8 = kernel("Scan", since=8, until=8, factory=True, multi_output=True,
               variant="scan8.subgraph")(scan8_kernel)
