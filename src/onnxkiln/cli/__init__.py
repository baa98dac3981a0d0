"""`onnxkiln run | info | check | bench | profile | demo | serve | cache`: the command line.

Only argparse loads before the arguments are parsed (so `--help` is quick); each command
imports what it needs. Results go to stdout (one JSON document with `--json`), errors and
progress to stderr. Exit codes: 0 ok, 1 the model or the run failed (a `SessionError`),
2 a usage error.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from onnxkiln import __version__

__all__ = ["UsageError", "main"]

_EXIT_CODES = "exit codes: 0 ok, 1 the model or the run failed, 2 a usage error."
_EPILOG = f"""\
{_EXIT_CODES}

disk caches: the numba kernels (the `fast` and `fuse` extras) compile on first use, which
can take seconds, and keep their machine code on disk so later processes load it:
onnxkiln/providers/cpu/__pycache__ (or $NUMBA_CACHE_DIR, or ~/.cache/numba when the
package folder is read-only) and $ONNXKILN_FUSE_CACHE (default ~/.cache/onnxkiln/fuse).
`onnxkiln cache` shows them and their size; `onnxkiln cache --clear` empties them."""

_INPUT_HELP = ("an input: NAME=FILE.npy, NAME=random, or NAME=ints:LOW:HIGH (random integers "
               "in [LOW, HIGH)); inputs not given are random: floats from a normal "
               "distribution, integers in [0, 2) (names with 'mask': 1), as token ids, type "
               "ids and masks of any vocabulary take them")
_DIM_HELP = ("the size of a named (symbolic) dim of the random inputs; dims of inputs given "
             "as files follow those files; the rest are 1")


class UsageError(Exception):
    """A bad command-line value: printed as one `error:` line, exit code 2."""


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `onnxkiln` command; returns the process exit code."""
    args = _parser().parse_args(argv)
    from onnxkiln.cli._output import Output
    from onnxkiln.errors import SessionError

    out = Output(as_json=getattr(args, "json", False))
    try:
        return args.func(args, out)
    except SessionError as e:
        out.error(f"{type(e).__name__}: {e}")
        return 1
    except UsageError as e:
        out.error(str(e))
        return 2
    except KeyboardInterrupt:
        out.error("interrupted")
        return 130


class _Help(argparse.RawDescriptionHelpFormatter):
    """Help that ends each option's text with its default (when it has one)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        default = action.default
        if (action.option_strings and "%(default)" not in text
                and not (default is None or default is False or default == []
                         or default is argparse.SUPPRESS)):
            text += " (default: %(default)s)"
        return text


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="onnxkiln", formatter_class=_Help, epilog=_EPILOG,
        description="An ONNX inference runtime: run, inspect, check, time and profile models.")
    parser.add_argument("--version", action="version", version=f"onnxkiln {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def command(name: str, summary: str, func: str) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=summary, description=summary, formatter_class=_Help,
                           epilog=_EPILOG if name in ("run", "cache") else _EXIT_CODES)
        p.set_defaults(func=_lazy(func))
        return p

    run = command("run", "run a model on given or random inputs; print the outputs and the "
                  "first-run and steady times", "run")
    _feed_args(run)
    _session_args(run)
    run.add_argument("--repeat", type=_count, default=3,
                     help="timed steady runs after the first run and the warm-up (0: none)")
    run.add_argument("--warmup", type=_count, default=1,
                     help="untimed runs between the first run and the timed ones")
    run.add_argument("--save", metavar="DIR", help="write each output to DIR/<name>.npy "
                     "(sequences and maps to DIR/<name>.json)")
    _json_arg(run)

    info = command("info", "inputs, outputs, opsets, op histogram and size", "info")
    info.add_argument("model", help="the .onnx file")
    _json_arg(info)

    check = command("check", "can this model run here: unsupported ops, opsets, placement "
                    "per provider (exit 1 when it cannot)", "check")
    check.add_argument("model", help="the .onnx file")
    check.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N")
    check.add_argument("--providers", help="comma-separated priority list, e.g. cuda,cpu")
    check.add_argument("--optimization", default="all",
                       choices=["disabled", "basic", "extended", "all"],
                       help="graph optimization level")
    _json_arg(check)

    bench = command("bench", "latency percentiles and throughput, beside onnxruntime; "
                    "--suite: the benchmark suite", "bench")
    _feed_args(bench, model_optional=True)
    _session_args(bench)
    bench.add_argument("--runs", type=_positive, default=100, help="timed runs per runtime")
    bench.add_argument("--warmup", type=_count, default=5, help="untimed runs first")
    bench.add_argument("--no-ort", action="store_true", help="skip onnxruntime")
    bench.add_argument("--suite", nargs=argparse.REMAINDER, metavar="SUITE OPTIONS",
                       help="run the benchmark suite (the zoo models vs onnxruntime and onnx's "
                       "ReferenceEvaluator; needs the source checkout's bench/ folder); every "
                       "later argument goes to it: see `python -m bench --help`")
    _json_arg(bench)

    profile = command("profile", "time per op type and per node (fused nodes name the model's "
                      "nodes they replaced), and a Chrome trace", "profile")
    _feed_args(profile)
    _session_args(profile)
    profile.add_argument("--runs", type=_positive, default=10, help="traced runs")
    profile.add_argument("--top", type=_count, default=10, help="how many nodes to list")
    profile.add_argument("--trace", metavar="FILE.json",
                         help="Chrome trace path (default: <model name>_profile.json)")

    demo = command("demo", "run the built-in demo model, and onnxruntime if present", "demo")
    demo.add_argument("--repeat", type=_positive, default=20, help="timed runs")

    cache = command("cache", "where the disk caches of compiled kernels are, and their size",
                    "cache")
    cache.add_argument("--clear", action="store_true", help="delete the cached kernels")
    _json_arg(cache)

    serve = command("serve", "serve a model over HTTP on Ray Serve (extra 'ray')", "serve")
    _serve_args(serve)
    return parser


def _lazy(name: str):
    """The command function `name` of onnxkiln.cli._commands, imported when it runs."""

    def run(args: argparse.Namespace, out) -> int:
        from onnxkiln.cli import _commands

        return getattr(_commands, f"cmd_{name}")(args, out)

    return run


def _feed_args(p: argparse.ArgumentParser, model_optional: bool = False) -> None:
    p.add_argument("model", nargs="?" if model_optional else None, help="the .onnx file")
    p.add_argument("-i", "--input", action="append", default=[], help=_INPUT_HELP,
                   metavar="NAME=VALUE")
    p.add_argument("--dim", action="append", default=[], metavar="NAME=SIZE", help=_DIM_HELP)
    p.add_argument("--seed", type=int, default=0, help="seed of the random inputs")


def _session_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N")
    p.add_argument("--threads", type=_positive, help="intra-op threads (default: the cores)")


def _json_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true",
                   help="print one JSON document instead of tables")


def _serve_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", help="the .onnx file")
    p.add_argument("--host", default="127.0.0.1", help="0.0.0.0 to listen on all interfaces")
    p.add_argument("--port", type=int, default=8000, help="the HTTP port")
    p.add_argument("--replicas", type=int, default=1, help="replicas, each with its session")
    p.add_argument("--batching", action="store_true",
                   help="stack concurrent requests into one run (the model must keep rows "
                   "apart; checked, refused otherwise); default: each request alone")
    p.add_argument("--max-batch-size", type=int, default=32,
                   help="requests per @serve.batch batch (with --batching)")
    p.add_argument("--batch-wait-ms", type=float, default=5.0,
                   help="how long a batch waits to fill")
    p.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N")
    p.add_argument("--threads", type=int, help="intra-op threads per replica")
    p.add_argument("--replica-cpus", type=float, default=1.0, help="CPUs Ray reserves per replica")
    p.add_argument("--replica-gpus", type=float, default=0.0, help="GPUs Ray gives each replica")
    p.add_argument("--route-prefix", default="/", help="the URL prefix of the app")
    p.add_argument("--name", default="onnxkiln", help="the Serve application's name")
    p.add_argument("--address", help="a Ray cluster to join (default: start a local one)")


def _count(text: str) -> int:
    return _at_least(text, 0)


def _positive(text: str) -> int:
    return _at_least(text, 1)


def _at_least(text: str, low: int) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if value < low:
        raise argparse.ArgumentTypeError(f"must be >= {low}, got {value}")
    return value
