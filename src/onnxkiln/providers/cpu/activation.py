"""CPU kernels: activation (being written)."""

from __future__ import annotations
