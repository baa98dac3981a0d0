"""int4 (MatMulNBits) against float32, onnxkiln and onnxruntime, per op and per decoder token.

    python bench/int4.py                      # per-op and decoders, 1 and 2 threads
    python bench/int4.py --ops --threads 1    # only the per-op table
    python bench/int4.py --decoders --hidden 512 --layers 4

Per op: one MatMulNBits node (4 bits, block 32, accuracy_level 4 as onnxruntime-genai's builder
writes for the CPU, constant weights) at decode shapes (M = 1, K and N in 256..2048) and a
prefill (M = 64), against a float32 MatMul of the same dequantized weights. Decoders: the
builder's Llama graphs (bench/genai_models.py, random weights) in fp32 and int4, greedy tokens
per second through plain `run` calls. Every engine runs interleaved with the others (a round
runs each once, in a random order; the median over rounds is reported), all at the same
intra-op thread count. The machine is shared: absolute times are noisy, ratios less so; the
load average is printed with the results.

Measured 2026-12 (onnxruntime 1.32, an AVX-512 VNNI Xeon VM, 2 cores shared with six other
engineers' jobs, load average 5-7: absolute times swing 2-5x between runs; three full runs):
- per op, 1 thread, M = 1: onnxkiln int4 (the VNNI kernel) 3.9-12x its float32 MatMul at
  K, N >= 1024 (1.5-5x at 2048x512 / 512x2048), 0.7-1.4x at 256-512 where the call overhead
  (~10 us) is the product; 0.8-1.3x onnxruntime's int4 time at K, N >= 1024 in most runs
  (outliers 0.4x and 3.2x). Prefill (M = 64): about float32's time (one GEMM on the
  dequantized weights), 0.5-1x (one noisy 2x).
- decoders, 1 thread: int4 tokens/s 1.5-2.6x onnxkiln's fp32 at hidden 512 (2 and 4
  layers), 0.7-1.2x at hidden 256, where the matmuls are a small share of a step (in a
  traced step GroupQueryAttention took about half, the 11 matmuls 0.2-0.3 ms either way);
  onnxruntime's int4 is 2.1-8.9x onnxkiln's.
  2 threads: 1.2-1.8x at hidden 512, 1.1-2.0x at hidden 256.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._timing import interleave

OP_SHAPES = ((1, 256, 256), (1, 512, 512), (1, 1024, 1024), (1, 2048, 2048), (1, 2048, 512),
             (1, 512, 2048), (64, 512, 512), (64, 2048, 2048))
BLOCK = 32


def _pack4(q: np.ndarray) -> np.ndarray:
    return (q[..., 0::2] | (q[..., 1::2] << 4)).astype(np.uint8)


def op_models(k: int, n: int, level: int = 4, seed: int = 0) -> tuple[onnx.ModelProto, ...]:
    """(int4 MatMulNBits model, float32 MatMul model of the same dequantized weights)."""
    rng = np.random.default_rng(seed)
    nb = k // BLOCK
    q = rng.integers(0, 16, (n, nb, BLOCK)).astype(np.uint8)
    scales = rng.uniform(0.005, 0.02, (n, nb)).astype(np.float32)
    w = ((q.astype(np.float32) - 8) * scales[:, :, None]).reshape(n, k)
    a = helper.make_tensor_value_info("A", TensorProto.FLOAT, ["M", k])
    y = helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["M", n])
    opsets = [helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)]
    node = helper.make_node("MatMulNBits", ["A", "B", "S"], ["Y"], domain="com.microsoft", K=k,
                            N=n, bits=4, block_size=BLOCK, accuracy_level=level)
    inits = [numpy_helper.from_array(_pack4(q), "B"), numpy_helper.from_array(scales, "S")]
    int4 = helper.make_model(helper.make_graph([node], "int4", [a], [y], inits),
                             opset_imports=opsets)
    fp32 = helper.make_model(helper.make_graph(
        [helper.make_node("MatMul", ["A", "W"], ["Y"])], "fp32", [a], [y],
        [numpy_helper.from_array(np.ascontiguousarray(w.T), "W")]), opset_imports=opsets)
    for m in (int4, fp32):
        m.ir_version = 10
    return int4, fp32


def onnxkiln_session(model, threads: int):
    import onnxkiln

    builder = onnxkiln.InferenceSession.builder().intra_op_threads(threads)
    if isinstance(model, onnx.ModelProto):
        return builder.load_bytes(model.SerializeToString())
    return builder.load(str(model))


def ort_session(model, threads: int):
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    src = model.SerializeToString() if isinstance(model, onnx.ModelProto) else str(model)
    return ort.InferenceSession(src, so, providers=["CPUExecutionProvider"])


def _median_us(times: list[float]) -> float:
    return statistics.median(times) * 1e6


def per_op(threads: int, rounds: int) -> list[dict]:
    """Median µs per call of each engine on each shape."""
    rows = []
    for m, k, n in OP_SHAPES:
        int4, fp32 = op_models(k, n)
        feeds = {"A": np.random.default_rng(1).standard_normal((m, k)).astype(np.float32)}
        sessions = {"ok_fp32": onnxkiln_session(fp32, threads),
                    "ok_int4": onnxkiln_session(int4, threads),
                    "ort_fp32": ort_session(fp32, threads), "ort_int4": ort_session(int4, threads)}
        calls = {}
        for name, s in sessions.items():
            run = (lambda s=s, f=feeds: s.run(None, f)) if name.startswith("ort") else (
                lambda s=s, f=feeds: s.run(f))
            for _ in range(5):
                run()
            reps = max(1, int(2e-3 / _time_once(run)))  # each sample at least ~2 ms

            def many(run=run, reps=reps):
                for _ in range(reps):
                    run()

            calls[name] = (many, reps)
        times = interleave({k2: c for k2, (c, _) in calls.items()}, rounds, {},
                           random.Random(0), gap_s=0.0)
        row = {"shape": f"{m}x{k}x{n}"}
        for name, (_, reps) in calls.items():
            row[name] = _median_us(times[name]) / reps
        rows.append(row)
    return rows


def _time_once(fn) -> float:
    start = time.perf_counter()
    fn()
    return max(time.perf_counter() - start, 1e-6)


def decoders(threads: int, rounds: int, configs: list[tuple[int, int]], steps: int,
             arch: str) -> list[dict]:
    """Greedy tokens/s of each engine on the builder's fp32 and int4 graphs."""
    from bench.genai_models import DecoderIO, build, greedy

    rows = []
    for hidden, layers in configs:
        folders = {p: build(arch, p, hidden=hidden, layers=layers) for p in ("fp32", "int4")}
        calls = {}
        for engine, make in (("ok", onnxkiln_session), ("ort", ort_session)):
            for precision, folder in folders.items():
                s = make(DecoderIO(folder).model_path, threads)
                greedy(s, folder, [5, 6, 7], 4)  # warm-up (and numba's first load)
                calls[f"{engine}_{precision}"] = (
                    lambda s=s, f=folder: greedy(s, f, [5, 6, 7], steps))
        times = interleave(calls, rounds, {}, random.Random(0), gap_s=0.0)
        row = {"model": f"{arch} h{hidden} l{layers}"}
        for name, t in times.items():
            row[name] = steps / statistics.median(t)
        rows.append(row)
    return rows


def _print(rows: list[dict], key: str, unit: str, ratio_note: str) -> None:
    names = [c for c in rows[0] if c != key]
    print(f"{key:>14} " + " ".join(f"{c:>10}" for c in names) + "  " + ratio_note)
    for r in rows:
        if unit == "us":  # time: fp32 / int4 is the int4 speed-up
            ok_x, ort_x = r["ok_fp32"] / r["ok_int4"], r["ort_fp32"] / r["ort_int4"]
            vs = r["ok_int4"] / r["ort_int4"]
        else:  # tokens/s
            ok_x, ort_x = r["ok_int4"] / r["ok_fp32"], r["ort_int4"] / r["ort_fp32"]
            vs = r["ort_int4"] / r["ok_int4"]
        print(f"{r[key]:>14} " + " ".join(f"{r[c]:>10.1f}" for c in names) +
              f"  {ok_x:5.2f}x {ort_x:5.2f}x {vs:5.2f}x")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--ops", action="store_true", help="only the per-op table")
    p.add_argument("--decoders", action="store_true", help="only the decoder table")
    p.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--hidden", type=int, nargs="+", default=[256, 512])
    p.add_argument("--layers", type=int, nargs="+", default=[2, 4])
    p.add_argument("--steps", type=int, default=24)
    p.add_argument("--arch", default="llama")
    args = p.parse_args(argv)
    both = not (args.ops or args.decoders)
    configs = [(h, n) for h in args.hidden for n in args.layers]
    print(f"load average before: {os.getloadavg()}; OPENBLAS_CORETYPE="
          f"{os.environ.get('OPENBLAS_CORETYPE', '(unset)')}")
    for threads in args.threads:
        if args.ops or both:
            print(f"\nMatMulNBits 4-bit block {BLOCK} accuracy_level 4 vs float32 MatMul, "
                  f"median µs per call, {threads} thread(s)")
            _print(per_op(threads, args.rounds), "shape", "us",
                   "ok fp32/int4, ort fp32/int4, ok/ort int4")
        if args.decoders or both:
            print(f"\nbuilder decoders, greedy tokens/s ({args.steps} steps), {threads} thread(s)")
            _print(decoders(threads, args.rounds, configs, args.steps, args.arch), "model", "tok",
                   "ok int4/fp32, ort int4/fp32, ort/ok int4")
    print(f"\nload average after: {os.getloadavg()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
