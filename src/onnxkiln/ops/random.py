"""The random ops' streams, for every provider (RandomNormal/Uniform, Bernoulli, Multinomial,
training Dropout).

Each node owns one stream, made when its kernel is built: numpy's legacy MT19937
`RandomState(seed)`, the generator onnx's test data and reference implementation seed, so a
seeded node follows onnx's sequence and draws the same values on every provider (a device
provider draws on the host and copies). Nodes without a `seed` draw theirs from
`set_default_seed`'s stream when one is set (onnxruntime's set_seed), else from entropy.
"""

from __future__ import annotations

import math

import numpy as np

__all__ = ["seeded_state", "set_default_seed"]

_U32 = 1 << 32
_U64 = 1 << 64

_default: np.random.RandomState | None = None  # set_default_seed's stream


def set_default_seed(seed: int | None) -> None:
    """Streams of nodes without a `seed` attribute, created from now on, draw their seeds
    from `RandomState(seed)` (onnxruntime's set_seed); None: from entropy again."""
    global _default
    _default = None if seed is None else np.random.RandomState(seed % _U32)


def seeded_state(seed: float | int | None) -> np.random.RandomState:
    """A legacy MT19937 stream: `RandomState(seed)` for seeds in [0, 2^32), entropy for None.

    Other integral seeds (negative or wider) are taken modulo 2^64 and split into two 32-bit
    words; non-integral float seeds use their 64-bit pattern the same way.
    """
    if seed is None:
        return np.random.RandomState(None if _default is None else _default.randint(_U32))
    if isinstance(seed, (float, np.floating)):
        f = float(seed)
        whole = math.isfinite(f) and f.is_integer()
        value = int(f) if whole else int(np.float64(f).view(np.uint64))
    else:
        value = int(seed)
    if 0 <= value < _U32:
        return np.random.RandomState(value)
    value %= _U64
    return np.random.RandomState([value & (_U32 - 1), value >> 32])
