"""Export the suite's models into a cache folder (run in the export venv: `make bench-models`).

    .venv-export/bin/python -m bench.exported.build --out bench/models
    .venv-export/bin/python -m bench.exported.build --models bert,sk-pca --force

Writes one .onnx file per catalog Spec and `manifest.json` (see bench/exported/manifest.py).
Each model is exported in a child process (a crash or a hang costs that model only); one
whose entry is up to date (same spec_hash, file present) is skipped. A model that fails to
export is listed under "failed" with the error, and the harness reports it.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import subprocess
import sys
import tempfile
import time
import traceback
from dataclasses import asdict
from importlib import metadata
from pathlib import Path
from typing import Any

from bench._env import ROOT
from bench.exported import manifest
from bench.exported.catalog import BUILD_VERSION, SPECS, Spec

TORCHSCRIPT_OPSET = 17
EXAMPLE_DIMS = {"batch": 2, "seq": 16, "past_seq": 8, "total_seq": 9, "enc_seq": 12}
"""Sizes the exporters trace with: all different and > 1, so that the dynamo exporter
neither specializes a dim to 1 nor merges two dims that happen to be equal."""
PACKAGES = {"torchscript": ("torch", "torchvision", "transformers", "onnx"),
            "dynamo": ("torch", "torchvision", "transformers", "onnx", "onnxscript"),
            "skl2onnx": ("scikit-learn", "skl2onnx", "onnx")}


def versions(spec: Spec) -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    for name in PACKAGES[spec.exporter]:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


DESCRIPTIVE = ("family", "size", "runs", "quick", "notes")
"""Spec fields that do not change the exported file: refreshed in place, no re-export."""


def spec_hash(spec: Spec) -> str:
    """What an export depends on: the spec's builder, config and exporter, the builder
    version, the packages' versions."""
    fields = {k: v for k, v in asdict(spec).items() if k not in DESCRIPTIVE}
    key = json.dumps([fields, BUILD_VERSION, versions(spec)], sort_keys=True)
    return hashlib.sha256(key.encode()).hexdigest()[:16]


def describe_spec(spec: Spec) -> dict[str, Any]:
    """The manifest fields that come from the Spec as it is now."""
    return {"name": spec.name, "family": spec.family, "size": spec.size,
            "exporter": spec.exporter, "notes": spec.notes, "runs": list(spec.runs),
            "quick": spec.quick}


# --- one model (child process) --------------------------------------------------------------


def export_torch(spec: Spec, path: Path) -> dict[str, Any]:
    """Export a torch model with the spec's exporter; the manifest fields it describes."""
    import torch

    from bench.exported import models

    ex = getattr(models, spec.builder)(spec.config)
    dims = {**EXAMPLE_DIMS, **spec.export_dims}
    args = ex.example(dims)
    names = [s["name"] for s in ex.inputs]
    with torch.no_grad():
        if spec.exporter == "torchscript":
            axes = {s["name"]: {i: d for i, d in enumerate(s["shape"]) if isinstance(d, str)}
                    for s in ex.inputs}
            torch.onnx.export(ex.module, args, str(path), input_names=names,
                              output_names=ex.outputs, dynamic_axes=axes,
                              opset_version=TORCHSCRIPT_OPSET, dynamo=False)
        else:
            dynamic = _dynamic_shapes(ex.module, ex.inputs)
            program = torch.onnx.export(ex.module, args, input_names=names,
                                        output_names=ex.outputs, dynamic_shapes=dynamic,
                                        dynamo=True)
            program.save(str(path))
    return {"inputs": ex.inputs, "outputs": ex.outputs, "config": ex.config}


def _dynamic_shapes(module: Any, inputs: list[dict[str, Any]]) -> tuple[Any, ...]:
    """torch.export's dynamic_shapes for the inputs: every named dim dynamic (the exporter
    finds relations such as total_seq = past_seq + 1 itself), shaped like forward's
    signature (a `*past` parameter takes one nested tuple)."""
    import inspect

    from torch.export import Dim

    specs = [{i: Dim.DYNAMIC for i, d in enumerate(s["shape"]) if isinstance(d, str)} or None
             for s in inputs]
    params = list(inspect.signature(module.forward).parameters.values())
    if params and params[-1].kind is inspect.Parameter.VAR_POSITIONAL:
        n = len(params) - 1
        return (*specs[:n], tuple(specs[n:]))
    return tuple(specs)


def export_sklearn(spec: Spec, path: Path) -> dict[str, Any]:
    from bench.exported import sk_models

    model, described = getattr(sk_models, spec.builder)(spec.config)
    path.write_bytes(model.SerializeToString())
    return described


def check(path: Path, described: dict[str, Any]) -> dict[str, Any]:
    """Node count and opset of the written file; its inputs must be the described ones."""
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    graph_inputs = [i.name for i in model.graph.input
                    if i.name not in {t.name for t in model.graph.initializer}]
    wanted = [s["name"] for s in described["inputs"]]
    if graph_inputs != wanted:
        raise RuntimeError(f"the exported graph's inputs are {graph_inputs}, expected {wanted}")
    opsets = {o.domain or "ai.onnx": o.version for o in model.opset_import}
    return {"nodes": len(model.graph.node), "functions": len(model.functions),
            "opset": opsets.get("ai.onnx"), "opsets": opsets,
            "outputs": [o.name for o in model.graph.output],
            "bytes": sum(p.stat().st_size for p in path.parent.glob(path.name + "*"))}


def export_one(spec: Spec, out: Path) -> dict[str, Any]:
    """Export one Spec into `out`; its manifest entry."""
    path = out / f"{spec.name}.onnx"
    for old in out.glob(f"{spec.name}.onnx*"):
        old.unlink()
    start = time.perf_counter()
    described = (export_sklearn if spec.exporter == "skl2onnx" else export_torch)(spec, path)
    seconds = time.perf_counter() - start
    return {**describe_spec(spec), "file": path.name, "versions": versions(spec),
            **described, **check(path, described), "spec_hash": spec_hash(spec),
            "export_s": round(seconds, 1),
            "built": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}


# --- the whole catalog (parent process) -----------------------------------------------------


def _up_to_date(spec: Spec, old: dict[str, Any] | None, out: Path) -> bool:
    return bool(old and old.get("spec_hash") == spec_hash(spec) and (out / old["file"]).exists())


def _export_in_child(spec: Spec, out: Path, timeout_s: float) -> dict[str, Any]:
    """Run `--one NAME` in a fresh interpreter; its entry, or a failure record."""
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
        result = Path(f.name)
    cmd = [sys.executable, "-m", "bench.exported.build", "--out", str(out), "--one", spec.name,
           "--result", str(result)]
    failure = {"name": spec.name, "family": spec.family, "exporter": spec.exporter,
               "spec_hash": spec_hash(spec)}
    try:
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout_s,
                              check=False)
        if proc.returncode == 0:
            entry = json.loads(result.read_text())
            return {**failure, **entry} if "error" in entry else entry
        return {**failure, "error": _last_error(proc.stderr) or f"exit {proc.returncode}"}
    except subprocess.TimeoutExpired:
        return {**failure, "error": f"export took more than {timeout_s:g} s"}
    finally:
        result.unlink(missing_ok=True)


def _describe(e: BaseException) -> str:
    """An exception as `Type: message`, without colour codes; of torch.export's long
    report, the first line and its exception summary."""
    text = re.sub(r"\x1b\[[0-9;]*m", "", f"{type(e).__name__}: {e}").strip()
    lines = [x for x in text.splitlines() if x.strip()]
    if "## Exception summary" in lines:
        cause = lines[lines.index("## Exception summary") + 1:][:1]
        lines = lines[:1] + [c[:600] for c in cause]
    return "\n".join(lines[:12])[:2000]


def _last_error(stderr: str) -> str:
    """The exception line of a traceback (and the line before it, for context)."""
    lines = [x for x in stderr.strip().splitlines() if x.strip()]
    for i in range(len(lines) - 1, -1, -1):
        if not lines[i].startswith(" ") and ("Error" in lines[i] or "Exception" in lines[i]):
            return "\n".join(lines[i:i + 3])[:1500]
    return "\n".join(lines[-3:])[:1500]


def build(out: Path, names: list[str] | None, force: bool, timeout_s: float,
          log: Any = print) -> dict[str, Any]:
    """Export every selected Spec that is not up to date; returns the saved manifest."""
    out.mkdir(parents=True, exist_ok=True)
    try:
        cache = manifest.load(out)
    except manifest.CacheMissing:
        cache = manifest.empty()
    entries = {e["name"]: e for e in cache["models"]}
    failed = {e["name"]: e for e in cache["failed"]}
    for spec in select(names):
        if not force and _up_to_date(spec, entries.get(spec.name), out):
            entries[spec.name].update(describe_spec(spec))
            log(f"  {spec.name}: up to date")
            continue
        if not force and failed.get(spec.name, {}).get("spec_hash") == spec_hash(spec):
            log(f"  {spec.name}: failed before with the same versions (--force retries)")
            continue
        start = time.perf_counter()
        entry = _export_in_child(spec, out, timeout_s)
        took = time.perf_counter() - start
        entries.pop(spec.name, None)
        failed.pop(spec.name, None)
        if "error" in entry:
            failed[spec.name] = entry
            log(f"  {spec.name}: FAILED ({took:.0f} s): {entry['error'].splitlines()[0]}")
        else:
            entries[spec.name] = entry
            log(f"  {spec.name}: {entry['exporter']}, {entry['nodes']} nodes, "
                f"{entry['bytes'] / 2**20:.1f} MiB ({took:.0f} s)")
        cache["models"], cache["failed"] = list(entries.values()), list(failed.values())
        manifest.save(out, cache)  # after each model: an interrupted build keeps its work
    cache["models"], cache["failed"] = list(entries.values()), list(failed.values())
    manifest.save(out, cache)
    return cache


def select(names: list[str] | None) -> list[Spec]:
    if not names:
        return list(SPECS)
    known = {s.name for s in SPECS} | {s.family for s in SPECS}
    unknown = sorted(set(names) - known)
    if unknown:
        raise SystemExit(f"unknown model(s) {unknown}; the catalog has {sorted(known)}")
    return [s for s in SPECS if s.name in names or s.family in names]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.exported.build",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=manifest.DEFAULT_CACHE, help="cache folder")
    p.add_argument("--models", help="comma-separated names or families (default: all)")
    p.add_argument("--force", action="store_true", help="re-export even when up to date")
    p.add_argument("--timeout", type=float, default=1200.0, help="seconds per model")
    p.add_argument("--list", action="store_true", help="list the catalog and exit")
    p.add_argument("--one", help=argparse.SUPPRESS)  # the child process: one model
    p.add_argument("--result", type=Path, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.list:
        for s in SPECS:
            print(f"{s.name:28} {s.family:12} {s.size:18} {s.exporter}")
        return 0
    if args.one:
        spec = next(s for s in SPECS if s.name == args.one)
        try:
            entry = export_one(spec, args.out)
        except Exception as e:  # reported as this model's failure, in the manifest
            traceback.print_exc()
            entry = {"error": _describe(e)}
        args.result.write_text(json.dumps(entry))
        return 0
    names = [n for n in (args.models or "").split(",") if n]
    print(f"exporting into {args.out} with {sys.executable}")
    cache = build(args.out, names, args.force, args.timeout)
    print(f"{len(cache['models'])} models, {len(cache['failed'])} failed; manifest: "
          f"{args.out / manifest.MANIFEST}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
