"""Session option keys accepted by `SessionBuilder.option`, with their allowed values."""

from __future__ import annotations

import difflib

from onnxkiln.errors import InvalidOptionError, UnknownOptionError

__all__ = ["COUNT_OPTIONS", "FILE_OPTIONS", "KNOWN_OPTIONS", "OPTIMIZATION_LEVELS", "check_option"]

OPTIMIZATION_LEVELS = ("disabled", "basic", "extended", "all")

# key -> allowed values (None: any non-empty string)
KNOWN_OPTIONS: dict[str, tuple[str, ...] | None] = {
    "ep.context_enable": ("0", "1"),
    "ep.context_file_path": None,
    "ep.context_embed_mode": ("0", "1"),
    "ep.context_node_name_prefix": None,
    "decode.verify": ("0", "1"),
    "capture.allow_seams": ("0", "1"),  # 0: a capture with any seam is NotCapturable
    "decode.memo": ("0", "1"),  # the decode memo and view plan (default 1; 0 for A/B runs)
    "optimized_model_path": None,
    "memory.inplace": ("0", "1"),  # write elementwise results into dying inputs (default 1)
    "memory.track": ("0", "1"),  # measure each run's peak live bytes (memory_stats())
    "specialize": ("0", "1"),  # per-signature specialised plans (default 1; 0 for A/B runs)
    # test-only: run the CUDA provider's torch kernels on torch's CPU device (no GPU needed)
    "testing.cuda_on_torch_cpu": ("0", "1"),
    # most nodes the model-local functions may inline to (default 1000000; see inlining.py)
    "load.max_inlined_nodes": None,
}
FILE_OPTIONS = frozenset({"ep.context_file_path", "optimized_model_path"})
COUNT_OPTIONS = frozenset({"load.max_inlined_nodes"})  # a whole number >= 1


def check_option(key: str, value: str) -> str:
    """Return the value if `key` is known and `value` allowed; else a clear error."""
    if key not in KNOWN_OPTIONS:
        close = difflib.get_close_matches(key, list(KNOWN_OPTIONS), n=1)
        hint = f"; did you mean '{close[0]}'?" if close else ""
        raise UnknownOptionError(
            f"unknown session option '{key}'; valid keys are {sorted(KNOWN_OPTIONS)}{hint}"
        )
    if not isinstance(value, str):
        raise InvalidOptionError(
            f"option '{key}' takes a string value, got {type(value).__name__} {value!r}"
        )
    allowed = KNOWN_OPTIONS[key]
    if allowed is None and not value:
        raise InvalidOptionError(f"option '{key}' needs a non-empty value")
    if allowed is not None and value not in allowed:
        raise InvalidOptionError(f"option '{key}' must be one of {list(allowed)}, got {value!r}")
    if key in COUNT_OPTIONS and not (value.isdecimal() and value.isascii() and int(value) >= 1):
        raise InvalidOptionError(f"option '{key}' takes a whole number >= 1, got {value!r}")
    if key in FILE_OPTIONS and value.endswith(("/", "\\")):
        raise InvalidOptionError(f"option '{key}' must name a file, got the folder {value!r}")
    return value
