"""Process environment for benchmarks: OpenBLAS pins, thread counts, machine description.

No numpy at import time: `unpin` must run before OpenBLAS is loaded.
"""

from __future__ import annotations

import json
import os
import platform
import sys
import time
from importlib import metadata
from pathlib import Path

PINNED = ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")
"""Variables that pin numpy's OpenBLAS to older kernels on some machines (see PERF_NOTES)."""
REMOVED_VAR = "ONNXKILN_BENCH_UNPINNED"
"""Set by `unpin` in the re-executed process: JSON of the pins it removed."""
ROOT = Path(__file__).resolve().parent.parent


def unpin(args: list[str], keep_env: bool = False) -> None:
    """Re-execute the suite (`python -m bench ARGS`) without the OpenBLAS pins, if any are set.

    Only this process (and the children it starts) loses them; the caller's shell keeps
    them. Returns normally when there is nothing to remove or `keep_env` is set.
    """
    present = {k: os.environ[k] for k in PINNED if k in os.environ}
    if keep_env or not present:
        return
    env = {k: v for k, v in os.environ.items() if k not in PINNED}
    env[REMOVED_VAR] = json.dumps(present)
    sys.stdout.flush()
    sys.stderr.flush()
    # not `-m bench`: a bench.py or bench/ in the working directory would shadow ours
    code = (f"import sys; sys.path.insert(0, {str(ROOT)!r}); "
            "from bench.__main__ import run_main; sys.exit(run_main())")
    os.execve(sys.executable, [sys.executable, "-c", code, *args], env)


def removed_pins() -> dict[str, str]:
    """The pins `unpin` removed before this process started ({} if none)."""
    return json.loads(os.environ.get(REMOVED_VAR, "{}"))




def physical_cores() -> int:
    """Physical cores this process may run on (sysfs topology; falls back to logical CPUs)."""
    try:
        cpus = sorted(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cpus = list(range(os.cpu_count() or 1))
    cores = set()
    for cpu in cpus:
        topo = Path(f"/sys/devices/system/cpu/cpu{cpu}/topology")
        try:
            cores.add(((topo / "physical_package_id").read_text().strip(),
                       (topo / "core_id").read_text().strip()))
        except OSError:
            return max(1, len(cpus))
    return max(1, len(cores))


def blas_info() -> list[dict[str, object]]:
    """The BLAS libraries loaded in this process, as threadpoolctl reports them."""
    from threadpoolctl import threadpool_info

    keys = ("internal_api", "version", "architecture", "threading_layer", "num_threads",
            "filepath")
    return [{k: p.get(k) for k in keys} for p in threadpool_info() if p["user_api"] == "blas"]


def machine() -> dict[str, object]:
    """CPU model, core counts, OS, Python and library versions, BLAS kernels, pins removed."""
    import numpy
    import onnx

    import onnxkiln

    info: dict[str, object] = {
        "cpu": _cpu_model(),
        "logical_cpus": os.cpu_count(),
        "physical_cores": physical_cores(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "numpy": numpy.__version__,
        "onnx": onnx.__version__,
        "onnxkiln": getattr(onnxkiln, "__version__", "?"),
    }
    for name in ("onnxruntime", "scipy", "numba", "threadpoolctl"):
        try:
            info[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            info[name] = None
    info["blas"] = blas_info()
    info["loadavg_1_5_15"] = loadavg()
    info["openblas_pins_removed"] = removed_pins()
    info["openblas_pins_present"] = {k: os.environ[k] for k in PINNED if k in os.environ}
    return info


def loadavg() -> list[float] | None:
    """The 1, 5 and 15 minute load averages (other work on a shared machine skews timings)."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except (AttributeError, OSError):
        return None


class OtherLoad:
    """CPU time other processes used while this one ran, in cores (from /proc/stat).

    `start()` then `cores()`: busy CPU seconds of the whole machine minus this process's own
    (all its threads: BLAS and onnxruntime pools included), over the wall time between.
    None where /proc/stat is missing.
    """

    def __init__(self) -> None:
        self.mark = self._sample()

    @staticmethod
    def _sample() -> tuple[float, float, float] | None:
        try:
            fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
        except OSError:
            return None
        ticks = [int(x) for x in fields]
        busy = sum(ticks[:3]) + sum(ticks[5:8])  # user nice system, irq softirq steal
        hz = os.sysconf("SC_CLK_TCK")
        return busy / hz, time.process_time(), time.perf_counter()

    def start(self) -> None:
        self.mark = self._sample()

    def cores(self) -> float | None:
        now = self._sample()
        if now is None or self.mark is None or now[2] - self.mark[2] <= 0:
            return None
        busy, own, wall = (a - b for a, b in zip(now, self.mark))
        return max(0.0, (busy - own) / wall)


def wait_quiet(max_wait_s: float, threshold: float = 0.3, window_s: float = 2.0) -> float | None:
    """Sleep until other processes use less than `threshold` cores over `window_s`, for at
    most `max_wait_s`; returns the last load seen (cores; None without /proc/stat)."""
    deadline = time.monotonic() + max_wait_s
    while True:
        load = OtherLoad()
        time.sleep(window_s)
        cores = load.cores()
        if cores is None or cores < threshold or time.monotonic() >= deadline:
            return cores


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()
