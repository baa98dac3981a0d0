"""The hostile-input suite's runner: each case in its own subprocess, with a time and a
memory bound, classified the same way for onnxkiln and for onnxruntime.

A case is a function `fn(rt, tmp)` registered with `@case(...)` in a `cases_*.py` module
next to this file. `rt` is a `Runtime`: `rt.ort` is onnxruntime's API (the real
`onnxruntime`, or `onnxkiln.compat` when the case runs on onnxkiln), `rt.kiln` is the
`onnxkiln` package (None on onnxruntime), `rt.name` says which. `tmp` is an empty folder.
The case builds its input, calls the runtime and asserts on the values it gets back.

Outcomes:
    ok        the function returned (what it asserted held)
    refused   a clear error: onnxkiln's `SessionError`s, onnxruntime's own exceptions
    wrong     an AssertionError: a silent wrong answer
    bug-text  a refusal whose message calls the user's input a bug in onnxkiln
    error:T   any other exception of type T (a crash of the Python kind)
    hang      the time bound passed
    oom       the memory bound was hit (MemoryError, or killed)
    crash:S   the process died on signal S (a segfault, an abort)
    n/a       the case has no onnxruntime form

    python tests/hostile/harness.py CASE [--runtime onnxruntime] [--src DIR]

runs one case in this process (that is what the subprocess does); `--src` puts another
checkout's `src/` first on the path (the before/after table in `scripts/hostile_table.py`).
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
DEFAULT_TIMEOUT = 60.0
DEFAULT_MEMORY = 2 << 30  # address space a case may add on top of the imports
BUG_TEXT = "bug in onnxkiln"


@dataclasses.dataclass(frozen=True)
class Case:
    name: str
    kind: str  # the class of hostile input it belongs to, for the table
    fn: Callable[[Runtime, Path], Any]
    expect: str  # "ok" or "refused": the good outcome on onnxkiln
    on_ort: bool  # whether fn also runs on onnxruntime (through its real API)
    timeout: float
    memory: int
    doc: str


@dataclasses.dataclass(frozen=True)
class Runtime:
    name: str  # "onnxkiln" or "onnxruntime"
    ort: ModuleType  # onnxruntime, or onnxkiln.compat
    kiln: ModuleType | None  # the onnxkiln package, None on onnxruntime


@dataclasses.dataclass(frozen=True)
class Result:
    outcome: str
    detail: str
    seconds: float


CASES: dict[str, Case] = {}


def case(kind: str, expect: str = "refused", *, on_ort: bool = True,
         timeout: float = DEFAULT_TIMEOUT, memory: int = DEFAULT_MEMORY) -> Callable:
    """Register `fn(rt, tmp)` as a hostile case named after the function."""
    if expect not in ("ok", "refused"):
        raise ValueError(f"expect must be 'ok' or 'refused', not {expect!r}")

    def register(fn: Callable[[Runtime, Path], Any]) -> Callable[[Runtime, Path], Any]:
        name = fn.__name__.removeprefix("case_")
        if name in CASES:
            raise ValueError(f"hostile case {name!r} is registered twice")
        CASES[name] = Case(name, kind, fn, expect, on_ort, timeout, memory,
                           (fn.__doc__ or "").strip().split("\n")[0])
        return fn

    return register


def load_cases() -> dict[str, Case]:
    """Import every `cases_*.py` beside this file (each registers its cases)."""
    for path in sorted(HERE.glob("cases_*.py")):
        module_name = f"hostile_{path.stem}"
        if module_name in sys.modules:
            continue
        spec = importlib.util.spec_from_file_location(module_name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[module_name] = module
        spec.loader.exec_module(module)
    return CASES


def run_isolated(name: str, runtime: str = "onnxkiln", src: str | None = None) -> Result:
    """Run one case in a fresh interpreter and classify how it ended."""
    spec = load_cases()[name]
    if runtime == "onnxruntime" and not spec.on_ort:
        return Result("n/a", "no onnxruntime form", 0.0)
    cmd = [sys.executable, str(HERE / "harness.py"), name, "--runtime", runtime]
    if src:
        cmd += ["--src", src]
    env = dict(os.environ, PYTHONFAULTHANDLER="0", OMP_NUM_THREADS="1")
    start = time.perf_counter()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=spec.timeout,
                              env=env, cwd=str(ROOT))
    except subprocess.TimeoutExpired:
        return Result("hang", f"no answer in {spec.timeout:.0f} s", time.perf_counter() - start)
    seconds = time.perf_counter() - start
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("HOSTILE-RESULT ")]
    if lines:
        data = json.loads(lines[-1].removeprefix("HOSTILE-RESULT "))
        return Result(data["outcome"], data["detail"], seconds)
    if proc.returncode < 0:
        sig = signal.Signals(-proc.returncode).name
        outcome = "oom" if sig == "SIGKILL" else f"crash:{sig}"
        return Result(outcome, proc.stderr[-400:], seconds)
    return Result(f"error:exit{proc.returncode}", proc.stderr[-400:], seconds)


def _is_refusal(error: BaseException, runtime: str) -> bool:
    if runtime == "onnxruntime":
        module = type(error).__module__ or ""  # its pybind layer raises RuntimeError too
        return module.startswith("onnxruntime") or type(error) is RuntimeError
    from onnxkiln import SessionError

    return isinstance(error, SessionError)


def classify(error: BaseException | None, runtime: str) -> tuple[str, str]:
    """The outcome of a case that ended in this process, and a short detail."""
    if error is None:
        return "ok", ""
    text = f"{type(error).__name__}: {error}"[:400]
    if isinstance(error, AssertionError):
        return "wrong", text
    if isinstance(error, MemoryError):
        return "oom", text
    if _is_refusal(error, runtime):
        return ("bug-text" if BUG_TEXT in str(error) else "refused"), text
    return f"error:{type(error).__name__}", text


def _runtime(name: str) -> Runtime:
    if name == "onnxruntime":
        import onnxruntime

        return Runtime(name, onnxruntime, None)
    import onnxkiln
    import onnxkiln.compat

    return Runtime(name, onnxkiln.compat, onnxkiln)


def _cap_memory(headroom: int) -> None:
    """Cap the address space at its current size plus `headroom` (Linux only)."""
    try:
        import resource

        with open("/proc/self/statm") as f:
            current = int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    except (ImportError, OSError, ValueError):
        return
    resource.setrlimit(resource.RLIMIT_AS, (current + headroom, resource.RLIM_INFINITY))


def _main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("case")
    parser.add_argument("--runtime", default="onnxkiln", choices=["onnxkiln", "onnxruntime"])
    parser.add_argument("--src", help="a checkout's src/ folder to import onnxkiln from")
    args = parser.parse_args()
    sys.modules.setdefault("harness", sys.modules[__name__])  # one registry for the cases
    sys.path.insert(0, args.src or str(ROOT / "src"))
    import numpy  # noqa: F401  (imported before the cap: its BLAS maps big arenas)
    import onnx  # noqa: F401

    spec = load_cases()[args.case]
    rt = _runtime(args.runtime)
    import warnings

    warnings.simplefilter("ignore")
    with tempfile.TemporaryDirectory(prefix="hostile-") as tmp:
        _cap_memory(spec.memory)
        error: BaseException | None = None
        try:
            spec.fn(rt, Path(tmp))
        except BaseException as e:  # classifying every ending is the point
            error = e
            if os.environ.get("HOSTILE_TRACEBACK"):
                traceback.print_exc()
        outcome, detail = classify(error, args.runtime)
    print("HOSTILE-RESULT " + json.dumps({"outcome": outcome, "detail": detail}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(_main())
