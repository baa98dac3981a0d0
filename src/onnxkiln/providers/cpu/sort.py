"""CPU kernels: sort (being written)."""

from __future__ import annotations
