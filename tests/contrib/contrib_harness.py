"""Shared pieces of the generated contrib-op tests: a case record, a per-op case table,
value generators that hit quantized saturation edges, and the comparison against
onnxruntime.

A case is one single-node model (feeds become graph inputs, constants initializers) that
runs on onnxkiln with graph optimizations off and on onnxruntime's CPU provider with
ORT_DISABLE_ALL, so both execute exactly that node.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import ml_dtypes
import numpy as np
import onnx
from onnx import helper

from onnxkiln import InferenceSession
from onnxkiln.errors import SessionError
from onnxkiln.testing import node_model, run_ort

MS = "com.microsoft"
F32 = np.float32
F16 = np.float16
U8 = np.uint8
I8 = np.int8
I32 = np.int32
I64 = np.int64


@dataclass
class Case:
    """One generated single-node model and how closely onnxkiln must follow onnxruntime.

    `names` is the node's input order ("" for an absent optional input); by default the
    feeds' then the constants' keys. `int_units` > 0 allows that many quantization steps on
    integer outputs and must come with `why`. `xfail` marks a known mismatch in a kernel
    another engineer owns (strict, with the measured difference).
    """

    id: str
    feeds: dict[str, np.ndarray]
    attrs: dict[str, Any] = field(default_factory=dict)
    consts: dict[str, np.ndarray] = field(default_factory=dict)
    names: list[str] | None = None
    n_out: int = 1
    rtol: float = 1e-5
    atol: float = 1e-6
    int_units: int = 0
    why: str = ""
    xfail: str = ""
    opset: int = 21
    ort_domain: str | None = None  # onnxruntime runs the op in this domain instead (say why)
    reference: Callable[..., list[np.ndarray]] | None = None  # numpy, for ops in ORT_LACKS
    ort_runner: Callable[[onnx.ModelProto, dict], list] | None = None  # instead of run_ort
    project: Callable[[list], list] | None = None  # applied to both sides' outputs first
    saturates: bool = False  # output 0 must reach both ends of its integer type
    refuses: bool = False  # onnxruntime refuses the node: onnxkiln must, with a SessionError
    widen: bool = False  # 4-bit outputs: onnxruntime's Python API returns none, so both
    # sides are compared after a cast to 8 bits (a Cast node on onnxruntime's side)

    def __post_init__(self) -> None:
        if self.int_units and not self.why:
            raise ValueError(f"case {self.id}: int_units={self.int_units} needs a reason")


CaseFn = Callable[[np.random.Generator], list[Case]]
SPECS: dict[tuple[str, str], CaseFn] = {}
# ops onnxkiln serves that onnxruntime's CPU build cannot run, with the reason; their cases
# carry a numpy `reference`, and the test checks that onnxruntime really refuses them
ORT_LACKS: dict[tuple[str, str], str] = {}


def spec(op: str, domain: str = MS, ort_lacks: str = "") -> Callable[[CaseFn], CaseFn]:
    """Register the case generator of `domain`'s `op` (one per op; a second is an error).
    `ort_lacks` says why onnxruntime's CPU build cannot run the op (cases then need a
    numpy `reference`)."""

    def register(fn: CaseFn) -> CaseFn:
        key = (domain, op)
        if key in SPECS:
            raise ValueError(f"two case generators for {key}")
        SPECS[key] = fn
        if ort_lacks:
            ORT_LACKS[key] = ort_lacks
        return fn

    return register


def rng_for(op: str) -> np.random.Generator:
    """A generator seeded from the op's name, so each op's cases are stable on their own."""
    return np.random.default_rng(zlib.crc32(op.encode()))


def normal(rng: np.random.Generator, shape, dtype=F32, scale: float = 1.0) -> np.ndarray:
    return (rng.standard_normal(shape) * scale).astype(dtype)


def qrange(dtype) -> tuple[int, int]:
    info = np.iinfo(dtype)
    return int(info.min), int(info.max)


def qvalues(rng: np.random.Generator, shape, dtype) -> np.ndarray:
    """Random integers of `dtype` whose first two entries are its minimum and maximum."""
    lo, hi = qrange(dtype)
    x = rng.integers(lo, hi + 1, size=shape, dtype=np.int64)
    flat = x.reshape(-1)
    flat[: min(2, flat.size)] = [lo, hi][: flat.size]
    return x.astype(dtype)


def zero_points(dtype) -> list[int]:
    """The zero points the issue names: both ends and the middle of the range."""
    return [0, 128, 255] if np.dtype(dtype) == np.uint8 else [-128, 0, 127]


def scalar(value, dtype) -> np.ndarray:
    return np.array(value, dtype=dtype)


def build(op: str, domain: str, case: Case) -> onnx.ModelProto:
    model = node_model(op, case.feeds, n_outputs=case.n_out, opset=case.opset,
                       initializers=case.consts, domain=domain, input_names=case.names)
    # attributes after the fact: some ops have one named `opset`, which node_model takes
    model.graph.node[0].attribute.extend(
        helper.make_attribute(k, v) for k, v in sorted(case.attrs.items()))
    return model


def run_onnxkiln(model: onnx.ModelProto, feeds) -> list[Any]:
    session = InferenceSession.builder().optimization("disabled").from_graph(model)
    return session.run(dict(feeds))


def compare(case: Case, ours: list[Any], theirs: list[Any]) -> None:
    """Equal dtypes and shapes; floats within the case's tolerance, integers exact (or
    within `int_units` steps when the case says why)."""
    assert len(ours) == len(theirs), f"{len(ours)} outputs vs onnxruntime's {len(theirs)}"
    for i, (a, b) in enumerate(zip(ours, theirs)):
        a, b = np.asarray(a), np.asarray(b)
        where = f"{case.id} output {i}"
        assert a.dtype == b.dtype, f"{where}: dtype {a.dtype} vs onnxruntime's {b.dtype}"
        assert a.shape == b.shape, f"{where}: shape {a.shape} vs onnxruntime's {b.shape}"
        if a.dtype.kind in "iub" and case.int_units:
            diff = np.abs(a.astype(np.int64) - b.astype(np.int64))
            assert diff.max(initial=0) <= case.int_units, (
                f"{where}: {int(diff.max())} steps apart (allowed {case.int_units}: {case.why})")
        elif a.dtype.kind in "iubUSO":
            np.testing.assert_array_equal(a, b, err_msg=where)
        else:
            np.testing.assert_allclose(a.astype(np.float64), b.astype(np.float64),
                                       rtol=case.rtol, atol=case.atol, err_msg=where)
        if case.saturates and i == 0:
            info = np.iinfo(a.dtype)
            assert info.min in a and info.max in a, f"{where}: the case does not saturate"


def check_against_ort(op: str, domain: str, case: Case) -> None:
    """onnxkiln against onnxruntime, or, for an op in ORT_LACKS, against the case's numpy
    reference after checking that onnxruntime still refuses the node."""
    model = build(op, domain, case)
    if (domain, op) in ORT_LACKS:
        import pytest

        assert case.reference is not None, f"{op} {case.id}: no numpy reference"
        with pytest.raises(Exception, match="NOT_IMPLEMENTED"):
            run_ort(model, case.feeds)
        compare(case, run_onnxkiln(model, case.feeds), case.reference(**case.feeds))
        return
    reference = model if case.ort_domain is None else build(op, case.ort_domain, case)
    if case.refuses:
        import pytest

        with pytest.raises(Exception, match="ONNXRuntimeError"):
            run_ort(reference, case.feeds)
        with pytest.raises(SessionError):
            run_onnxkiln(model, case.feeds)
        return
    ours = run_onnxkiln(model, case.feeds)
    if case.widen:
        ours = [_widen(reference, i, v) for i, v in enumerate(ours)]
    theirs = (case.ort_runner or run_ort)(reference, case.feeds)
    if case.project is not None:
        ours, theirs = case.project(ours), case.project(theirs)
    compare(case, ours, theirs)


def _widen(model: onnx.ModelProto, i: int, value: np.ndarray) -> np.ndarray:
    """Cast output i of `model` (a 4-bit tensor, `value` on onnxkiln's side) to 8 bits."""
    signed = np.dtype(value.dtype) == np.dtype(ml_dtypes.int4)
    to = onnx.TensorProto.INT8 if signed else onnx.TensorProto.UINT8
    out = model.graph.output[i]
    wide = f"{out.name}_8bit"
    model.graph.node.append(helper.make_node("Cast", [out.name], [wide], to=to))
    out.CopyFrom(helper.make_tensor_value_info(wide, to, None))
    return value.astype(I8 if signed else U8)
