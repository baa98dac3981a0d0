"""Which providers serve a session: device and provider requests -> kernel registries."""

from __future__ import annotations

import importlib.util
import logging
from collections.abc import Sequence
from dataclasses import dataclass

from onnxkiln.errors import ExecutionProviderUnavailableError, InvalidOptionError
from onnxkiln.providers.base import KernelRegistry
from onnxkiln.types import DeviceId, DeviceType

__all__ = ["Placement", "select_providers"]

logger = logging.getLogger(__name__)
KNOWN_PROVIDERS = ("cpu", "cuda")
_warned: set[str] = set()


@dataclass(frozen=True)
class Placement:
    """The registries a session uses, its device, and why an accelerator was not used."""

    registries: tuple[KernelRegistry, ...]
    device: DeviceId
    requested: str
    fallback_reason: str | None


def select_providers(device: str, providers: Sequence[str] | None) -> Placement:
    """Resolve `device("auto"|"cpu"|"cuda[:N]")` and `providers([...])` to registries."""
    from onnxkiln.providers.cpu import REGISTRY as CPU

    names = [p.lower() for p in providers] if providers else None
    if names is not None:
        for name in names:
            if name.split(":")[0] not in KNOWN_PROVIDERS:
                raise InvalidOptionError(
                    f"unknown provider '{name}'; known providers are {list(KNOWN_PROVIDERS)}"
                )
        if not names:
            raise InvalidOptionError("providers([...]) needs at least one provider")
    wanted = names[0] if names else device
    if wanted in ("auto", "cpu"):  # no CUDA provider exists yet, so "auto" is the CPU
        return Placement((CPU,), DeviceId(DeviceType.CPU), wanted, None)
    reason = _cuda_unavailable_reason()
    if names is not None and "cpu" not in names:
        raise ExecutionProviderUnavailableError(
            f"provider 'cuda' was requested without 'cpu' and cannot run: {reason}. "
            "Add 'cpu' to the providers list to allow fallback."
        )
    if reason not in _warned:
        _warned.add(reason)
        logger.warning("CUDA requested but unavailable (%s); the session runs on the CPU", reason)
    return Placement((CPU,), DeviceId(DeviceType.CPU), wanted, reason)


def _cuda_unavailable_reason() -> str:
    """Why a CUDA session cannot run here (the CUDA provider lands in a later issue)."""
    if importlib.util.find_spec("torch") is None:
        return "torch is not installed"
    import torch

    if not torch.cuda.is_available():
        return "no CUDA device"
    return "onnxkiln's CUDA provider is not implemented yet"
