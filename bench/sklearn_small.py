"""skl2onnx pipelines on small batches: onnxkiln vs onnxruntime, both at 1 intra-op thread.

    python bench/sklearn_small.py [--rounds 30] [--only rf,gb] [--batches 1,16,256]

Each pipeline is trained on seeded make_classification / make_regression data (20
features), converted with skl2onnx (ZipMap output where skl2onnx adds it by default, and
zipmap=False variants for the tree classifiers), then both engines run the same batch:
in each round every engine runs a block of calls (sized to ~2 ms) in alternating order;
the table shows the median per-call time over the rounds and the ratio onnxkiln / ort.
Outputs are compared once before timing (labels exactly, scores to 1e-5 relative).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np

TREE_BATCHES = (1, 16, 256)
OTHER_BATCHES = (1, 16)


def _data(n_classes: int, n: int = 1500, seed: int = 0):
    from sklearn.datasets import make_classification

    x, y = make_classification(n, 20, n_informative=10, n_redundant=4, n_classes=n_classes,
                               random_state=seed)
    return x.astype(np.float32), y


def _reg_data(n: int = 1500, seed: int = 0):
    from sklearn.datasets import make_regression

    x, y = make_regression(n, 20, n_informative=12, noise=0.5, random_state=seed)
    return x.astype(np.float32), y


def _pipelines() -> list[tuple[str, Callable[[], tuple[Any, np.ndarray, dict]], bool]]:
    """(name, builder returning (fitted estimator, X, skl2onnx options), is_tree)."""
    from sklearn.decomposition import PCA
    from sklearn.ensemble import (
        GradientBoostingClassifier,
        RandomForestClassifier,
        RandomForestRegressor,
    )
    from sklearn.linear_model import LinearRegression, LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler
    from sklearn.svm import SVC, SVR

    def fit(est, data, **opts):
        x, y = data
        return lambda: (est.fit(x, y), x, opts)

    def rf():
        return RandomForestClassifier(100, max_depth=10, random_state=0)

    def gb():
        return GradientBoostingClassifier(n_estimators=100, max_depth=3, random_state=0)

    nozip = {"zipmap": False}
    return [
        ("logreg bin", fit(make_pipeline(StandardScaler(), LogisticRegression()), _data(2)),
         False),
        ("logreg 4cls", fit(make_pipeline(StandardScaler(), LogisticRegression()), _data(4)),
         False),
        ("svc proba 3cls", fit(make_pipeline(StandardScaler(), SVC(probability=True,
                                                                     random_state=0)),
                               _data(3, n=400)), False),
        ("svr rbf", fit(make_pipeline(StandardScaler(), SVR(C=10.0)), _reg_data(400)), False),
        ("rf 3cls zipmap", fit(rf(), _data(3)), True),
        ("rf 3cls nozip", fit(rf(), _data(3), **nozip), True),
        ("gb bin zipmap", fit(gb(), _data(2)), True),
        ("gb bin nozip", fit(gb(), _data(2), **nozip), True),
        ("gb 3cls zipmap", fit(gb(), _data(3)), True),
        ("gb 3cls nozip", fit(gb(), _data(3), **nozip), True),
        ("rf regressor", fit(RandomForestRegressor(100, max_depth=10, random_state=0),
                             _reg_data()), True),
        ("pca", fit(PCA(5, random_state=0), _data(2)), False),
        ("scaler+linreg", fit(make_pipeline(StandardScaler(), LinearRegression()),
                              _reg_data()), False),
    ]


def _convert(est, x, opts):
    from skl2onnx import to_onnx

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return to_onnx(est, x[:1], options=opts or None, target_opset={"": 17, "ai.onnx.ml": 3})


def _engines(model):
    import onnx
    import onnxruntime as ort

    from onnxkiln import InferenceSession

    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    so.inter_op_num_threads = 1
    so.log_severity_level = 3
    theirs = ort.InferenceSession(model.SerializeToString(), so,
                                  providers=["CPUExecutionProvider"])
    seq = any(o.type.HasField("sequence_type") for o in model.graph.output)
    copy = onnx.ModelProto()
    copy.CopyFrom(model)  # the loader strips map types from the proto it is given
    ours = InferenceSession.builder().intra_op_threads(1).from_graph(copy)
    name = model.graph.input[0].name
    if seq:
        def run_ours(x):
            return [o.value for o in ours.run_outputs({name: x})]
    else:
        def run_ours(x):
            return ours.run({name: x})

    def run_theirs(x):
        return theirs.run(None, {name: x})

    return run_ours, run_theirs


def _same(a: Any, b: Any, where: str) -> None:
    if isinstance(b, list):
        assert isinstance(a, list) and len(a) == len(b), where
        for r, (da, db) in enumerate(zip(a, b)):
            assert list(da) == list(db), f"{where}[{r}] keys {list(da)} vs {list(db)}"
            np.testing.assert_allclose(list(da.values()), list(db.values()), rtol=1e-5,
                                       atol=1e-6, err_msg=f"{where}[{r}]")
        return
    a, b = np.asarray(a), np.asarray(b)
    assert a.shape == b.shape and a.dtype == b.dtype, (where, a.shape, b.shape, a.dtype, b.dtype)
    if b.dtype.kind == "f":
        # float32 sums of large terms: the absolute error scales with the output magnitude
        atol = 1e-6 * max(1.0, float(np.abs(b).max(initial=0.0)))
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=atol, err_msg=where)
    else:
        np.testing.assert_array_equal(a, b, err_msg=where)


def _block(fn: Callable[[], Any], target_s: float = 0.002) -> int:
    start = time.perf_counter()
    fn()
    one = max(time.perf_counter() - start, 1e-6)
    return max(1, min(200, int(target_s / one)))


def _time(runs: dict[str, Callable[[], Any]], rounds: int,
          clock: Callable[[], float] = time.perf_counter) -> dict[str, float]:
    """Median seconds per call: every round runs a block of each, order alternating."""
    for fn in runs.values():
        for _ in range(5):
            fn()
    blocks = {k: _block(fn) for k, fn in runs.items()}
    n = max(blocks.values())
    samples: dict[str, list[float]] = {k: [] for k in runs}
    keys = list(runs)
    for r in range(rounds):
        for k in (keys if r % 2 == 0 else keys[::-1]):
            fn = runs[k]
            start = clock()
            for _ in range(n):
                fn()
            samples[k].append((clock() - start) / n)
    return {k: statistics.median(v) for k, v in samples.items()}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=30)
    p.add_argument("--only", default="", help="comma-separated substrings of pipeline names")
    p.add_argument("--batches", default="", help="override the batch sizes, e.g. 1,16")
    p.add_argument("--clock", choices=("cpu", "wall"), default="cpu",
                   help="cpu: this process's CPU time (robust when other jobs share the "
                        "cores; both engines run on this one thread); wall: perf_counter")
    args = p.parse_args(argv)
    clock = time.process_time if args.clock == "cpu" else time.perf_counter
    only = [s for s in args.only.split(",") if s]
    print(f"load average {os.getloadavg()[0]:.2f}, rounds {args.rounds}, clock {args.clock}")
    print(f"{'pipeline':<16} {'batch':>5} {'onnxkiln us':>12} {'ort us':>9} {'ratio':>6}")
    rng = np.random.default_rng(1)
    for name, build, is_tree in _pipelines():
        if only and not any(s in name for s in only):
            continue
        est, x, opts = build()
        model = _convert(est, x, opts)
        ours, theirs = _engines(model)
        batches = TREE_BATCHES if is_tree else OTHER_BATCHES
        if args.batches:
            batches = tuple(int(b) for b in args.batches.split(","))
        for b in batches:
            xb = np.ascontiguousarray(x[rng.integers(0, x.shape[0], b)])
            for i, (oa, ob) in enumerate(zip(ours(xb), theirs(xb))):
                _same(oa, ob, f"{name} batch {b} output {i}")
            t = _time({"ours": lambda xb=xb, f=ours: f(xb),
                       "ort": lambda xb=xb, f=theirs: f(xb)}, args.rounds, clock)
            print(f"{name:<16} {b:>5} {t['ours'] * 1e6:>12.1f} {t['ort'] * 1e6:>9.1f} "
                  f"{t['ours'] / t['ort']:>6.2f}", flush=True)
    print(f"load average {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
