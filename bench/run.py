"""Compatibility entry point: `python bench/run.py` runs the benchmark suite (bench/suite.py).

    python bench/run.py                   # = python -m bench
    python bench/run.py --small           # = python -m bench --quick
    python bench/run.py --only gpt2 --repeat 50     # = python -m bench --models gpt2 ...

The old options map onto the suite's (--only NAME, repeatable -> --models; --small ->
--quick); every other option is the suite's own (see `python -m bench --help`).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.__main__ import run_main


def translate(argv: list[str]) -> list[str]:
    """bench/run.py's old flags -> the suite's."""
    out, only = [], []
    args = iter(argv)
    for arg in args:
        if arg == "--only":
            only.append(next(args, ""))
        elif arg.startswith("--only="):
            only.append(arg.split("=", 1)[1])
        elif arg == "--small":
            out.append("--quick")
        else:
            out.append(arg)
    return [*out, "--models", ",".join(only)] if only else out


if __name__ == "__main__":
    sys.exit(run_main(translate(sys.argv[1:])))
