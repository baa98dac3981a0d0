"""CPU kernels: linalg (being written)."""

from __future__ import annotations
