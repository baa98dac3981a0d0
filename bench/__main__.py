"""`python -m bench`: the onnxkiln benchmark suite (see bench/suite.py);
`python -m bench --suite exported`: the exported-model suite (see bench/exported/cli.py);
`python -m bench --suite quantized`: quantized and float16 variants (see bench/quantized.py)."""

from __future__ import annotations

import importlib.util
import sys

from bench import _env

SUITES = ("realistic", "exported", "quantized")
NEEDS_ORT = ("the benchmarks compare onnxkiln with onnxruntime, which is not installed: "
             "pip install 'onnxkiln[bench]' (or pip install onnxruntime)")


def split_suite(argv: list[str]) -> tuple[str, list[str]]:
    """The `--suite NAME` (or `--suite=NAME`) choice, default "realistic", and the rest."""
    for i, arg in enumerate(argv):
        if arg == "--suite" and i + 1 < len(argv):
            return argv[i + 1], argv[:i] + argv[i + 2:]
        if arg.startswith("--suite="):
            return arg.split("=", 1)[1], argv[:i] + argv[i + 1:]
    return "realistic", argv


def run_main(argv: list[str] | None = None) -> int:
    """Drop the OpenBLAS pins before numpy loads (re-executing, unless --keep-env), then run."""
    argv = sys.argv[1:] if argv is None else argv
    if importlib.util.find_spec("onnxruntime") is None:
        print(NEEDS_ORT, file=sys.stderr)
        return 2
    _env.unpin(argv, keep_env="--keep-env" in argv)
    suite, rest = split_suite(argv)
    if suite not in SUITES:
        print(f"unknown suite {suite!r}; choose one of {', '.join(SUITES)}", file=sys.stderr)
        return 2
    if suite == "exported":
        from bench.exported.cli import main as exported_main

        return exported_main(rest)
    if suite == "quantized":
        from bench.quantized import main as quantized_main

        return quantized_main(rest)
    from bench.suite import main

    return main(rest)


if __name__ == "__main__":
    sys.exit(run_main())
