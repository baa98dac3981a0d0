"""Someone else's pytest files, run on onnxruntime and on onnxkiln behind it, compared
test by test: which pass on onnxruntime, how many of those pass on onnxkiln, and the first
line of each failure that remains.

    python scripts/ort_api_tests.py /tmp/ort/onnxruntime/test/python --ort-testdata \\
        --files 'onnxruntime_test_python*.py'
    python scripts/sklearn_onnx_tests.py ~/sklearn-onnx     # the same, for skl2onnx's tests

Each file runs in its own pytest process from its own folder (tests open data by relative
paths), once per runtime, files one after the other. On onnxkiln a conftest plugin, written
to a temporary folder and loaded with `-p`, calls `onnxkiln.compat.install()` before any
test module imports onnxruntime; the script adds nothing to the test folder. With `--json
FILE` outcomes are saved after each file; `--resume` skips files already there, and
`--resume --rerun onnxkiln` runs only onnxkiln again (after a fix). `PYTHONPATH=SRC` runs
the onnxkiln of another source tree.
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


def counts(outcomes_of_runtime: dict[str, tuple[str, str]], prefix: str) -> str:
    """'passed/failed/skipped' of the tests whose id starts with `prefix`."""
    found = [status for t, (status, _) in outcomes_of_runtime.items() if t.startswith(prefix)]
    return "/".join(str(found.count(s)) for s in ("passed", "failed", "skipped"))


def table(files: list[Path], results: dict[str, dict[str, tuple[str, str]]]) -> str:
    """The comparison in markdown: a line per file, then every remaining failure."""
    passing, rest = compare(results)
    lines = ["| file | onnxruntime pass/fail/skip | onnxkiln pass/fail/skip | "
             "pass on onnxruntime | of those, pass on onnxkiln |", "|---|---|---|---|---|"]
    for file in [*files, None]:
        prefix = file.name + "::" if file else ""
        ok, bad = (sum(t.startswith(prefix) for t in ids) for ids in (passing, rest))
        name = file.name if file else "**all**"
        lines.append(f"| {name} | {counts(results['onnxruntime'], prefix)} | "
                     f"{counts(results['onnxkiln'], prefix)} | {ok} | {ok - bad} |")
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


def _load(path: Path | None) -> dict[str, dict[str, tuple[str, str]]]:
    """Outcomes kept by an earlier run (--json), or none."""
    results: dict[str, dict[str, tuple[str, str]]] = {r: {} for r in RUNTIMES}
    if path is not None and path.exists():
        for runtime, found in json.loads(path.read_text()).items():
            results[runtime] = {t: tuple(v) for t, v in found.items()}
    return results


def _forget(results: dict[str, tuple[str, str]], file: Path) -> None:
    """Drops one file's outcomes, before it runs again."""
    for test_id in [t for t in results if t.startswith(file.name + "::")]:
        del results[test_id]


def run_all(files: list[Path], args: argparse.Namespace) -> dict[str, dict[str, tuple[str, str]]]:
    """Runs every file on each runtime in turn, one file at a time; with --json, saves the
    outcomes after each file (and, with --resume, keeps those of files already there)."""
    results = _load(args.json if args.resume else None)
    with tempfile.TemporaryDirectory() as plugin_dir:
        Path(plugin_dir, PLUGIN + ".py").write_text(PLUGIN_SOURCE)
        for file in files:
            for runtime in args.runtimes:
                done = any(t.startswith(file.name + "::") for t in results[runtime])
                if args.resume and done and runtime not in args.rerun:
                    continue
                print(f"{runtime}: {file.name}", file=sys.stderr, flush=True)
                _forget(results[runtime], file)
                results[runtime].update(
                    run_file(file, runtime, args.timeout, plugin_dir, args.pytest_args))
            if args.json:
                args.json.write_text(json.dumps(results, indent=1))
    return results


def parser_for(description: str, folder_help: str, default_files: list[str]
               ) -> argparse.ArgumentParser:
    """The command line this script and the suite-specific ones built on it share."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("folder", type=Path, help=folder_help)
    parser.add_argument("--files", nargs="+", default=default_files,
                        help="file names or glob patterns inside the folder")
    parser.add_argument("--timeout", type=float, default=600, help="seconds per file and run")
    parser.add_argument("--json", type=Path, help="keep every outcome here, saved per file")
    parser.add_argument("--resume", action="store_true",
                        help="with --json: skip the files it already holds outcomes for")
    parser.add_argument("--rerun", nargs="*", default=[], choices=RUNTIMES,
                        help="with --resume: run these runtimes again on every file")
    parser.add_argument("--runtimes", nargs="+", default=list(RUNTIMES), choices=RUNTIMES,
                        help="the runtimes to run (the table needs both, from --json)")
    parser.add_argument("pytest_args", nargs="*", help="after --: passed on to pytest")
    return parser


def run_folder(folder: Path, args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """Runs the matching files of `folder` and prints the table."""
    files = test_files(folder.resolve(), args.files)
    if not files:
        parser.error(f"no file in {folder} matches {args.files}")
    print(table(files, run_all(files, args)))
    return 0


def main() -> int:
    parser = parser_for(__doc__.split("\n")[0], "the folder holding the test files",
                        ["test_*.py"])
    parser.add_argument("--ort-testdata", action="store_true",
                        help="first build FOLDER/testdata, the models onnxruntime's Python "
                        "tests load (scripts/ort_testdata.py)")
    args = parser.parse_args()
    if args.ort_testdata:
        sys.path.insert(0, str(Path(__file__).parent))
        import ort_testdata

        ort_testdata.build(args.folder, log=lambda line: print(line, file=sys.stderr))
    return run_folder(args.folder, args, parser)


if __name__ == "__main__":
    sys.exit(main())
