"""CPU kernels: ml (being written)."""

from __future__ import annotations
