"""A 16-step decode loop through GroupQueryAttention: KV bindings vs plain run vs onnxruntime.

    python bench/decode_attention.py                       # a builder Llama and one GQA node
    python bench/decode_attention.py --past 256 1024 --rounds 5
    python bench/decode_attention.py --where torch         # the torch provider on torch's CPU

Each point starts from a past of `--past` positions and times rounds of `--steps`
single-token steps, each round continuing where the last stopped (as a decode loop runs:
plain `run` meets new input shapes every step), or with `--repeat` decoding the same
positions again from the same past (plain `run` then finds a specialisation built for every
step: its best case). "bound" runs through `run_with_device_bindings` (GroupQueryAttention
writes the new position into the binding and attends over it), "plain" through `run`
feeding each step's presents back (GroupQueryAttention builds a new present of past + 1
positions), "ort" is onnxruntime's plain loop on the same graph. One intra-op thread for
both runtimes; rounds are interleaved (bound, plain, ort, bound, ...), medians reported.
The models: a decoder from onnxruntime-genai's model builder (bench/genai_models.py: fp32,
hidden 256, 2 layers, random weights, GroupQueryAttention with rotary inside) in the
growing and the static-cache form, when the builder imports, and a single
GroupQueryAttention node with rotary (8 heads, 2 KV heads, head 64).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import onnxkiln as ok

GAP_S = 0.05  # lets the previous engine's spinning threads go idle before the next timing


class Loop:
    """One model's decode loop: the feeds of a step and the KV input/output names."""

    def __init__(self, name, model, past, present, kv_shape, feeds, static_len=None):
        self.name, self.model, self.past, self.present = name, model, past, present  # a path
        # (external data) or the bytes of the model
        self.kv_shape, self.feeds = kv_shape, feeds  # kv_shape(length); feeds(total) -> dict
        self.static_len = static_len  # the static-cache form: KV buffers of this length


def _gqa_loop(max_len: int) -> Loop:
    from onnx import helper

    from onnxkiln.testing import make_model, tensor_info

    n, nk, h = 8, 2, 64
    f32 = np.float32
    ins = [tensor_info("q", f32, [1, 1, n * h]), tensor_info("k", f32, [1, 1, nk * h]),
           tensor_info("v", f32, [1, 1, nk * h]),
           tensor_info("past_key", f32, [1, nk, "p", h]),
           tensor_info("past_value", f32, [1, nk, "p", h]),
           tensor_info("seqlens_k", np.int32, [1]), tensor_info("total", np.int32, [])]
    ang = np.arange(max_len)[:, None] / (10000.0 ** (np.arange(0, h, 2) / h))[None, :]
    inits = {"cos": np.cos(ang).astype(f32), "sin": np.sin(ang).astype(f32)}
    node = helper.make_node(
        "GroupQueryAttention", ["q", "k", "v", "past_key", "past_value", "seqlens_k", "total",
                                "cos", "sin"],
        ["out", "present_key", "present_value"], domain="com.microsoft", num_heads=n,
        kv_num_heads=nk, do_rotary=1)
    outs = [tensor_info("out", f32, [1, 1, n * h]),
            tensor_info("present_key", f32, [1, nk, "t", h]),
            tensor_info("present_value", f32, [1, nk, "t", h])]
    model = make_model([node], ins, outs, inits, extra_opsets={"com.microsoft": 1})
    rng = np.random.default_rng(0)
    qkv = {"q": rng.standard_normal((1, 1, n * h), f32),
           "k": rng.standard_normal((1, 1, nk * h), f32),
           "v": rng.standard_normal((1, 1, nk * h), f32)}

    def feeds(total):
        return {**qkv, "seqlens_k": np.array([total - 1], np.int32),
                "total": np.array(total, np.int32)}

    return Loop("one GroupQueryAttention node (8 heads, 2 KV, head 64)", model.SerializeToString(),
                ["past_key", "past_value"], ["present_key", "present_value"],
                lambda t: (1, nk, t, h), feeds)


def _genai_loops(max_len: int) -> list[Loop]:
    """The builder's Llama twice: the growing cache (past + 1 positions each step, the
    attention mask grows too) and the static cache (KV buffers and attention mask of
    `max_len`, the mask's ones saying how much is valid: shapes never change)."""
    from bench import genai_models

    if genai_models.available():
        return []
    context = 1 << max(max_len - 1, 1).bit_length()  # a round size: one build serves many runs
    folder = genai_models.build("llama", "fp32", hidden=256, layers=2, context=context)
    io = genai_models.DecoderIO(folder)
    ids = np.array([[7]], np.int64)
    name = "builder Llama fp32 (hidden 256, 2 layers, GQA 4/2 heads of 64)"

    def static_feeds(total):
        feeds = io.feeds(ids, total, {})
        mask = np.zeros((1, max_len), np.int64)
        mask[:, :total] = 1
        feeds[io.attention_mask] = mask
        return feeds

    shape = lambda t: (1, io.kv_heads, t, io.head_size)  # noqa: E731
    return [Loop(f"{name}, growing cache", str(io.model_path), io.past, io.present, shape,
                 lambda total: io.feeds(ids, total, {})),
            Loop(f"{name}, static cache of {max_len}", str(io.model_path), io.past, io.present,
                 shape, static_feeds, static_len=max_len)]


def _sessions(loop: Loop, where: str):
    import onnxruntime as ort

    b = ok.InferenceSession.builder().intra_op_threads(1)
    if where == "torch":
        b = b.providers(["cuda", "cpu"]).option("testing.cuda_on_torch_cpu", "1")
    elif where == "cuda":
        b = b.providers(["cuda", "cpu"])
    else:
        b = b.providers(["cpu"])
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    so.inter_op_num_threads = 1
    ours = b.load(loop.model) if isinstance(loop.model, str) else b.load_bytes(loop.model)
    return ours, ort.InferenceSession(loop.model, so, providers=["CPUExecutionProvider"])


def measure(loop: Loop, past: int, steps: int, rounds: int, where: str,
            repeat: bool = False, clock=time.perf_counter) -> dict:
    """Median ms of `steps` decode steps after a past of `past` positions, three ways.

    Continuing (the default, as a decode loop runs): round r decodes positions
    past + r * steps + 1 ..., so no step's input shapes were seen before (plain `run` builds
    a specialisation for each). `repeat`: every round decodes the same positions again
    from the same past (plain `run` finds its specialisations built: its best case)."""
    ours, theirs = _sessions(loop, where)
    rng = np.random.default_rng(1)
    span = steps if repeat else steps * (rounds + 1)  # positions the loop decodes
    length = loop.static_len or past  # of the past fed to the first step
    start = {}
    for n in loop.past:
        start[n] = np.zeros(loop.kv_shape(length), np.float32)
        start[n][:, :, :past] = rng.standard_normal(loop.kv_shape(past), np.float32)
    binds = [ours.allocate_device_binding(i, o, ok.DataType.FLOAT,
                                          loop.kv_shape(loop.static_len or past + span),
                                          loop.kv_shape(length))
             for i, o in zip(loop.past, loop.present)]
    for b in binds:
        b.write(start[b.input_name])
    names = [m.name for m in theirs.get_outputs()]
    present_at = [names.index(o) for o in loop.present]
    sync = getattr(binds[0]._provider, "synchronize", None) or (lambda: None)

    def first(r):
        return past + (0 if repeat else r * steps)

    def bound(r):
        if repeat:
            for b in binds:
                b.set_logical_shape(loop.kv_shape(length))
        for t in range(first(r) + 1, first(r) + steps + 1):
            ours.run_with_device_bindings(loop.feeds(t), binds)
        sync()

    def plain(run):
        state = {"kv": dict(start)}

        def go(r):
            kv = dict(start) if repeat else state["kv"]
            for t in range(first(r) + 1, first(r) + steps + 1):
                out = run({**loop.feeds(t), **kv})
                kv = {n: out[i] for n, i in zip(loop.past, present_at)}
            state["kv"] = kv
        return go

    ways = {"bound": bound, "plain": plain(ours.run),
            "onnxruntime": plain(lambda f: theirs.run(None, f))}
    for fn in ways.values():
        fn(0)  # warm: the decode memo; specialisations of round 0's shapes
    times: dict[str, list[float]] = {k: [] for k in ways}
    for r in range(1, rounds + 1):
        for key, fn in ways.items():
            time.sleep(GAP_S)
            t0 = clock()
            fn(r)
            times[key].append((clock() - t0) * 1e3)
    stats = binds[0].write_stats()
    row = {k: statistics.median(v) for k, v in times.items()}
    row.update(past=past, copied=stats.copied_bytes, memo=ours.decode_memo_counts(),
               in_place_per_step=stats.in_place_bytes / max(stats.in_place_writes, 1))
    return row


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--past", type=int, nargs="+", default=[256, 1024, 2048])
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--where", choices=("cpu", "torch", "cuda"), default="cpu")
    parser.add_argument("--repeat", action="store_true",
                        help="decode the same positions every round (plain run's best case)")
    parser.add_argument("--cpu-time", action="store_true",
                        help="time this process's CPU (both runtimes run on this thread at one "
                             "intra-op thread): steadier than wall time on a loaded machine")
    args = parser.parse_args()
    clock = time.process_time if args.cpu_time else time.perf_counter
    max_len = max(args.past) + args.steps * (1 if args.repeat else args.rounds + 1) + 1
    loops = [*_genai_loops(max_len), _gqa_loop(max_len)]
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    mode = "the same positions each round" if args.repeat else "continuing positions"
    mode += ", CPU time" if args.cpu_time else ", wall time"
    print(f"{args.steps}-step decode loops ({mode}), provider {args.where}, 1 intra-op thread, "
          f"median of {args.rounds} interleaved rounds; load average {load:.2f} at start "
          f"({os.cpu_count()} cores; other processes share them: absolute times are noisy)")
    for loop in loops:
        print(f"\n{loop.name}")
        print(f"{'past':>6} {'bound ms':>9} {'plain ms':>9} {'ort ms':>8} {'plain/bound':>11} "
              f"{'ort/bound':>9} {'KV B/step':>9} {'copied B':>8}  memo (primed, rebuilt, "
              "replayed, ineligible)")
        for past in args.past:
            r = measure(loop, past, args.steps, args.rounds, args.where, args.repeat, clock)
            print(f"{past:>6} {r['bound']:>9.2f} {r['plain']:>9.2f} {r['onnxruntime']:>8.2f} "
                  f"{r['plain'] / r['bound']:>11.2f} {r['onnxruntime'] / r['bound']:>9.2f} "
                  f"{r['in_place_per_step']:>9.0f} {r['copied']:>8}  {r['memo']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
