"""Greedy decode throughput on real exported decoders: onnxkiln against onnxruntime and
onnxruntime-genai.

    python bench/decode_real.py                          # builder llama/qwen2/phi3 fp32+int4,
                                                         # and a torch.onnx.export of GPT-2
    python bench/decode_real.py --models llama-fp32 gpt2-export --tokens 32 --rounds 3
    python bench/decode_real.py --device cuda --json out.json     # on a GPU

Models: onnxruntime-genai builder graphs from random-weight configs (`bench.genai_models`:
GroupQueryAttention with rotary inside, MatMulNBits for int4) and a transformers GPT-2 with
random weights exported by `torch.onnx.export` with its past key values (Concat KV,
attention_mask and position_ids inputs); each folder has a genai_config.json.

Modes, each the same greedy decode of `--tokens` tokens after one prompt:

  ort-loop     onnxruntime, the plain Python loop (`bench.genai_models.greedy`, timed)
  og           onnxruntime-genai's Generator driven with token ids
  ok-plain     onnxkiln, the same plain loop through `run`
  ok-plain-cold  the same on a new session each round (created before the timed call): no
               specialisation from an earlier round's identical signatures, as a loop at a
               prompt length the session has not seen runs
  ok-bound     onnxkiln.generate path="bound", option decode.memo=0 (KV bindings only)
  ok-memo      onnxkiln.generate path="bound" (KV bindings and the decode memo)
  ok-captured  onnxkiln.generate path="captured" (the step captured once, then replayed)
  ok-generate  onnxkiln.generate with its defaults (path="auto")

"tok/s" is decode throughput: one over the median time of the steps after the first token
(run, argmax, feeding back; the median because a shared machine preempts some steps for
milliseconds); "e2e tok/s" all tokens over the whole call (prompt included). The
modes run interleaved (A, B, C ... then again, each round in a rotated order, with a short
pause before each call so one engine's spinning threads do not steal the next one's cores);
the table gives the median over rounds, at each --threads count for every engine. Tokens of
every mode are compared with ort-loop's; a mismatch is flagged. The machine may be shared:
the load average is printed, read the numbers as rough and prefer the ratios.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

if __package__ in (None, ""):  # run as a script: make `bench` and `onnxkiln` importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))

import onnxkiln as ok
from bench import genai_models as gm
from onnxkiln.generation import generate

MODES = ("ort-loop", "og", "ok-plain", "ok-plain-cold", "ok-bound", "ok-memo", "ok-captured",
         "ok-generate")
DEFAULT_MODELS = ("llama-fp32", "llama-int4", "qwen2-fp32", "qwen2-int4", "phi3-fp32",
                  "phi3-int4", "gpt2-export")
PROMPT = [5, 6, 7, 8, 9, 10, 11, 12]
GAP_S = 0.1


# --- models ---------------------------------------------------------------------------------


def export_gpt2(hidden: int, layers: int, vocab: int = 512, context: int = 256,
                seed: int = 0) -> Path:
    """A transformers GPT-2 (random weights) exported by torch.onnx.export with its past key
    values, plus a genai_config.json naming its inputs; built once, cached beside the
    builder folders."""
    out = gm.cache_root() / f"gpt2-export-h{hidden}-l{layers}-v{vocab}-c{context}-s{seed}"
    heads = max(hidden // 64, 2)
    if (out / "model.onnx").exists():
        _write_genai_config(out, layers, heads, hidden // heads, vocab, context)
        return out
    import torch
    import transformers as tf

    torch.manual_seed(seed)
    # a wide initializer: the default 0.02 gives near-tied logits, and then argmax follows
    # rounding noise instead of the model
    config = tf.GPT2Config(n_layer=layers, n_embd=hidden, n_head=heads,
                           vocab_size=vocab, n_positions=context, initializer_range=0.2,
                           bos_token_id=1, eos_token_id=2, pad_token_id=3)
    model = tf.GPT2LMHeadModel(config).eval()
    wrapper = _CacheWrapper(model, layers)
    past = [torch.randn(1, heads, 2, hidden // heads) for _ in range(2 * layers)]
    ids, mask = torch.tensor([[5, 6, 7]]), torch.ones(1, 5, dtype=torch.long)
    position = torch.arange(2, 5)[None]
    names = [f"past_key_values.{i}.{k}" for i in range(layers) for k in ("key", "value")]
    outputs = ["logits"] + [f"present.{i}.{k}" for i in range(layers) for k in ("key", "value")]
    axes = {"input_ids": {0: "batch", 1: "seq"}, "attention_mask": {0: "batch", 1: "total"},
            "position_ids": {0: "batch", 1: "seq"}}
    axes.update((n, {0: "batch", 2: "past"}) for n in names)
    axes.update((n, {0: "batch", 2: "total"}) for n in outputs[1:])
    out.mkdir(parents=True, exist_ok=True)
    with torch.no_grad():
        torch.onnx.export(wrapper, (ids, mask, position, *past), str(out / "model.onnx"),
                          input_names=["input_ids", "attention_mask", "position_ids", *names],
                          output_names=outputs, dynamic_axes=axes, dynamo=False,
                          opset_version=17)
    _write_genai_config(out, layers, heads, hidden // heads, vocab, context)
    return out


class _CacheWrapper:
    """forward(input_ids, attention_mask, position_ids, *flat past) -> (logits, *presents),
    the flat signature torch.onnx.export needs, over a transformers DynamicCache."""

    def __new__(cls, model: Any, layers: int) -> Any:
        import torch
        from transformers import DynamicCache

        class Wrapper(torch.nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.model = model

            def forward(self, input_ids, attention_mask, position_ids, *past):
                cache = DynamicCache()
                for i in range(layers):
                    cache.update(past[2 * i], past[2 * i + 1], i)
                out = self.model(input_ids=input_ids, attention_mask=attention_mask,
                                 position_ids=position_ids, past_key_values=cache,
                                 use_cache=True)
                flat = []
                for layer in out.past_key_values.layers:
                    flat += [layer.keys, layer.values]
                return (out.logits, *flat)

        return Wrapper()


def _write_genai_config(folder: Path, layers: int, heads: int, head: int, vocab: int,
                        context: int) -> None:
    decoder = {
        "filename": "model.onnx", "head_size": head, "hidden_size": heads * head,
        "num_attention_heads": heads, "num_key_value_heads": heads,
        "num_hidden_layers": layers, "session_options": {"provider_options": []},
        "inputs": {"input_ids": "input_ids", "attention_mask": "attention_mask",
                   "position_ids": "position_ids", "past_key_names": "past_key_values.%d.key",
                   "past_value_names": "past_key_values.%d.value"},
        "outputs": {"logits": "logits", "present_key_names": "present.%d.key",
                    "present_value_names": "present.%d.value"}}
    # type "llama": onnxruntime-genai's generic decoder (its "gpt2" type expects the older
    # exporter's combined past_N inputs and refuses these names)
    config = {"model": {"bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 3,
                        "context_length": context, "vocab_size": vocab, "type": "llama",
                        "decoder": decoder},
              "search": {"max_length": context, "past_present_share_buffer": False,
                         "do_sample": False, "num_beams": 1}}
    (folder / "genai_config.json").write_text(json.dumps(config, indent=2))


def model_folder(name: str, hidden: int, layers: int) -> Path:
    """The folder of `name` ("llama-int4", "gpt2-export", ...), built on first use."""
    arch, _, precision = name.partition("-")
    if name == "gpt2-export":
        return export_gpt2(hidden, layers)
    return gm.build(arch, precision, hidden=hidden, layers=layers)


# --- modes ----------------------------------------------------------------------------------


def timed_greedy(session: Any, io: gm.DecoderIO, prompt: list[int], steps: int
                 ) -> tuple[list[int], list[float]]:
    """`bench.genai_models.greedy` with the time of each step after the first token."""
    past = io.empty_past()
    tokens = np.asarray([prompt], np.int64)
    total, produced, times = tokens.shape[1], [], []
    for i in range(steps):
        start = time.perf_counter()
        logits, *present = session.run([io.logits, *io.present], io.feeds(tokens, total, past))
        past = dict(zip(io.past, present, strict=True))
        produced.append(int(np.argmax(logits[0, -1])))
        tokens = np.asarray([[produced[-1]]], np.int64)
        total += 1
        if i:
            times.append(time.perf_counter() - start)
    return produced, times


def _ok_session(io: gm.DecoderIO, threads: int, device: str, memo: bool = True) -> Any:
    builder = ok.InferenceSession.builder().device(device).intra_op_threads(threads)
    if not memo:
        builder = builder.option("decode.memo", "0")
    return builder.load(io.model_path)


def _ort_session(io: gm.DecoderIO, threads: int, device: str) -> Any:
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    providers = ["CPUExecutionProvider"]
    if device.startswith("cuda") and "CUDAExecutionProvider" in ort.get_available_providers():
        providers.insert(0, "CUDAExecutionProvider")
    return ort.InferenceSession(str(io.model_path), so, providers=providers)


def _og_runner(folder: Path, threads: int, device: str, steps: int,
               reference: list[int]) -> Callable:
    """onnxruntime-genai's Generator over `folder`. Its stop token is moved to an id the
    reference decode never produces: min_length would instead mask the real one's logit,
    and a greedy pick of it would then differ from the plain loop's."""
    import onnxruntime_genai as og

    vocab = json.loads((folder / "genai_config.json").read_text())["model"]["vocab_size"]
    eos = max(set(range(vocab)) - set(reference) - set(PROMPT))
    config = og.Config(str(folder))
    options = {"intra_op_num_threads": threads, "inter_op_num_threads": 1}
    config.overlay(json.dumps({"model": {"eos_token_id": eos,
                                         "decoder": {"session_options": options}}}))
    if device.startswith("cuda"):
        config.clear_providers()
        config.append_provider("cuda")
    model = og.Model(config)
    length = len(PROMPT) + steps

    def run() -> tuple[list[int], list[float]]:
        params = og.GeneratorParams(model)
        params.set_search_options(max_length=length, do_sample=False)
        generator = og.Generator(model, params)
        generator.append_tokens(np.asarray([PROMPT], np.int32))
        produced, times = [], []
        while not generator.is_done():
            start = time.perf_counter()
            generator.generate_next_token()
            produced.append(int(generator.get_next_tokens()[0]))
            if len(produced) > 1:
                times.append(time.perf_counter() - start)
        return produced, times

    return run


def make_modes(folder: Path, threads: int, device: str, steps: int,
               modes: tuple[str, ...]) -> dict[str, Callable | Exception]:
    """Each mode's zero-argument run (tokens, step times), or the error that prevented it."""
    io = gm.DecoderIO(folder)
    made: dict[str, Callable | Exception] = {}

    def gen(session: Any, path: str | None) -> Callable:
        def run() -> tuple[list[int], list[float]]:
            kw = {"path": path} if path else {}
            r = generate(session, PROMPT, max_new_tokens=steps, eos_token_id=None,
                         config=folder, **kw)
            run.info = {**r.counters, "path": r.path, "fallbacks": r.fallbacks}
            return r.tokens[0], [ms / 1e3 for ms in r.step_ms]
        return run

    def loop(session: Any) -> Callable:
        return lambda: timed_greedy(session, io, PROMPT, steps)

    def cold(new_session: Callable[[], Any]) -> Callable:
        held: list[Any] = []

        def run() -> tuple[list[int], list[float]]:
            return timed_greedy(held.pop(), io, PROMPT, steps)

        run.prepare = lambda: held.append(new_session())  # untimed, before each call
        return run

    factories: dict[str, Callable[[], Callable]] = {
        "ort-loop": lambda: loop(_ort_session(io, threads, device)),
        "og": lambda: _og_runner(folder, threads, device, steps,
                                 gm.greedy(_ort_session(io, threads, device), folder, PROMPT,
                                           steps)),
        "ok-plain": lambda: loop(_ok_session(io, threads, device)),
        "ok-plain-cold": lambda: cold(lambda: _ok_session(io, threads, device)),
        "ok-bound": lambda: gen(_ok_session(io, threads, device, memo=False), "bound"),
        "ok-memo": lambda: gen(_ok_session(io, threads, device), "bound"),
        "ok-captured": lambda: gen(_ok_session(io, threads, device), "captured"),
        "ok-generate": lambda: gen(_ok_session(io, threads, device), None),
    }
    for mode in modes:
        try:
            made[mode] = factories[mode]()
        except Exception as exc:  # a missing engine or a refused model: report, go on
            made[mode] = exc
    return made


# --- driver ---------------------------------------------------------------------------------


def measure(folder: Path, threads: int, device: str, steps: int, rounds: int,
            modes: tuple[str, ...]) -> dict[str, dict]:
    """{mode: {"tok_s", "e2e_tok_s", "tokens", "info"} or {"error"}}, medians over rounds."""
    runs = make_modes(folder, threads, device, steps, modes)
    samples: dict[str, list[tuple[float, float]]] = {m: [] for m in runs}
    results: dict[str, dict] = {m: {"error": _describe(e)} for m, e in runs.items()
                                if isinstance(e, Exception)}
    live = [m for m in runs if m not in results]
    for r in range(rounds + 1):  # round 0 warms every mode (specialisations, caches)
        order = live[r % len(live):] + live[: r % len(live)] if live else []
        for mode in order:
            if mode in results and "error" in results[mode]:
                continue
            prepare = getattr(runs[mode], "prepare", None)
            if prepare is not None:
                prepare()
            time.sleep(GAP_S)
            start = time.perf_counter()
            try:
                tokens, times = runs[mode]()
            except Exception as exc:
                results[mode] = {"error": _describe(exc)}
                continue
            wall = time.perf_counter() - start
            if r:  # the median step: a shared machine preempts some steps for milliseconds
                samples[mode].append((1 / statistics.median(times), len(tokens) / wall))
            results[mode] = {"tokens": tokens, "info": getattr(runs[mode], "info", {})}
    for mode, got in samples.items():
        if got and "error" not in results[mode]:
            results[mode]["tok_s"] = statistics.median(s for s, _ in got)
            results[mode]["e2e_tok_s"] = statistics.median(e for _, e in got)
    return results


def _describe(exc: BaseException) -> str:
    last = traceback.extract_tb(exc.__traceback__)[-1:] if exc.__traceback__ else []
    where = f" ({last[0].filename.rsplit('/', 1)[-1]}:{last[0].lineno})" if last else ""
    return f"{type(exc).__name__}: {str(exc).splitlines()[0][:160] if str(exc) else ''}{where}"


def report(rows: list[dict], header: str) -> str:
    """The table: one line per (model, threads, mode), tok/s, e2e and the ratio to ort-loop."""
    lines = [header, f"{'model':<14}{'thr':>4} {'mode':<13}{'tok/s':>9}{'e2e tok/s':>11}"
                     f"{'x ort-loop':>11}  note"]
    for row in rows:
        base = next((r for r in rows if (r["model"], r["threads"], r["mode"]) ==
                     (row["model"], row["threads"], "ort-loop") and "tok_s" in r), None)
        if "error" in row:
            lines.append(f"{row['model']:<14}{row['threads']:>4} {row['mode']:<13}"
                         f"{'-':>9}{'-':>11}{'-':>11}  {row['error']}")
            continue
        ratio = f"{row['tok_s'] / base['tok_s']:.2f}" if base else "-"
        note = [] if row.get("tokens_match", True) else ["TOKENS DIFFER from ort-loop"]
        info = row.get("info") or {}
        if info.get("path") and info["path"] != row["mode"].removeprefix("ok-"):
            note.append(f"path {info['path']}")
        if info.get("segments"):
            note.append(f"{info['segments']} segment(s)")
        note += [f"fallback: {f[:80]}" for f in info.get("fallbacks", [])]
        lines.append(f"{row['model']:<14}{row['threads']:>4} {row['mode']:<13}"
                     f"{row['tok_s']:>9.1f}{row['e2e_tok_s']:>11.1f}{ratio:>11}  "
                     f"{'; '.join(note)}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=list(DEFAULT_MODELS))
    parser.add_argument("--modes", nargs="+", default=list(MODES), choices=MODES)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--tokens", type=int, default=64, help="new tokens per decode")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", default="1,2", help="comma-separated intra-op threads")
    parser.add_argument("--device", default="cpu", help="cpu | cuda (the GPU script)")
    parser.add_argument("--gpu", action="store_true", help="the same as --device cuda")
    parser.add_argument("--json", type=Path, help="write every row here")
    args = parser.parse_args(argv)
    device = "cuda" if args.gpu else args.device
    why = gm.available()
    if why:
        print(f"cannot build the models: {why}")
        return 2
    rows = []
    threads = [int(t) for t in args.threads.split(",")]
    for name in args.models:
        try:
            folder = model_folder(name, args.hidden, args.layers)
        except Exception as exc:
            rows += [{"model": name, "threads": t, "mode": "build", "error": _describe(exc)}
                     for t in threads]
            continue
        for t in threads:
            results = measure(folder, t, device, args.tokens, args.rounds, tuple(args.modes))
            ref = results.get("ort-loop", {}).get("tokens")
            for mode, res in results.items():
                row = {"model": name, "threads": t, "mode": mode, **res}
                if ref is not None and "tokens" in res:
                    row["tokens_match"] = res["tokens"] == ref
                rows.append(row)
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    header = (f"greedy decode, prompt {len(PROMPT)}, {args.tokens} new tokens, hidden "
              f"{args.hidden}, {args.layers} layers, device {device}; median of {args.rounds} "
              f"interleaved rounds; load average {load} on {os.cpu_count()} cores (shared: "
              "rough numbers)")
    print(report(rows, header))
    if args.json:
        for row in rows:
            row.pop("tokens", None)
        args.json.write_text(json.dumps({"header": header, "rows": rows}, indent=2,
                                        default=str))
    return 1 if any(r.get("tokens_match") is False for r in rows) else 0


if __name__ == "__main__":
    raise SystemExit(main())
