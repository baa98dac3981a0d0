"""The exported models on the torch provider (torch's CPU device standing in for a GPU):
tiny variants of the catalog that the project's own venv exports, the host<->device copies
a run makes, and the capture audit.

Shared by tests/providers/cuda/test_torch_models.py (CI: torch, transformers, skl2onnx, no
torchvision, no onnxscript) and scripts/torch_provider_models.py (any cache, the full one
of `make bench-models` included).

The tiny variants (`build_tiny`): every catalog family the TorchScript exporter exports
without torchvision, from the catalog's own builders (bench.exported.models) with configs
shrunk so that all of them export in seconds, the sklearn specs as they are, and
onnxkiln.zoo's ResNet and MobileNetV2 standing in for the torchvision CNNs. Left out:
resnet18, mobilenetv3, efficientnet and ssdlite320 (their builders are torchvision's) and
every dynamo spec (the dynamo exporter needs onnxscript); distilbert, which the catalog
exports with dynamo only, exports with TorchScript at this size.
"""

from __future__ import annotations

import collections
import dataclasses
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from bench.exported import build, catalog, manifest

COPY_OPS = {"MemcpyFromHost": "up", "MemcpyToHost": "down"}
SHAPE_MATH = "shape computation kept on the host"
"""How the placer's reason for host shape arithmetic begins (onnxkiln.partition)."""

_TEXT = {"batch": 2, "seq": 8}
_IDS = {"bos_token_id": 0, "eos_token_id": 1, "pad_token_id": 0}  # inside the tiny vocab
BERT = {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2,
        "intermediate_size": 64, "vocab_size": 128, "max_position_embeddings": 64}
DISTILBERT = {"dim": 32, "n_layers": 2, "n_heads": 2, "hidden_dim": 64, "vocab_size": 128,
              "max_position_embeddings": 64}
GPT2 = {"n_embd": 32, "n_layer": 2, "n_head": 2, "vocab_size": 128, "n_positions": 64,
        "bos_token_id": 0, "eos_token_id": 1}
T5 = {"d_model": 32, "d_ff": 64, "num_layers": 2, "num_decoder_layers": 2, "num_heads": 2,
      "d_kv": 16, "vocab_size": 128, **_IDS, "decoder_start_token_id": 0}
VIT = {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2,
       "intermediate_size": 64, "image_size": 32, "patch_size": 8}
WHISPER = {"d_model": 32, "encoder_layers": 2, "decoder_layers": 1,
           "encoder_attention_heads": 2, "decoder_attention_heads": 2, "encoder_ffn_dim": 64,
           "decoder_ffn_dim": 64, "num_mel_bins": 16, "max_source_positions": 16,
           "max_target_positions": 32, "vocab_size": 128, **_IDS,
           "decoder_start_token_id": 0}

TINY: dict[str, tuple[str, dict[str, Any] | None, dict[str, int]]] = {
    # name: (the catalog spec whose builder exports it, config (None: the spec's), run dims)
    "bert-tiny-ts": ("bert-small-ts", BERT, _TEXT),
    "distilbert-tiny-ts": ("distilbert-base-dynamo", DISTILBERT, _TEXT),
    "gpt2-tiny-prefill-ts": ("gpt2-small-prefill-ts", GPT2, _TEXT),
    "gpt2-tiny-decode-ts": ("gpt2-small-decode-ts", GPT2,
                            {"batch": 2, "past_seq": 8, "total_seq": 9}),
    "t5-tiny-encoder-ts": ("t5-small-encoder-ts", T5, _TEXT),
    "t5-tiny-decoder-ts": ("t5-small-decoder-ts", T5, {"batch": 2, "enc_seq": 8, "past_seq": 4}),
    "whisper-micro-encoder-ts": ("whisper-tiny-encoder-ts", WHISPER, {"batch": 2}),
    "vit-tiny-ts": ("vit-small-ts", VIT, {"batch": 2}),
    # the tagger's sizes are fixed in its builder (vocab 5000, hidden 256): small already
    "lstm-tagger-ts": ("lstm-tagger-ts", None, _TEXT),
    "gru-tagger-ts": ("gru-tagger-ts", None, _TEXT),
}
SKLEARN = tuple(s.name for s in catalog.SPECS if s.exporter == "skl2onnx")
ZOO = ("zoo-resnet", "zoo-mobilenet")
DECODE_STEPS = ("gpt2-tiny-decode-ts", "t5-tiny-decoder-ts")
"""Decode-step models: past key values in, present ones out."""


def tiny_specs() -> list[catalog.Spec]:
    """The torch and sklearn specs of the tiny cache (see the module docstring)."""
    by_name = {s.name: s for s in catalog.SPECS}
    specs = []
    for name, (source, config, dims) in TINY.items():
        spec = by_name[source]
        specs.append(dataclasses.replace(
            spec, name=name, exporter="torchscript", size="tiny", quick=True,
            config=spec.config if config is None else config,
            runs=({"label": f"b{dims['batch']}", "dims": dims},)))
    batch4 = ({"label": "b4", "dims": {"batch": 4}},)
    specs.extend(dataclasses.replace(by_name[name], runs=batch4) for name in SKLEARN)
    return specs


def _zoo_entry(folder: Path, name: str) -> dict[str, Any]:
    from onnxkiln import zoo

    model = zoo.resnet() if name == "zoo-resnet" else zoo.mobilenet_v2()
    (folder / f"{name}.onnx").write_bytes(model.SerializeToString())
    (image,) = model.graph.input
    size = image.type.tensor_type.shape.dim[-1].dim_value
    return {"name": name, "family": "zoo", "size": "small", "file": f"{name}.onnx",
            "exporter": "zoo", "notes": "onnxkiln.zoo, in place of the torchvision CNNs",
            "versions": {}, "config": {}, "quick": True,
            "inputs": [{"name": image.name, "dtype": "float32",
                        "shape": ["batch", 3, size, size]}],
            "outputs": [o.name for o in model.graph.output],
            "nodes": len(model.graph.node), "runs": [{"label": "b2", "dims": {"batch": 2}}]}


def build_tiny(folder: Path, names: Sequence[str] | None = None) -> dict[str, dict[str, Any]]:
    """Export the tiny models `names` (default: all) into `folder`; their manifest entries.
    An entry whose spec_hash and file are still there is reused (a persistent folder)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    try:
        cache = manifest.load(folder)
    except manifest.CacheMissing:
        cache = manifest.empty()
    old = {e["name"]: e for e in cache["models"]}
    wanted = set(names) if names else None
    out: dict[str, dict[str, Any]] = {}
    for spec in tiny_specs():
        if wanted is not None and spec.name not in wanted:
            continue
        entry = old.get(spec.name)
        if (entry is None or entry.get("spec_hash") != build.spec_hash(spec)
                or not (folder / entry["file"]).is_file()):
            entry = build.export_one(spec, folder)
        out[spec.name] = entry
    for name in ZOO:
        if wanted is None or name in wanted:
            out[name] = _zoo_entry(folder, name)
    cache["models"] = list({**old, **out}.values())
    manifest.save(folder, cache)
    return out


def feeds(entry: dict[str, Any], seed: int = 0) -> dict[str, np.ndarray]:
    """Seeded inputs at the entry's first run."""
    return manifest.make_feeds(entry, entry["runs"][0]["dims"], seed)


def torch_session(path: Path | str) -> Any:
    """A session placed as on a GPU (`device="cuda"`): on torch's CPU device, or on the GPU
    itself when ONNXKILN_TORCH_TEST_DEVICE=cuda (scripts/gpu_check.sh)."""
    import onnxkiln as ok

    on_gpu = os.environ.get("ONNXKILN_TORCH_TEST_DEVICE", "cpu") == "cuda"
    return ok.InferenceSession(str(path), device="cuda",
                               options={} if on_gpu else {"testing.cuda_on_torch_cpu": "1"})


def declines(session: Any) -> list[Any]:
    report = session.execution_provider_fallback_report()
    return [] if report is None else list(report.declines)


# --- copies per run -------------------------------------------------------------------------

@dataclass
class Copies:
    """The copy steps of one traced run: the values uploaded and downloaded (real copies:
    a host array to a device tensor, a device tensor to a host array), and the copy steps
    that moved nothing (a host array fed to a "download", a device tensor to an upload)."""

    up: list[str] = field(default_factory=list)
    down: list[str] = field(default_factory=list)
    idle: int = 0

    def counts(self) -> tuple[int, int]:
        return len(self.up), len(self.down)


_COPIED = re.compile(r"copy '(.*)' to \w+")


def _is_device(dtype: str) -> bool:
    return dtype.startswith("torch.")  # a span's dtype of a torch tensor (onnxkiln.trace)


def traced_copies(session: Any, inputs: dict[str, np.ndarray]) -> Copies:
    """The copies one run on `inputs` executes, read from its trace."""
    from onnxkiln.trace import TraceContext

    ctx = TraceContext.in_memory()
    session.set_trace_context(ctx)
    try:
        session.run_outputs(None, inputs)
    finally:
        session.set_trace_context(TraceContext.disabled())
    copies = Copies()
    for span in ctx.spans:
        a = span.attributes
        way = COPY_OPS.get(a.get("op_type", "")) if span.category == "node" else None
        if way is None:
            continue
        moved = _is_device(a["input_dtypes"][0]) != (way == "up")
        value = _COPIED.fullmatch(a["node"])
        name = value.group(1) if value else a["node"]
        if not moved:
            copies.idle += 1
        else:
            (copies.up if way == "up" else copies.down).append(name)
    return copies


def run_copies(session: Any, inputs: dict[str, np.ndarray]) -> tuple[Copies, Copies]:
    """(first run: the generic plan; steady state: the fourth run of the same inputs, on
    the signature's specialised plan, built on its second run). Use a fresh session."""
    generic = traced_copies(session, inputs)
    for _ in range(2):
        session.run_outputs(None, inputs)
    return generic, traced_copies(session, inputs)


def device_read_inputs(session: Any) -> list[str]:
    """Graph inputs some device kernel reads (not as a host operand), in input order."""
    plan = session._raw_plan  # placed, before copies
    slots = set(plan.input_slots)
    read = {s for st in plan.steps if st.provider != "cpu"
            for i, s in enumerate(st.inputs) if s in slots and i not in st.spec.host_inputs}
    return [plan.slot_names[s] for s in plan.input_slots if s in read]


def _producers(plan: Any) -> dict[int, Any]:
    return {s: st for st in plan.steps for s in st.outputs if s is not None}


def device_made_outputs(session: Any) -> list[str]:
    """Graph outputs a device kernel makes (each comes down once), in output order."""
    plan = session._raw_plan
    made = _producers(plan)
    return [plan.slot_names[s] for s in plan.output_slots
            if s in made and made[s].provider != "cpu" and not made[s].spec.host_outputs]


def declined_crossings(session: Any) -> tuple[list[str], list[str]]:
    """The values that cross at nodes declined for want of a device kernel (not host shape
    arithmetic): (made by such a node, read by a device kernel), (made by a device kernel,
    read by such a node)."""
    plan = session._raw_plan
    declined = {d.node_id for d in declines(session) if not d.reason.startswith(SHAPE_MATH)}
    made = _producers(plan)
    up: list[str] = []
    down: list[str] = []
    for st in plan.steps:
        for i, s in enumerate(st.inputs):
            src = made.get(s)
            if src is None or s in plan.constants:
                continue
            name = plan.slot_names[s]
            if (st.provider != "cpu" and i not in st.spec.host_inputs
                    and src.node_id in declined and name not in up):
                up.append(name)
            if (st.node_id in declined and src.provider != "cpu"
                    and not src.spec.host_outputs and name not in down):
                down.append(name)
    return up, down


def round_trips(session: Any) -> list[str]:
    """Device nodes that only make a round trip: every input they read comes up from a host
    node, every output they make goes straight back down (to host nodes or graph outputs)."""
    plan = session._raw_plan
    made = _producers(plan)
    outputs = set(plan.output_slots)
    readers: dict[int, list[Any]] = collections.defaultdict(list)
    for st in plan.steps:
        for s in st.inputs:
            if s is not None:
                readers[s].append(st)
    found = []
    for st in plan.steps:
        if st.provider == "cpu" or st.node_id < 0:
            continue
        live = [s for s in st.inputs if s is not None and s not in plan.constants]
        ups = all(s in made and made[s].provider == "cpu" for s in live)
        downs = all(all(r.provider == "cpu" for r in readers[s]) and (readers[s] or s in outputs)
                    for s in st.outputs if s is not None)
        if live and ups and downs:
            found.append(f"{st.op_type} '{st.name}'")
    return found


# --- the capture audit ----------------------------------------------------------------------

@dataclass
class Bound:
    """The bindings of one capture layout, by graph input / output name (an in-place KV
    binding under both its past and its present name)."""

    layout: str
    bindings: list[Any]
    by_name: dict[str, Any]


def _dtype(array: np.ndarray) -> Any:
    from onnxkiln.dtypes import from_numpy

    return from_numpy(array.dtype)


def bind_fixed(session: Any, inputs: dict[str, np.ndarray]) -> Bound:
    """Every input in an input-only binding at its shape (written with `inputs`), every
    tensor output in an output binding at the shape a run on `inputs` gives it: one step
    at these shapes, replayed with new values written into the input bindings. Outputs
    that are not tensors (a ZipMap's list of maps) cannot be bound: they are left out,
    and the capture refuses."""
    by_name = {}
    for name, value in inputs.items():
        b = session.allocate_device_binding(name, None, _dtype(value), value.shape, value.shape)
        b.write(value)
        by_name[name] = b
    for o in session.run_outputs(None, inputs):
        if o.kind != "tensor":
            continue
        value = np.asarray(o.value)
        by_name[o.name] = session.allocate_device_output_binding(o.name, _dtype(value),
                                                                 value.shape, value.shape)
    return Bound("fixed", list(by_name.values()), by_name)


def bind_growing(session: Any, entry: dict[str, Any], inputs: dict[str, np.ndarray],
                 capacity: int) -> Bound:
    """A decode step's KV cache in place: each `past.*` input shares a binding of
    `capacity` positions with its `present.*` output (appended to every step), an input
    with a `total_seq` dim (the mask) is bound at that capacity and follows the cache,
    every other input and output is bound at its shape."""
    by_name: dict[str, Any] = {}
    bindings = []
    for spec in entry["inputs"]:
        name, value = spec["name"], inputs[spec["name"]]
        present = name.replace("past.", "present.", 1)
        if name.startswith("past.") and present in entry["outputs"]:
            dims, out = "past_seq", present
        elif "total_seq" in spec["shape"]:
            dims, out = "total_seq", None
        else:
            dims, out = "", None
        physical = tuple(capacity if d == dims else n for d, n in zip(spec["shape"], value.shape))
        b = session.allocate_device_binding(name, out, _dtype(value), physical, value.shape)
        b.write(value)
        by_name[name] = b
        if out is not None:
            by_name[out] = b
        bindings.append(b)
    for o in session.run_outputs(None, inputs):
        if o.name not in by_name:
            value = np.asarray(o.value)
            b = session.allocate_device_output_binding(o.name, _dtype(value), value.shape,
                                                       value.shape)
            by_name[o.name] = b
            bindings.append(b)
    return Bound("growing", bindings, by_name)


def next_step(entry: dict[str, Any], inputs: dict[str, np.ndarray], outputs: Sequence[Any],
              token: int) -> dict[str, np.ndarray]:
    """The next decode step's inputs: the token, each past the present the step made, a
    `total_seq` input (the mask) one longer; the rest as they were."""
    made = dict(zip(entry["outputs"], outputs))
    nxt = dict(inputs)
    for spec in entry["inputs"]:
        name = spec["name"]
        present = name.replace("past.", "present.", 1)
        if name.startswith("past.") and present in made:
            nxt[name] = np.asarray(made[present])
        elif "total_seq" in spec["shape"]:
            old = inputs[name]
            nxt[name] = np.ones((old.shape[0], old.shape[1] + 1), old.dtype)
    first = entry["inputs"][0]
    nxt[first["name"]] = np.full_like(inputs[first["name"]], token)  # the new token ids
    return nxt


def write_step(bound: Bound, entry: dict[str, Any], inputs: dict[str, np.ndarray]) -> None:
    """Write a step's new token and mask into their bindings (the cache grows by itself)."""
    for spec in entry["inputs"]:
        name = spec["name"]
        if bound.layout == "growing" and name.startswith("past."):
            continue
        b = bound.by_name[name]
        b.write(inputs[name])
        if tuple(b.logical_shape) != inputs[name].shape:
            b.set_logical_shape(inputs[name].shape)


@dataclass
class Audit:
    """A capture's outcome: segments (0: nothing captured, `refused` says why) and seams."""

    model: str
    layout: str
    segments: int
    seams: list[Any] = field(default_factory=list)
    refused: str | None = None

    def reasons(self) -> dict[str, int]:
        """Seams by kind, op and reason (the reason's value names cut at the first quote)."""
        counter: collections.Counter[str] = collections.Counter()
        for d in self.seams:
            reason = re.sub(r"'[^']*'", "'…'", d.reason)
            counter[f"{d.seam_kind.name} {d.op_type}: {reason}"] += 1
        return dict(counter)

    def row(self) -> dict[str, Any]:
        return {"model": self.model, "layout": self.layout, "segments": self.segments,
                "seams": len(self.seams), "refused": self.refused,
                "by_kind": dict(collections.Counter(d.seam_kind.name for d in self.seams)),
                "reasons": self.reasons()}


def capture(session: Any, bound: Bound, model: str) -> Audit:
    """Capture one step over `bound`; its audit."""
    import onnxkiln as ok

    try:
        res = session.try_capture_with_device_bindings({}, bound.bindings)
    except ok.CaptureError as e:  # an output left unbound
        return Audit(model, bound.layout, 0, [], str(e))
    if not res.captured:
        return Audit(model, bound.layout, 0, list(res.declines), "NotCapturable")
    return Audit(model, bound.layout, res.segments, session.capture_segmentation())
