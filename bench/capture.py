"""Decode-step time with device-graph capture against eager runs and torch.

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

The modes run interleaved, step by step in a fresh random order, so drifting load on a shared
machine hits them alike. "ms/step" is the median over the steady steps (all but the first of
each decode loop; for replays all but the warm and the capture step); "first ms" is the first
step (specialisation).
Greedy tokens must agree across modes (the grow-* modes among themselves): a mismatch is
printed with the first differing step and the exit status is 1. A mode whose API is missing
or that fails prints its error in its row; the other modes still run.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import statistics
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
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


@dataclass
class Runner:
    """One mode, set up: `step(index, token, feeds) -> logits` (host), `reset()` before each
    decode loop, `sync()` after a step, the steps not counted as steady (`skip`), and
    `info()` for the report's notes."""

    step: Callable[[int, int, dict[str, np.ndarray]], Any]
    reset: Callable[[], None]
    sync: Callable[[], None] = lambda: None
    skip: int = 1
    info: Callable[[], dict] = dict


def _session(model: Any, device: str, memo: bool | None) -> ok.InferenceSession:
    builder = ok.InferenceSession.builder().device(device)
    if memo is False:
        builder = builder.option("decode.memo", "0")
    return builder.from_graph(model)


def _kv_bindings(session: ok.InferenceSession, cfg: zoo.GptConfig, capacity: int) -> list:
    nh, dh = cfg.heads, cfg.hidden // cfg.heads
    shape = (1, nh, capacity, dh)
    binds = [session.allocate_device_binding(f"past_{kv}_{i}", f"present_{kv}_{i}",
                                             ok.DataType.FLOAT, shape, shape)
             for i in range(cfg.layers) for kv in ("key", "value")]
    _reset(binds)
    return binds


def _reset(binds: list) -> None:
    """Zero the caches: masked slots are still read, so no stale NaN may be there."""
    for b in binds:
        b.set_logical_shape(b.physical_shape)
        b.write(np.zeros(b.physical_shape, np.float32))


def _sync_of(session: ok.InferenceSession) -> Callable[[], None]:
    return getattr(session._bindings.provider, "synchronize", None) or (lambda: None)


def mode_eager(model, cfg, capacity, device, memo: bool) -> Runner:
    """run_with_device_bindings: token/position/mask fed as inputs, the KV in bindings."""
    session = _session(model, device, memo)
    binds = _kv_bindings(session, cfg, capacity)

    def step(i, token, feeds):
        return session.run_with_device_bindings(feeds, binds)[0]

    return Runner(step, lambda: _reset(binds), _sync_of(session),
                  info=lambda: {"memo_counts": list(session.decode_memo_counts())})


def mode_replay(model, cfg, capacity, device) -> Runner:
    """Every input and output bound; step 0 eager (warm), step 1 captured, then replays."""
    session = _session(model, device, None)
    kv, ins, logits_b = zoo.static_decode_bindings(session, cfg, capacity)
    replayer = _Replayer(session, [*ins.values(), *kv, logits_b])

    def step(i, token, feeds):
        for name, b in ins.items():
            b.write(feeds[name])
        replayer.step(i)
        return logits_b.read()

    def reset():
        replayer.reset()
        _reset(kv)

    return Runner(step, reset, _sync_of(session), skip=2, info=replayer.info)


class _Replayer:
    """Step 0 eager (warm), step 1 try_capture_with_device_bindings, then replays; a
    retired graph is captured again on the next step."""

    def __init__(self, session: ok.InferenceSession, binds: list) -> None:
        self.session, self.binds = session, binds
        self.captured, self.captures, self.retired, self.segments = False, 0, 0, 0

    def step(self, i: int) -> None:
        s = self.session
        if self.captured:
            if not s.replay_device_graph(self.binds):
                self.captured, self.retired = False, self.retired + 1
        elif i == 0:
            s.run_with_device_bindings({}, self.binds)
        else:
            result = s.try_capture_with_device_bindings({}, self.binds)
            if not result.captured:
                raise RuntimeError(f"NotCapturable: {result}")
            self.captured, self.captures = True, self.captures + 1
            self.segments = s.captured_graph_segment_count()

    def reset(self) -> None:
        self.session.reset_device_graph()
        self.captured = False

    def info(self) -> dict:
        error = self.session.check_device_capture_error()
        if error:
            raise RuntimeError(f"check_device_capture_error() = {error:#x} (a capture-safe "
                               "kernel clamped an index or a write)")
        return {"capture_error": error, "segments": self.segments, "captures": self.captures,
                "retired": self.retired}


def mode_grow(cfg, capacity, device, capture: bool) -> Runner:
    """The growing-KV decoder: eager (decode.memo=0, input_ids fed) or replayed from a
    segmented capture (input_ids and logits bound)."""
    session = _session(zoo.gpt_decoder_step(cfg), device, None if capture else False)
    nh, dh = cfg.heads, cfg.hidden // cfg.heads
    kv = [session.allocate_device_binding(f"past_{kv}_{i}", f"present_{kv}_{i}",
                                          ok.DataType.FLOAT, (1, nh, capacity, dh),
                                          (1, nh, 0, dh))
          for i in range(cfg.layers) for kv in ("key", "value")]
    ids = session.allocate_device_binding("input_ids", None, ok.DataType.INT64, (1, 1), (1, 1))
    logits_b = session.allocate_device_output_binding("logits", ok.DataType.FLOAT,
                                                      (1, 1, cfg.vocab), (1, 1, cfg.vocab))
    replayer = _Replayer(session, [*kv, ids, logits_b])

    def step(i, token, feeds):
        if not capture:
            return session.run_with_device_bindings({"input_ids": feeds["input_ids"]}, kv)[0]
        ids.write(feeds["input_ids"])
        replayer.step(i)
        return logits_b.read()

    def reset():
        replayer.reset()
        for b in kv:
            b.set_logical_shape((1, nh, 0, dh))

    return Runner(step, reset, _sync_of(session), skip=2 if capture else 1,
                  info=replayer.info if capture else dict)


def mode_torch(model, cfg, capacity, device, graph: bool) -> Runner:
    """The plain-torch reference, eager or replayed from a torch.cuda.CUDAGraph."""
    ref = TorchStaticGpt(model, cfg, capacity, "cuda" if device.startswith("cuda") else "cpu")
    if graph:
        ref.capture()

    def step(i, token, feeds):
        return _host(ref.step(feeds["input_ids"], feeds["position"], feeds["attention_mask"]))

    return Runner(step, ref.reset, ref.sync)


# --- driver ---------------------------------------------------------------------------------


def measure(cfg: zoo.GptConfig, capacity: int, steps: int, device: str, repeat: int = 1,
            modes: tuple[str, ...] = MODES, seed: int = 0) -> dict:
    """Every mode's result: {mode: {"tokens", "ms", "first_ms", ...} or {"error": text}}.

    The modes run interleaved: each decode step is taken by every mode in a fresh random
    order before the next step, so drifting load on a shared machine hits all modes alike.
    """
    if steps > min(capacity, cfg.max_positions):
        raise SystemExit(f"--steps {steps} exceeds the capacity {capacity} or the model's "
                         f"max_positions {cfg.max_positions}")
    on_cuda = device.startswith("cuda")
    model = zoo.gpt_static_decoder_step(cfg, capacity=capacity)
    makers: dict[str, Callable[[], Runner]] = {
        "eager": lambda: mode_eager(model, cfg, capacity, device, memo=False),
        "memo": lambda: mode_eager(model, cfg, capacity, device, memo=True),
        "replay": lambda: mode_replay(model, cfg, capacity, device),
        "torch": lambda: mode_torch(model, cfg, capacity, device, graph=False),
        "torch-cg": lambda: mode_torch(model, cfg, capacity, device, graph=True),
        "grow-eager": lambda: mode_grow(cfg, capacity, device, capture=False),
        "grow-replay": lambda: mode_grow(cfg, capacity, device, capture=True),
    }
    results: dict[str, dict] = {}
    runners: dict[str, Runner] = {}
    for mode in modes:
        if mode == "torch-cg" and not on_cuda:
            continue
        try:
            runners[mode] = makers[mode]()
        except Exception as e:  # a missing API or a failing mode is reported, not fatal
            results[mode] = {"error": _describe(e)}
    rng = random.Random(seed)
    times: dict[str, list[list[float]]] = {m: [] for m in runners}
    seen: dict[str, tuple[list[int], list[np.ndarray]]] = {}
    for r in range(repeat):
        tokens = dict.fromkeys(runners, FIRST_TOKEN % cfg.vocab)
        got: dict[str, tuple[list[int], list[np.ndarray]]] = {m: ([], []) for m in runners}
        for m in runners:
            times[m].append([])
            if r:
                runners[m].reset()
        for i in range(steps):
            order = list(runners)
            rng.shuffle(order)
            for m in order:
                _timed_step(m, runners, i, tokens, got, times, capacity, results)
        for m in list(runners):
            if r == 0:
                seen[m] = got[m]
            elif got[m][0] != seen[m][0]:
                results[m] = {"error": f"repeat {r} produced other tokens than repeat 0"}
                del runners[m]
    for m, runner in runners.items():
        steady = [t for loop in times[m] for t in loop[runner.skip:]] or times[m][0][-1:]
        try:
            extra = runner.info()
        except Exception as e:
            results[m] = {"error": _describe(e)}
            continue
        results[m] = {"tokens": seen[m][0], "logits": seen[m][1],
                      "ms": statistics.median(steady), "first_ms": times[m][0][0],
                      "second_ms": times[m][0][min(1, len(times[m][0]) - 1)], **extra}
    return {m: results[m] for m in modes if m in results}


def _timed_step(m: str, runners: dict[str, Runner], i: int, tokens: dict[str, int],
                got: dict, times: dict, capacity: int, results: dict) -> None:
    """Mode m's step i (its feeds from its own previous token); a failure drops the mode."""
    runner = runners.get(m)
    if runner is None:
        return
    try:
        start = time.perf_counter()
        feeds = zoo.static_decode_feeds(i, tokens[m], capacity)
        logits = runner.step(i, tokens[m], feeds)
        tokens[m] = _argmax(logits)
        runner.sync()
        times[m][-1].append((time.perf_counter() - start) * 1e3)
    except Exception as e:
        results[m] = {"error": _describe(e)}
        del runners[m]
        return
    got[m][0].append(tokens[m])
    got[m][1].append(np.asarray(logits).reshape(-1))


def _describe(e: Exception) -> str:
    where = traceback.extract_tb(e.__traceback__)[-1] if e.__traceback__ else None
    text = str(e).splitlines()[0] if str(e) else ""
    at = f" [{Path(where.filename).name}:{where.lineno}]" if where else ""
    return f"{type(e).__name__}: {text}{at}"


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
