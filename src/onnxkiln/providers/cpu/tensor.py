"""CPU kernels: tensor (being written)."""

from __future__ import annotations
