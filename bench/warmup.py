"""Does warmup make the first real run cost what a second run costs?

    python bench/warmup.py [--trials 15] [--only resnet]

Per trial and model, two fresh sessions built from the same model, measured alternately:
  cold      no warmup: first run, then second run
  warmed    .warmup([WarmupShape(...)]) at build: first real run, then second run
Medians over trials; `first/second` near 1.0 means the first run is as fast as the second.
Zoo small configs, symbolic dims bound as below; the warmup shapes are the feeds' shapes.
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np

from onnxkiln import InferenceSession, WarmupShape, zoo

DIMS = {"mlp": {}, "resnet": {}, "bert": {"seq": 16}, "gpt2": {"seq": 1, "past_seq": 16}}


def _trial(model, feeds, warm: bool) -> tuple[float, float]:
    builder = InferenceSession.builder()
    if warm:
        builder.warmup([WarmupShape(k, v.shape) for k, v in feeds.items()])
    session = builder.from_graph(model)
    times = []
    for _ in range(2):
        start = time.perf_counter()
        session.run(feeds)
        times.append(time.perf_counter() - start)
    if warm:
        stats = session.cache_stats()
        assert (stats.misses, stats.hits) == (1, 2), stats
    return times[0], times[1]


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--trials", type=int, default=15)
    parser.add_argument("--only", action="append", choices=sorted(DIMS))
    args = parser.parse_args()
    print(f"{'model':<8} {'cold 1st ms':>12} {'cold 2nd ms':>12} {'1st/2nd':>8} "
          f"{'warm 1st ms':>12} {'warm 2nd ms':>12} {'1st/2nd':>8}")
    for name in args.only or list(DIMS):
        generator, small, _ = zoo.MODELS[name]
        model = generator(small)
        feeds = zoo.random_inputs(model, seed=0, **DIMS[name])
        runs = {"cold": [], "warm": []}
        for _ in range(args.trials):
            for kind in runs:
                runs[kind].append(_trial(model, feeds, kind == "warm"))
        cells = []
        for kind in ("cold", "warm"):
            first, second = (np.median([r[i] for r in runs[kind]]) * 1e3 for i in (0, 1))
            cells.append(f"{first:>12.3f} {second:>12.3f} {first / second:>8.2f}")
        print(f"{name:<8} {' '.join(cells)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
