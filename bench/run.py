"""Side-by-side latency of onnxkiln and onnxruntime on the zoo models, in one process.

    python bench/run.py                 # realistic sizes: MLP, ResNet-50, BERT-base, GPT-2 step
    python bench/run.py --small         # the small test configs (quick)
    python bench/run.py --only gpt2 --repeat 50

OPENBLAS_CORETYPE/OPENBLAS_L2_SIZE pin older OpenBLAS kernels on these machines; the script
re-executes itself without them (for its own process only) unless --keep-env is given, and
prints the BLAS kernel threadpoolctl reports. Times drift on shared machines: read the ratio.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

PINNED = ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")

SIZES = {  # symbolic dims of each realistic case
    "mlp": {"batch": 1},
    "resnet": {"batch": 1},
    "bert": {"batch": 1, "seq": 128},
    "gpt2": {"batch": 1, "seq": 1, "past_seq": 128},
    "overhead": {},
}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--only", action="append", choices=sorted(SIZES))
    parser.add_argument("--small", action="store_true", help="use the small test configs")
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--keep-env", action="store_true")
    args = parser.parse_args()
    if not args.keep_env and any(k in os.environ for k in PINNED):
        env = {k: v for k, v in os.environ.items() if k not in PINNED}
        os.execve(sys.executable, [sys.executable, *sys.argv, "--keep-env"], env)

    import numpy as np
    from threadpoolctl import threadpool_info

    from onnxkiln import InferenceSession, zoo
    from onnxkiln.testing import ort_session

    blas = [f"{p['internal_api']} {p.get('version')} {p.get('architecture')} "
            f"threads={p['num_threads']}" for p in threadpool_info() if p["user_api"] == "blas"]
    print(f"BLAS: {'; '.join(blas)}; env pins: "
          f"{ {k: os.environ.get(k) for k in PINNED} }")
    print(f"{'model':<10} {'nodes':>6} {'onnxkiln ms':>12} {'ort ms':>9} {'ratio':>7} "
          f"{'ort-noopt ms':>13} {'ratio':>7} {'max|diff|':>10}")
    for name in args.only or list(SIZES):
        if name == "overhead":
            model, feeds = _chain_model(1000), {"x": np.ones((1,), np.float32)}
        else:
            generator, small, large = zoo.MODELS[name]
            model = generator(small if args.small else large)
            dims = {} if args.small else SIZES[name]
            feeds = zoo.random_inputs(model, seed=0, **dims)
        ours = InferenceSession.from_graph(model)
        theirs = ort_session(model, optimize=True)
        plain = ort_session(model, optimize=False)
        runs = {
            "ours": lambda f, s=ours: s.run(f),
            "ort": lambda f, s=theirs: s.run(None, f),
            "plain": lambda f, s=plain: s.run(None, f),
        }
        times = _interleaved(runs, feeds, args.repeat)
        a, b = runs["ours"](feeds), runs["ort"](feeds)
        diff = max(float(np.max(np.abs(x - y))) for x, y in zip(a, b) if x.size)
        med = {k: float(np.median(v)) * 1e3 for k, v in times.items()}
        print(f"{name:<10} {len(model.graph.node):>6} {med['ours']:>12.3f} {med['ort']:>9.3f} "
              f"{med['ours'] / med['ort']:>6.2f}x {med['plain']:>13.3f} "
              f"{med['ours'] / med['plain']:>6.2f}x {diff:>10.2e}")
        if name == "overhead":
            per_op = (med["ours"] - med["ort"]) / len(model.graph.node) * 1e3
            print(f"{'':<10} per-op overhead beyond onnxruntime: {per_op:.2f} us")
    return 0


def _interleaved(runs, feeds, repeat):
    for fn in runs.values():  # warm up: first-run costs are not latency
        fn(feeds)
        fn(feeds)
    times = {k: [] for k in runs}
    for _ in range(repeat):
        for k, fn in runs.items():
            start = time.perf_counter()
            fn(feeds)
            times[k].append(time.perf_counter() - start)
    return times


def _chain_model(n: int):
    """n tiny Add nodes in a chain: measures per-op dispatch cost, not math."""
    import numpy as np
    from onnx import helper

    from onnxkiln.testing import make_model, tensor_info

    nodes = [helper.make_node("Add", ["x" if i == 0 else f"t{i - 1}", "one"],
                              [f"t{i}" if i < n - 1 else "y"]) for i in range(n)]
    return make_model(nodes, [tensor_info("x", np.float32, [1])],
                      [tensor_info("y", np.float32, [1])], {"one": np.ones(1, np.float32)},
                      name=f"chain{n}")


if __name__ == "__main__":
    sys.exit(main())
