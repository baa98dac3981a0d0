"""CPU kernels: random (being written)."""

from __future__ import annotations
