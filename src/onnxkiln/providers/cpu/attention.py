"""CPU kernels: attention (being written)."""

from __future__ import annotations
