"""onnxkiln on Ray: batch-job rows/s at 1 and 2 actors, Serve requests/s with and without
batching.

    python bench/ray_bench.py [--rows 200000] [--requests 3000] [--clients 16]
                              [--only data|serve] [--small]

Model: zoo.mlp 256 -> 1024 -> 1024 -> 16 (about 1.3 M weights, 2.6 MFLOP a row; --small:
64 -> 256 -> 256 -> 16). One BLAS thread per actor / replica, one CPU each.

Batch job: `predict(ds, model)` (BatchPredictor on an actor pool) over a materialized
dataset of --rows rows, batch_size 4096, timed from submit to the last row (actor start
included), and the same minus a 2-block job's time (the fixed cost: actor start, model
load, scheduling), which gives the steady rate. Baseline: the same rows through one
session in this process, one thread.

Serve: one replica; --clients threads, each with its own keep-alive connection, send
single-row JSON requests until --requests are answered; requests/s and latency
percentiles, first with `@serve.batch` (max_batch_size 32, wait 2 ms), then with
batching off. The client runs on the same machine and takes CPU from the server: on a
2-core machine both numbers are bounded by that.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import socket
import sys
import tempfile
import threading
import time

import numpy as np
import onnx

from onnxkiln import InferenceSession, zoo


def _model(small: bool) -> onnx.ModelProto:
    if small:
        return zoo.mlp(zoo.MlpConfig(64, (256, 256), 16))
    return zoo.mlp(zoo.MlpConfig(256, (1024, 1024), 16))


def _baseline(model: onnx.ModelProto, x: np.ndarray, batch: int) -> float:
    session = InferenceSession.builder().intra_op_threads(1).from_graph(model)
    session.run({"x": x[:batch]})
    start = time.perf_counter()
    for i in range(0, len(x), batch):
        session.run({"x": x[i:i + batch]})
    return len(x) / (time.perf_counter() - start)


def bench_data(model_path: str, model: onnx.ModelProto, rows: int) -> None:
    import ray

    from onnxkiln.integrations.ray import predict

    features = model.graph.input[0].type.tensor_type.shape.dim[1].dim_value
    x = np.random.default_rng(0).standard_normal((rows, features)).astype(np.float32)
    print(f"batch job: {rows} rows x {features} features, batch_size 4096")
    print(f"  one process, 1 thread, no Ray: {_baseline(model, x, 4096):,.0f} rows/s")
    blocks = np.array_split(x, 16)  # column "data"; 16 blocks so that both actors get work
    big = ray.data.from_numpy(blocks).materialize()
    small = ray.data.from_numpy(blocks[:2]).materialize()
    small_rows = sum(len(b) for b in blocks[:2])
    for actors in (1, 2):
        t_big = _job(predict, big, model_path, actors, rows)
        t_small = _job(predict, small, model_path, actors, small_rows)
        marginal = (rows - small_rows) / max(t_big - t_small, 1e-9)
        print(f"  Ray Data, {actors} actor(s): {rows / t_big:,.0f} rows/s over the whole job "
              f"({t_big:.1f} s, actor start included); {marginal:,.0f} rows/s without the "
              f"fixed cost (a {small_rows}-row job takes {t_small:.1f} s)")


def _job(predict, ds, model_path: str, actors: int, rows: int) -> float:
    start = time.perf_counter()
    out = predict(ds, model_path, input_columns={"x": "data"}, concurrency=actors,
                  num_cpus=1, batch_size=4096, intra_op_threads=1).materialize()
    elapsed = time.perf_counter() - start
    assert out.count() == rows
    return elapsed


def _client(port: str, path: str, bodies: list[bytes], counter: list[int], total: int,
            latencies: list[float], lock: threading.Lock) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", int(port), timeout=60)
    i = 0
    while True:
        with lock:
            if counter[0] >= total:
                break
            counter[0] += 1
        start = time.perf_counter()
        conn.request("POST", path, bodies[i % len(bodies)], {"Content-Type": "application/json"})
        resp = conn.getresponse()
        resp.read()
        if resp.status != 200:
            raise RuntimeError(f"HTTP {resp.status}")
        latencies.append(time.perf_counter() - start)
        i += 1
    conn.close()


def _load(port: int, path: str, bodies: list[bytes], total: int, clients: int
          ) -> tuple[float, np.ndarray]:
    counter, lock = [0], threading.Lock()
    latencies: list[float] = []
    threads = [threading.Thread(target=_client, args=(str(port), path, bodies, counter, total,
                                                      latencies, lock)) for _ in range(clients)]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return total / (time.perf_counter() - start), np.array(latencies) * 1e3


def bench_serve(model_path: str, model: onnx.ModelProto, requests: int, clients: int) -> None:
    from ray import serve

    from onnxkiln.integrations.ray import deployment

    features = model.graph.input[0].type.tensor_type.shape.dim[1].dim_value
    rng = np.random.default_rng(1)
    bodies = [json.dumps({"inputs": {"x": rng.standard_normal((1, features)).tolist()}}).encode()
              for _ in range(64)]
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    print(f"serve: 1 replica, {clients} clients, {requests} single-row JSON requests each run")
    for label, batching in (("with @serve.batch (32, 2 ms)", True), ("without batching", False)):
        app = deployment(model_path, batching=batching, max_batch_size=32,
                         batch_wait_timeout_s=0.002, intra_op_threads=1,
                         ray_actor_options={"num_cpus": 1}, max_ongoing_requests=64)
        serve.run(app, name="bench", route_prefix="/b")
        _load(port, "/b/predict", bodies, min(200, requests), clients)  # warm up
        rate, ms = _load(port, "/b/predict", bodies, requests, clients)
        conn = http.client.HTTPConnection("127.0.0.1", port)
        conn.request("GET", "/b/metadata")
        stats = json.loads(conn.getresponse().read())["stats"]
        p50, p99 = np.percentile(ms, [50, 99])
        per_run = stats["requests"] / max(stats["runs"], 1)
        print(f"  {label}: {rate:,.0f} requests/s, p50 {p50:.1f} ms, p99 {p99:.1f} ms, "
              f"{per_run:.1f} requests per session run (largest {stats['largest_stack']})")
        serve.delete("bench")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--requests", type=int, default=3000)
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--only", choices=["data", "serve"])
    parser.add_argument("--small", action="store_true", help="the small MLP")
    args = parser.parse_args(argv)
    try:
        import ray
    except ImportError:
        print('needs Ray: pip install "onnxkiln[ray]"')
        return 2
    model = _model(args.small)
    print(f"machine: {os.cpu_count()} CPUs; model mlp "
          f"{'64-256-256-16' if args.small else '256-1024-1024-16'}")
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "mlp.onnx")
        onnx.save(model, path)
        ray.init(address="local", include_dashboard=False, logging_level="warning",
                 log_to_driver=False)
        import ray.data

        ray.data.DataContext.get_current().enable_progress_bars = False
        try:
            if args.only in (None, "data"):
                bench_data(path, model, args.rows)
            if args.only in (None, "serve"):
                bench_serve(path, model, args.requests, args.clients)
        finally:
            from ray import serve

            serve.shutdown()
            ray.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
