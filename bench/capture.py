"""Decode-step time with device-graph capture (SPEC §7) against eager runs and torch.

    python bench/capture.py                        # the zoo's small GPT, CPU, capacity 128
    python bench/capture.py --small                # quick: capacity 16, 3 steps
    python bench/capture.py --device cuda --gpt2 --steps 100
    python bench/capture.py --steps 20 --repeat 3 --json out.json

The model is `zoo.gpt_static_decoder_step`: fixed-capacity KV buffers, every shape static, the
new key/value scattered in at `position`. Each mode runs the same greedy decode (one token per
step from the same first token) and times every step end to end: new inputs in, the step, the
logits back on the host, argmax. Modes:

  eager    onnxkiln run_with_device_bindings, KV in bindings, option decode.memo=0
  memo     the same with default options (the decode memo on)
  replay   onnxkiln device-graph capture: every input and output bound; the first step runs
           eagerly (warm), the second is try_capture_with_device_bindings, then
           replay_device_graph after binding.write() of the new token/position/mask
  torch    the same computation written in plain torch (TorchStaticGpt), eager
  torch-cg that forward recorded in a torch.cuda.CUDAGraph (CUDA only), inputs .copy_()'d in
  grow-eager / grow-replay   the growing-KV model (`zoo.gpt_decoder_step`, same weights: the
           KV appended in place each step) eagerly, and replayed from a segmented capture
           (the cache-length-dependent nodes run as seams between recorded segments)

"ms/step" is the median over the steady steps (all but the first of each decode loop; for
replay all but the warm and the capture step); "first ms" is the first step (specialisation).
Greedy tokens must agree across modes (the grow-* modes among themselves): a mismatch is
printed with the first differing step and the exit status is 1. A mode whose API is missing
or that fails prints its error in its row; the other modes still run.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

if __package__ in (None, ""):  # run as a script: make `onnxkiln` importable from src/
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))

import onnxkiln as ok
from onnxkiln import zoo

FIRST_TOKEN = 464
MODES = ("eager", "memo", "replay", "torch", "torch-cg", "grow-eager", "grow-replay")


# --- torch reference ------------------------------------------------------------------------


class TorchStaticGpt:
    """`zoo.gpt_static_decoder_step` written in plain torch, on the weights of its ModelProto.

    The KV caches are persistent [1, heads, capacity, head_dim] tensors; a step writes the new
    key/value at `position` with `index_copy_` and attends over the whole capacity under the
    additive mask. `step(ids, position, mask)` copies host values into static input tensors
    and runs the forward (eager); after `capture()` (CUDA) it replays a torch.cuda.CUDAGraph of
    the forward instead. Returns the logits [1, 1, vocab] as a torch tensor on the device.
    """

    def __init__(self, model: Any, cfg: zoo.GptConfig, capacity: int,
                 device: str = "cpu") -> None:
        import torch
        from onnx import numpy_helper

        self.torch, self.cfg, self.capacity = torch, cfg, capacity
        self.dev = torch.device(device)
        self.w = {t.name: torch.from_numpy(numpy_helper.to_array(t).copy()).to(self.dev)
                  for t in model.graph.initializer}
        self.w["lm_head"] = self.w["transformer.wte.weight"].t().contiguous()
        nh, dh = cfg.heads, cfg.hidden // cfg.heads
        shape = (1, nh, capacity, dh)
        self.keys = [torch.zeros(shape, device=self.dev) for _ in range(cfg.layers)]
        self.values = [torch.zeros(shape, device=self.dev) for _ in range(cfg.layers)]
        self.ids = torch.zeros((1, 1), dtype=torch.int64, device=self.dev)
        self.pos = torch.zeros((1,), dtype=torch.int64, device=self.dev)
        self.mask = torch.zeros((1, capacity), dtype=torch.float32, device=self.dev)
        self.graph: Any = None
        self.out: Any = None

    def reset(self) -> None:
        """Zero the caches in place (a captured graph keeps pointing at them)."""
        for t in (*self.keys, *self.values):
            t.zero_()

    def sync(self) -> None:
        if self.dev.type == "cuda":
            self.torch.cuda.synchronize(self.dev)

    def forward(self) -> Any:
        """One decode step on the static inputs (self.ids, self.pos, self.mask)."""
        torch, w, cfg = self.torch, self.w, self.cfg
        f = torch.nn.functional
        h, nh = cfg.hidden, cfg.heads
        dh = h // nh
        with torch.no_grad():
            x = w["transformer.wte.weight"][self.ids] + w["transformer.wpe.weight"][self.pos]
            mask = self.mask.view(1, 1, 1, self.capacity)
            for i in range(cfg.layers):
                p = f"transformer.h.{i}"
                a = f.layer_norm(x, (h,), w[f"{p}.ln_1.weight"], w[f"{p}.ln_1.bias"], cfg.eps)
                qkv = a @ w[f"{p}.attn.c_attn.weight"] + w[f"{p}.attn.c_attn.bias"]
                q, k, v = (t.view(1, 1, nh, dh).transpose(1, 2) for t in qkv.split(h, 2))
                self.keys[i].index_copy_(2, self.pos, k)
                self.values[i].index_copy_(2, self.pos, v)
                scores = q @ self.keys[i].transpose(2, 3) / math.sqrt(dh) + mask
                ctx = torch.softmax(scores, dim=-1) @ self.values[i]
                ctx = ctx.transpose(1, 2).reshape(1, 1, h)
                x = x + ctx @ w[f"{p}.attn.c_proj.weight"] + w[f"{p}.attn.c_proj.bias"]
                m = f.layer_norm(x, (h,), w[f"{p}.ln_2.weight"], w[f"{p}.ln_2.bias"], cfg.eps)
                m = f.gelu(m @ w[f"{p}.mlp.c_fc.weight"] + w[f"{p}.mlp.c_fc.bias"],
                           approximate="tanh")
                x = x + m @ w[f"{p}.mlp.c_proj.weight"] + w[f"{p}.mlp.c_proj.bias"]
            x = f.layer_norm(x, (h,), w["transformer.ln_f.weight"], w["transformer.ln_f.bias"],
                             cfg.eps)
            return x @ w["lm_head"]

    def _load(self, ids: np.ndarray, position: np.ndarray, mask: np.ndarray) -> None:
        torch = self.torch
        self.ids.copy_(torch.from_numpy(ids), non_blocking=True)
        self.pos.copy_(torch.from_numpy(position), non_blocking=True)
        self.mask.copy_(torch.from_numpy(mask), non_blocking=True)

    def step(self, ids: np.ndarray, position: np.ndarray, mask: np.ndarray) -> Any:
        """Copy the new inputs in, run one step (graph replay once captured)."""
        self._load(ids, position, mask)
        if self.graph is None:
            return self.forward()
        self.graph.replay()
        return self.out

    def capture(self, warmup: int = 3) -> None:
        """Record the forward in a torch.cuda.CUDAGraph (warm on a side stream first, as
        torch asks); the caches are zeroed afterwards."""
        torch = self.torch
        if self.dev.type != "cuda":
            raise RuntimeError("CUDA graphs need a CUDA device")
        side = torch.cuda.Stream(self.dev)
        side.wait_stream(torch.cuda.current_stream(self.dev))
        with torch.cuda.stream(side):
            for _ in range(warmup):
                self.forward()
        torch.cuda.current_stream(self.dev).wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.out = self.forward()
        self.sync()
        self.reset()


# --- decode loops ---------------------------------------------------------------------------


def _argmax(logits: Any) -> int:
    return int(np.asarray(logits).reshape(-1).argmax())


def _host(t: Any) -> np.ndarray:
    return t.detach().cpu().numpy() if hasattr(t, "detach") else np.asarray(t)


class _Loop:
    """Times a greedy decode: `step(index, token) -> logits (host)` per step."""

    def __init__(self, steps: int, capacity: int, sync: Callable[[], None]) -> None:
        self.steps, self.capacity, self.sync = steps, capacity, sync

    def run(self, step: Callable[[int, int, dict[str, np.ndarray]], np.ndarray],
            first_token: int) -> tuple[list[int], list[float], list[np.ndarray]]:
        tokens, times, logits_seen = [], [], []
        token = first_token
        for i in range(self.steps):
            start = time.perf_counter()
            feeds = zoo.static_decode_feeds(i, token, self.capacity)
            logits = step(i, token, feeds)
            token = _argmax(logits)
            self.sync()
            times.append((time.perf_counter() - start) * 1e3)
            tokens.append(token)
            logits_seen.append(np.asarray(logits).reshape(-1))
        return tokens, times, logits_seen


def _session(model: Any, device: str, memo: bool | None) -> tuple[ok.InferenceSession, str]:
    builder = ok.InferenceSession.builder().device(device)
    note = ""
    if memo is False:
        from onnxkiln.options import KNOWN_OPTIONS

        if "decode.memo" in KNOWN_OPTIONS:
            builder = builder.option("decode.memo", "0")
        else:
            note = "decode.memo option not available yet: built with default options"
    return builder.from_graph(model), note


def _kv_bindings(session: ok.InferenceSession, cfg: zoo.GptConfig, capacity: int) -> list:
    nh, dh = cfg.heads, cfg.hidden // cfg.heads
    shape = (1, nh, capacity, dh)
    zeros = np.zeros(shape, np.float32)
    binds = []
    for i in range(cfg.layers):
        for kv in ("key", "value"):
            b = session.allocate_device_binding(f"past_{kv}_{i}", f"present_{kv}_{i}",
                                                ok.DataType.FLOAT, shape, shape)
            b.write(zeros)  # masked slots are still read: no uninitialised NaN may be there
            binds.append(b)
    return binds


def _reset(binds: list) -> None:
    for b in binds:
        b.set_logical_shape(b.physical_shape)
        b.write(np.zeros(b.physical_shape, np.float32))


def _sync_of(session: ok.InferenceSession) -> Callable[[], None]:
    provider = session._bindings.provider
    return getattr(provider, "synchronize", None) or (lambda: None)


def mode_eager(model, cfg, capacity, steps, device, repeat, memo: bool) -> dict:
    """run_with_device_bindings: token/position/mask fed as inputs, the KV in bindings."""
    session, note = _session(model, device, memo)
    binds = _kv_bindings(session, cfg, capacity)

    def step(i, token, feeds):
        return session.run_with_device_bindings(feeds, binds)[0]

    loop = _Loop(steps, capacity, _sync_of(session))
    result = _repeat(loop, step, repeat, lambda: _reset(binds), cfg.vocab)
    if note:
        result["note"] = note
    counts = getattr(session, "decode_memo_counts", None)
    if counts is not None:
        result["memo_counts"] = list(counts())
    return result


def mode_replay(model, cfg, capacity, steps, device, repeat) -> dict:
    """Every input and output bound; step 0 eager, step 1 captured, then replays."""
    session, _ = _session(model, device, None)
    vocab = cfg.vocab
    kv = _kv_bindings(session, cfg, capacity)
    ins = {
        "input_ids": session.allocate_device_binding("input_ids", None, ok.DataType.INT64,
                                                     (1, 1), (1, 1)),
        "position": session.allocate_device_binding("position", None, ok.DataType.INT64,
                                                    (1,), (1,)),
        "attention_mask": session.allocate_device_binding(
            "attention_mask", None, ok.DataType.FLOAT, (1, capacity), (1, capacity)),
    }
    logits_b = session.allocate_device_output_binding("logits", ok.DataType.FLOAT,
                                                      (1, 1, vocab), (1, 1, vocab))
    binds = [*ins.values(), *kv, logits_b]
    for name in ("try_capture_with_device_bindings", "replay_device_graph"):
        if not hasattr(session, name):
            raise NotImplementedError(f"InferenceSession.{name} does not exist yet "
                                      "(capture API not landed)")
    state = {"captured": False, "retired": 0, "segments": 0, "recaptures": 0}

    def step(i, token, feeds):
        for name, b in ins.items():
            b.write(feeds[name])
        if state["captured"]:
            if not session.replay_device_graph(binds):
                state["captured"] = False
                state["retired"] += 1
        elif i == 0 and not state.get("warm"):
            session.run_with_device_bindings({}, binds)  # warm eager step before capture
            state["warm"] = True
        else:
            result = session.try_capture_with_device_bindings({}, binds)
            if not result.captured:
                declines = "; ".join(f"{d.op_type} {d.node_id}: {d.reason}"
                                     for d in getattr(result, "declines", [])[:5])
                raise RuntimeError(f"NotCapturable: {declines or result!r}")
            state["recaptures"] += 1
            state["captured"] = True
            state["segments"] = session.captured_graph_segment_count()
        return logits_b.read()

    loop = _Loop(steps, capacity, _sync_of(session))
    result = _repeat(loop, step, repeat, lambda: _reset(kv), vocab, skip=2)
    check = getattr(session, "check_device_capture_error", None)
    result["capture_error"] = int(check()) if check is not None else None
    result["segments"] = state["segments"]
    result["captures"] = state["recaptures"]
    result["retired"] = state["retired"]
    if result["capture_error"]:
        raise RuntimeError(f"check_device_capture_error() = {result['capture_error']:#x} "
                           "(a capture-safe kernel clamped an index or a write)")
    return result


def mode_grow(cfg, capacity, steps, device, repeat, capture: bool) -> dict:
    """The growing-KV decoder: eager (decode.memo=0, input_ids fed) or replayed from a
    segmented capture (input_ids and logits bound; the first step eager, the second
    captured)."""
    session, _ = _session(zoo.gpt_decoder_step(cfg), device, None if capture else False)
    nh, dh = cfg.heads, cfg.hidden // cfg.heads
    kv = [session.allocate_device_binding(f"past_{kv}_{i}", f"present_{kv}_{i}",
                                          ok.DataType.FLOAT, (1, nh, capacity, dh),
                                          (1, nh, 0, dh))
          for i in range(cfg.layers) for kv in ("key", "value")]
    ids = session.allocate_device_binding("input_ids", None, ok.DataType.INT64, (1, 1), (1, 1))
    logits_b = session.allocate_device_output_binding("logits", ok.DataType.FLOAT,
                                                      (1, 1, cfg.vocab), (1, 1, cfg.vocab))
    binds = [*kv, ids, logits_b]
    state = {"captured": False, "segments": 0, "retired": 0}

    def step(i, token, feeds):
        if not capture:
            return session.run_with_device_bindings({"input_ids": feeds["input_ids"]}, kv)[0]
        ids.write(feeds["input_ids"])
        if state["captured"]:
            if not session.replay_device_graph(binds):
                state["captured"], state["retired"] = False, state["retired"] + 1
        elif i == 0:
            session.run_with_device_bindings({}, binds)  # warm eager step before capture
        else:
            if not session.try_capture_with_device_bindings({}, binds).captured:
                raise RuntimeError("NotCapturable")
            state["captured"] = True
            state["segments"] = session.captured_graph_segment_count()
        return logits_b.read()

    def reset():
        session.reset_device_graph()
        state["captured"] = False
        for b in kv:
            b.set_logical_shape((1, nh, 0, dh))

    result = _repeat(_Loop(steps, capacity, _sync_of(session)), step, repeat, reset, cfg.vocab,
                     skip=2 if capture else 1)
    if capture:
        result.update(segments=state["segments"], retired=state["retired"],
                      capture_error=session.check_device_capture_error())
    return result


def mode_torch(model, cfg, capacity, steps, device, repeat, graph: bool) -> dict:
    """The plain-torch reference, eager or replayed from a torch.cuda.CUDAGraph."""
    ref = TorchStaticGpt(model, cfg, capacity, "cuda" if device.startswith("cuda") else "cpu")
    if graph:
        ref.capture()

    def step(i, token, feeds):
        return _host(ref.step(feeds["input_ids"], feeds["position"], feeds["attention_mask"]))

    return _repeat(_Loop(steps, capacity, ref.sync), step, repeat, ref.reset, cfg.vocab)


def _repeat(loop: _Loop, step, repeat: int, reset: Callable[[], None], vocab: int,
            skip: int = 1) -> dict:
    """Run the loop `repeat` times (reset between); the median over the steps after the first
    `skip` of each loop (the warm and capture steps), the first step's time apart."""
    first_token = FIRST_TOKEN % vocab
    tokens, steady, first, second, logits = None, [], [], [], None
    for r in range(repeat):
        if r:
            reset()
        got, times, seen = loop.run(step, first_token)
        if tokens is None:
            tokens, logits = got, seen
        elif got != tokens:
            raise RuntimeError(f"repeat {r} produced other tokens than repeat 0: {got} vs "
                               f"{tokens}")
        first.append(times[0])
        second.append(times[min(1, len(times) - 1)])
        steady.extend(times[skip:] or times[-1:])
    return {"tokens": tokens, "ms": statistics.median(steady), "first_ms": first[0],
            "second_ms": second[0], "logits": logits}


# --- driver ---------------------------------------------------------------------------------


def measure(cfg: zoo.GptConfig, capacity: int, steps: int, device: str, repeat: int = 1,
            modes: tuple[str, ...] = MODES) -> dict:
    """Every mode's result: {mode: {"tokens", "ms", "first_ms", ...} or {"error": text}}."""
    if steps > min(capacity, cfg.max_positions):
        raise SystemExit(f"--steps {steps} exceeds the capacity {capacity} or the model's "
                         f"max_positions {cfg.max_positions}")
    on_cuda = device.startswith("cuda")
    model = zoo.gpt_static_decoder_step(cfg, capacity=capacity)
    runners: dict[str, Callable[[], dict]] = {
        "eager": lambda: mode_eager(model, cfg, capacity, steps, device, repeat, memo=False),
        "memo": lambda: mode_eager(model, cfg, capacity, steps, device, repeat, memo=True),
        "replay": lambda: mode_replay(model, cfg, capacity, steps, device, repeat),
        "torch": lambda: mode_torch(model, cfg, capacity, steps, device, repeat, graph=False),
        "torch-cg": lambda: mode_torch(model, cfg, capacity, steps, device, repeat, graph=True),
        "grow-eager": lambda: mode_grow(cfg, capacity, steps, device, repeat, capture=False),
        "grow-replay": lambda: mode_grow(cfg, capacity, steps, device, repeat, capture=True),
    }
    results = {}
    for mode in modes:
        if mode == "torch-cg" and not on_cuda:
            continue
        try:
            results[mode] = runners[mode]()
        except Exception as e:  # a missing API or a failing mode is reported, not fatal
            where = traceback.extract_tb(e.__traceback__)[-1]
            text = str(e).splitlines()[0] if str(e) else ""
            results[mode] = {"error": f"{type(e).__name__}: {text} "
                                      f"[{Path(where.filename).name}:{where.lineno}]"}
    return results


def compare_tokens(results: dict) -> list[str]:
    """Mismatch descriptions (empty: the modes of each model produced the same tokens)."""
    problems = []
    for grow in (False, True):
        ran = [(m, r) for m, r in results.items()
               if "tokens" in r and m.startswith("grow-") == grow]
        if not ran:
            continue
        base_mode, base = ran[0]
        for mode, r in ran[1:]:
            if r["tokens"] == base["tokens"]:
                continue
            i = next(j for j, (a, b) in enumerate(zip(r["tokens"], base["tokens"])) if a != b)
            top = np.sort(base["logits"][i])[-2:]
            diff = float(np.abs(r["logits"][i] - base["logits"][i]).max())
            problems.append(
                f"TOKEN MISMATCH: {mode} differs from {base_mode} first at step {i} "
                f"({r['tokens'][i]} vs {base['tokens'][i]}); {base_mode}'s top-2 logit "
                f"margin there {float(top[1] - top[0]):.3g}, max |logit diff| {diff:.3g}")
    return problems


def _config(args: argparse.Namespace) -> zoo.GptConfig:
    if args.gpt2:
        return zoo.GptConfig.gpt2_small()
    return zoo.MODELS["gpt2"][1]


def report(results: dict, device: str, cfg: zoo.GptConfig, capacity: int, steps: int,
           repeat: int) -> dict:
    """Print the table; returns the JSON-able summary."""
    on_cuda = device.startswith("cuda")
    print(f"GPT static decode step ({cfg.layers} layers, hidden {cfg.hidden}, vocab {cfg.vocab}), "
          f"capacity {capacity}, {steps} steps x {repeat}, device {device}; "
          f"python {sys.version.split()[0]}")
    base = results.get("eager", {}).get("ms")
    print(f"{'mode':<9} {'ms/step':>9} {'tok/s':>8} {'vs eager':>9} {'first ms':>9}  notes")
    summary: dict[str, Any] = {"device": device, "capacity": capacity, "steps": steps,
                               "repeat": repeat, "config": dict(cfg.__dict__), "modes": {}}
    for mode, r in results.items():
        if "error" in r:
            print(f"{mode:<9} {'-':>9} {'-':>8} {'-':>9} {'-':>9}  FAILED: {r['error']}")
            summary["modes"][mode] = {"error": r["error"]}
            continue
        notes = []
        if r.get("note"):
            notes.append(r["note"])
        if "memo_counts" in r:
            notes.append("memo (primed, rebuilt, replayed, ineligible) = "
                         f"{tuple(r['memo_counts'])}")
        if mode == "grow-replay":
            notes.append(f"segments {r['segments']}, retired {r['retired']}, capture error "
                         f"{r['capture_error']}")
        if mode == "replay":
            notes.append(f"capture step {r['second_ms']:.2f} ms, segments {r['segments']}, "
                         f"captures {r['captures']}, retired {r['retired']}, capture error "
                         f"{r['capture_error']}")
        ref = results.get("grow-eager", {}).get("ms") if mode.startswith("grow-") else base
        ratio = f"{r['ms'] / ref:.2f}x" if ref else "-"
        print(f"{mode:<9} {r['ms']:>9.3f} {1e3 / r['ms']:>8.1f} {ratio:>9} "
              f"{r['first_ms']:>9.2f}  {'; '.join(notes)}")
        summary["modes"][mode] = {k: v for k, v in r.items() if k != "logits"}
    ms = {m: r["ms"] for m, r in results.items() if "ms" in r}
    ratios = {f"{m}/eager": ms[m] / ms["eager"] for m in ms
              if m != "eager" and "eager" in ms and not m.startswith("grow-")}
    if "grow-eager" in ms and "grow-replay" in ms:
        ratios["grow-replay/grow-eager"] = ms["grow-replay"] / ms["grow-eager"]
        print(f"growing KV: replay vs eager {ratios['grow-replay/grow-eager']:.2f}x")
    for mode in ("eager", "memo", "replay"):
        for ref, label in (("torch-cg", "torch CUDA graph"), ("torch", "torch eager")):
            if mode in ms and ref in ms:
                ratios[f"{mode}/{ref}"] = ms[mode] / ms[ref]
                if on_cuda and (mode == "replay" or ref == "torch"):
                    target = (" (target <= 1.2x: " + (
                        "met)" if ratios[f"{mode}/{ref}"] <= 1.2 else "MISSED)")
                    ) if (mode, ref) == ("replay", "torch-cg") else ""
                    print(f"onnxkiln {mode} vs {label}: {ratios[f'{mode}/{ref}']:.2f}x{target}")
    if "torch-cg" in ms and "torch" in ms:
        ratios["torch/torch-cg"] = ms["torch"] / ms["torch-cg"]
    summary["ratios"] = ratios
    problems = compare_tokens(results)
    summary["tokens_match"] = not problems
    for line in problems:
        print(line)
    if not problems:
        ran = [m for m in results if "tokens" in results[m]]
        print(f"tokens match across {', '.join(ran)}: {results[ran[0]]['tokens'][:12]}"
              f"{' ...' if steps > 12 else ''}" if ran else "no mode ran")
    return summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu", help="cpu | cuda | cuda:N")
    parser.add_argument("--gpt2", action="store_true", help="GPT-2-small sizes")
    parser.add_argument("--small", action="store_true",
                        help="quick check: the small model, capacity 16, 3 steps")
    parser.add_argument("--capacity", type=int, default=None, help="KV capacity (default 128)")
    parser.add_argument("--steps", type=int, default=None, help="decode steps (default 50)")
    parser.add_argument("--repeat", type=int, default=1, help="decode loops per mode")
    parser.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES))
    parser.add_argument("--json", help="write the numbers to this file")
    args = parser.parse_args(argv)
    capacity = args.capacity or (16 if args.small else 128)
    steps = args.steps or (3 if args.small else 50)
    cfg = _config(args)
    if args.device.startswith("cuda"):
        import torch

        if not torch.cuda.is_available():
            print("no CUDA device visible to torch")
            return 1
    results = measure(cfg, capacity, steps, args.device, max(1, args.repeat), tuple(args.modes))
    summary = report(results, args.device, cfg, capacity, steps, max(1, args.repeat))
    if args.json:
        Path(args.json).write_text(json.dumps(summary, indent=2))
    ran = any("tokens" in r for r in results.values())
    return 0 if summary["tokens_match"] and ran else 1


if __name__ == "__main__":
    raise SystemExit(main())
