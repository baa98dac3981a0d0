"""Render a suite's JSON results (python -m bench --json PATH) as Markdown, for BENCHMARKS.md.

    python -m bench.report results.json
(results of `python -m bench --suite exported` are rendered by bench/exported/report.py)
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from bench.suite import format_creation, format_memory, format_models, format_overhead


def render(results: dict) -> str:
    if results.get("suite") == "exported":
        from bench.exported.report import render as render_exported

        return render_exported(results)
    m = results["machine"]
    blas = "; ".join(f"{b['internal_api']} {b['version']}, kernel {b['architecture']}, "
                     f"{b['threading_layer']}" for b in m["blas"]) or "none found"
    removed = m.get("openblas_pins_removed") or {}
    lines = [
        f"- command: `{results['command']}`",
        f"- run: {results['started']} to {results.get('finished', '?')}",
        f"- CPU: {m['cpu']}, {m['physical_cores']} physical cores ({m['logical_cpus']} logical); "
        f"{m['platform']}",
        f"- threads per engine: {results['threads']}",
        f"- BLAS (threadpoolctl): {blas}; OpenBLAS pins removed for the run: "
        f"{removed or 'none were set'}",
        f"- python {m['python']}, numpy {m['numpy']}, onnxruntime {m['onnxruntime']}, "
        f"onnx {m['onnx']}, onnxkiln {m['onnxkiln']}, scipy {m['scipy']}, numba {m['numba']}",
        f"- load average at start / end: {m.get('loadavg_1_5_15')} / "
        f"{results.get('loadavg_end')}",
        "",
        format_models(results, markdown=True),
    ]
    loads = {r["model"]: r.get("other_load_cores", {}).get("during")
             for r in results["models"]}
    if any(v is not None for v in loads.values()):
        lines += ["", "CPU cores other processes kept busy while each model was timed: "
                  + ", ".join(f"{k} {v:.2f}" for k, v in loads.items() if v is not None)]
    if any(r.get("memory") for r in results["models"]):
        lines += ["", format_memory(results, markdown=True)]
    if "overhead" in results:
        lines += ["", format_overhead(results["overhead"])]
    if "session_creation" in results:
        lines += ["", format_creation(results["session_creation"])]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print(__doc__)
        return 2
    print(render(json.loads(Path(argv[0]).read_text())))
    return 0


if __name__ == "__main__":
    sys.exit(main())
