"""CPU kernels: reduce (being written)."""

from __future__ import annotations
