"""The ONNX backend node cases of the installed onnx, run through `onnxkiln.backend`."""

from __future__ import annotations

import functools
import re
import warnings
from pathlib import Path

import numpy as np
from onnx.backend.test.loader import load_model_tests
from onnx.backend.test.runner import Runner
from onnx.backend.test.runner import _normalize_tensor as normalize

from onnxkiln.backend import OnnxkilnBackend
from onnxkiln.capture import NONDETERMINISTIC

MANIFEST = Path(__file__).with_name("manifest_cpu.txt")


@functools.cache
def load_cases() -> tuple:
    """Every node case (plain and _expanded), generated in memory by onnx."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return tuple(load_model_tests(kind="node"))


@functools.cache
def cases_by_name() -> dict:
    return {c.name: c for c in load_cases()}


def load_manifest(path: Path = MANIFEST) -> dict[str, str]:
    """Case name -> reason, for the cases expected not to pass."""
    entries: dict[str, str] = {}
    if not path.exists():
        return entries
    for line in path.read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        name, _, reason = line.partition(" ")
        entries[name] = reason.strip()
    return entries


RUNS = 3
"""Each data set runs three times: the generic plan, the recording run, and the plan
specialised for its signature (onnxkiln.specialize), each compared with the expected;
once for models with random ops (seeded generators move on between runs)."""


def run_case(case) -> str | None:
    """None if the case passes, else a one-line reason."""
    ops = {n.op_type for n in case.model.graph.node}
    runs = 1 if ops & NONDETERMINISTIC else RUNS
    try:
        rep = OnnxkilnBackend.prepare(case.model, "CPU")
        for inputs, expected in case.data_sets:
            for _ in range(runs):
                outputs = rep.run([normalize(x) for x in inputs])
                _compare([normalize(x) for x in expected], list(outputs), case.rtol,
                         case.atol)
    except Exception as e:
        text = f"{type(e).__name__}: {e}".replace("\n", " ")
        return re.sub(r"\s+", " ", text)[:500]
    return None


def _compare(expected: list, outputs: list, rtol: float, atol: float) -> None:
    """onnx's comparison, except sequences are compared element by element (onnx's own
    helper calls len() on each element and so fails on 0-d tensors inside a sequence)."""
    assert len(expected) == len(outputs), f"{len(outputs)} outputs, expected {len(expected)}"
    for ref, out in zip(expected, outputs):
        if isinstance(ref, list):
            assert isinstance(out, list), f"expected a sequence, got {type(out).__name__}"
            assert len(ref) == len(out), f"sequence of {len(out)}, expected {len(ref)}"
            for r, o in zip(ref, out):
                Runner.assert_similar_outputs([np.asarray(r)], [o], rtol=rtol, atol=atol)
        else:
            Runner.assert_similar_outputs([ref], [out], rtol=rtol, atol=atol)


@functools.cache
def _op_of_plain_cases() -> dict[str, str]:
    out = {}
    for case in load_cases():
        nodes = case.model.graph.node
        if len(nodes) == 1:
            out[case.name] = nodes[0].op_type
    return out


def case_op(name: str) -> str:
    """The op a case exercises (its single node, or its plain variant's node)."""
    ops = _op_of_plain_cases()
    base = name.split("_expanded")[0]
    return ops.get(name) or ops.get(base) or "(multi-node)"


def case_opset(case) -> int:
    for o in case.model.opset_import:
        if o.domain in ("", "ai.onnx"):
            return o.version
    return 0


def outputs_equal(a, b) -> bool:
    return np.array_equal(np.asarray(a), np.asarray(b))
