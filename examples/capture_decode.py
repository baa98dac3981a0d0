"""Greedy decoding replayed from a captured device graph, checked against eager steps.

    python examples/capture_decode.py                  # the small fixed-capacity decoder, CPU
    python examples/capture_decode.py --growing        # a KV cache that grows each step
    python examples/capture_decode.py --device cuda    # CUDA graphs (torch with CUDA)
    python examples/capture_decode.py --gpt2 --tokens 32

By default the model keeps its KV cache in fixed-capacity buffers
(`zoo.gpt_static_decoder_step`), so every shape is the same each step and the whole step
records as one graph. With `--growing` (`zoo.gpt_decoder_step`) the past is appended to
each step: the nodes whose shapes follow its length run eagerly between recorded segments,
and the graph stays valid while the cache grows within its capacity. Every input and output
lives in a device binding: each step writes the new token (and position, mask) into their
buffers and replays; the KV buffers are written in place by the step itself.

A replay that returns False has already run its step (eagerly, correctly) and retired the
graph: read the step's outputs as usual and capture again on the next step. Capturing in the
same step would run it a second time (an appended cache would grow twice).
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from typing import Any

import numpy as np

import onnxkiln as ok
from onnxkiln import zoo


def replayed_loop(s: ok.InferenceSession, binds: list, write: Callable[[int, int], None],
                  logits: Any, first: int, steps: int) -> tuple[list[int], float, dict]:
    """Tokens of `steps` greedy steps: capture on the first, replay after; a replay that
    returns False already produced its step, so the next step captures again. Returns
    the tokens, ms per step after the first capture and the counts of each kind of step."""
    token, tokens, start = first, [], 0.0
    counts = {"captured": 0, "replayed": 0, "retired": 0}
    capture_next = True
    for step in range(steps):
        write(step, token)
        if capture_next:
            result = s.try_capture_with_device_bindings({}, binds)
            if not result.captured:
                raise SystemExit(f"not capturable: {result}")
            if step == 0:
                print(f"captured {result.segments} segment(s), {len(s.capture_segmentation())}"
                      " seam node(s)")
                start = time.perf_counter()
            counts["captured"] += 1
            capture_next = False
        elif s.replay_device_graph(binds):
            counts["replayed"] += 1
        else:  # this step ran eagerly and its outputs are right: capture on the next one
            counts["retired"] += 1
            capture_next = True
        token = int(logits.read()[0, -1].argmax())
        tokens.append(token)
    bits = s.check_device_capture_error()
    if bits:
        raise SystemExit(f"capture violation: {ok.CaptureViolation(bits)!r}")
    return tokens, (time.perf_counter() - start) * 1e3 / max(steps - 1, 1), counts


def greedy_replayed(s: ok.InferenceSession, cfg: zoo.GptConfig, capacity: int, first: int,
                    steps: int) -> tuple[list[int], float]:
    """Tokens from a captured static-cache step replayed `steps - 1` times; ms per step."""
    kv, feeds, logits = zoo.static_decode_bindings(s, cfg, capacity)

    def write(step: int, token: int) -> None:
        for name, value in zoo.static_decode_feeds(step, token, capacity).items():
            feeds[name].write(value)

    tokens, ms, _ = replayed_loop(s, [*kv, *feeds.values(), logits], write, logits, first,
                                  steps)
    return tokens, ms


def growing_replayed(s: ok.InferenceSession, cfg: zoo.GptConfig, capacity: int, first: int,
                     steps: int) -> tuple[list[int], float, dict]:
    """The same loop over `zoo.gpt_decoder_step`: KV bindings that grow by one position a
    step (logical length 0 of `capacity` at first), the token in a (1, 1) binding."""
    shape = (1, cfg.heads, capacity, cfg.hidden // cfg.heads)
    kv = [s.allocate_device_binding(f"past_{k}_{i}", f"present_{k}_{i}", ok.DataType.FLOAT,
                                    shape, (*shape[:2], 0, shape[3]))
          for i in range(cfg.layers) for k in ("key", "value")]
    ids = s.allocate_device_binding("input_ids", None, ok.DataType.INT64, (1, 1), (1, 1))
    logits = s.allocate_device_output_binding("logits", ok.DataType.FLOAT, (1, 1, cfg.vocab),
                                              (1, 1, cfg.vocab))
    return replayed_loop(s, [*kv, ids, logits],
                         lambda step, token: ids.write(np.array([[token]], np.int64)),
                         logits, first, steps)


def greedy_eager(s: ok.InferenceSession, cfg: zoo.GptConfig, capacity: int, first: int,
                 steps: int, growing: bool = False) -> list[int]:
    """The same loop with plain `run`, the caches fed back as arrays."""
    heads, dim = cfg.heads, cfg.hidden // cfg.heads
    past = {f"past_{kv}_{i}": np.zeros((1, heads, 0 if growing else capacity, dim), np.float32)
            for i in range(cfg.layers) for kv in ("key", "value")}
    names = [m.name for m in s.outputs()]
    token, tokens = first, []
    for step in range(steps):
        feeds = ({"input_ids": np.array([[token]], np.int64)} if growing
                 else zoo.static_decode_feeds(step, token, capacity))
        logits, *present = s.run({**feeds, **past})
        past = {n.replace("present", "past"): v for n, v in zip(names[1:], present)}
        token = int(logits[0, -1].argmax())
        tokens.append(token)
    return tokens


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--gpt2", action="store_true", help="GPT-2-small sizes")
    parser.add_argument("--growing", action="store_true", help="a KV cache appended to")
    parser.add_argument("--tokens", type=int, default=24)
    args = parser.parse_args()
    cfg = zoo.GptConfig.gpt2_small() if args.gpt2 else zoo.GptConfig()
    capacity = min(cfg.max_positions, 128)
    if args.growing:
        model = zoo.gpt_decoder_step(cfg)
        s = ok.InferenceSession.builder().device(args.device).from_graph(model)
        replayed, ms, counts = growing_replayed(s, cfg, capacity, 7, args.tokens)
        print(f"steps: {counts}")
    else:
        model = zoo.gpt_static_decoder_step(cfg, capacity=capacity)
        s = ok.InferenceSession.builder().device(args.device).from_graph(model)
        replayed, ms = greedy_replayed(s, cfg, capacity, 7, args.tokens)
    eager = greedy_eager(ok.InferenceSession.builder().device("cpu").from_graph(model), cfg,
                         capacity, 7, args.tokens, growing=args.growing)
    print(f"replayed tokens: {replayed}\n{ms:.3f} ms per step after the capture on "
          f"{args.device}")
    if replayed != eager:
        print(f"MISMATCH with eager CPU steps: {eager}")
        return 1
    print("identical to eager steps on the CPU")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
