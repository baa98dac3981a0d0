"""Greedy decoding replayed from a captured device graph, checked against eager steps.

    python examples/capture_decode.py                  # the small fixed-capacity decoder, CPU
    python examples/capture_decode.py --device cuda    # CUDA graphs (torch with CUDA)
    python examples/capture_decode.py --gpt2 --tokens 32

The model keeps its KV cache in fixed-capacity buffers (`zoo.gpt_static_decoder_step`), so
every shape is the same each step and the whole step records as one graph. Every input and
output lives in a device binding: each step writes the new token, position and mask into
their buffers and replays; the KV buffers are written in place by the step itself.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

import onnxkiln as ok
from onnxkiln import zoo


def greedy_replayed(s: ok.InferenceSession, cfg: zoo.GptConfig, capacity: int, first: int,
                    steps: int) -> tuple[list[int], float]:
    """Tokens from a captured step replayed `steps - 1` times; ms per replayed step."""
    kv, feeds, logits = zoo.static_decode_bindings(s, cfg, capacity)
    binds = [*kv, *feeds.values(), logits]
    token, tokens, start = first, [], 0.0
    for step in range(steps):
        for name, value in zoo.static_decode_feeds(step, token, capacity).items():
            feeds[name].write(value)
        if step == 0:
            result = s.try_capture_with_device_bindings({}, binds)
            if not result.captured:
                raise SystemExit(f"not capturable: {result}")
            print(f"captured {result.segments} segment(s); seams: {s.capture_segmentation()}")
            start = time.perf_counter()
        elif not s.replay_device_graph(binds):  # a branch flipped: capture again
            s.try_capture_with_device_bindings({}, binds)
        token = int(logits.read().argmax())
        tokens.append(token)
    bits = s.check_device_capture_error()
    if bits:
        raise SystemExit(f"capture violation: {ok.CaptureViolation(bits)!r}")
    return tokens, (time.perf_counter() - start) * 1e3 / max(steps - 1, 1)


def greedy_eager(s: ok.InferenceSession, cfg: zoo.GptConfig, capacity: int, first: int,
                 steps: int) -> list[int]:
    """The same loop with plain `run`, the caches fed back as arrays."""
    heads, dim = cfg.heads, cfg.hidden // cfg.heads
    past = {f"past_{kv}_{i}": np.zeros((1, heads, capacity, dim), np.float32)
            for i in range(cfg.layers) for kv in ("key", "value")}
    names = [m.name for m in s.outputs()]
    token, tokens = first, []
    for step in range(steps):
        logits, *present = s.run({**zoo.static_decode_feeds(step, token, capacity), **past})
        past = {n.replace("present", "past"): v for n, v in zip(names[1:], present)}
        token = int(logits.argmax())
        tokens.append(token)
    return tokens


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--gpt2", action="store_true", help="GPT-2-small sizes")
    parser.add_argument("--tokens", type=int, default=24)
    args = parser.parse_args()
    cfg = zoo.GptConfig.gpt2_small() if args.gpt2 else zoo.GptConfig()
    capacity = min(cfg.max_positions, 128)
    model = zoo.gpt_static_decoder_step(cfg, capacity=capacity)
    s = ok.InferenceSession.builder().device(args.device).from_graph(model)
    replayed, ms = greedy_replayed(s, cfg, capacity, 7, args.tokens)
    eager = greedy_eager(ok.InferenceSession.builder().device("cpu").from_graph(model), cfg,
                         capacity, 7, args.tokens)
    print(f"replayed tokens: {replayed}\n{ms:.3f} ms per replayed step on {args.device}")
    if replayed != eager:
        print(f"MISMATCH with eager CPU steps: {eager}")
        return 1
    print("identical to eager steps on the CPU")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
