"""CPU kernels: pool (being written)."""

from __future__ import annotations
