"""`onnxkiln cache`: where compiled kernels are kept between processes, found without
importing numba.

numba (`cache=True`) writes a module's kernels as .nbi/.nbc files into, in order of
preference: $NUMBA_CACHE_DIR/<folder>_<sha1 of the folder path>, the module's
__pycache__ folder when writable, or the per-user ~/.cache/numba/<folder>_<sha1>. The
fuse provider's generated loops and their numba files live in $ONNXKILN_FUSE_CACHE
(default $XDG_CACHE_HOME/onnxkiln/fuse, i.e. ~/.cache/onnxkiln/fuse).
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["Cache", "clear", "locations"]

_NUMBA_FILES = ("*.nbi", "*.nbc")
_CPU_KERNELS = Path(__file__).resolve().parents[1] / "providers" / "cpu"


@dataclass(frozen=True)
class Cache:
    """One cache folder and the kernel files in it."""

    what: str
    folder: Path
    patterns: tuple[str, ...]

    @property
    def paths(self) -> list[Path]:
        """The cached files (none when the folder does not exist)."""
        if not self.folder.is_dir():
            return []
        return sorted({p for pattern in self.patterns for p in self.folder.rglob(pattern)
                       if p.is_file()})

    @property
    def files(self) -> int:
        """How many files."""
        return len(self.paths)

    @property
    def nbytes(self) -> int:
        """Their total size."""
        return sum(p.stat().st_size for p in self.paths)

    def doc(self) -> dict[str, Any]:
        """The --json form."""
        return {"what": self.what, "folder": str(self.folder), "files": self.files,
                "bytes": self.nbytes}


def locations() -> list[Cache]:
    """The numba kernel cache of the cpu provider and the fuse provider's cache."""
    caches = [Cache("numba kernels (cpu provider)", _numba_folder(_CPU_KERNELS), _NUMBA_FILES)]
    from onnxkiln.providers.fuse.codegen import cache_dir

    fuse = cache_dir()
    if fuse is not None:
        caches.append(Cache("fused loops (fuse provider)", fuse,
                            ("k_*.py", *_NUMBA_FILES, "*.pyc")))
    return caches


def clear(caches: list[Cache]) -> int:
    """Delete the cached files; returns how many went."""
    removed = 0
    for cache in caches:
        for path in cache.paths:
            try:
                path.unlink()
                removed += 1
            except FileNotFoundError:
                pass
    return removed


def _numba_folder(source: Path) -> Path:
    """Where numba caches the kernels of modules in `source` (its locator order)."""
    suffix = f"{source.name}_{hashlib.sha1(str(source).encode()).hexdigest()}"
    if os.environ.get("NUMBA_CACHE_DIR"):
        return Path(os.environ["NUMBA_CACHE_DIR"]) / suffix
    in_tree = source / "__pycache__"
    if os.access(in_tree if in_tree.exists() else source, os.W_OK):
        return in_tree
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "numba" / suffix
