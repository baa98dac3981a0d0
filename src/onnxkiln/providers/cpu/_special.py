"""scipy.special's ufuncs the kernels use, imported on their first call.

scipy takes a few hundred milliseconds to import and most models never reach an erf or a
sigmoid, so neither importing onnxkiln nor building a session imports it. Each name here
is a callable with the ufunc's signature (`erf(x, out=y)`); the first call imports
scipy.special and later calls go straight to the ufunc.
"""

from __future__ import annotations

from typing import Any

__all__ = ["erf", "expit"]


class _Ufunc:
    """A scipy.special ufunc looked up on the first call."""

    __slots__ = ("_fn", "_name")

    def __init__(self, name: str) -> None:
        self._name = name
        self._fn: Any = None

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        fn = self._fn
        if fn is None:
            import scipy.special

            fn = self._fn = getattr(scipy.special, self._name)
        return fn(*args, **kwargs)

    def __repr__(self) -> str:
        return f"<scipy.special.{self._name}, imported on first call>"


erf = _Ufunc("erf")
expit = _Ufunc("expit")
