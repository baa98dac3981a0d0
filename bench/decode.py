"""Decode-step time against the past length, with KV bindings and without.

    python bench/decode.py                         # GPT-2-small step on the CPU, past 16..1024
    python bench/decode.py --device cuda           # on a GPU, plus torch eager on the same weights
    python bench/decode.py --small --past 16 64    # the test-size decoder (quick)

Without bindings each step feeds the whole past in and gets past+1 back (a Concat copies it
all: O(past) per token). With bindings the present is appended in place into the past's
buffer: only the new position is written, so the time per token should stay flat as the past
grows (what still grows is attention itself, which reads the whole past).
Each point runs `--tokens` steps at exactly that past length (the logical length is reset
after each step) and reports the median; "kv ms" is the time the KV-cache Concat nodes take per
step (traced separately): the in-place append stays flat while concatenating grows with the past.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import numpy as np

import onnxkiln as ok
from onnxkiln import zoo


def _session(model, device: str) -> ok.InferenceSession:
    return ok.InferenceSession.builder().device(device).from_graph(model)


def _median_ms(fn, repeat: int, sync=lambda: None) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        sync()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def measure(cfg: zoo.GptConfig, pasts: list[int], tokens: int, device: str) -> list[dict]:
    """Per past length: ms per token with bindings, with plain run, with torch eager."""
    model = zoo.gpt_decoder_step(cfg)
    session = _session(model, device)
    heads, dim = cfg.heads, cfg.hidden // cfg.heads
    capacity = max(pasts) + 1
    rng = np.random.default_rng(0)
    binds = [session.allocate_device_binding(
        f"past_{kv}_{i}", f"present_{kv}_{i}", ok.DataType.FLOAT,
        (1, heads, capacity, dim), (1, heads, 0, dim))
        for i in range(cfg.layers) for kv in ("key", "value")]
    provider = binds[0]._provider  # the device the bindings live on
    eager = _TorchGpt(model, cfg, device) if device.startswith("cuda") else None
    rows = []
    ids = np.array([[17]], np.int64)
    for past in pasts:
        kv = rng.standard_normal((1, heads, past, dim), dtype=np.float32)
        for b in binds:
            b.set_logical_shape((1, heads, past, dim))
            b.write(kv)

        def bound_step(binds=binds, past=past):
            session.run_with_device_bindings({"input_ids": ids}, binds)
            for b in binds:
                b.set_logical_shape((1, heads, past, dim))

        feeds = {"input_ids": ids}
        feeds.update((f"past_{k}_{i}", kv) for i in range(cfg.layers) for k in ("key", "value"))
        bound_step()
        session.run(feeds)  # warm both paths
        row = {"past": past,
               "bound_ms": _median_ms(bound_step, tokens, provider.synchronize),
               "plain_ms": _median_ms(lambda feeds=feeds: session.run(feeds), tokens),
               "bound_kv_ms": _kv_update_ms(session, bound_step),
               "plain_kv_ms": _kv_update_ms(session, lambda feeds=feeds: session.run(feeds))}
        if eager is not None:
            eager.load_past(kv)
            eager.step(ids)
            row["torch_eager_ms"] = _median_ms(lambda: eager.step(ids), tokens, eager.sync)
        rows.append(row)
    return rows


def _kv_update_ms(session: ok.InferenceSession, step, repeat: int = 3) -> float:
    """Time per step spent in Concat nodes (the KV-cache updates; the graph's other Concats
    build small shapes), from a trace: the in-place append vs concatenating the past."""
    ctx = ok.TraceContext.in_memory()
    session.set_trace_context(ctx)
    try:
        for _ in range(repeat):
            step()
    finally:
        session.set_trace_context(ok.TraceContext.disabled())
    spans = [sp for sp in ctx.spans if sp.attributes.get("op_type") == "Concat"]
    return sum(sp.duration_ns for sp in spans) / repeat / 1e6


class _TorchGpt:
    """The same decoder step written directly in torch (eager), on the zoo model's weights."""

    def __init__(self, model, cfg: zoo.GptConfig, device: str) -> None:
        import torch
        from onnx import numpy_helper

        self.torch, self.cfg = torch, cfg
        self.dev = torch.device(device if device != "auto" else "cuda")
        self.w = {t.name: torch.from_numpy(numpy_helper.to_array(t).copy()).to(self.dev)
                  for t in model.graph.initializer}

    def load_past(self, kv: np.ndarray) -> None:
        t = self.torch.from_numpy(kv).to(self.dev)
        self.past = [(t.clone(), t.clone()) for _ in range(self.cfg.layers)]

    def sync(self) -> None:
        self.torch.cuda.synchronize(self.dev)

    def step(self, ids: np.ndarray):
        torch, w, cfg = self.torch, self.w, self.cfg
        f = torch.nn.functional
        nh, dh = cfg.heads, cfg.hidden // cfg.heads
        with torch.inference_mode():
            past_len = self.past[0][0].shape[2]
            tok = torch.from_numpy(ids).to(self.dev)
            x = w["transformer.wte.weight"][tok] + w["transformer.wpe.weight"][past_len]
            for i in range(cfg.layers):
                p = f"transformer.h.{i}"
                a = f.layer_norm(x, (cfg.hidden,), w[f"{p}.ln_1.weight"], w[f"{p}.ln_1.bias"],
                                 cfg.eps)
                qkv = a @ w[f"{p}.attn.c_attn.weight"] + w[f"{p}.attn.c_attn.bias"]
                q, k, v = (t.view(1, 1, nh, dh).transpose(1, 2) for t in qkv.split(cfg.hidden, 2))
                k = torch.cat([self.past[i][0], k], 2)
                v = torch.cat([self.past[i][1], v], 2)
                ctx = f.scaled_dot_product_attention(q, k, v)
                ctx = ctx.transpose(1, 2).reshape(1, 1, cfg.hidden)
                x = x + ctx @ w[f"{p}.attn.c_proj.weight"] + w[f"{p}.attn.c_proj.bias"]
                m = f.layer_norm(x, (cfg.hidden,), w[f"{p}.ln_2.weight"], w[f"{p}.ln_2.bias"],
                                 cfg.eps)
                m = f.gelu(m @ w[f"{p}.mlp.c_fc.weight"] + w[f"{p}.mlp.c_fc.bias"],
                           approximate="tanh")
                x = x + m @ w[f"{p}.mlp.c_proj.weight"] + w[f"{p}.mlp.c_proj.bias"]
            x = f.layer_norm(x, (cfg.hidden,), w["transformer.ln_f.weight"],
                             w["transformer.ln_f.bias"], cfg.eps)
            return x @ w["transformer.wte.weight"].T


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--small", action="store_true", help="the test-size decoder")
    parser.add_argument("--past", type=int, nargs="+", default=[16, 64, 256, 1024])
    parser.add_argument("--tokens", type=int, default=10, help="steps timed per past length")
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    cfg = zoo.MODELS["gpt2"][1] if args.small else zoo.GptConfig.gpt2_small()
    if max(args.past) + 1 > cfg.max_positions:
        cfg = zoo.GptConfig(**{**cfg.__dict__, "max_positions": max(args.past) + 1})
    rows = measure(cfg, sorted(args.past), args.tokens, args.device)
    print(f"GPT decoder step ({cfg.layers} layers, hidden {cfg.hidden}), device {args.device}, "
          f"median of {args.tokens} steps per point; python {sys.version.split()[0]}")
    eager = "torch_eager_ms" in rows[0]
    header = (f"{'past':>6} {'bound ms':>9} {'tok/s':>7} {'kv ms':>7} {'plain ms':>9} "
              f"{'tok/s':>7} {'kv ms':>7}")
    print(header + (f" {'torch ms':>9} {'tok/s':>7}" if eager else ""))
    for r in rows:
        line = (f"{r['past']:>6} {r['bound_ms']:>9.2f} {1e3 / r['bound_ms']:>7.1f} "
                f"{r['bound_kv_ms']:>7.3f} {r['plain_ms']:>9.2f} {1e3 / r['plain_ms']:>7.1f} "
                f"{r['plain_kv_ms']:>7.3f}")
        if eager:
            line += f" {r['torch_eager_ms']:>9.2f} {1e3 / r['torch_eager_ms']:>7.1f}"
        print(line)
    first, last = rows[0], rows[-1]
    print(f"growth from past {first['past']} to {last['past']}: bound "
          f"{last['bound_ms'] / first['bound_ms']:.2f}x (KV update "
          f"{last['bound_kv_ms'] / first['bound_kv_ms']:.2f}x), plain "
          f"{last['plain_ms'] / first['plain_ms']:.2f}x (KV update "
          f"{last['plain_kv_ms'] / first['plain_kv_ms']:.2f}x); kv ms = time in the KV "
          "Concat nodes per step (traced); the rest of the growth is attention reading the past")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
