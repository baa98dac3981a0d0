"""CPU kernels: image (being written)."""

from __future__ import annotations
