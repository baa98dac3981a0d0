"""`onnxkiln serve MODEL`: the Serve deployment on a local (or given) Ray cluster."""

from __future__ import annotations

import argparse
import time
from typing import Any

from onnxkiln.integrations.ray._config import SessionConfig

__all__ = ["serve_command", "wait_for_interrupt"]


def wait_for_interrupt() -> None:
    """Block until Ctrl-C (KeyboardInterrupt)."""
    while True:
        time.sleep(3600)


def serve_command(args: argparse.Namespace, console: Any) -> int:
    """Check the model loads, start Ray and Serve, serve until Ctrl-C; the exit code."""
    if args.replicas < 1 or args.max_batch_size < 1 or args.batch_wait_ms < 0:
        console.print("error: --replicas and --max-batch-size must be >= 1, --batch-wait-ms >= 0")
        return 2
    config = SessionConfig.of(args.device, None, "all", args.threads)
    config.load(args.model)  # a model that cannot load fails here, with its message
    try:
        import ray

        from onnxkiln.integrations.ray._serve import serve_model
    except ImportError as e:
        console.print(f'error: `onnxkiln serve` needs Ray Serve: pip install "onnxkiln[ray]" '
                      f"({e})")
        return 2
    connected = not ray.is_initialized()
    own = connected and not args.address  # a local cluster this command owns
    if connected:
        ray.init(address=args.address or "local", include_dashboard=False,
                 logging_level="warning")
    actor: dict[str, float] = {"num_cpus": args.replica_cpus}
    if args.replica_gpus:
        actor["num_gpus"] = args.replica_gpus
    try:
        url = serve_model(
            args.model, host=args.host, port=args.port, route_prefix=args.route_prefix,
            app_name=args.name, num_replicas=args.replicas,
            batching=args.batching and args.max_batch_size > 1,
            max_batch_size=args.max_batch_size, batch_wait_timeout_s=args.batch_wait_ms / 1e3,
            ray_actor_options=actor, device=args.device, intra_op_threads=args.threads)
    except Exception as e:  # Ray's own errors (port in use, replicas failing to start)
        console.print(f"error: starting Serve failed: {type(e).__name__}: {e}")
        _stop(own, connected, args.name)
        return 1
    try:
        console.print(f"serving {args.model} on {args.replicas} replica(s) at {url}\n"
                      f"  POST {url}/predict   (JSON, npz or npy; see onnxkiln.integrations.ray)"
                      f"\n  GET  {url}/health   GET {url}/metadata\nCtrl-C stops.")
        try:
            wait_for_interrupt()
        except KeyboardInterrupt:
            console.print("stopping")
    finally:
        _stop(own, connected, args.name)
    return 0


def _stop(own: bool, connected: bool, app_name: str) -> None:
    """Undo what the command did: shut down its own local cluster, else delete its app
    (and disconnect when it connected to `--address`)."""
    import ray
    from ray import serve

    if own:
        serve.shutdown()
    else:
        serve.delete(app_name)
    if connected:
        ray.shutdown()
