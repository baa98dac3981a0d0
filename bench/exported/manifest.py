"""The exported-model cache: manifest.json next to the .onnx files, and seeded feeds from it.

Read by both sides: `bench.exported.build` (the export venv, with torch) writes it, the
harness (the project's venv, numpy only) reads it. No torch here.

An entry (one .onnx file) has: name, family, size, file, exporter, versions, config, notes,
opset, nodes, inputs (name, dtype, shape with named dims, and for integer inputs a value
range [low, high)), outputs, runs (labelled dims: one per batch size to time), quick (part of
`--quick`), spec_hash (what the export was made from: skip it when unchanged).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import numpy as np

from bench._env import ROOT

SCHEMA = 1
MANIFEST = "manifest.json"
DEFAULT_CACHE = ROOT / "bench" / "models"
EXPORT_PYTHON = ROOT / ".venv-export" / "bin" / "python"


class CacheMissing(SystemExit):
    """The cache folder has no manifest (or no usable one): say how to build it."""


def build_command(cache: Path) -> str:
    """The command that fills `cache` (the Makefile target for the default folder)."""
    if Path(cache).resolve() == DEFAULT_CACHE.resolve():
        return "make bench-models"
    return f"{EXPORT_PYTHON.relative_to(ROOT)} -m bench.exported.build --out {cache}"


def load(cache: Path) -> dict[str, Any]:
    """The manifest in `cache`; CacheMissing (with the command that builds it) if absent."""
    path = Path(cache) / MANIFEST
    hint = (f"build it with `{build_command(cache)}` (creates .venv-export with torch, "
            "torchvision and transformers, then exports every model), or pass "
            "--export-python PATH to have this command run the export with that interpreter")
    if not path.is_file():
        raise CacheMissing(f"no exported-model cache at {cache} ({MANIFEST} is missing); {hint}")
    try:
        manifest = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise CacheMissing(f"{path} is not valid JSON ({e}); {hint}") from None
    if manifest.get("schema") != SCHEMA:
        raise CacheMissing(f"{path} has schema {manifest.get('schema')!r}, this harness reads "
                           f"{SCHEMA}; {hint}")
    return manifest


def empty() -> dict[str, Any]:
    return {"schema": SCHEMA, "models": [], "failed": []}


def save(cache: Path, manifest: dict[str, Any]) -> None:
    """Write the manifest atomically (a reader never sees half a file)."""
    manifest["updated"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    manifest["models"].sort(key=lambda e: e["name"])
    manifest["failed"].sort(key=lambda e: e["name"])
    path = Path(cache) / MANIFEST
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(manifest, indent=1) + "\n")
    tmp.replace(path)


def select(manifest: dict[str, Any], wanted: list[str] | None, quick: bool
           ) -> list[dict[str, Any]]:
    """Entries by name or family (all when `wanted` is empty), quick ones under `quick`;
    an unknown name is an error that lists the known ones."""
    entries = [e for e in manifest["models"] if e.get("quick") or not quick]
    if not wanted:
        return entries
    known = {e["name"] for e in manifest["models"]} | {e["family"] for e in manifest["models"]}
    unknown = sorted(set(wanted) - known)
    if unknown:
        raise SystemExit(f"unknown model(s) or families {unknown}; the cache has "
                         f"{sorted(known)}")
    return [e for e in entries if e["name"] in wanted or e["family"] in wanted]


def shape(spec: dict[str, Any], dims: dict[str, int]) -> tuple[int, ...]:
    """Concrete shape of one input: named dims looked up in `dims`."""
    out = []
    for d in spec["shape"]:
        if isinstance(d, str):
            if d not in dims:
                raise ValueError(f"input '{spec['name']}' needs dim '{d}'; the run gives "
                                 f"{sorted(dims)}")
            out.append(dims[d])
        else:
            out.append(int(d))
    return tuple(out)


def make_feeds(entry: dict[str, Any], dims: dict[str, int], seed: int = 0
               ) -> dict[str, np.ndarray]:
    """Seeded inputs for one run: integers uniform in the input's range, floats N(0, 1)
    times its `scale` (default 1)."""
    rng = np.random.default_rng(seed)
    feeds = {}
    for spec in entry["inputs"]:
        dtype = np.dtype(spec["dtype"])
        size = shape(spec, dims)
        if dtype.kind in "iu":
            low, high = spec.get("range", (0, 2))
            feeds[spec["name"]] = rng.integers(low, high, size=size).astype(dtype)
        elif dtype.kind == "b":
            feeds[spec["name"]] = rng.random(size) < 0.5
        else:
            value = rng.standard_normal(size) * spec.get("scale", 1.0)
            feeds[spec["name"]] = value.astype(dtype)
    return feeds


def model_path(cache: Path, entry: dict[str, Any]) -> Path:
    return Path(cache) / entry["file"]
