"""The exported bench models on the torch provider, on torch's CPU device
(`testing.cuda_on_torch_cpu=1`), built here in tiny sizes by the catalog's own builders
(bench.exported.torch_audit: every family the TorchScript exporter handles without
torchvision, the sklearn specs, onnxkiln.zoo's CNNs in place of torchvision's).

Per model: only host shape arithmetic is declined (the sklearn models: the ai.onnx.ml ops
the torch provider has no kernel for), outputs are onnxruntime's, a steady-state run copies
only the graph inputs up and the outputs down (the sklearn models: the values crossing at
the declined ops), and the capture audit: with every input and output bound at one run's
shapes, every torch-exported and zoo model captures whole, the decode steps included (PCA
in one segment after its host Scaler; a ZipMap's list of maps cannot be bound, so those
pipelines are not captured); a decode step whose KV cache grows in place segments around
the shapes that grow.

ONNXKILN_TORCH_MODELS_CACHE: a folder that keeps the exports between runs (default: a
temporary folder per run).
"""

from __future__ import annotations

import collections
import os
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="the torch provider's kernels are torch ops")
ort = pytest.importorskip("onnxruntime", reason="outputs are compared with onnxruntime's")
pytest.importorskip("transformers", reason="the transformer models come from transformers")
pytest.importorskip("skl2onnx", reason="the sklearn models are converted by skl2onnx")

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))

from bench.exported import harness  # noqa: E402
from bench.exported import torch_audit as ta  # noqa: E402

import onnxkiln as ok  # noqa: E402

NAMES = [*ta.TINY, *ta.SKLEARN, *ta.ZOO]
TORCH_MODELS = [n for n in NAMES if n not in ta.SKLEARN]
RTOL = 1e-5  # of onnxruntime's largest |output| (at least 1); seen: <= 4e-7
ML_DECLINES = {  # the ai.onnx.ml ops the torch provider has no kernel for, per model
    "sk-scaler-logreg": {"Scaler", "LinearClassifier", "Normalizer", "ZipMap"},
    "sk-svc": {"Scaler", "SVMClassifier", "ZipMap"},
    "sk-random-forest": {"TreeEnsembleClassifier", "ZipMap"},
    "sk-gradient-boosting": {"TreeEnsembleClassifier", "ZipMap"},
    "sk-pca": {"Scaler"},
}
ZIPMAP = [n for n, ops in ML_DECLINES.items() if "ZipMap" in ops]
K = ok.SeamKind


class _Models:
    """The tiny exports, each built on first use (so that -k NAME builds one)."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self._entries: dict[str, dict] = {}

    def entry(self, name: str) -> dict:
        if name not in self._entries:
            with warnings.catch_warnings():  # the exporters' tracer and deprecation notes
                warnings.simplefilter("ignore")
                self._entries.update(ta.build_tiny(self.folder, [name]))
        return self._entries[name]

    def path(self, name: str) -> str:
        return str(self.folder / self.entry(name)["file"])

    def session(self, name: str):
        return ta.torch_session(self.path(name))

    def reference(self, name: str, feeds: dict) -> list:
        ref = ort.InferenceSession(self.path(name), providers=["CPUExecutionProvider"])
        return ref.run(None, feeds)


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> _Models:
    folder = os.environ.get("ONNXKILN_TORCH_MODELS_CACHE")
    return _Models(Path(folder) if folder else tmp_path_factory.mktemp("torch_models"))


def _assert_matches(ours: list, reference: list, what: str) -> None:
    assert len(ours) == len(reference)
    for i, (a, b) in enumerate(zip(ours, reference)):
        a, b = harness.plain(a), harness.plain(b)  # ZipMap's maps: rows of probabilities
        assert a.shape == b.shape, f"{what} output {i}: shape {a.shape} vs {b.shape}"
        if b.dtype.kind in "biu":
            np.testing.assert_array_equal(a, b, err_msg=f"{what} output {i}")
            continue
        scale = max(1.0, float(np.max(np.abs(b)))) if b.size else 1.0
        diff = float(np.max(np.abs(a.astype(np.float64) - b))) if b.size else 0.0
        assert diff <= RTOL * scale, f"{what} output {i}: |diff| {diff:.3g} > {RTOL} * {scale:.3g}"


# --- placement, outputs, copies ---------------------------------------------------------

BETWEEN_HOST = "its inputs come from host nodes and its outputs go only to host nodes"
KEPT_ON_HOST = {"sk-scaler-logreg": 1, "sk-svc": 2, "sk-random-forest": 1,
                "sk-gradient-boosting": 1}
"""Casts between a declined ai.onnx.ml op and a host reader or a graph output: kept on the
host, where on the device their value would only go up and come straight back down."""


@pytest.mark.parametrize("name", NAMES)
def test_only_host_shape_arithmetic_is_declined(models, name):
    declines = ta.declines(models.session(name))
    ml = {d.op_type for d in declines if d.domain == "ai.onnx.ml"}
    assert ml == ML_DECLINES.get(name, set())
    between = [d for d in declines if d.reason.startswith(BETWEEN_HOST)]
    assert [d.op_type for d in between] == ["Cast"] * KEPT_ON_HOST.get(name, 0)
    for d in declines:
        if d.domain == "ai.onnx.ml":
            assert d.reason == f"no cuda kernel for ai.onnx.ml::{d.op_type}", d
        elif d not in between:
            assert d.reason.startswith(ta.SHAPE_MATH), d


@pytest.mark.parametrize("name", NAMES)
def test_outputs_match_onnxruntime(models, name):
    feeds = ta.feeds(models.entry(name))
    ours = models.session(name).run_outputs(None, feeds)
    _assert_matches(ours, models.reference(name, feeds), name)


@pytest.mark.parametrize("name", TORCH_MODELS)
def test_a_steady_run_copies_only_the_inputs_up_and_the_outputs_down(models, name):
    # the generic plan also uploads the host shape arithmetic that device kernels read
    # (position ids, masks made from shapes); the signature's specialised plan reads the
    # device constants it folded them into
    entry = models.entry(name)
    s = models.session(name)
    _, steady = ta.run_copies(s, ta.feeds(entry))
    inputs = ta.device_read_inputs(s)
    assert inputs == [i["name"] for i in entry["inputs"]]  # every input is read on the device
    assert ta.device_made_outputs(s) == entry["outputs"]
    assert sorted(steady.up) == sorted(inputs)
    assert sorted(steady.down) == sorted(entry["outputs"])


@pytest.mark.parametrize("name", ta.SKLEARN)
def test_sklearn_copies_are_the_crossings_at_the_declined_ops(models, name):
    entry = models.entry(name)
    s = models.session(name)
    _, steady = ta.run_copies(s, ta.feeds(entry))
    up, down = ta.declined_crossings(s)
    assert ta.device_read_inputs(s) == []  # X goes to a declined op first
    assert sorted(steady.up) == sorted(up)
    assert sorted(steady.down) == sorted(set(down) | set(ta.device_made_outputs(s)))


@pytest.mark.parametrize("name", ta.SKLEARN)
def test_no_value_makes_a_device_round_trip(models, name):
    assert ta.round_trips(models.session(name)) == []


# --- the capture audit ------------------------------------------------------------------

FIXED_SEAMS = {  # with every input and output bound at one run's shapes; others: none
    "sk-pca": {("MemcpyToHost", K.KERNEL_NOT_CAPTURABLE), ("Scaler", K.CPU_FALLBACK),
               ("MemcpyFromHost", K.KERNEL_NOT_CAPTURABLE)},  # X down to the Scaler, back up
}


@pytest.mark.parametrize("name", [n for n in NAMES if n not in ZIPMAP])
def test_with_every_input_and_output_bound_the_model_captures_in_one_segment(models, name):
    entry = models.entry(name)
    s = models.session(name)
    bound = ta.bind_fixed(s, ta.feeds(entry))
    audit = ta.capture(s, bound, name)
    assert audit.segments == 1, audit.row()
    assert {(d.op_type, d.seam_kind) for d in audit.seams} == FIXED_SEAMS.get(name, set())
    new = ta.feeds(entry, seed=1)  # a replay reads what the input bindings hold now
    for n, value in new.items():
        bound.by_name[n].write(value)
    assert s.replay_device_graph(bound.bindings)
    _assert_matches([bound.by_name[o].read() for o in entry["outputs"]],
                    models.reference(name, new), f"{name} replay")
    assert s.check_device_capture_error() == 0


@pytest.mark.parametrize("name", ZIPMAP)
def test_a_zipmap_output_cannot_be_bound_so_the_model_is_not_captured(models, name):
    s = models.session(name)
    audit = ta.capture(s, ta.bind_fixed(s, ta.feeds(models.entry(name))), name)
    assert audit.segments == 0
    assert "every graph output must be bound" in audit.refused
    assert "output_probability" in audit.refused


GROWING_SEAMS = {  # the kinds of seam a decode step with its KV cache in place has
    "gpt2-tiny-decode-ts": {K.GROWING_SHAPE, K.CPU_FALLBACK, K.DATA_DEPENDENT_SHAPE,
                            K.KERNEL_NOT_CAPTURABLE},
    "t5-tiny-decoder-ts": {K.GROWING_SHAPE, K.CPU_FALLBACK, K.DATA_DEPENDENT_SHAPE},
}


@pytest.mark.parametrize("name", ta.DECODE_STEPS)
def test_a_decode_step_with_its_cache_in_place_segments_around_the_growing_shapes(models,
                                                                                   name):
    entry = models.entry(name)
    s = models.session(name)
    step = ta.feeds(entry)
    bound = ta.bind_growing(s, entry, step, capacity=16)
    audit = ta.capture(s, bound, name)
    assert audit.segments >= 2, audit.row()
    assert {d.seam_kind for d in audit.seams} == GROWING_SEAMS[name]
    by_kind = collections.defaultdict(list)
    for d in audit.seams:
        by_kind[d.seam_kind].append(d)
    # the host shape arithmetic that reads the growing length runs between the segments
    assert all(ta.SHAPE_MATH in d.reason for d in by_kind[K.CPU_FALLBACK])
    assert {d.op_type for d in by_kind[K.DATA_DEPENDENT_SHAPE]} == {"Range"}
    # the position ids, made on the host from the past length, go up each step
    assert {d.op_type for d in by_kind[K.KERNEL_NOT_CAPTURABLE]} <= {"MemcpyFromHost"}
    layers = sum(1 for i in entry["inputs"] if i["name"].endswith(".key"))
    appends = [d for d in by_kind[K.GROWING_SHAPE] if d.op_type == "Concat"]
    assert len(appends) >= 2 * layers  # each past key and value appended in place
    past = next(i["name"] for i in entry["inputs"] if i["name"].startswith("past."))
    length = bound.by_name[past].logical_shape[2]
    expect = models.reference(name, step)
    for token in (3, 5, 7):  # the capture ran the first step; replay three more
        step = ta.next_step(entry, step, expect, token)
        ta.write_step(bound, entry, step)
        assert s.replay_device_graph(bound.bindings)
        expect = models.reference(name, step)
        _assert_matches([bound.by_name[entry["outputs"][0]].read()], expect[:1],
                        f"{name} replay")
    assert bound.by_name[past].logical_shape[2] == length + 3
    np.testing.assert_allclose(bound.by_name[past].read(), expect[1], rtol=RTOL, atol=RTOL)
