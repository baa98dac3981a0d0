"""OrtDevice, OrtMemoryInfo and OrtArenaCfg: onnxruntime's device and memory descriptors.

onnxkiln.compat keeps every value in host memory, so these describe; they allocate
nothing. `OrtDevice.make("cuda", 0)` is accepted (it is only a description); binding a
value to it raises `DeviceBindingError`, as `OrtValue` and `IOBinding` do.
"""

from __future__ import annotations

import enum
from typing import Any

from onnxkiln.compat._errors import ort_errors_class
from onnxkiln.errors import InvalidOptionError

__all__ = ["OrtAllocatorType", "OrtArenaCfg", "OrtDevice", "OrtDeviceMemoryType",
           "OrtDeviceVendorId", "OrtMemType", "OrtMemoryInfo", "OrtMemoryInfoDeviceType"]


class OrtAllocatorType(enum.IntEnum):
    """onnxruntime's allocator kinds."""

    INVALID = -1
    ORT_DEVICE_ALLOCATOR = 0
    ORT_ARENA_ALLOCATOR = 1


class OrtDeviceVendorId(enum.IntEnum):
    """PCI vendor ids onnxruntime names devices by."""
    NONE = 0
    AMD = 0x1002
    NVIDIA = 0x10DE
    ARM = 0x13B5
    MICROSOFT = 0x1414
    HUAWEI = 0x19E5
    QUALCOMM = 0x5143
    INTEL = 0x8086


class OrtDeviceMemoryType(enum.IntEnum):
    DEFAULT = 0
    HOST_ACCESSIBLE = 5


class OrtMemoryInfoDeviceType(enum.IntEnum):
    CPU = 0
    GPU = 1
    FPGA = 2
    NPU = 3


# the vendor OrtDevice.make gives a device type when none is named
_DEFAULT_VENDORS = {"cuda": OrtDeviceVendorId.NVIDIA, "dml": OrtDeviceVendorId.MICROSOFT,
                    "cann": OrtDeviceVendorId.HUAWEI}


class OrtMemType(enum.IntEnum):
    """onnxruntime's memory kinds (CPU is CPU_OUTPUT's alias, as there)."""

    CPU_INPUT = -2
    CPU_OUTPUT = -1
    CPU = -1
    DEFAULT = 0


_DEVICE_TYPES = {"cpu": 0, "gpu": 1, "cuda": 1, "fpga": 2, "npu": 3, "dml": 1, "cann": 3,
                 "webgpu": 1}  # as onnxruntime's OrtDevice.make codes them


@ort_errors_class
class OrtDevice:
    """A device description with onnxruntime's API: `OrtDevice.make("cpu", 0)`, or the
    C-level form `OrtDevice(device_type, mem_type, device_id, vendor_id=0)` with
    `OrtDevice.cpu()` / `cuda()` / `default_memory()` as the codes.

    Example:
        >>> d = OrtDevice.make("cpu", 0)
        >>> d.device_type(), d.device_id()
        (0, 0)
    """

    __slots__ = ("_id", "_mem", "_type", "_vendor")

    def __init__(self, device_type: int, mem_type: int, device_id: int,
                 vendor_id: int = 0) -> None:
        for name, v in (("device_type", device_type), ("mem_type", mem_type),
                        ("device_id", device_id), ("vendor_id", vendor_id)):
            if isinstance(v, bool) or not isinstance(v, int):
                raise InvalidOptionError(f"OrtDevice: {name} must be an int, got {v!r}")
        self._type, self._mem, self._id, self._vendor = device_type, mem_type, device_id, vendor_id

    @classmethod
    def make(cls, ort_device_name: str, device_id: int, vendor_id: int | None = None
             ) -> OrtDevice:
        """The device named "cpu", "cuda", "gpu", "npu", "dml", "cann" or "webgpu"."""
        code = _DEVICE_TYPES.get(str(ort_device_name).lower())
        if code is None:
            raise InvalidOptionError(
                f"OrtDevice.make: unknown device type {ort_device_name!r}; known: "
                f"{sorted(_DEVICE_TYPES)}")
        if vendor_id is None:
            vendor_id = _DEFAULT_VENDORS.get(str(ort_device_name).lower(), 0)
        return cls(code, 0, device_id, int(vendor_id))

    @staticmethod
    def cpu() -> int:
        return 0

    @staticmethod
    def gpu() -> int:
        return 1

    @staticmethod
    def cuda() -> int:
        return 1

    @staticmethod
    def npu() -> int:
        return 3

    @staticmethod
    def dml() -> int:
        return 4

    @staticmethod
    def default_memory() -> int:
        return 0

    def device_type(self) -> int:
        return self._type

    def device_id(self) -> int:
        return self._id

    def device_mem_type(self) -> int:
        return self._mem

    mem_type = device_mem_type

    def device_vendor_id(self) -> int:
        return self._vendor

    vendor_id = device_vendor_id

    def __eq__(self, other: object) -> bool:
        return isinstance(other, OrtDevice) and (self._type, self._mem, self._id, self._vendor) \
            == (other._type, other._mem, other._id, other._vendor)

    def __hash__(self) -> int:
        return hash((self._type, self._mem, self._id, self._vendor))

    def __repr__(self) -> str:
        return (f"OrtDevice(device_type={self._type}, mem_type={self._mem}, "
                f"device_id={self._id}, vendor_id={self._vendor})")


@ort_errors_class
class OrtMemoryInfo:
    """Where a value lives: `OrtMemoryInfo("Cpu", OrtAllocatorType.ORT_ARENA_ALLOCATOR, 0,
    OrtMemType.DEFAULT)`; what `get_input_memory_infos()` returns."""

    __slots__ = ("_device_mem", "_vendor", "allocator_type", "device_id", "mem_type", "name")

    def __init__(self, name: str, allocator_type: int, device_id: int, mem_type: int) -> None:
        if not isinstance(name, str):
            raise InvalidOptionError(f"OrtMemoryInfo: name must be a str, got {name!r}")
        self.name = name
        self.allocator_type = OrtAllocatorType(allocator_type)
        self.device_id = int(device_id)
        self.mem_type = OrtMemType(mem_type)
        self._device_mem, self._vendor = OrtDeviceMemoryType.DEFAULT, 0

    @classmethod
    def create_v2(cls, name: str, device_type: int, vendor_id: int, device_id: int,
                  device_mem_type: int, alignment: int, allocator_type: int) -> OrtMemoryInfo:
        """onnxruntime's CreateMemoryInfo_V2 form (the alignment is not kept: onnxkiln's
        buffers are numpy's)."""
        OrtMemoryInfoDeviceType(device_type)
        device_mem = OrtDeviceMemoryType(device_mem_type)
        host = device_mem == OrtDeviceMemoryType.HOST_ACCESSIBLE  # onnxruntime's CPU mem type
        info = cls(name, allocator_type, device_id, OrtMemType.CPU if host else OrtMemType.DEFAULT)
        info._device_mem, info._vendor = device_mem, int(vendor_id)
        return info

    @property
    def device_mem_type(self) -> OrtDeviceMemoryType:
        return self._device_mem

    @property
    def device_vendor_id(self) -> int:
        return self._vendor

    def __eq__(self, other: object) -> bool:
        return isinstance(other, OrtMemoryInfo) and all(
            getattr(self, k) == getattr(other, k) for k in self.__slots__)

    def __hash__(self) -> int:
        return hash(tuple(getattr(self, k) for k in self.__slots__))

    def __repr__(self) -> str:
        return (f"OrtMemoryInfo(name={self.name!r}, allocator_type={self.allocator_type.name}, "
                f"device_id={self.device_id}, mem_type={self.mem_type.name})")


CPU_MEMORY = OrtMemoryInfo("Cpu", OrtAllocatorType.ORT_ARENA_ALLOCATOR, 0, OrtMemType.DEFAULT)

_ARENA_KEYS = ("max_mem", "arena_extend_strategy", "initial_chunk_size_bytes",
               "max_dead_bytes_per_chunk", "initial_growth_chunk_size_bytes",
               "max_power_of_two_extend_bytes")


@ort_errors_class
class OrtArenaCfg:
    """onnxruntime's arena settings, `OrtArenaCfg(max_mem, arena_extend_strategy,
    initial_chunk_size_bytes, max_dead_bytes_per_chunk)` or `OrtArenaCfg({key: int})`;
    kept and readable, and otherwise ignored (onnxkiln has no arena). Unset fields are -1.
    """

    __slots__ = _ARENA_KEYS

    def __init__(self, *args: Any) -> None:
        for key in _ARENA_KEYS:
            setattr(self, key, -1)
        if len(args) == 1 and isinstance(args[0], dict):
            values = args[0]
        elif len(args) == 4:
            values = dict(zip(_ARENA_KEYS, args))
        else:
            raise InvalidOptionError(
                "OrtArenaCfg takes (max_mem, arena_extend_strategy, initial_chunk_size_bytes, "
                f"max_dead_bytes_per_chunk) or one dict, got {len(args)} arguments")
        for key, value in values.items():
            if key not in _ARENA_KEYS:
                raise InvalidOptionError(
                    f"OrtArenaCfg: unknown key {key!r}; known: {list(_ARENA_KEYS)}")
            if isinstance(value, bool) or not isinstance(value, int):
                raise InvalidOptionError(f"OrtArenaCfg: {key} must be an int, got {value!r}")
            setattr(self, key, value)
