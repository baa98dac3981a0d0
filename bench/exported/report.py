"""Text and Markdown tables for the exported suite's results (also `python -m bench.report
RESULTS.json`, which renders this suite's JSON with `render`)."""

from __future__ import annotations

import math
from typing import Any

from bench.suite import _table  # the realistic suite's table layout, shared


def header(results: dict[str, Any]) -> str:
    m = results["machine"]
    blas = "; ".join(f"{b['internal_api']} {b['version']} {b['architecture']}"
                     for b in m["blas"]) or "none"
    return (f"onnxkiln exported-model suite: {m['cpu']}, {m['physical_cores']} physical cores; "
            f"threads {','.join(map(str, results['threads']))}; onnxruntime "
            f"{m['onnxruntime']}, onnx {m['onnx']}, numpy {m['numpy']}; BLAS {blas}; "
            f"load average {m.get('loadavg_1_5_15')}")


def _ms(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:.2f}" if value < 100 else f"{value:,.0f}"


def _x(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"


def _diff(row: dict[str, Any]) -> str:
    d = row.get("diff")
    if d is None:
        return "-"
    if d["mismatch"]:
        return "MISMATCH"
    text = "inf" if math.isinf(d["max_abs_diff"]) else f"{d['max_abs_diff']:.1e}"
    text += f" / {d['ort_max_abs']:.2g}"
    return text if d["ok"] else f"{text} (!)"


def row_line(row: dict[str, Any]) -> str:
    parts = []
    for n, t in row["threads"].items():
        ms = t["ms"]
        parts.append(f"{n}t kiln {_ms(ms.get('onnxkiln'))} / ort {_ms(ms.get('onnxruntime'))}"
                     f" ms {_x(t.get('kiln_vs_ort'))}")
    load = [t["other_load_cores"] for t in row["threads"].values()
            if t["other_load_cores"] is not None]
    busy = f"  (others: {max(load):.2f} cores)" if load else ""
    errors = f"  ERRORS: {row['errors']}" if row["errors"] else ""
    return f"  {row['model']} {row['run']}: " + "; ".join(parts) + \
        f"; diff {_diff(row)}{busy}{errors}"


def summarize(results: dict[str, Any]) -> dict[str, Any]:
    """Geometric mean and worst of onnxkiln/onnxruntime per thread count."""
    out: dict[str, Any] = {}
    for n in map(str, results["threads"]):
        ratios = [(r["threads"][n]["kiln_vs_ort"], r) for r in results["rows"]
                  if r["threads"].get(n, {}).get("kiln_vs_ort")]
        if not ratios:
            continue
        worst, row = max(ratios, key=lambda p: p[0])
        out[n] = {"geomean": math.exp(sum(math.log(x) for x, _ in ratios) / len(ratios)),
                  "rows": len(ratios), "worst": worst,
                  "worst_model": f"{row['model']} {row['run']}"}
    out["wrong"] = [f"{r['model']} {r['run']}" for r in results["rows"]
                    if r["diff"] and not r["diff"]["ok"]]
    out["errors"] = {f"{r['model']} {r['run']}": r["errors"] for r in results["rows"]
                     if r["errors"]}
    return out


def format_rows(results: dict[str, Any], markdown: bool = False) -> str:
    threads = list(map(str, results["threads"]))
    head = ["model", "exporter", "batch", "nodes -> kiln"]
    for n in threads:
        head += [f"kiln ms {n}t", f"ort ms {n}t", f"kiln/ort {n}t"]
    head += ["max abs diff / max abs out", "others' cores"]
    rows = []
    for r in results["rows"]:
        cells = [r["model"], r["exporter"], r["run"],
                 f"{r['nodes']} -> {r['kiln_nodes'] if r['kiln_nodes'] else 'error'}"]
        for n in threads:
            t = r["threads"].get(n, {})
            ms = t.get("ms", {})
            cells += [_ms(ms.get("onnxkiln")), _ms(ms.get("onnxruntime")),
                      _x(t.get("kiln_vs_ort"))]
        load = [t["other_load_cores"] for t in r["threads"].values()
                if t["other_load_cores"] is not None]
        rows.append([*cells, _diff(r), f"{max(load):.2f}" if load else "-"])
    s = results.get("summary") or summarize(results)
    for label, key in (("geometric mean", "geomean"), ("worst", "worst")):
        cells = [label, "", "", ""]
        for n in threads:
            cells += ["", "", _x(s.get(n, {}).get(key))]
        rows.append([*cells, "", ""])
    title = (f"median ms over interleaved rounds (at most {results['repeat']}, about "
             f"{results['budget_s']:g} s per cell), onnxkiln / onnxruntime: lower is better")
    return title + ("\n\n" if markdown else "\n") + _table(head, rows, markdown)


def format_creation(results: dict[str, Any], markdown: bool = False) -> str:
    head = ["model", "kiln import s", "kiln create s", "kiln 1st run ms", "ort import s",
            "ort create s", "ort 1st run ms", "kiln warm create s", "ort warm create s",
            "warm kiln/ort"]
    rows = []
    for c in results["creation"]:
        cells = [c["model"]]
        for runtime in ("onnxkiln", "onnxruntime"):
            f = c["fresh"].get(runtime, {})
            if "error" in f:
                cells += ["error", "", ""]
            else:
                cells += [f"{f['import_s']:.2f}", f"{f['create_s']:.2f}",
                          _ms(f["first_run_s"] * 1e3)]
        w = c.get("warm", {})
        if "error" in w:
            cells += ["error", "error", "-"]
        else:
            k, o = w["onnxkiln"]["create_s"], w["onnxruntime"]["create_s"]
            cells += [f"{k:.3f}", f"{o:.3f}", _x(k / o if o else None)]
        rows.append(cells)
    title = ("session creation at 1 thread: a fresh process (import, create, first run) and "
             "warm (another session in the same process, median)")
    return title + ("\n\n" if markdown else "\n") + _table(head, rows, markdown)


def format_contention(results: dict[str, Any], markdown: bool = False) -> str:
    head = ["model"]
    keys = [f"{r}@{t}" for r in ("onnxkiln", "onnxruntime") for t in ("default", "1")]
    head += [f"{k} quiet -> busy ms" for k in keys]
    head += ["slowdown kiln/ort default", "slowdown kiln/ort 1t",
             "default slower than 1t busy (kiln, ort)"]
    rows = []
    for c in results["contention"]:
        cells = [f"{c['model']} {c['run']}"]
        cells += [f"{_ms(c['quiet']['ms'][k])} -> {_ms(c['busy']['ms'][k])} "
                  f"({c['slowdown'][k]:.1f}x)" for k in keys]
        d = c["default_slower_than_1"]
        cells += [_x(c["kiln_vs_ort_slowdown@default"]), _x(c["kiln_vs_ort_slowdown@1"]),
                  f"{'yes' if d['onnxkiln'] else 'no'}, {'yes' if d['onnxruntime'] else 'no'}"]
        rows.append(cells)
    k = results["contention"][0]["busy_processes"] if results["contention"] else "?"
    title = (f"under contention: {k} busy processes; default threads = physical cores; "
             "slowdown = busy / quiet at the same thread count")
    return title + ("\n\n" if markdown else "\n") + _table(head, rows, markdown)


def creation_line(c: dict[str, Any]) -> str:
    parts = []
    for runtime in ("onnxkiln", "onnxruntime"):
        f = c["fresh"].get(runtime, {})
        parts.append(f"{runtime} " + ("error" if "error" in f else
                                      f"{f['import_create_s']:.2f} s + first run "
                                      f"{f['first_run_s'] * 1e3:.0f} ms"))
    return "    creation (fresh process): " + ", ".join(parts)


def contention_line(c: dict[str, Any]) -> str:
    s = c["slowdown"]
    return ("    contention: slowdowns " + ", ".join(f"{k} {v:.1f}x" for k, v in s.items()))


def render(results: dict[str, Any], markdown: bool = True, head: bool = True) -> str:
    """Everything: machine, the latency table, failures, creation, contention."""
    lines = []
    if head:
        m = results["machine"]
        lines += [f"- command: `{results['command']}`",
                  f"- run: {results['started']} to {results.get('finished', '?')} "
                  f"({results.get('seconds', 0) / 60:.1f} min)",
                  f"- CPU: {m['cpu']}, {m['physical_cores']} physical cores; {m['platform']}",
                  f"- python {m['python']}, numpy {m['numpy']}, onnxruntime {m['onnxruntime']}, "
                  f"onnx {m['onnx']}, onnxkiln {m['onnxkiln']}, numba {m['numba']}",
                  f"- load average at start / end: {m.get('loadavg_1_5_15')} / "
                  f"{results.get('loadavg_end')}", ""]
    lines.append(format_rows(results, markdown))
    s = results.get("summary") or summarize(results)
    if s["wrong"]:
        lines += ["", "outputs differ from onnxruntime beyond tolerance: " + ", ".join(s["wrong"])]
    for name, errors in s["errors"].items():
        lines.append(f"- {name}: " + "; ".join(f"{k}: {v}" for k, v in errors.items()))
    for f in results.get("failed_exports", []):
        lines.append(f"- did not export: {f['name']} ({f['exporter']}): "
                     + " ".join(f["error"].splitlines()[-1:])[:240])
    if results.get("creation"):
        lines += ["", format_creation(results, markdown)]
    if results.get("contention"):
        lines += ["", format_contention(results, markdown)]
    return "\n".join(lines)
