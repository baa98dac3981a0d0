"""Every ONNX backend node case passes, except those the manifest lists with a reason."""

from __future__ import annotations

import importlib.util

import pytest
from node_cases import MANIFEST, case_op, load_cases, load_manifest, run_case

EXPECTED_FAILURES = load_manifest()
NAMES = [c.name for c in load_cases()]


def test_manifest_names_only_existing_cases():
    unknown = sorted(set(EXPECTED_FAILURES) - set(NAMES))
    assert not unknown, f"{MANIFEST.name} lists cases onnx does not generate: {unknown}"


@pytest.mark.parametrize("name", NAMES)
def test_node_case(name):
    from node_cases import cases_by_name

    if case_op(name) == "ImageDecoder" and importlib.util.find_spec("PIL") is None:
        pytest.skip("ImageDecoder needs Pillow (optional): pip install onnxkiln[image]")
    reason = run_case(cases_by_name()[name])
    if name in EXPECTED_FAILURES:
        assert reason is not None, (
            f"{name} now passes: remove it from {MANIFEST.name} "
            f"(listed as: {EXPECTED_FAILURES[name]})"
        )
        pytest.xfail(EXPECTED_FAILURES[name])
    assert reason is None, reason
