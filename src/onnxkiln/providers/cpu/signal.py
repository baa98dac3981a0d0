"""CPU kernels: signal (being written)."""

from __future__ import annotations
