"""The common decode loop, a KV cache that grows each step and a mask that grows with it: plain
runs against the decode memo and a captured replay, and onnxruntime, on one graph.

    python bench/decode_growing.py                    # an onnxruntime-genai Llama graph (GQA)
    python bench/decode_growing.py --hidden 64 --steps 16 --rounds 2   # quick

The graph is onnxruntime-genai's builder output for a tiny random-weight Llama
(`bench.genai_models.build`: GroupQueryAttention, rotary inside). Each mode runs the same
greedy loop (a 3-token prompt, then one token a step) and times every step end to end:

  ort      onnxruntime, presents fed back as the next pasts (the reference loop)
  plain    onnxkiln `run`, the same feeding
  memo     onnxkiln `run_with_device_bindings`: KV in bindings, the mask a plain array one
           column wider each step (the decode memo replays it)
  replay   every input and output bound, the mask a binding that grows; the step after the
           prompt is `try_capture_with_device_bindings`, the rest `replay_device_graph`

Both engines at 1 intra-op thread; the modes' loops run in a fresh random order each round
(median over rounds of the median steady step). "capture" is the capture step's time as a
multiple of an eager bound step, for the first binding set of the session and a second one
(the growth probe and audit are reused by plan). Tokens must agree across the onnxkiln modes;
a mismatch exits 1. The machine is shared: compare ratios, not absolute times.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

if __package__ in (None, ""):  # run as a script: make `onnxkiln` and `bench` importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import onnxkiln as ok
from bench.genai_models import DecoderIO, build

PROMPT = [5, 6, 7]
MODES = ("ort", "plain", "memo", "replay")


def _feeds(io: DecoderIO, tokens: list[int], total: int, past: dict) -> dict:
    return io.feeds(np.array([tokens], np.int64), total, past)


def loop_plain(run: Any, io: DecoderIO, steps: int) -> tuple[list[int], list[float]]:
    """`run(names, feeds)`: onnxruntime's or onnxkiln's plain loop."""
    past, tokens, total = io.empty_past(), PROMPT, len(PROMPT)
    out, times = [], []
    for _ in range(steps + 1):
        t = time.perf_counter()
        logits, *present = run([io.logits, *io.present], _feeds(io, tokens, total, past))
        past = dict(zip(io.past, present))
        tokens = [int(logits[0, -1].argmax())]
        times.append((time.perf_counter() - t) * 1e3)
        out.append(tokens[0])
        total += 1
    return out, times


def _kv(s: ok.InferenceSession, io: DecoderIO, capacity: int) -> list:
    shape = (1, io.kv_heads, capacity, io.head_size)
    return [s.allocate_device_binding(p, q, ok.DataType.FLOAT, shape, (*shape[:2], 0, shape[3]))
            for p, q in zip(io.past, io.present)]


def loop_memo(s: ok.InferenceSession, io: DecoderIO, steps: int, capacity: int
              ) -> tuple[list[int], list[float]]:
    kv, tokens, total = _kv(s, io, capacity), PROMPT, len(PROMPT)
    out, times = [], []
    for _ in range(steps + 1):
        t = time.perf_counter()
        feeds = _feeds(io, tokens, total, {})
        logits = s.run_with_device_bindings(feeds, kv)[0]
        tokens = [int(logits[0, -1].argmax())]
        times.append((time.perf_counter() - t) * 1e3)
        out.append(tokens[0])
        total += 1
    for b in kv:
        b.release()
    return out, times


def loop_replay(s: ok.InferenceSession, io: DecoderIO, steps: int, capacity: int,
                vocab: int) -> tuple[list[int], list[float], dict]:
    """Prompt on the memo, capture the first step, replay the rest; capture vs eager ms."""
    kv = _kv(s, io, capacity)
    ids = s.allocate_device_binding(io.input_ids, None, ok.DataType.INT64, (1, 3), (1, 3))
    mask = s.allocate_device_binding(io.attention_mask, None, ok.DataType.INT64,
                                     (1, capacity), (1, 3))
    mask.write(np.ones((1, capacity), np.int64))
    logits = s.allocate_device_output_binding(io.logits, ok.DataType.FLOAT, (1, 3, vocab),
                                              (1, 3, vocab))
    binds = [*kv, ids, mask, logits]
    out, times, info = [], [], {"replayed": 0, "retired": 0}
    t = time.perf_counter()
    ids.write(np.array([PROMPT], np.int64))
    s.run_with_device_bindings({}, binds)
    out.append(int(logits.read()[0, -1].argmax()))
    times.append((time.perf_counter() - t) * 1e3)
    ids.set_logical_shape((1, 1))
    for step in range(steps):
        t = time.perf_counter()
        ids.write(np.array([[out[-1]]], np.int64))
        mask.set_logical_shape((1, len(PROMPT) + step + 1))
        if step == 0:
            res = s.try_capture_with_device_bindings({}, binds)
            assert res.captured
            info["capture_ms"] = (time.perf_counter() - t) * 1e3
            info["segments"], info["seams"] = res.segments, len(s.capture_segmentation())
        elif s.replay_device_graph(binds):
            info["replayed"] += 1
        else:
            info["retired"] += 1
        out.append(int(logits.read()[0, -1].argmax()))
        times.append((time.perf_counter() - t) * 1e3)
    s.reset_device_graph()
    for b in binds:
        b.release()
    return out, times, info


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", default="llama")
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--steps", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    import onnxruntime as ort

    folder = build(args.arch, "fp32", hidden=args.hidden, layers=args.layers)
    io = DecoderIO(folder)
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    ref = ort.InferenceSession(str(io.model_path), so, providers=["CPUExecutionProvider"])
    vocab = ref.get_outputs()[0].shape[-1]
    vocab = vocab if isinstance(vocab, int) else 512
    capacity = len(PROMPT) + max(args.steps, 6) + 1  # the capture-cost loops run 6 steps

    def session() -> ok.InferenceSession:
        return ok.InferenceSession.builder().intra_op_threads(1).load(str(io.model_path))

    plain, memo, rep = session(), session(), session()
    steady: dict[str, list[float]] = {m: [] for m in MODES}
    tokens: dict[str, list[int]] = {}
    info: dict = {}
    for _ in range(args.rounds):
        for mode in random.sample(MODES, len(MODES)):
            time.sleep(0.2)  # let the last engine's threads go idle
            if mode == "ort":
                toks, ms = loop_plain(ref.run, io, args.steps)
            elif mode == "plain":
                toks, ms = loop_plain(lambda n, f: plain.run(n, f), io, args.steps)
            elif mode == "memo":
                toks, ms = loop_memo(memo, io, args.steps, capacity)
            else:
                toks, ms, info = loop_replay(rep, io, args.steps, capacity, vocab)
            tokens[mode] = toks
            steady[mode].append(statistics.median(ms[2:]))
    return report(args, io, steady, tokens, memo, rep, capacity, vocab, info)


def _capture_cost(s: ok.InferenceSession, io: DecoderIO, capacity: int, vocab: int
                  ) -> tuple[float, float]:
    """(capture ms, eager bound step ms) on a fresh binding set of `s` (median of 7)."""
    caps, eager = [], []
    for _ in range(7):
        _, ms, info = loop_replay(s, io, 2, capacity, vocab)
        caps.append(info["capture_ms"])
    memo = ok.InferenceSession.builder().intra_op_threads(1).option("decode.memo", "0").load(
        str(io.model_path))
    for _ in range(3):
        _, ms = loop_memo(memo, io, 6, capacity)
        eager.append(statistics.median(ms[2:]))
    return statistics.median(caps), statistics.median(eager)


def report(args: argparse.Namespace, io: DecoderIO, steady: dict, tokens: dict,
           memo: ok.InferenceSession, rep: ok.InferenceSession, capacity: int,
           vocab: int, info: dict) -> int:
    ms = {m: statistics.median(v) for m, v in steady.items()}
    print(f"{args.arch} fp32 hidden {args.hidden}, {args.layers} layers; {args.steps} steps "
          f"after a {len(PROMPT)}-token prompt; {args.rounds} rounds; 1 thread each")
    for m in MODES:
        print(f"  {m:7s} {ms[m]:8.3f} ms/step   x{ms[m] / ms['ort']:.2f} of onnxruntime")
    primed, rebuilt, replayed, _ = memo.decode_memo_counts()
    print(f"  memo counts per loop: primed {primed}, rebuilt {rebuilt // args.rounds}, "
          f"replayed {replayed // args.rounds} of {args.steps + 1} runs")
    print(f"  replay: {info['segments']} captured segments, {info['seams']} seam nodes; "
          f"{info['replayed']} of {args.steps - 1} replays valid, {info['retired']} retired")
    first = rep  # already captured once per round: the later captures reused the audit
    cap, eager = _capture_cost(first, io, capacity, vocab)
    print(f"  capture step {cap:.2f} ms = {cap / eager:.2f} eager bound steps ({eager:.3f} ms)"
          " on a new binding set of a session that captured this plan before")
    fresh = ok.InferenceSession.builder().intra_op_threads(1).load(str(io.model_path))
    _, _, info = loop_replay(fresh, io, 2, capacity, vocab)
    print(f"  capture step on a fresh session: {info['capture_ms']:.2f} ms = "
          f"{info['capture_ms'] / eager:.2f} eager bound steps")
    kiln = {m: t for m, t in tokens.items() if m != "ort"}
    if len({tuple(t) for t in kiln.values()}) != 1:
        print(f"MISMATCH between onnxkiln modes: {kiln}")
        return 1
    same = "same" if tokens["ort"] == tokens["plain"] else "different"
    print(f"  tokens agree across onnxkiln modes; {same} as onnxruntime's")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
