"""What tracing costs on a 1,000-node model (a chain of tiny Adds: dispatch, not math).

    python bench/trace_overhead.py [--nodes 1000] [--rounds 300]

Variants, run interleaved, median and min per run and per op beyond the plain function:
  plain           the generated straight-line function, no tracing code at all
  compiled        CompiledPlan.__call__ (the plain function in its try/except)
  session         session.run, tracing disabled (the default): validation + cache +
                  one `ctx.enabled` check per run, then the plain function
  guard-per-op    the alternative design: one `if h.enabled:` per op, disabled
  hooks-noop      the instrumented function with hooks that do nothing
  traced-memory   TraceContext.in_memory(), one span per op
  traced-chrome   TraceContext.chrome(path) (recording; the file is written once at the end)
  traced-otel     TraceContext.opentelemetry() with an SDK tracer and no exporter
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
import tempfile
import time

import numpy as np

from onnxkiln import InferenceSession
from onnxkiln.trace import TraceContext

sys.path.insert(0, os.path.dirname(__file__))
from run import _chain_model


class _Noop:
    enabled = False

    def start(self, i):
        return None

    def finish(self, token, ins, outs):
        return None


def guarded_source(hooked_source: str) -> str:
    """Rewrite `run_hooked` so each step is `if h.enabled: <traced> else: <plain>`."""
    lines = hooked_source.split("def run_hooked(inputs, h):\n")[1].splitlines()
    out = ["def run_guarded(inputs, h):"]
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("    _h = h.start("):
            j = i + 1
            while not lines[j].startswith("    h.finish("):
                j += 1
            body = lines[i + 1:j]
            out += ["    if h.enabled:", "    " + line, *("    " + b for b in body),
                    "    " + lines[j], "    else:", *("    " + b for b in body)]
            i = j + 1
        else:
            out.append(line)
            i += 1
    return "\n".join(out) + "\n"


def _otel_context():
    try:
        from opentelemetry.sdk.trace import TracerProvider
    except ImportError:
        return None
    return TraceContext.opentelemetry(TracerProvider().get_tracer("bench"))


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=300)
    args = parser.parse_args()
    model = _chain_model(args.nodes)
    x = np.ones((1,), np.float32)
    feeds = {"x": x}
    plain_session = InferenceSession.from_graph(model)
    compiled = plain_session._compiled
    namespace = dict(compiled._fn.__globals__)
    exec(compile(guarded_source(compiled.source), "<guarded>", "exec"), namespace)
    guarded, noop = namespace["run_guarded"], _Noop()
    tmp = tempfile.mkdtemp()
    contexts = {"traced-memory": TraceContext.in_memory(),
                "traced-chrome": TraceContext.chrome(os.path.join(tmp, "t.json"))}
    otel = _otel_context()
    if otel is not None:
        contexts["traced-otel"] = otel
    traced = {k: InferenceSession.builder().trace(c).from_graph(model) for k, c in contexts.items()}
    variants = {
        "plain": lambda: compiled._fn([x]),
        "compiled": lambda: compiled([x]),
        "session": lambda: plain_session.run(feeds),
        "guard-per-op": lambda: guarded([x], noop),
        "hooks-noop": lambda: compiled.hooked([x], noop),
        **{k: (lambda s=s: s.run(feeds)) for k, s in traced.items()},
    }
    times = _interleaved(variants, args.rounds, contexts)
    base = np.median(times["plain"])
    print(f"{args.nodes}-node chain, {args.rounds} interleaved rounds, "
          f"python {sys.version.split()[0]}")
    print(f"{'variant':<15} {'median us':>10} {'min us':>9} {'+us/run':>9} {'+ns/op':>9}")
    for name, t in times.items():
        med = np.median(t)
        print(f"{name:<15} {med / 1e3:>10.1f} {np.min(t) / 1e3:>9.1f} {(med - base) / 1e3:>9.1f} "
              f"{(med - base) / args.nodes:>9.1f}")
    print("(+: median beyond `plain`; `session` adds a per-run constant: input validation "
          "and the cache lookup)")
    for c in contexts.values():
        c.close()
    return 0


def _interleaved(variants, rounds, contexts):
    for fn in variants.values():
        fn()
        fn()
    times = {k: [] for k in variants}
    gc.disable()
    try:
        for r in range(rounds):
            for name, fn in variants.items():
                start = time.perf_counter_ns()
                fn()
                times[name].append(time.perf_counter_ns() - start)
            if r % 50 == 0:
                for c in contexts.values():
                    c.clear()  # keep span lists from growing without bound
                gc.collect()
    finally:
        gc.enable()
    return times


if __name__ == "__main__":
    sys.exit(main())
