"""CPU kernels: quant (being written)."""

from __future__ import annotations
