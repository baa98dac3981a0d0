"""CPU kernels: loss (being written)."""

from __future__ import annotations
