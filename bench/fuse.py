"""The `fuse` compiling provider vs the plain CPU provider on the zoo models, and session
creation from a dumped EPContext model vs from the original.

    python bench/fuse.py                         # realistic sizes, level "all" (the default)
    python bench/fuse.py --levels all,disabled   # also without the graph optimizer's fusions
    python bench/fuse.py --small --only bert     # the small test configs (quick)
    python bench/fuse.py --only bert --layers 2  # BERT-base shapes, 2 of its 12 layers

Per model and optimization level: nodes left after the optimizer, partitions fuse claims
(and how many nodes they cover), run latency (median of interleaved runs) for cpu,
fuse+numpy code and fuse+numba code (when numba is installed), max |diff| vs cpu; then
session creation time: original (load + optimize + fuse analysis/codegen + plan) vs the
context model (load + EPContext resolve + plan), and each one's first run (numba compiles
its loops on first use and caches them on disk, see codegen.cache_dir(); each build is
measured in a fresh subprocess, with a fresh cache folder per model). The session is built
the way the session will once fuse is wired in (optimize, then apply_fuse, then plan).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # for bench._timing
from bench._timing import interleave_runs

SIZES = {
    "bert": {"batch": 1, "seq": 128},
    "gpt2": {"batch": 1, "seq": 1, "past_seq": 128},
    "mlp": {"batch": 1},
    "resnet": {"batch": 1},
}


def _session(model, providers):
    from onnxkiln.partition import Placement
    from onnxkiln.session import InferenceSession, SessionBuilder
    from onnxkiln.types import DeviceId, DeviceType

    placement = Placement(tuple(providers), DeviceId(DeviceType.CPU), "cpu", None)
    return InferenceSession(model, placement, SessionBuilder().optimization("disabled"))


def build(path: Path, level: str, backend: str | None, dump: Path | None = None):
    """(session, partitions, seconds to build) from a model file, fuse when backend given."""
    from onnxkiln import ep_context, ep_context_load, loader, optimizer
    from onnxkiln.providers.cpu.provider import CpuProvider
    from onnxkiln.providers.fuse import FuseProvider

    start = time.perf_counter()
    model = optimizer.optimize(loader.load_path(path), level)
    parts = []
    providers = [CpuProvider()]
    if backend is not None:
        fuse = FuseProvider(backend)
        cfg = ep_context.EpContextDumpConfig(dump is not None, dump, 1, "")
        model, parts = ep_context_load.apply_fuse(model, fuse, cfg, path)
        providers.insert(0, fuse)
    session = _session(model, providers)
    return session, parts, time.perf_counter() - start


def build_from_context(path: Path, backend: str):
    from onnxkiln import ep_context_load, loader
    from onnxkiln.providers.cpu.provider import CpuProvider
    from onnxkiln.providers.fuse import FuseProvider

    start = time.perf_counter()
    fuse = FuseProvider(backend)
    model = ep_context_load.load_with_contexts(loader.load_path(path), path.parent, [fuse])
    session = _session(model, [fuse, CpuProvider()])
    return session, time.perf_counter() - start


def partition_table(path: Path, level: str, feeds, backends, repeat: int) -> None:
    """Each partition alone: the unfused nodes as a CPU sub-model vs its fused kernel, on the
    arrays the partition sees in a real run (min of `repeat` calls: robust to machine load)."""
    import numpy as np
    import onnx
    from onnx import helper

    from onnxkiln import loader, optimizer
    from onnxkiln.providers.fuse import FuseProvider, codegen

    model = optimizer.optimize(loader.load_path(path), level)
    proto = loader.ir.serde.serialize_model(model)
    session, parts, _ = build(path, level, backends[0])
    seen = []
    call = codegen.FusedKernel.__call__

    def record(self, *xs):
        seen.append(xs)
        return call(self, *xs)

    codegen.FusedKernel.__call__ = record
    try:
        session.run(feeds)
    finally:
        codegen.FusedKernel.__call__ = call
    inits = {t.name: t for t in proto.graph.initializer}
    for part, xs in zip(parts, seen):
        nodes = [proto.graph.node[i] for i in part.covered_nodes]
        reads = {n for node in nodes for n in node.input if n}
        graph = helper.make_graph(
            nodes, part.partition_name,
            [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(x.dtype), x.shape)
             for n, x in zip(part.inputs, xs)],
            [helper.make_empty_tensor_value_info(n) for n in part.outputs],
            [inits[n] for n in sorted(reads - set(part.inputs)) if n in inits])
        sub = helper.make_model(graph, opset_imports=proto.opset_import)
        sub.ir_version = proto.ir_version
        cpu = _session(loader.from_graph(onnx.ModelProto.FromString(sub.SerializeToString())),
                       [__import__("onnxkiln.providers.cpu.provider",
                                   fromlist=["CpuProvider"]).CpuProvider()])
        sub_feeds = dict(zip(part.inputs, xs))
        runs = {"cpu": lambda s=cpu, f=sub_feeds: s.run(f)}
        for b in backends:
            kernel = FuseProvider(b).make_kernel(part)
            runs[b] = lambda k=kernel, a=xs: k(*a)
        best = {}
        for k, fn in runs.items():
            fn()
            times = []
            for _ in range(repeat):
                start = time.perf_counter()
                fn()
                times.append(time.perf_counter() - start)
            best[k] = min(times) * 1e3
        shape = max((x.shape for x in xs), key=lambda t: int(np.prod(t)))
        ops = "+".join(part.payload["ops"])
        print(f"  {part.partition_name:<8} {ops[:44]:<44} {shape!s:<18} "
              f"{best['cpu']:>8.3f} " + " ".join(f"{best[b]:>8.3f}" for b in backends),
              flush=True)


def _first_run(session, feeds):
    start = time.perf_counter()
    session.run(feeds)
    return time.perf_counter() - start


def child(args) -> int:
    """Subprocess: time building from a file (context model or original) and the first run."""
    import numpy as np

    path = Path(args.child)
    feeds = dict(np.load(args.feeds))
    if args.child_kind == "context":
        session, seconds = build_from_context(path, args.backend)
    else:
        session, _, seconds = build(path, args.level, args.backend)
    print(json.dumps({"build": seconds, "first": _first_run(session, feeds)}))
    return 0


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--only", action="append", choices=sorted(SIZES))
    parser.add_argument("--levels", default="all")
    parser.add_argument("--small", action="store_true")
    parser.add_argument("--repeat", type=int, default=15)
    parser.add_argument("--stat", choices=("median", "min"), default="median",
                        help="min resists other processes' load on a shared machine")
    parser.add_argument("--layers", type=int, help="override the layer count (bert, gpt2)")
    parser.add_argument("--child")
    parser.add_argument("--child-kind")
    parser.add_argument("--feeds")
    parser.add_argument("--backend")
    parser.add_argument("--level", default="all")
    args = parser.parse_args()
    if args.child:
        return child(args)

    import numpy as np
    import onnx

    from onnxkiln import zoo
    from onnxkiln.providers.fuse import codegen

    backends = ["numpy"] + (["numba"] if codegen.numba_available() is None else [])
    print(f"{'model':<7} {'level':<9} {'nodes':>5} {'parts':>5} {'covers':>6} "
          f"{'cpu ms':>8} " + " ".join(f"{'fuse/' + b + ' ms':>15}" for b in backends)
          + f" {'max|diff|':>9}")
    creation = []
    tmp = Path(tempfile.mkdtemp(prefix="onnxkiln-bench-fuse-"))
    os.environ.setdefault("ONNXKILN_FUSE_CACHE", str(tmp / "cache"))  # not the user's cache
    for name in args.only or list(SIZES):
        generator, small, large = zoo.MODELS[name]
        cfg = small if args.small else large
        if args.layers and isinstance(getattr(cfg, "layers", None), int):
            cfg = dataclasses.replace(cfg, layers=args.layers)
        proto = generator(cfg)
        feeds = zoo.random_inputs(proto, seed=0, **({} if args.small else SIZES[name]))
        path = tmp / f"{name}.onnx"
        onnx.save(proto, path)
        np.savez(tmp / f"{name}_feeds.npz", **feeds)
        for level in [lv for lv in args.levels.split(",") if lv]:
            cpu, _, _ = build(path, level, None)
            runs = {"cpu": lambda f, s=cpu: s.run(f)}
            parts = []
            for b in backends:
                session, parts, _ = build(path, level, b)
                runs[b] = lambda f, s=session: s.run(f)
            times = interleave_runs(runs, feeds, args.repeat)
            ref = runs["cpu"](feeds)
            diff = max(float(np.max(np.abs(a.astype(np.float64) - r)))
                       for b in backends for a, r in zip(runs[b](feeds), ref) if r.size)
            stat = np.min if args.stat == "min" else np.median
            ms = {k: float(stat(v)) * 1e3 for k, v in times.items()}
            covered = sum(len(p.covered_nodes) for p in parts)
            print(f"{name:<7} {level:<9} {len(cpu.graph()):>5} {len(parts):>5} {covered:>6} "
                  f"{ms['cpu']:>8.3f} " + " ".join(f"{ms[b]:>15.3f}" for b in backends)
                  + f" {diff:>9.2e}", flush=True)
            if parts:
                creation.append((name, level, path, tmp))
                print(f"  {'partition':<8} {'ops':<44} {'largest input':<18} {'cpu ms':>8} "
                      + " ".join(f"{b + ' ms':>8}" for b in backends))
                partition_table(path, level, feeds, backends, 5 * args.repeat)
    if creation:
        print("\nsession creation, fresh process each, build s / first run s: original (numba "
              "cache cold), context (cache warm), original (cache warm)")
        for name, level, path, folder in creation:
            for b in backends:
                ctx = folder / f"{name}_{level}_{b}_ctx.onnx"
                build(path, level, b, dump=ctx)
                row = []
                env = dict(os.environ, ONNXKILN_FUSE_CACHE=str(folder / f"cache_{ctx.stem}"))
                for kind, p in (("original", path), ("context", ctx), ("original", path)):
                    out = subprocess.run(
                        [sys.executable, __file__, "--child", str(p), "--child-kind", kind,
                         "--feeds", str(folder / f"{name}_feeds.npz"), "--backend", b,
                         "--level", level], capture_output=True, text=True, check=True,
                        env=env)
                    r = json.loads(out.stdout.strip().splitlines()[-1])
                    row.append(f"{kind} {r['build']:.3f} / {r['first']:.3f}")
                print(f"{name:<7} {level:<9} fuse/{b:<6} " + "   ".join(row), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
