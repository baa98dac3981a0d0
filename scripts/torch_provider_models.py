"""The exported bench models on the torch provider (torch's CPU device): what each places
where, the host<->device copies per run, outputs against onnxruntime, and the capture audit.

    python scripts/torch_provider_models.py [NAME ...] [--cache bench/models] [--json F]
    python scripts/torch_provider_models.py --tiny [FOLDER]   # the test's tiny models

For every model of the cache's manifest.json (`make bench-models` builds bench/models; with
`--tiny`, the tiny variants tests/providers/cuda/test_torch_models.py exports, built into
FOLDER, default $ONNXKILN_TORCH_MODELS_CACHE or a temporary folder): the nodes the torch
provider declined with their reasons; the copies a run executes (read from its trace: the
generic plan's first run and the steady state, the fourth run of the same inputs on the
signature's specialised plan), against the floor (graph inputs a device kernel reads up,
outputs down); the largest difference from onnxruntime's outputs on the manifest's first
run shape; the capture audit with every input and output bound at that shape, and for
decode-step models (past.* in, present.* out) also with the KV cache grown in place; then
the capture table (model, layout, segments, seams by kind).
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.exported import harness  # noqa: E402
from bench.exported import torch_audit as ta  # noqa: E402


def _diff(ours: list[Any], reference: list[Any]) -> float:
    """The largest |difference| relative to onnxruntime's largest |output| (at least 1)."""
    worst = 0.0
    for a, b in zip(ours, reference, strict=True):
        a, b = harness.plain(a).astype(np.float64), harness.plain(b).astype(np.float64)
        if b.size:
            worst = max(worst, float(np.max(np.abs(a - b))) / max(1.0, float(np.max(np.abs(b)))))
    return worst


def _is_decode_step(entry: dict[str, Any]) -> bool:
    return any(i["name"].startswith("past.") and i["name"].replace("past.", "present.", 1)
               in entry["outputs"] for i in entry["inputs"])


def audits(entry: dict[str, Any], path: Path) -> list[ta.Audit]:
    """The capture audit of one model: every input and output bound, and for a decode step
    its KV cache grown in place too (each on a session of its own)."""
    name = entry["name"]
    feeds = ta.feeds(entry)
    s = ta.torch_session(path)
    out = [ta.capture(s, ta.bind_fixed(s, feeds), name)]
    if _is_decode_step(entry):
        s = ta.torch_session(path)
        past = next(i for i in entry["inputs"] if i["name"].startswith("past."))
        capacity = feeds[past["name"]].shape[past["shape"].index("past_seq")] + 16
        out.append(ta.capture(s, ta.bind_growing(s, entry, feeds, capacity), name))
    return out


def examine(entry: dict[str, Any], cache: Path) -> dict[str, Any]:
    """One model's row: declines by reason, copies, the difference from onnxruntime, the
    capture audits."""
    import onnxruntime as ort

    path = cache / entry["file"]
    session = ta.torch_session(path)
    declines = collections.Counter(f"{d.op_type}: {d.reason}" for d in ta.declines(session))
    feeds = ta.feeds(entry)
    generic, steady = ta.run_copies(session, feeds)
    ours = session.run_outputs(None, feeds)
    reference = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(
        None, feeds)
    steps = session._plan.steps
    on_device = sum(1 for s in steps if s.provider != "cpu" and s.node_id >= 0)
    up, down = ta.declined_crossings(session)
    row = {"model": entry["name"], "steps": len(steps), "on_torch": on_device,
           "declined": dict(declines),
           "floor": {"up": len(ta.device_read_inputs(session)),
                     "down": len(ta.device_made_outputs(session)),
                     "declined_ops_up": len(up), "declined_ops_down": len(down)},
           "generic": {"up": generic.up, "down": generic.down, "idle": generic.idle},
           "steady": {"up": steady.up, "down": steady.down, "idle": steady.idle},
           "round_trips": ta.round_trips(session), "rel_diff": _diff(ours, reference)}
    try:
        row["capture"] = [a.row() for a in audits(entry, path)]
    except Exception as exc:  # a report: say what failed and go on
        row["capture"] = [{"model": entry["name"], "layout": "?", "segments": 0,
                           "refused": f"{type(exc).__name__}: {exc}"[:300]}]
    return row


def table(rows: list[dict[str, Any]]) -> str:
    """Markdown: copies (generic -> steady vs the floor) and the capture audits."""
    lines = ["| model | up generic | up steady | down steady | floor up/down | rel diff |",
             "|---|---|---|---|---|---|"]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['model']} | error: {r['error'][:80]} | | | | |")
            continue
        f = r["floor"]
        lines.append(f"| {r['model']} | {len(r['generic']['up'])} | {len(r['steady']['up'])} "
                     f"| {len(r['steady']['down'])} | {f['up']}+{f['declined_ops_up']} / "
                     f"{f['down']}+{f['declined_ops_down']} | {r['rel_diff']:.2g} |")
    lines += ["", "| model | layout | segments | seams by kind |", "|---|---|---|---|"]
    for r in rows:
        for a in r.get("capture", []):
            kinds = ", ".join(f"{k} {v}" for k, v in a.get("by_kind", {}).items()) or "none"
            if a.get("refused"):
                kinds = f"not captured: {a['refused'][:100]}"
            lines.append(f"| {a['model']} | {a['layout']} | {a['segments']} | {kinds} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*")
    parser.add_argument("--cache", type=Path, default=ROOT / "bench" / "models")
    parser.add_argument("--tiny", nargs="?", const="", metavar="FOLDER",
                        help="build and examine the tiny models instead (into FOLDER)")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    if args.tiny is not None:
        folder = args.tiny or os.environ.get("ONNXKILN_TORCH_MODELS_CACHE") \
            or tempfile.mkdtemp(prefix="torch_models_")
        args.cache = Path(folder)
        ta.build_tiny(args.cache, args.names or None)
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
    print(table(rows))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
