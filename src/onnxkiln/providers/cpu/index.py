"""CPU kernels: index (being written)."""

from __future__ import annotations
