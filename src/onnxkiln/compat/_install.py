"""`install()`: onnxkiln.compat behind the name `onnxruntime`, for programs that import
onnxruntime themselves and cannot be edited."""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.metadata
import re
import sys
from collections.abc import Sequence
from types import ModuleType

from onnxkiln import __version__ as kiln_version
from onnxkiln.compat._runtime import ORT_API_VERSION
from onnxkiln.errors import SessionError

__all__ = ["ALIASES", "InstallError", "install", "installed", "uninstall"]

# onnxruntime's module name -> the onnxkiln.compat module served under it
ALIASES = {
    "onnxruntime": "onnxkiln.compat",
    "onnxruntime.capi": "onnxkiln.compat.capi",
    "onnxruntime.capi._pybind_state": "onnxkiln.compat.capi._pybind_state",
    "onnxruntime.capi.onnxruntime_pybind11_state":
        "onnxkiln.compat.capi.onnxruntime_pybind11_state",
    "onnxruntime.capi.onnxruntime_inference_collection":
        "onnxkiln.compat.capi.onnxruntime_inference_collection",
    "onnxruntime.backend": "onnxkiln.compat.backend",
}


class InstallError(SessionError, ImportError):
    """`install()` cannot put onnxkiln behind `onnxruntime` in this process."""


class _Distribution(importlib.metadata.Distribution):
    """The `onnxruntime` distribution's metadata, for packages that check
    `importlib.metadata.version("onnxruntime")` before importing it."""

    def read_text(self, filename: str) -> str | None:
        if filename == "METADATA":
            return (f"Metadata-Version: 2.1\nName: onnxruntime\nVersion: {ORT_API_VERSION}\n"
                    f"Summary: onnxkiln {kiln_version} behind onnxruntime's API "
                    "(onnxkiln.compat.install())\n")
        return None

    def locate_file(self, path: str) -> None:  # type: ignore[override]
        return None


class _OtherSubmodules(importlib.abc.MetaPathFinder):
    """Refuses `onnxruntime.<anything else>` by name, so it is never looked for among
    onnxkiln.compat's own files (which would load a second copy of them); and answers
    `importlib.metadata` for the `onnxruntime` distribution."""

    def find_distributions(self, context: importlib.metadata.DistributionFinder.Context
                           | None = None) -> list:
        name = context.name if context is not None else None
        if name is not None and re.sub(r"[-_.]+", "_", name).lower() == "onnxruntime":
            return [_Distribution()]
        return []

    def find_spec(self, fullname: str, path: Sequence[str] | None, target: ModuleType | None
                  = None) -> None:
        if fullname.startswith("onnxruntime.") and fullname not in ALIASES:
            raise ModuleNotFoundError(
                f"No module named {fullname!r}: onnxkiln.compat.install() serves "
                f"{', '.join(ALIASES)}; {fullname} (an onnxruntime tool, training or "
                "transformers module) has no onnxkiln counterpart", name=fullname)
        return None


_finder = _OtherSubmodules()


def installed() -> bool:
    """True when `import onnxruntime` gives onnxkiln.compat in this process."""
    return sys.modules.get("onnxruntime") is sys.modules.get("onnxkiln.compat") is not None


def install() -> None:
    """Make `import onnxruntime` (and the submodules in ALIASES) give onnxkiln.compat.

    Call it before the program imports onnxruntime, or run the program with
    `python -m onnxkiln.compat SCRIPT [ARGS]`. A second call does nothing. If the real
    onnxruntime is already imported, raises InstallError rather than leave a process in
    which some code runs on onnxruntime and some on onnxkiln.

    Example:
        >>> import onnxkiln.compat
        >>> onnxkiln.compat.install()
        >>> import onnxruntime as ort          # onnxkiln.compat
        >>> ort.InferenceSession("model.onnx").run(None, feeds)
    """
    if installed():
        return
    loaded = sorted(n for n in sys.modules if n == "onnxruntime" or n.startswith("onnxruntime."))
    if loaded:
        origin = getattr(sys.modules.get(loaded[0]), "__file__", None) or "?"
        raise InstallError(
            f"onnxkiln.compat.install(): the real onnxruntime is already imported in this "
            f"process ({loaded[0]} from {origin}); call install() before anything imports "
            "onnxruntime, or run the program with `python -m onnxkiln.compat SCRIPT`")
    modules = {alias: importlib.import_module(target) for alias, target in ALIASES.items()}
    sys.modules.update(modules)
    if _finder not in sys.meta_path:
        sys.meta_path.insert(0, _finder)


def uninstall() -> None:
    """Undo `install()`: `onnxruntime` is importable again as whatever is installed."""
    for alias, target in ALIASES.items():
        if sys.modules.get(alias) is sys.modules.get(target):
            del sys.modules[alias]
    if _finder in sys.meta_path:
        sys.meta_path.remove(_finder)
