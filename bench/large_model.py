"""A model over 2 GB with external data: loaded by memory mapping, weights never copied.

    python bench/large_model.py                   # ~2.5 GB in a temp dir, removed afterwards
    python bench/large_model.py --gb 4 --keep     # keep the files (path printed)
    python bench/large_model.py --dir /data/tmp   # where the temp dir goes (needs ~size free)

Writes a chain of `Tanh(x @ W_i)` layers whose square float32 weights live in one
`weights.bin` beside `model.onnx`, in chunks (no weight is ever whole in this process's
memory). A fresh child process then loads the model with onnxkiln, runs it once, and
reports from /proc/self/status and getrusage:

  - peak RSS (VmHWM, ru_maxrss) against the weights' size: every page of the weights is
    read by the run, so a peak near 1x the size means they were mapped once; 2x would
    mean a copy;
  - RssAnon (process-private memory: copies would land here) and RssFile (the mapped
    weights) after the run;
  - load and run times.

The parent then checks the child's output against a float64 reference computed layer by
layer from `np.memmap` (after the child has exited, so its pages do not count).
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper

CHUNK_ROWS = 256


def _layers(total_bytes: int, width: int) -> int:
    return max(1, round(total_bytes / (width * width * 4)))


def write_model(folder: Path, total_gb: float, width: int, seed: int = 0) -> tuple[Path, int]:
    """model.onnx + weights.bin under `folder`; returns the model path and the weight bytes."""
    n = _layers(int(total_gb * (1 << 30)), width)
    rng = np.random.default_rng(seed)
    scale = np.float32(1.5 / np.sqrt(width))
    inits, nodes, offset = [], [], 0
    prev = "x"
    with open(folder / "weights.bin", "wb") as f:
        for i in range(n):
            for start in range(0, width, CHUNK_ROWS):
                rows = min(CHUNK_ROWS, width - start)
                chunk = rng.standard_normal((rows, width), dtype=np.float32) * scale
                f.write(chunk.tobytes())
            length = width * width * 4
            t = TensorProto(name=f"w{i}", data_type=TensorProto.FLOAT, dims=[width, width],
                            data_location=TensorProto.EXTERNAL)
            for key, value in (("location", "weights.bin"), ("offset", str(offset)),
                               ("length", str(length))):
                t.external_data.add(key=key, value=value)
            inits.append(t)
            offset += length
            nodes.append(helper.make_node("MatMul", [prev, f"w{i}"], [f"m{i}"], name=f"mm{i}"))
            nodes.append(helper.make_node("Tanh", [f"m{i}"], [f"t{i}"], name=f"tanh{i}"))
            prev = f"t{i}"
    nodes.append(helper.make_node("Identity", [prev], ["y"], name="out"))
    graph = helper.make_graph(
        nodes, "large",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", width])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", width])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    path = folder / "model.onnx"
    onnx.save(model, path)  # small: the weights are references into weights.bin
    return path, offset


def _status() -> dict[str, int]:
    """VmHWM, VmRSS, RssAnon, RssFile in bytes (Linux)."""
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("VmHWM", "VmRSS", "RssAnon", "RssFile"):
                out[key] = int(value.split()[0]) * 1024
    return out


def child(path: str, width: int, batch: int) -> None:
    """Load and run in this fresh process; print one JSON line of measurements."""
    import onnxkiln.providers.cpu  # noqa: F401  (kernel modules: counted in the baseline)
    from onnxkiln import InferenceSession

    before = _status()
    t0 = time.perf_counter()
    session = InferenceSession.load(path)
    load_s = time.perf_counter() - t0
    after_load = _status()
    x = np.random.default_rng(1).standard_normal((batch, width), dtype=np.float32)
    t0 = time.perf_counter()
    (y,) = session.run({"x": x})
    run_s = time.perf_counter() - t0
    after_run = _status()
    np.save(Path(path).parent / "y.npy", y)
    print(json.dumps({
        "load_s": load_s, "run_s": run_s, "before": before, "after_load": after_load,
        "after_run": after_run,
        "ru_maxrss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
    }))


def reference(folder: Path, n: int, width: int, batch: int) -> np.ndarray:
    """The expected output in float64, one memory-mapped layer at a time."""
    w = np.memmap(folder / "weights.bin", dtype=np.float32, mode="r")
    h = np.random.default_rng(1).standard_normal((batch, width), dtype=np.float32)
    h = h.astype(np.float64)
    layer = width * width
    for i in range(n):
        h = np.tanh(h @ np.asarray(w[i * layer:(i + 1) * layer]).reshape(width, width))
    return h


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--gb", type=float, default=2.5, help="weight bytes, in GiB")
    parser.add_argument("--width", type=int, default=8192, help="square weight size")
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--dir", default=None, help="parent of the temp dir")
    parser.add_argument("--keep", action="store_true")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child, args.width, args.batch)
        return 0
    parent = Path(args.dir or tempfile.gettempdir())
    need = int(args.gb * (1 << 30) * 1.1) + (1 << 30)
    free = shutil.disk_usage(parent).free
    if free < need:
        print(f"skipped: {free / 2**30:.1f} GiB free in {parent}, need {need / 2**30:.1f} GiB")
        return 0
    folder = Path(tempfile.mkdtemp(prefix="onnxkiln-large-", dir=parent))
    try:
        t0 = time.perf_counter()
        path, weight_bytes = write_model(folder, args.gb, args.width)
        n = _layers(int(args.gb * (1 << 30)), args.width)
        write_s = time.perf_counter() - t0
        writer_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        cmd = [sys.executable, __file__, "--child", str(path), "--width", str(args.width),
               "--batch", str(args.batch)]
        result = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if result.returncode != 0:
            print(result.stdout, result.stderr)
            return 1
        m = json.loads(result.stdout.strip().splitlines()[-1])
        y = np.load(folder / "y.npy")
        expected = reference(folder, n, args.width, args.batch)
        err = float(np.max(np.abs(y - expected)))
        mib = 1 << 20
        files = weight_bytes + path.stat().st_size
        print(f"model: {n} layers of float32[{args.width}, {args.width}], "
              f"{files / 2**30:.2f} GiB on disk ({path.stat().st_size:,} bytes of model.onnx), "
              f"written in {write_s:.1f}s with writer peak RSS {writer_rss / mib:.0f} MiB")
        print(f"load: {m['load_s']:.2f}s; RSS {m['before']['VmRSS'] / mib:.0f} -> "
              f"{m['after_load']['VmRSS'] / mib:.0f} MiB "
              f"(anon {m['after_load']['RssAnon'] / mib:.0f} MiB)")
        print(f"run (batch {args.batch}): {m['run_s']:.2f}s; after it RssAnon "
              f"{m['after_run']['RssAnon'] / mib:.0f} MiB, RssFile "
              f"{m['after_run']['RssFile'] / mib:.0f} MiB (the mapped weights)")
        peak = max(m["ru_maxrss"], m["after_run"]["VmHWM"])
        added = peak - m["before"]["VmRSS"]  # over the interpreter with onnxkiln imported
        print(f"peak RSS {peak / mib:.0f} MiB = {peak / weight_bytes:.2f}x the weights "
              f"({weight_bytes / mib:.0f} MiB); {added / mib:.0f} MiB = "
              f"{added / weight_bytes:.2f}x over the {m['before']['VmRSS'] / mib:.0f} MiB before "
              f"loading; max |y - float64 reference| = {err:.2e}")
        ok = err < 1e-3 and added < 1.25 * weight_bytes
        print("OK" if ok else "FAILED")
        return 0 if ok else 1
    finally:
        if args.keep:
            print(f"kept: {folder}")
        else:
            shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
