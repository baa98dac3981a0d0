"""CPU kernels: norm (being written)."""

from __future__ import annotations
