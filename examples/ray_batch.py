"""Score a tabular dataset with an ONNX model on Ray Data, one session per actor.

    python examples/ray_batch.py [--model model.onnx] [--rows 100000] [--actors 2]

Without --model it builds a small MLP (zoo.mlp: 32 features -> 10 class
probabilities). The dataset has an `id` column and 32 scalar feature columns
f0..f31, the way a Parquet table would; `input_columns` stacks them into the
model's `x [batch, 32]` input, `keep_columns` carries the id through, and the
output column takes the model output's name (`probs`). On a GPU machine add
`--gpus 1`: each actor gets a GPU and the session (device "auto") runs on it.

Needs `pip install "onnxkiln[ray]"`.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

import numpy as np
import onnx

from onnxkiln import InferenceSession, zoo


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", help="an .onnx file with one input x [batch, features]")
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--actors", type=int, default=2)
    parser.add_argument("--gpus", type=float, default=0, help="GPUs per actor")
    parser.add_argument("--batch-size", type=int, default=4096)
    args = parser.parse_args()
    try:
        import ray
    except ImportError:
        print('this example needs Ray: pip install "onnxkiln[ray]"')
        return 2
    from onnxkiln.integrations.ray import predict

    with tempfile.TemporaryDirectory() as tmp:
        path = args.model
        if path is None:
            path = os.path.join(tmp, "mlp.onnx")
            onnx.save(zoo.mlp(), path)  # x [batch, 32] -> probs [batch, 10]
        features = InferenceSession.load(path).inputs()[0].shape[1]
        columns = [f"f{j}" for j in range(features)]

        ray.init(include_dashboard=False, logging_level="warning")
        ray.data.DataContext.get_current().enable_progress_bars = False

        def make_features(batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
            rng = np.random.default_rng(int(batch["id"][0]))
            values = rng.standard_normal((len(batch["id"]), features))
            return {"id": batch["id"], **{c: values[:, j] for j, c in enumerate(columns)}}

        # Made up front here; a real table streams from read_parquet(...). Each actor holds
        # its CPU for the whole job, so a streaming read needs CPUs left over: on a small
        # machine pass num_cpus=0.5 to predict, or run fewer actors than CPUs.
        table = ray.data.range(args.rows, override_num_blocks=8).map_batches(make_features)
        table = table.materialize()
        start = time.perf_counter()
        scored = predict(
            table, path,
            input_columns={"x": columns},  # float64 columns, cast to the input's float32
            keep_columns=["id"],
            concurrency=args.actors, num_gpus=args.gpus or None, batch_size=args.batch_size,
            intra_op_threads=1,
        ).materialize()
        elapsed = time.perf_counter() - start
        first = scored.take(3)
        ray.shutdown()
    print(f"scored {args.rows} rows on {args.actors} actor(s) in {elapsed:.1f} s "
          f"({args.rows / elapsed:,.0f} rows/s, actor start included)")
    for row in first:
        probs = np.asarray(row["probs"])
        print(f"  id {row['id']}: class {int(probs.argmax())} (p={probs.max():.3f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
