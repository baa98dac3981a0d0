"""Someone else's pytest files, run on onnxruntime and on onnxkiln behind it, compared
test by test: which pass on onnxruntime, how many of those pass on onnxkiln, and the first
line of each failure that remains.

    python scripts/ort_api_tests.py /tmp/ort/onnxruntime/test/python \\
        --files onnxruntime_test_python.py onnxruntime_test_python_backend.py
    python scripts/ort_api_tests.py ~/sklearn-onnx/tests --files 'test_sklearn_*.py'

Each file runs in its own pytest process from its own folder (tests open data by relative
paths), once per runtime. On onnxkiln a conftest plugin, written to a temporary folder and
loaded with `-p`, calls `onnxkiln.compat.install()` before any test module imports
onnxruntime; the test folder itself is never written to.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from pathlib import Path

RUNTIMES = ("onnxruntime", "onnxkiln")
PLUGIN = "kiln_compat_conftest"
PLUGIN_SOURCE = '"""Serves onnxkiln under the name onnxruntime."""\n' \
    "import onnxkiln.compat\n\nonnxkiln.compat.install()\n"


def test_files(folder: Path, patterns: list[str]) -> list[Path]:
    """The files under `folder` that match any of `patterns`, each once, sorted."""
    found = {path for pattern in patterns for path in folder.glob(pattern) if path.is_file()}
    return sorted(found)


def outcomes(report: Path, file: Path) -> dict[str, tuple[str, str]]:
    """Test id -> (passed | failed | skipped, first line of the message) from a JUnit XML."""
    results: dict[str, tuple[str, str]] = {}
    for case in ET.parse(report).getroot().iter("testcase"):
        test_id = f"{file.name}::{case.get('classname', '').rsplit('.', 1)[-1]}::" \
            f"{case.get('name')}"
        status, message = "passed", ""
        for child in case:
            if child.tag in ("failure", "error", "skipped"):
                status = "skipped" if child.tag == "skipped" else "failed"
                message = child.get("message") or ""
                errors = [line[1:].strip() for line in (child.text or "").splitlines()
                          if line.startswith("E ")]
                if errors and message in ("", "collection failure"):
                    message = errors[-1]  # the exception that stopped the collection
                message = next((line for line in message.splitlines() if line.strip()),
                               child.tag)
                break
        results[test_id] = (status, message.strip()[:200])
    return results


def run_file(file: Path, runtime: str, timeout: float, plugin_dir: str,
             pytest_args: list[str]) -> dict[str, tuple[str, str]]:
    """The outcomes of one test file on one runtime, in a fresh pytest process."""
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.xml"
        command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                   f"--junitxml={report}", "-o", "junit_family=xunit1", *pytest_args]
        env = dict(os.environ)
        if runtime == "onnxkiln":
            command += ["-p", PLUGIN]
            env["PYTHONPATH"] = os.pathsep.join(
                p for p in (plugin_dir, env.get("PYTHONPATH")) if p)
        command.append(file.name)
        try:
            done = subprocess.run(command, cwd=file.parent, env=env, capture_output=True,
                                  text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            return {f"{file.name}::(file)": ("failed", f"timed out after {timeout:.0f} s")}
        if not report.exists():
            tail = (done.stdout + done.stderr).strip().splitlines()[-1:] or ["no output"]
            return {f"{file.name}::(file)": ("failed", f"pytest rc {done.returncode}: {tail[0]}")}
        return outcomes(report, file)


def compare(results: dict[str, dict[str, tuple[str, str]]]) -> tuple[list[str], list[str]]:
    """(ids passing on onnxruntime, those of them that do not pass on onnxkiln)."""
    ort, kiln = results["onnxruntime"], results["onnxkiln"]
    passing = sorted(t for t, (status, _) in ort.items() if status == "passed")
    rest = [t for t in passing if kiln.get(t, ("missing", ""))[0] != "passed"]
    return passing, rest


def file_failure(outcomes_of_runtime: dict[str, tuple[str, str]], test_id: str) -> tuple[str, str]:
    """Why a test never ran: its file's collection error or time-out, if there was one."""
    file = test_id.split("::", 1)[0]
    for other, (status, message) in outcomes_of_runtime.items():
        if other.startswith(file + "::") and status == "failed" and (
                other.endswith("::(file)") or other.split("::")[1] == ""):
            return "not run", message
    return "missing", "not collected"


def table(files: list[Path], results: dict[str, dict[str, tuple[str, str]]]) -> str:
    """The comparison in markdown: a line per file, then every remaining failure."""
    passing, rest = compare(results)
    lines = ["| file | tests | pass on onnxruntime | of those, pass on onnxkiln |",
             "|---|---|---|---|"]
    for file in files:
        prefix = file.name + "::"
        total, ok, bad = (sum(t.startswith(prefix) for t in ids)
                          for ids in (results["onnxruntime"], passing, rest))
        lines.append(f"| {file.name} | {total} | {ok} | {ok - bad} |")
    lines.append(f"| **all** | {len(results['onnxruntime'])} | {len(passing)} | "
                 f"{len(passing) - len(rest)} |")
    if rest:
        lines += ["", "Passing on onnxruntime, not on onnxkiln:", ""]
        for test_id in rest:
            status, message = results["onnxkiln"].get(test_id) or file_failure(
                results["onnxkiln"], test_id)
            lines.append(f"- `{test_id}` ({status}): {message}")
    others = sorted((t, m) for t, (s, m) in results["onnxruntime"].items() if s == "failed")
    if others:
        lines += ["", "Failing on onnxruntime itself (not counted):", ""]
        lines += [f"- `{t}`: {m}" for t, m in others]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("folder", type=Path, help="the folder holding the test files")
    parser.add_argument("--files", nargs="+", default=["test_*.py"],
                        help="file names or glob patterns inside the folder")
    parser.add_argument("--timeout", type=float, default=600, help="seconds per file and run")
    parser.add_argument("--json", type=Path, help="also write every outcome here")
    parser.add_argument("pytest_args", nargs="*", help="after --: passed on to pytest")
    args = parser.parse_args()
    files = test_files(args.folder.resolve(), args.files)
    if not files:
        parser.error(f"no file in {args.folder} matches {args.files}")
    results: dict[str, dict[str, tuple[str, str]]] = {r: {} for r in RUNTIMES}
    with tempfile.TemporaryDirectory() as plugin_dir:
        Path(plugin_dir, PLUGIN + ".py").write_text(PLUGIN_SOURCE)
        for file in files:
            for runtime in RUNTIMES:
                print(f"{runtime}: {file.name}", file=sys.stderr, flush=True)
                results[runtime].update(
                    run_file(file, runtime, args.timeout, plugin_dir, args.pytest_args))
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    print(table(files, results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
