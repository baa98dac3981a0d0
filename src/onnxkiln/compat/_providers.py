"""onnxruntime execution provider names <-> onnxkiln providers."""

from __future__ import annotations

import functools
import warnings
from collections.abc import Mapping, Sequence
from typing import Any

from onnxkiln.errors import ExecutionProviderUnavailableError, InvalidOptionError

__all__ = [
    "ALL_PROVIDERS",
    "CPU",
    "CUDA",
    "check_and_normalize_provider_args",
    "get_all_providers",
    "get_available_providers",
    "normalize_providers",
    "to_onnxkiln",
]

CPU = "CPUExecutionProvider"
CUDA = "CUDAExecutionProvider"

# every name onnxruntime 1.2x/1.3x knows; a name outside this list is a typo
ALL_PROVIDERS = (
    "TensorrtExecutionProvider", CUDA, "MIGraphXExecutionProvider", "ROCMExecutionProvider",
    "OpenVINOExecutionProvider", "DnnlExecutionProvider", "VitisAIExecutionProvider",
    "QNNExecutionProvider", "NnapiExecutionProvider", "VSINPUExecutionProvider",
    "JsExecutionProvider", "CoreMLExecutionProvider", "ArmNNExecutionProvider",
    "ACLExecutionProvider", "DmlExecutionProvider", "RknpuExecutionProvider",
    "WebNNExecutionProvider", "WebGpuExecutionProvider", "XnnpackExecutionProvider",
    "CANNExecutionProvider", "AzureExecutionProvider", "NvTensorRTRTXExecutionProvider", CPU,
)


def get_all_providers() -> list[str]:
    """Every execution provider name onnxruntime defines (most are not served here)."""
    return list(ALL_PROVIDERS)


def get_available_providers() -> list[str]:
    """The providers onnxkiln can run here: CUDAExecutionProvider when onnxkiln's CUDA
    provider works on this machine, and always CPUExecutionProvider."""
    return list(_available())


@functools.cache
def _available() -> tuple[str, ...]:
    from onnxkiln.partition import select_providers

    try:
        select_providers("cuda", ["cuda"])
    except ExecutionProviderUnavailableError:
        return (CPU,)
    return (CUDA, CPU)


def normalize_providers(
    providers: Sequence[str | tuple[str, Mapping[str, Any]]] | None,
    provider_options: Sequence[Mapping[str, Any]] | None,
) -> tuple[list[str], list[dict[str, str]]]:
    """Validate `providers` / `provider_options` as onnxruntime does and return the names
    (with CPUExecutionProvider last, as onnxruntime always falls back to it) and their
    options as strings.

    Differences from onnxruntime, on purpose: a name onnxruntime does not know raises
    `InvalidOptionError` (a ValueError) instead of a printed fallback to the CPU, and a
    bare string raises instead of being read as a list of one-letter names.
    """
    available = get_available_providers()
    if providers is None:
        if provider_options is not None:
            raise InvalidOptionError("'provider_options' was given without 'providers'")
        providers = list(available)
    if isinstance(providers, str) or not isinstance(providers, Sequence):
        raise InvalidOptionError(
            f"'providers' should be a sequence of provider names, got {providers!r}; e.g. "
            f"providers=['{CPU}']")
    pairs: list[tuple[str, Mapping[str, Any]]] = []
    if provider_options is not None:
        if isinstance(provider_options, Mapping) or not isinstance(provider_options, Sequence):
            raise InvalidOptionError("'provider_options' should be a sequence of dicts")
        if len(providers) != len(provider_options):
            raise InvalidOptionError(
                "'providers' and 'provider_options' should be the same length if both are "
                f"given ({len(providers)} vs {len(provider_options)})")
        if not all(isinstance(p, str) for p in providers):
            raise InvalidOptionError(
                "Only string values for 'providers' are supported if 'provider_options' is "
                "given.")
        if not all(isinstance(o, Mapping) for o in provider_options):
            raise InvalidOptionError("'provider_options' values must be dicts.")
        pairs = list(zip(providers, provider_options))  # type: ignore[arg-type]
    else:
        for p in providers:
            if isinstance(p, str):
                pairs.append((p, {}))
            elif (isinstance(p, tuple) and len(p) == 2 and isinstance(p[0], str)
                  and isinstance(p[1], Mapping)):
                pairs.append((p[0], p[1]))
            else:
                raise InvalidOptionError(
                    "'providers' values must be either strings or (string, dict) tuples, got "
                    f"{p!r}")
    names: list[str] = []
    options: list[dict[str, str]] = []
    for name, opts in pairs:
        if name not in ALL_PROVIDERS:
            raise InvalidOptionError(
                f"Unknown Provider Type: {name} (unknown execution provider '{name}'); "
                f"onnxkiln.compat serves {available} "
                f"(onnxruntime's names are {list(ALL_PROVIDERS)})")
        if name in names:
            warnings.warn(f"Duplicate provider '{name}' encountered, ignoring.", stacklevel=4)
            continue
        if name not in available:
            warnings.warn(
                f"Specified provider '{name}' is not in available provider names. Available "
                f"providers: '{', '.join(available)}'", stacklevel=4)
            if name != CUDA:  # onnxkiln asks for CUDA anyway: its fallback report says why
                continue
        names.append(name)
        options.append({str(k): str(v) for k, v in opts.items()})
    if CPU not in names:
        names.append(CPU)
        options.append({})
    return names, options


def to_onnxkiln(names: Sequence[str], options: Sequence[Mapping[str, str]]) -> list[str]:
    """onnxkiln provider names: "cuda[:device_id]" and "cpu"."""
    out = []
    for name, opts in zip(names, options):
        if name == CUDA:
            device = opts.get("device_id", "0")
            if not device.isdigit():
                raise InvalidOptionError(
                    f"{CUDA} option device_id must be an integer >= 0, got {device!r}")
            out.append(f"cuda:{int(device)}" if int(device) else "cuda")
            ignored = sorted(set(opts) - {"device_id"})
            if ignored:  # cudnn_conv_algo_search, gpu_mem_limit, arena and stream knobs...
                warnings.warn(f"{CUDA} options {ignored} have no onnxkiln equivalent (its CUDA "
                              "provider runs on torch); ignored", stacklevel=4)
        elif name == CPU:
            out.append("cpu")
    return out


def check_and_normalize_provider_args(
    providers: Sequence[str | tuple[str, Mapping[Any, Any]]] | None,
    provider_options: Sequence[Mapping[Any, Any]] | None,
    available_provider_names: Sequence[str],
) -> tuple[list[str], list[dict[str, str]]]:
    """onnxruntime's helper of that name: `providers` (names, or (name, options) pairs) and
    `provider_options` checked and returned as (names, options as str -> str dicts); a
    repeated name is dropped with a warning, a name not in `available_provider_names` is
    kept with one, anything malformed raises `InvalidOptionError` (a ValueError)."""
    if providers is None:
        return [], []
    if isinstance(providers, str) or not isinstance(providers, Sequence):
        raise InvalidOptionError(f"'providers' should be a sequence, got {providers!r}")
    if provider_options is not None:
        if isinstance(provider_options, str) or not isinstance(provider_options, Sequence):
            raise InvalidOptionError(
                f"'provider_options' should be a sequence, got {provider_options!r}")
        if len(providers) != len(provider_options):
            raise InvalidOptionError("'providers' and 'provider_options' should be the same "
                                     f"length, got {len(providers)} and {len(provider_options)}")
    chosen: dict[str, dict[str, str]] = {}
    for i, entry in enumerate(providers):
        if isinstance(entry, str):
            name = entry
            options = {} if provider_options is None else provider_options[i]
        elif (isinstance(entry, tuple) and len(entry) == 2 and isinstance(entry[0], str)
              and provider_options is None):
            name, options = entry
        else:
            raise InvalidOptionError(
                f"'providers' entry {entry!r} should be a name or a (name, options dict) pair "
                "(and pairs cannot be mixed with 'provider_options')")
        if not isinstance(options, Mapping):
            raise InvalidOptionError(f"options of provider '{name}' should be a dict, got "
                                     f"{options!r}")
        if name not in available_provider_names:
            warnings.warn(f"Specified provider '{name}' is not in available provider names. "
                          f"Available providers: '{', '.join(available_provider_names)}'",
                          stacklevel=2)
        if name in chosen:
            warnings.warn(f"Duplicate provider '{name}' encountered, ignoring.", stacklevel=2)
            continue
        chosen[name] = {str(k): str(v) for k, v in options.items()}
    return list(chosen), list(chosen.values())
