"""sklearn-onnx's own test suite (every tests/test_*.py of a checkout of onnx/sklearn-onnx)
on onnxruntime and on onnxkiln behind it, compared test by test.

    python scripts/sklearn_onnx_tests.py ~/sklearn-onnx --json /tmp/skl.json
    python scripts/sklearn_onnx_tests.py ~/sklearn-onnx --files 'test_algebra_*.py'

Use the checkout of the installed skl2onnx's release (the tests import skl2onnx from the
environment, not from the checkout). Each file runs in its own pytest process, on each
runtime in turn (scripts/ort_api_tests.py does the running and the table); the output is a
line per file with passed/failed/skipped on each runtime, then every test that passes on
onnxruntime and not on onnxkiln, with the first line of its failure.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import ort_api_tests  # a sibling script, not a package


def tests_folder(checkout: Path) -> Path:
    """The checkout's tests/ folder (or the checkout itself when it is that folder)."""
    folder = checkout / "tests" if (checkout / "tests").is_dir() else checkout
    if not (folder / "test_utils").is_dir():
        raise SystemExit(f"{checkout} is not a checkout of onnx/sklearn-onnx (no tests/test_utils)")
    return folder


def main() -> int:
    parser = ort_api_tests.parser_for(__doc__.split("\n")[0],
                                      "a checkout of onnx/sklearn-onnx", ["test_*.py"])
    parser.set_defaults(timeout=900)
    args = parser.parse_args()
    return ort_api_tests.run_folder(tests_folder(args.folder), args, parser)


if __name__ == "__main__":
    sys.exit(main())
