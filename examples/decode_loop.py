"""Greedy decoding with the KV cache in device bindings, checked against plain `run`.

    python examples/decode_loop.py                 # the small test-size decoder, CPU
    python examples/decode_loop.py --gpt2 --tokens 16
    python examples/decode_loop.py --device cuda   # on a GPU (torch with CUDA)

Each layer's past_key/past_value is bound together with its present_* output, so every
step appends the new position into the same buffer (O(1) per token in the past length)
instead of concatenating a growing past. The tokens must equal those of a loop that feeds
the growing past arrays back through `run`.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

import onnxkiln as ok
from onnxkiln import zoo


def greedy_with_bindings(session: ok.InferenceSession, cfg: zoo.GptConfig, prompt: np.ndarray,
                         steps: int, capacity: int) -> list[int]:
    """Tokens from `steps` greedy steps, the KV cache living in device bindings."""
    heads, dim = cfg.heads, cfg.hidden // cfg.heads
    bindings = [
        session.allocate_device_binding(f"past_{kv}_{i}", f"present_{kv}_{i}", ok.DataType.FLOAT,
                                        (1, heads, capacity, dim), (1, heads, 0, dim))
        for i in range(cfg.layers) for kv in ("key", "value")
    ]
    ids, tokens = prompt, []
    for _ in range(steps):
        logits = session.run_with_device_bindings({"input_ids": ids}, bindings)[0]
        tokens.append(int(logits[0, -1].argmax()))
        ids = np.array([[tokens[-1]]], np.int64)
    for b in bindings:
        b.release()
    return tokens


def greedy_plain(session: ok.InferenceSession, cfg: zoo.GptConfig, prompt: np.ndarray,
                 steps: int) -> list[int]:
    """The same loop with the past fed back as growing arrays through `run`."""
    heads, dim = cfg.heads, cfg.hidden // cfg.heads
    past = {f"past_{kv}_{i}": np.zeros((1, heads, 0, dim), np.float32)
            for i in range(cfg.layers) for kv in ("key", "value")}
    names = [m.name for m in session.outputs()]
    ids, tokens = prompt, []
    for _ in range(steps):
        logits, *present = session.run({"input_ids": ids, **past})
        past = {n.replace("present", "past"): v for n, v in zip(names[1:], present)}
        tokens.append(int(logits[0, -1].argmax()))
        ids = np.array([[tokens[-1]]], np.int64)
    return tokens


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpt2", action="store_true", help="GPT-2-small sizes (slow on a CPU)")
    parser.add_argument("--tokens", type=int, default=24)
    parser.add_argument("--device", default="cpu", help="cpu | cuda | auto")
    args = parser.parse_args()
    cfg = zoo.GptConfig.gpt2_small() if args.gpt2 else zoo.MODELS["gpt2"][1]
    model = zoo.gpt_decoder_step(cfg)
    session = ok.InferenceSession.builder().device(args.device).from_graph(model)
    prompt = np.array([[464, 2068, 7586, 21831]], np.int64) % cfg.vocab
    start = time.perf_counter()
    bound = greedy_with_bindings(session, cfg, prompt, args.tokens, prompt.shape[1] + args.tokens)
    bound_s = time.perf_counter() - start
    start = time.perf_counter()
    plain = greedy_plain(session, cfg, prompt, args.tokens)
    plain_s = time.perf_counter() - start
    print(f"device {session.device_id()}: {args.tokens} tokens")
    print(f"  with KV bindings : {args.tokens / bound_s:8.1f} tokens/s  {bound}")
    print(f"  plain run        : {args.tokens / plain_s:8.1f} tokens/s  {plain}")
    if bound != plain:
        print("MISMATCH: the two loops produced different tokens")
        return 1
    print("tokens match")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
