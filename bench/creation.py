"""Session creation time, onnxkiln beside onnxruntime: in a fresh process and warm.

    python bench/creation.py model.onnx [more.onnx ...] [--repeat 5] [--first-run]
    python bench/creation.py --zoo                   # the zoo's small configs, written to a tmp dir

fresh: a subprocess runs `import X; create a session` and reports, from its own clock
(time.perf_counter() at its first line), the import and creation times; the subprocesses of
the two engines alternate, in a shuffled order per round. `interp` is the interpreter's own
start (`python -c pass`, timed from outside), which both pay on top. warm: a second session of
the model in this process (both engines imported and one session built first), alternating
too. Both engines at 1 intra-op thread. Medians over `--repeat` rounds; the children's CPU
time for import + create is shown too (less swayed than wall time by other jobs' load).
With `--first-run` the fresh process also runs the model once on random feeds (onnxkiln
loads its numba kernels on the first run that needs them, so that run carries their load).
Which of numba, scipy, torch and sympy a fresh onnxkiln process imported by the end is
listed. One untimed child per engine and model goes first, and the children write and read
bytecode caches (PYTHONDONTWRITEBYTECODE is dropped for them), as for an installed package.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # `python bench/creation.py`
from bench._timing import interleave

HEAVY = ("numba", "scipy", "torch", "sympy")
_CHILD = """\
import time
t0, c0 = time.perf_counter(), time.process_time()
import json, sys
path, engine, first_run = sys.argv[1], sys.argv[2], sys.argv[3] == "1"
if engine == "onnxkiln":
    import onnxkiln
    t1, c1 = time.perf_counter(), time.process_time()
    s = onnxkiln.InferenceSession.builder().intra_op_threads(1).load(path)
else:
    import onnxruntime as ort
    t1, c1 = time.perf_counter(), time.process_time()
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    s = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
t2, c2 = time.perf_counter(), time.process_time()
out = {"import": t1 - t0, "create": t2 - t1, "cpu_import": c1 - c0, "cpu_create": c2 - c1}
if first_run:
    import onnx
    from onnxkiln import zoo
    m = onnx.load(path, load_external_data=False)
    dims = {d.dim_param: 8 for vi in m.graph.input for d in vi.type.tensor_type.shape.dim
            if d.dim_param}
    try:
        feeds = zoo.random_inputs(m, **dims)
        t3 = time.perf_counter()
        s.run(None, feeds) if engine == "onnxruntime" else s.run(feeds)
        out["first_run"] = time.perf_counter() - t3
    except Exception as e:  # feeds the declared inputs cannot describe: no first run
        out["first_run"] = float("nan")
        print(f"first run of {path} on {engine} failed: {e}", file=sys.stderr)
out["heavy"] = [m for m in sys.argv[4].split(",") if m in sys.modules]
print(json.dumps(out))
"""


def _env() -> dict[str, str]:
    """The children's environment: bytecode caches written and read (as an installed
    package has them; PYTHONDONTWRITEBYTECODE would recompile onnxkiln in every child)."""
    return {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}


def fresh(path: str, engine: str, first_run: bool) -> dict:
    """One fresh process: its import/creation (and first run) seconds, heavy modules loaded."""
    proc = subprocess.run([sys.executable, "-c", _CHILD, path, engine, str(int(first_run)),
                           ",".join(HEAVY)], capture_output=True, text=True, check=False,
                          env=_env())
    if proc.returncode != 0:
        raise RuntimeError(f"{engine} on {path} failed:\n{proc.stderr[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def interpreter_start(repeat: int) -> float:
    """Median seconds of `python -c pass`, timed from outside."""
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        subprocess.run([sys.executable, "-c", "pass"], check=True, env=_env())
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def bench_fresh(path: str, repeat: int, first_run: bool, rng: random.Random) -> dict:
    rows: dict[str, list[dict]] = {"onnxkiln": [], "onnxruntime": []}
    for engine in rows:  # untimed: bytecode and the OS file cache warm, numba's disk cache
        fresh(path, engine, first_run)
    for _ in range(repeat):
        order = list(rows)
        rng.shuffle(order)
        for engine in order:
            rows[engine].append(fresh(path, engine, first_run))
    result = {}
    for engine, samples in rows.items():
        result[engine] = {k: statistics.median(s[k] for s in samples)
                          for k in samples[0] if k != "heavy"}
        result[engine]["heavy"] = sorted({m for s in samples for m in s["heavy"]})
    return result


def bench_warm(path: str, repeat: int) -> dict[str, float]:
    """Median seconds of a second (and later) session of the model in this process."""
    import onnxruntime as ort

    import onnxkiln

    def kiln():
        return onnxkiln.InferenceSession.builder().intra_op_threads(1).load(path)

    def ort_session():
        so = ort.SessionOptions()
        so.intra_op_num_threads = 1
        return ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])

    calls = {"onnxkiln": kiln, "onnxruntime": ort_session}
    for fn in calls.values():
        fn()
    times = interleave(calls, repeat, {}, random.Random(1), gap_s=0.05)
    return {k: statistics.median(v) for k, v in times.items()}


def zoo_files(folder: Path) -> list[str]:
    """The zoo's small configs as .onnx files in `folder`."""
    import onnx

    from onnxkiln import zoo

    paths = []
    for name, (build, small, _) in zoo.MODELS.items():
        path = folder / f"zoo_{name}.onnx"
        onnx.save(build(small), path)
        paths.append(str(path))
    return paths


def report(path: str, fr: dict, warm: dict[str, float]) -> str:
    """One line per model: fresh import/create (and first run), warm creation, ratios."""
    k, o = fr["onnxkiln"], fr["onnxruntime"]
    ms = 1e3
    line = (f"{Path(path).name:<22} {Path(path).stat().st_size / 2**20:5.1f} MB | fresh import "
            f"{k['import'] * ms:6.0f} / {o['import'] * ms:4.0f} ms, create "
            f"{k['create'] * ms:6.0f} / {o['create'] * ms:4.0f} ms, over ort "
            f"{(k['import'] + k['create'] - o['import'] - o['create']) * ms:+6.0f} ms")
    if "first_run" in k:
        line += f", 1st run {k['first_run'] * ms:5.0f} / {o['first_run'] * ms:4.0f} ms"
    line += (f" (cpu {(k['cpu_import'] + k['cpu_create']) * ms:.0f} / "
             f"{(o['cpu_import'] + o['cpu_create']) * ms:.0f} ms)")
    line += (f" | warm {warm['onnxkiln'] * ms:6.1f} / {warm['onnxruntime'] * ms:5.1f} ms "
             f"({warm['onnxkiln'] / warm['onnxruntime']:.1f}x)")
    if k["heavy"]:
        line += f" | loaded {','.join(k['heavy'])}"
    return line


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("models", nargs="*")
    parser.add_argument("--zoo", action="store_true", help="add the zoo's small configs")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--first-run", action="store_true")
    parser.add_argument("--no-warm", action="store_true")
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        models = list(args.models) + (zoo_files(Path(tmp)) if args.zoo else [])
        if not models:
            parser.error("give model files or --zoo")
        interp = interpreter_start(args.repeat)
        print(f"interpreter start {interp * 1e3:.0f} ms (both engines pay it on top); "
              f"onnxkiln / onnxruntime, medians of {args.repeat}")
        results = {"interpreter_s": interp, "models": {}}
        rng = random.Random(0)
        for path in models:
            fr = bench_fresh(path, args.repeat, args.first_run, rng)
            warm = ({"onnxkiln": float("nan"), "onnxruntime": float("nan")} if args.no_warm
                    else bench_warm(path, args.repeat))
            results["models"][Path(path).name] = {"fresh": fr, "warm": warm}
            print(report(path, fr, warm), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
