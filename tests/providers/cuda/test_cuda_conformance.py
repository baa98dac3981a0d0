"""Backend node cases on the torch kernels alone agree with manifest_torch.txt: a fixed
quarter of the cases (every fourth by name), so that a kernel regression or a changed
decline reason fails the unit suite. conformance_torch.py checks all of them (about 25 s of CPU)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch", reason="the CUDA provider's kernels are torch ops")

from conformance_torch import load_torch_manifest, mismatch, torch_outcome  # noqa: E402
from node_cases import cases_by_name  # noqa: E402

LISTED = load_torch_manifest()
NAMES = sorted(cases_by_name())[::4]


def test_manifest_names_only_existing_cases():
    unknown = sorted(set(LISTED) - set(cases_by_name()))
    assert not unknown, f"manifest_torch.txt lists cases onnx does not generate: {unknown}"


@pytest.mark.parametrize("name", NAMES)
def test_torch_node_case(name):
    problem = mismatch(name, torch_outcome(cases_by_name()[name]), LISTED.get(name))
    assert problem is None, problem
