"""Torch kernels: Optional, OptionalHasElement, OptionalGetElement (opset 15+).

An optional is its value (a tensor or a list of tensors, a sequence) or None when empty,
as in the CPU provider; nothing here touches element data.
"""

from __future__ import annotations

import torch

from onnxkiln.providers.cuda.device import current_device
from onnxkiln.providers.cuda.dtypes import FLOAT8, SERVED, SUB_BYTE, needs
from onnxkiln.providers.cuda.registry import kernel
from onnxkiln.providers.cuda.unsigned import UNSIGNED

# any element type the torch kernels can hold (the value is only passed along)
_HELD = needs(SERVED | FLOAT8 | SUB_BYTE | UNSIGNED)


@kernel("Optional", since=15, view=True, supports=_HELD)
def optional(input=None, *, type=None):
    """An optional holding `input`, or an empty optional (None) when it is absent."""
    return input


@kernel("OptionalHasElement", since=15, supports=_HELD)
def optional_has_element(input=None) -> torch.Tensor:
    """True when the input is present and not an empty optional (a 0-d bool tensor)."""
    device = input.device if isinstance(input, torch.Tensor) else (
        input[0].device if isinstance(input, list) and input else current_device())
    return torch.tensor(input is not None, device=device)


@kernel("OptionalGetElement", since=15, view=True, supports=_HELD)
def optional_get_element(input=None):
    """The value inside an optional (a plain tensor or sequence is returned as it is)."""
    if input is None:
        raise ValueError("OptionalGetElement: the optional input is empty (holds no element)")
    return input
