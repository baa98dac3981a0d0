"""CPU kernels: math (being written)."""

from __future__ import annotations
