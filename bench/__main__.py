"""`python -m bench`: the onnxkiln benchmark suite (see bench/suite.py)."""

from __future__ import annotations

import sys

from bench import _env


def run_main(argv: list[str] | None = None) -> int:
    """Drop the OpenBLAS pins before numpy loads (re-executing, unless --keep-env), then run."""
    argv = sys.argv[1:] if argv is None else argv
    _env.unpin(argv, keep_env="--keep-env" in argv)
    from bench.suite import main

    return main(argv)


if __name__ == "__main__":
    sys.exit(run_main())
