"""Small recurrent models, onnxkiln against onnxruntime at the same intra-op thread count.

    python bench/recurrent.py [--threads 1] [--rounds 30] [--cases a,b] [--numpy] [--cpu-time]

Each case is a torch nn.LSTM / nn.GRU (batch_first, as taggers and voice-activity
detectors use them) exported with torch.onnx.export(dynamo=False), with a Linear head.
Both sessions are built first, then timed in alternation: per round, after an idle gap
(the previous engine's spinning BLAS and pool threads go quiet, see bench/_timing.py), a
burst of calls of each engine (order alternating), the mean per call; the median over
rounds is shown, with the ratio. --numpy times onnxkiln with the numba kernels off as a
third engine. --cpu-time times the calling thread's CPU time instead of the wall clock:
at 1 thread both engines compute on the calling thread, and on a shared machine the CPU
time leaves out the time other processes held the core.
"""

from __future__ import annotations

import argparse
import io
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._timing import GAP_S

# name: (cell, input, hidden, layers, bidirectional, seq, batch)
CASES = {
    "lstm-h32-s10-b1": ("LSTM", 16, 32, 1, False, 10, 1),
    "gru-h64-s10-b1": ("GRU", 40, 64, 1, False, 10, 1),
    "lstm-h64-s100-b1": ("LSTM", 40, 64, 1, False, 100, 1),
    "gru-h64-s100-b1": ("GRU", 40, 64, 2, False, 100, 1),
    "bilstm-h64-s50-b1": ("LSTM", 64, 64, 1, True, 50, 1),
    "bigru-h32-s20-b2": ("GRU", 32, 32, 1, True, 20, 2),
    "bilstm-h128-s50-b4": ("LSTM", 64, 128, 2, True, 50, 4),
    "bigru-h128-s100-b4": ("GRU", 64, 128, 1, True, 100, 4),
    "lstm-h128-s100-b2": ("LSTM", 64, 128, 1, False, 100, 2),
    "bilstm-h256-s64-b1": ("LSTM", 128, 256, 2, True, 64, 1),
}


def export(cell: str, n_in: int, hidden: int, layers: int, bi: bool, seq: int,
           batch: int) -> bytes:
    """ONNX bytes of torch nn.<cell> + Linear, input x [batch, seq, n_in]."""
    import torch
    from torch import nn

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.rnn = getattr(nn, cell)(n_in, hidden, layers, batch_first=True,
                                         bidirectional=bi)
            self.head = nn.Linear(hidden * (2 if bi else 1), 8)

        def forward(self, x):
            out, _ = self.rnn(x)
            return self.head(out)

    torch.manual_seed(0)
    net = Net().eval()
    buf = io.BytesIO()
    torch.onnx.export(net, (torch.zeros(batch, seq, n_in),), buf, input_names=["x"],
                      output_names=["y"], opset_version=17, dynamo=False)
    return buf.getvalue()


def _sessions(model: bytes, threads: int, numpy_too: bool):
    import onnxruntime as ort

    from onnxkiln import InferenceSession
    from onnxkiln.providers.cpu import _numba

    so = ort.SessionOptions()
    so.intra_op_num_threads = 1 if threads == 1 else threads
    so.inter_op_num_threads = 1
    ort_s = ort.InferenceSession(model, so, providers=["CPUExecutionProvider"])
    runs = {"onnxkiln": InferenceSession.builder().intra_op_threads(threads).load_bytes(model),
            "onnxruntime": ort_s}
    if numpy_too:
        _numba.ENABLED = False
        runs["kiln-numpy"] = InferenceSession.builder().intra_op_threads(threads) \
            .load_bytes(model)
        _numba.ENABLED = True
    return runs


def measure(model: bytes, feeds: dict, threads: int, rounds: int, numpy_too: bool,
            clock=time.perf_counter):
    """Median seconds per call of each engine, interleaved; and the largest |kiln - ort|."""
    runs = _sessions(model, threads, numpy_too)
    calls = {k: ((lambda s=s: s.run(None, feeds)) if k == "onnxruntime"
                 else (lambda s=s: s.run(feeds))) for k, s in runs.items()}
    for fn in calls.values():
        fn()
    start = time.perf_counter()
    calls["onnxruntime"]()
    burst = max(1, min(500, int(0.03 / max(time.perf_counter() - start, 1e-6))))
    times: dict[str, list[float]] = {k: [] for k in calls}
    names = list(calls)
    for i in range(rounds):
        for k in names if i % 2 == 0 else names[::-1]:
            fn = calls[k]
            time.sleep(GAP_S)
            t0 = clock()
            for _ in range(burst):
                fn()
            times[k].append((clock() - t0) / burst)
    kiln = calls["onnxkiln"]()
    ref = calls["onnxruntime"]()
    diff = max(float(np.max(np.abs(np.asarray(a) - np.asarray(b)))) for a, b in
               zip(kiln, ref))
    return {k: statistics.median(v) for k, v in times.items()}, diff


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--rounds", type=int, default=30)
    p.add_argument("--cases", default=",".join(CASES))
    p.add_argument("--numpy", action="store_true", help="also time the numpy loop")
    p.add_argument("--cpu-time", action="store_true", help="time the calling thread's CPU "
                   "time (threads 1 only)")
    args = p.parse_args()
    rng = np.random.default_rng(0)
    print(f"{'case':22s} {'kiln us':>9s} {'ort us':>9s} {'kiln/ort':>8s}"
          + (f" {'numpy us':>9s} {'numpy/ort':>9s}" if args.numpy else "") + "  max|diff|")
    for name in args.cases.split(","):
        cell, n_in, hidden, layers, bi, seq, batch = CASES[name]
        model = export(cell, n_in, hidden, layers, bi, seq, batch)
        feeds = {"x": rng.standard_normal((batch, seq, n_in)).astype(np.float32)}
        clock = time.thread_time if args.cpu_time else time.perf_counter
        med, diff = measure(model, feeds, args.threads, args.rounds, args.numpy, clock)
        k, o = med["onnxkiln"], med["onnxruntime"]
        line = f"{name:22s} {k * 1e6:9.1f} {o * 1e6:9.1f} {k / o:7.2f}x"
        if args.numpy:
            n = med["kiln-numpy"]
            line += f" {n * 1e6:9.1f} {n / o:8.2f}x"
        print(f"{line}  {diff:.1e}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
