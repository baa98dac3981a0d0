"""Every op the CPU provider serves outside ai.onnx and ai.onnx.ml, on generated inputs,
against onnxruntime's CPU provider (graph optimizations off on both sides, so the node runs as
written), or against numpy for the few onnxruntime's CPU build cannot run (ORT_LACKS).

The op list comes from the kernel registry, so a new kernel without a case fails
`test_every_served_op_has_a_case`. The generators live in contrib_cases_*.py, one per op.
"""

from __future__ import annotations

import contrib_cases_attention
import contrib_cases_blocks
import contrib_cases_float
import contrib_cases_generation
import contrib_cases_nchwc
import contrib_cases_qlinear
import contrib_cases_quant
import contrib_cases_recurrent
import pytest
from contrib_harness import ORT_LACKS, SPECS, check_against_ort, rng_for

import onnxkiln.providers.cpu
from onnxkiln.providers.cpu import _numba
from onnxkiln.providers.cpu.registry import REGISTRY

CASE_MODULES = (contrib_cases_attention, contrib_cases_blocks, contrib_cases_float,
                contrib_cases_generation, contrib_cases_nchwc, contrib_cases_qlinear,
                contrib_cases_quant, contrib_cases_recurrent, onnxkiln.providers.cpu)
STANDARD = {"", "ai.onnx", "ai.onnx.ml"}

# Served outside ai.onnx / ai.onnx.ml but not contrib ops of onnxruntime's, each with why and
# where its values are checked instead.
NOT_CONTRIB = {
    **{("onnxkiln", op): "onnxkiln's own fusion output, which onnxruntime does not have; "
       "checked against the unfused graphs on onnxruntime in tests/optimizer"
       for op in ("FusedConv", "FusedMatMulBias", "ScaledDotProductAttention", "Silu")},
    **{("ai.onnx.preview.training", op): "ONNX's training preview domain, absent from "
       "onnxruntime's inference build; checked against numpy transcriptions of the spec in "
       "tests/providers/cpu/test_training.py"
       for op in ("Adagrad", "Adam", "Momentum", "Gradient")},
    ("ai.onnx.preview", "FlexAttention"): "an ONNX preview op onnxruntime 1.32 does not have; "
    "checked against numpy in tests/providers/cpu/test_attention.py",
}


def served() -> set[tuple[str, str]]:
    return {k for k in REGISTRY.ops() if k[0] not in STANDARD}


def test_every_served_op_has_a_case():
    missing = sorted(served() - set(SPECS) - set(NOT_CONTRIB))
    assert not missing, "ops served but with no case: " + ", ".join(
        f"{d}::{op}" for d, op in missing)
    stale = sorted((set(SPECS) | set(NOT_CONTRIB)) - served())
    assert not stale, f"cases for ops the CPU provider does not serve: {stale}"
    assert not set(SPECS) & set(NOT_CONTRIB)


def test_ops_listed_as_not_contrib_are_absent_from_onnxruntime():
    """Once onnxruntime runs one of these, it belongs in the generated table."""
    from onnxruntime.capi import onnxruntime_pybind11_state as ort_c

    known = {(s.domain, s.name) for s in ort_c.get_all_operator_schema()}
    assert not known & set(NOT_CONTRIB), known & set(NOT_CONTRIB)
    assert all(ORT_LACKS.values())


def _params():
    out = []
    for (domain, op), make in sorted(SPECS.items()):
        cases = make(rng_for(op))
        assert cases, f"{op}: no cases"
        for case in cases:
            marks = [pytest.mark.xfail(strict=True, reason=case.xfail)] if case.xfail else []
            out.append(pytest.param(op, domain, case, id=f"{op}-{case.id}", marks=marks))
    return out


@pytest.mark.parametrize("numba_on", [True, False], ids=["numba", "numpy"])
@pytest.mark.parametrize("op,domain,case", _params())
def test_matches_onnxruntime(op, domain, case, numba_on, monkeypatch):
    monkeypatch.setattr(_numba, "ENABLED", numba_on)  # read at plan time: both paths
    check_against_ort(op, domain, case)
