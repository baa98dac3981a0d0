"""`python -m onnxkiln.compat SCRIPT [ARGS]` or `python -m onnxkiln.compat -m MODULE
[ARGS]`: run an onnxruntime program, unchanged, on onnxkiln (`install()` first)."""

from __future__ import annotations

import os
import runpy
import sys

from onnxkiln.compat._install import install

USAGE = ("usage: python -m onnxkiln.compat SCRIPT [ARGS...]\n"
         "       python -m onnxkiln.compat -m MODULE [ARGS...]\n"
         "Runs an onnxruntime program on onnxkiln: `import onnxruntime` gives onnxkiln.compat.")


def main(argv: list[str]) -> int:
    """Run the script or module `argv` names, as python would, with onnxkiln installed."""
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE, file=sys.stderr if not argv else sys.stdout)
        return 2 if not argv else 0
    install()
    if argv[0] == "-m":
        if len(argv) < 2:
            print(USAGE, file=sys.stderr)
            return 2
        sys.argv = [argv[1], *argv[2:]]
        sys.path[0] = os.getcwd()
        runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
        return 0
    script = argv[0]
    if not os.path.isfile(script):
        print(f"python -m onnxkiln.compat: can't open file {script!r}", file=sys.stderr)
        return 2
    sys.argv = list(argv)
    sys.path[0] = os.path.dirname(os.path.abspath(script))
    runpy.run_path(script, run_name="__main__")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
