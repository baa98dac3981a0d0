"""The exported bench models on the torch provider (torch's CPU device): what each places
where, the host<->device copies per run, outputs against onnxruntime, and the capture audit.

    python scripts/torch_provider_models.py [NAME ...] [--cache bench/models] [--json F]

For every model of `bench/models/manifest.json` (built by `make bench-models`): the nodes the
torch provider declined with their reasons, the copy steps in the plan (graph inputs up and
outputs down are the floor), the largest difference from onnxruntime's outputs on the
manifest's first run shape, and, for decode-step models, the capture segmentation.
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.exported.manifest import make_feeds  # noqa: E402

COPY_OPS = frozenset({"MemcpyToHost", "MemcpyFromHost"})


def torch_session(path: Path) -> Any:
    """A session on the torch provider, placed as it would be on a GPU, on torch's CPU."""
    import onnxkiln as ok

    return ok.InferenceSession(str(path), device="cuda",
                               options={"testing.cuda_on_torch_cpu": "1"})


def examine(entry: dict[str, Any], cache: Path) -> dict[str, Any]:
    """One model's row: declines by reason, copy steps, the difference from onnxruntime."""
    import onnxruntime as ort

    path = cache / entry["file"]
    session = torch_session(path)
    report = session.execution_provider_fallback_report()
    declines = collections.Counter(f"{d.op_type}: {d.reason}" for d in report.declines) \
        if report is not None else collections.Counter()
    steps = session._plan.steps
    copies = collections.Counter(s.op_type for s in steps if s.op_type in COPY_OPS)
    feeds = make_feeds(entry, entry["runs"][0]["dims"])
    ours = session.run_outputs(None, feeds)
    reference = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(
        None, feeds)
    pairs = [(o.value, b) for o, b in zip(ours, reference, strict=True)
             if o.kind == "tensor" and np.size(b)]  # ZipMap's lists of maps: not compared
    diff = max(float(np.max(np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64))))
               / max(1.0, float(np.max(np.abs(np.asarray(b, np.float64)))))
               for a, b in pairs)
    on_device = sum(1 for s in steps if s.provider != "cpu" and s.op_type not in COPY_OPS)
    return {"model": entry["name"], "steps": len(steps), "on_torch": on_device,
            "declined": dict(declines), "copies": dict(copies),
            "inputs": len(entry["inputs"]), "outputs": len(entry["outputs"]),
            "rel_diff": diff}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*")
    parser.add_argument("--cache", type=Path, default=ROOT / "bench" / "models")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    manifest = json.loads((args.cache / "manifest.json").read_text())
    rows = []
    for entry in manifest["models"]:
        if args.names and entry["name"] not in args.names:
            continue
        try:
            row = examine(entry, args.cache)
        except Exception as exc:  # a report, not a test: say what failed and go on
            row = {"model": entry["name"], "error": f"{type(exc).__name__}: {exc}"[:300]}
        rows.append(row)
        print(json.dumps(row), flush=True)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
