"""ONNX backend node cases through the CUDA provider's torch kernels alone (no partitioner).

    python tests/providers/cuda/conformance_torch.py [-k substring] [-v] [--write-manifest]
    ONNXKILN_TORCH_TEST_DEVICE=cuda python tests/providers/cuda/conformance_torch.py

Every case whose nodes all resolve in the torch registry runs node by node on the torch
kernels (cases with subgraphs: a session on the torch provider alone, which refuses any node
it would have to run on the CPU) and is compared with onnx's expected outputs. Cases a
kernel declines through `supports` are counted, not run. Each case's outcome is checked
against tests/conformance/manifest_torch.txt (the cases that do not pass, with their reason:
"not served: ...", "declined: ..." or "fails: ..."); exits 1 on any difference.
--write-manifest rewrites it (existing reasons for "fails" entries are kept).
test_cuda_conformance.py checks a subset of the cases in the unit suite.
"""

from __future__ import annotations

import argparse
import collections
import re
import sys
import warnings
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parents[1] / "conformance"))

MANIFEST = HERE.parents[1] / "conformance" / "manifest_torch.txt"
_HEADER = [
    "# ONNX backend node cases that do not pass on the CUDA provider's torch kernels alone",
    "# (run node by node on torch's CPU device): exact names, one reason each, prefixed",
    "# 'not served:' (no torch kernel, or inputs the harness cannot feed), 'declined:' (the",
    "# kernel's supports reason, which the planner hands to the CPU provider) or 'fails:'.",
    "# Regenerate with tests/providers/cuda/conformance_torch.py --write-manifest.",
]


def _unserved(model) -> str | None:
    """Why the graph cannot run on the torch registry alone, else None."""
    from cuda_harness import CUDA

    graph, imports = model.graph, dict(model.opset_imports)
    nodes = list(graph.all_nodes())
    missing = sorted({
        n.op_type for n in nodes
        if CUDA.resolve("" if n.domain == "ai.onnx" else n.domain, n.op_type,
                        imports.get("" if n.domain == "ai.onnx" else n.domain, 1)) is None})
    if missing:
        return f"not served: no torch kernel for {', '.join(missing)}"
    return None


def torch_outcome(case) -> str | None:
    """None if the case passes on the torch kernels, else a one-line reason (prefixed)."""
    from cuda_harness import run_graph, run_session
    from node_cases import _compare, normalize

    from onnxkiln import loader

    model = loader.from_graph(case.model)
    why = _unserved(model)
    if why is not None:
        return why
    graph = model.graph
    names = [v.name for v in graph.inputs if v.name not in graph.initializers]
    nested = len(list(graph.all_nodes())) != len(list(graph))
    try:
        for inputs, expected in case.data_sets:
            feeds = dict(zip(names, [None if x is None else normalize(x) for x in inputs]))
            outputs = (run_session(case.model, feeds) if nested
                       else run_graph(model, feeds, True))
            _compare([normalize(x) for x in expected], outputs, case.rtol, case.atol)
    except Exception as e:  # an outcome, not a test
        msg = re.sub(r"\s+", " ", f"{type(e).__name__}: {e}")
        if "declined: " in msg:
            return "declined: " + msg.split("declined: ")[-1][:200]
        return "fails: " + msg[:200]
    return None


def load_torch_manifest() -> dict[str, str]:
    from node_cases import load_manifest

    return load_manifest(MANIFEST)


def mismatch(name: str, outcome: str | None, listed: str | None) -> str | None:
    """Why a case's outcome disagrees with the manifest, else None. 'fails:' entries match
    any failure (their messages carry values); the others must match exactly."""
    if outcome is None:
        return None if listed is None else f"{name} now passes: remove it (was: {listed})"
    if listed is None:
        return f"{name} does not pass: {outcome}"
    if listed.startswith("fails:") and outcome.startswith("fails:"):
        return None
    if outcome != listed:
        return f"{name}: {outcome} (the manifest says: {listed})"
    return None


def _write(results: dict[str, str | None]) -> None:
    known = load_torch_manifest()
    lines = []
    for name, outcome in sorted(results.items()):
        if outcome is None:
            continue
        old = known.get(name)
        keep = old is not None and old.startswith("fails:") and outcome.startswith("fails:")
        lines.append(f"{name} {old if keep else outcome}")
    MANIFEST.write_text("\n".join(_HEADER + lines) + "\n")
    print(f"wrote {MANIFEST} ({len(lines)} entries)")


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("-k", default="")
    parser.add_argument("-v", action="store_true")
    parser.add_argument("--write-manifest", action="store_true")
    args = parser.parse_args()
    from cuda_harness import DEVICE
    from node_cases import load_cases

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cases = [c for c in load_cases() if args.k in c.name]
        results = {c.name: torch_outcome(c) for c in cases}
    counts = collections.Counter(
        "pass" if r is None else r.split(":")[0] for r in results.values())
    print(f"torch kernels on {DEVICE}: {dict(counts)}")
    if args.v:
        reasons = collections.Counter(r for r in results.values() if r is not None)
        for reason, n in reasons.most_common():
            print(f"  x{n}: {reason[:160]}")
    if args.write_manifest:
        if args.k:
            parser.error("--write-manifest needs every case (no -k)")
        _write(results)
        return 0
    listed = load_torch_manifest()
    problems = [m for name, r in results.items()
                if (m := mismatch(name, r, listed.get(name))) is not None]
    for p in problems:
        print(p)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
