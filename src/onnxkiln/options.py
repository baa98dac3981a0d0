"""Session options: one table of keys, allowed values, defaults and meanings, and the
typed `SessionConfig` a session reads them from (parsed once, defaults applied).

`SessionBuilder.option(key, value)` takes string values, as onnxruntime's session config
entries do; keys under `testing.` are for tests only.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from dataclasses import dataclass

from onnxkiln.errors import InvalidOptionError, UnknownOptionError
from onnxkiln.inlining import MAX_INLINED_NODES

__all__ = ["KNOWN_OPTIONS", "OPTIMIZATION_LEVELS", "OPTIONS", "Option", "SessionConfig",
           "check_option"]

OPTIMIZATION_LEVELS = ("disabled", "basic", "extended", "all")
_FLAG = ("0", "1")


@dataclass(frozen=True)
class Option:
    """One session option: its key, the strings it takes (None: any non-empty string),
    how a value reads ("flag", "int", "text", "file" or "count": a whole number >= 1), and
    what it does."""

    key: str
    values: tuple[str, ...] | None
    kind: str
    doc: str

    @property
    def field(self) -> str:
        """Its SessionConfig attribute."""
        return self.key.replace(".", "_")


OPTIONS: tuple[Option, ...] = (
    Option("ep.context_enable", _FLAG, "flag",
           "write the compiled partitions as an EPContext model (see docs/api.md)"),
    Option("ep.context_file_path", None, "file", "where the EPContext model goes"),
    Option("ep.context_embed_mode", _FLAG, "int",
           "1: compiled partitions inside the context model; 0: in files beside it"),
    Option("ep.context_node_name_prefix", None, "text", "prefix of the EPContext node names"),
    Option("decode.memo", _FLAG, "flag", "the decode memo and its view plans (0 for A/B runs)"),
    Option("decode.verify", _FLAG, "flag",
           "compare every memo replay bit for bit with the ordinary path"),
    Option("capture.allow_seams", _FLAG, "flag",
           "0: a capture with any seam is NotCapturable"),
    Option("optimized_model_path", None, "file", "save the optimized model there"),
    Option("memory.inplace", _FLAG, "flag",
           "write elementwise results into dying inputs (unset: ONNXKILN_INPLACE, else on)"),
    Option("memory.track", _FLAG, "flag", "measure each run's peak live bytes"),
    Option("specialize", _FLAG, "flag", "per-signature specialised plans (0 for A/B runs)"),
    Option("load.max_inlined_nodes", None, "count",
           "most nodes the model-local functions may inline to"),
    Option("testing.cuda_on_torch_cpu", _FLAG, "flag",
           "test-only: the CUDA provider's torch kernels on torch's CPU device"),
)
_BY_KEY = {o.key: o for o in OPTIONS}
KNOWN_OPTIONS: dict[str, tuple[str, ...] | None] = {o.key: o.values for o in OPTIONS}
"""key -> allowed values (None: any non-empty string)."""


@dataclass(frozen=True)
class SessionConfig:
    """A session's options as typed values, defaults applied (field = key with "." -> "_")."""

    ep_context_enable: bool = False
    ep_context_file_path: str | None = None
    ep_context_embed_mode: int = 1
    ep_context_node_name_prefix: str = ""
    decode_memo: bool = True
    decode_verify: bool = False
    capture_allow_seams: bool = True
    optimized_model_path: str | None = None
    memory_inplace: bool | None = None  # None: the ONNXKILN_INPLACE environment default
    memory_track: bool = False
    specialize: bool = True
    load_max_inlined_nodes: int = MAX_INLINED_NODES
    testing_cuda_on_torch_cpu: bool = False

    @classmethod
    def from_options(cls, options: Mapping[str, str]) -> SessionConfig:
        """The config of checked `option(key, value)` strings (see check_option)."""
        values = {}
        for key, value in options.items():
            option = _BY_KEY[key]
            if option.kind == "flag":
                values[option.field] = value == "1"
            elif option.kind in ("int", "count"):
                values[option.field] = int(value)
            else:
                values[option.field] = value
        return cls(**values)


def check_option(key: str, value: str) -> str:
    """Return the value if `key` is known and `value` allowed; else a clear error."""
    option = _BY_KEY.get(key)
    if option is None:
        close = difflib.get_close_matches(key, list(KNOWN_OPTIONS), n=1)
        hint = f"; did you mean '{close[0]}'?" if close else ""
        raise UnknownOptionError(
            f"unknown session option '{key}'; valid keys are {sorted(KNOWN_OPTIONS)}{hint}"
        )
    if not isinstance(value, str):
        raise InvalidOptionError(
            f"option '{key}' takes a string value, got {type(value).__name__} {value!r}"
        )
    if option.values is None and not value:
        raise InvalidOptionError(f"option '{key}' needs a non-empty value")
    if option.values is not None and value not in option.values:
        raise InvalidOptionError(
            f"option '{key}' must be one of {list(option.values)}, got {value!r}")
    if option.kind == "count" and not (value.isdecimal() and value.isascii() and int(value) >= 1):
        raise InvalidOptionError(f"option '{key}' takes a whole number >= 1, got {value!r}")
    if option.kind == "file" and value.endswith(("/", "\\")):
        raise InvalidOptionError(f"option '{key}' must name a file, got the folder {value!r}")
    return value

