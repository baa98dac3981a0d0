"""Serve an ONNX model over HTTP with Ray Serve, and call it with JSON and npz.

    python examples/ray_serve.py [--model model.onnx] [--port 8000] [--replicas 1] [--keep]

Without --model it serves a small MLP (zoo.mlp: x [batch, 32] -> probs [batch, 10]).
The same app comes from the command line: `onnxkiln serve model.onnx --port 8000`.

    curl localhost:8000/metadata
    curl -H 'Content-Type: application/json' -d '{"inputs": {"x": [[0.1, ...]]}}' \\
         localhost:8000/predict
    python -c "import numpy as np; np.save('x.npy', np.zeros((4, 32), np.float32))"
    curl --data-binary @x.npy -H 'Content-Type: application/x-npy' \\
         localhost:8000/predict -o probs.npy

Needs `pip install "onnxkiln[ray]"`.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import sys
import tempfile
import time
import urllib.error
import urllib.request

import numpy as np
import onnx

from onnxkiln import zoo


def post(url: str, body: bytes, content_type: str) -> tuple[int, bytes]:
    request = urllib.request.Request(url, data=body, headers={"Content-Type": content_type})
    try:
        with urllib.request.urlopen(request, timeout=30) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as e:  # 4xx / 5xx carry a JSON error body
        return e.code, e.read()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--replicas", type=int, default=1)
    parser.add_argument("--keep", action="store_true", help="keep serving until Ctrl-C")
    args = parser.parse_args()
    try:
        import ray
        from ray import serve
    except ImportError:
        print('this example needs Ray: pip install "onnxkiln[ray]"')
        return 2
    from onnxkiln.integrations.ray import serve_model

    with tempfile.TemporaryDirectory() as tmp:
        path = args.model
        if path is None:
            path = os.path.join(tmp, "mlp.onnx")
            onnx.save(zoo.mlp(), path)
        ray.init(include_dashboard=False, logging_level="warning")
        try:
            url = serve_model(path, port=args.port, num_replicas=args.replicas,
                              max_batch_size=32, batch_wait_timeout_s=0.005)
            print(f"serving {path} at {url}")
            with urllib.request.urlopen(f"{url}/metadata") as resp:
                meta = json.load(resp)
            x_meta = meta["inputs"][0]
            print("inputs:", meta["inputs"], "\noutputs:", meta["outputs"])
            x = np.random.default_rng(0).standard_normal((2, x_meta["shape"][1]))

            doc = {"inputs": {x_meta["name"]: x.tolist()}}  # float64 lists -> float32
            status, body = post(f"{url}/predict", json.dumps(doc).encode(), "application/json")
            print("JSON ->", status, {k: np.round(v, 3).tolist()
                                     for k, v in json.loads(body)["outputs"].items()})

            buf = io.BytesIO()
            np.savez(buf, **{x_meta["name"]: x.astype(np.float32)})
            status, body = post(f"{url}/predict", buf.getvalue(), "application/x-npz")
            print("npz  ->", status, {k: v.shape for k, v in np.load(io.BytesIO(body)).items()})

            status, body = post(f"{url}/predict", b'{"inputs": {"nope": [1]}}',
                                "application/json")
            print("bad  ->", status, json.loads(body)["error"]["message"])
            if args.keep:
                print("Ctrl-C stops")
                try:
                    while True:
                        time.sleep(3600)
                except KeyboardInterrupt:
                    pass
        finally:
            serve.shutdown()
            ray.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
