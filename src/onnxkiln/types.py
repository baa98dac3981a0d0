"""Public value types: IoMeta, ModelMetadata, SessionOutput, DeviceId, CacheStats."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from onnxkiln.dtypes import DataType
from onnxkiln.errors import SequenceOutputError

__all__ = [
    "CacheStats",
    "CaptureDecline",
    "CaptureViolation",
    "Captured",
    "ControlFlowStats",
    "DeviceId",
    "DeviceType",
    "IoMeta",
    "MemoryStats",
    "ModelMetadata",
    "NotCapturable",
    "SeamKind",
    "SessionOutput",
    "WarmupShape",
]

Dim = int | str | None


@dataclass(frozen=True)
class IoMeta:
    """A graph input or output: name, element type, shape (symbolic dims by name), kind."""

    name: str
    dtype: DataType
    shape: tuple[Dim, ...] | None
    kind: str = "tensor"
    optional: bool = False

    def __str__(self) -> str:
        if self.shape is None:
            return f"{self.name}: {self.dtype}[?]"
        dims = ", ".join("?" if d is None else str(d) for d in self.shape)
        return f"{self.name}: {self.dtype}[{dims}]"


@dataclass(frozen=True)
class ModelMetadata:
    """What the model file says about itself."""

    ir_version: int
    producer_name: str
    producer_version: str
    domain: str
    model_version: int
    doc_string: str
    graph_name: str
    metadata_props: dict[str, str] = field(default_factory=dict)
    opset_imports: dict[str, int] = field(default_factory=dict)


class DeviceType(enum.Enum):
    """Kinds of device a session can run on."""

    CPU = "cpu"
    CUDA = "cuda"


@dataclass(frozen=True)
class DeviceId:
    """A device: its type and index (0 for the CPU)."""

    type: DeviceType
    index: int = 0

    def __str__(self) -> str:
        return self.type.value if self.type is DeviceType.CPU else f"cuda:{self.index}"


@dataclass(frozen=True)
class CacheStats:
    """Counters of the specialisation cache (keyed by input dtypes and shapes)."""

    entries: int
    hits: int
    misses: int
    evictions: int


@dataclass(frozen=True)
class MemoryStats:
    """Memory of a session's runs (`InferenceSession.memory_stats()`); bytes of inputs and
    intermediate values, not weights (see onnxkiln.memory).

    `planned_peak_bytes`: peak predicted by the lifetime simulation for the last run's
    input signature, in-place reuse included, over sizes from onnx shape inference or,
    where it cannot size a value (data-dependent shapes, custom-domain ops such as the
    optimizer's fusions), from a tracked run of that signature; a lower bound while sizes
    are unknown; None before the first run. `last_run_peak_bytes`: peak measured on
    the last tracked run (a `memory_limit` or option `memory.track=1`), else None.
    `inplace_reuses`: outputs written into a dying input's buffer during that run, else
    None. `inplace_steps`: steps the plan lets reuse a dying input's buffer (0 with
    option `memory.inplace=0`).
    """

    planned_peak_bytes: int | None
    last_run_peak_bytes: int | None
    inplace_reuses: int | None
    inplace_steps: int


@dataclass(frozen=True)
class ControlFlowStats:
    """Subgraph (If/Loop/Scan body) specialisations built and body runs."""

    subgraph_builds: int
    subgraph_runs: int


@dataclass(frozen=True)
class WarmupShape:
    """An input shape to build a specialisation for ahead of the first run."""

    input_name: str
    shape: tuple[int, ...]
    dtype: DataType | None = None


@dataclass(frozen=True)
class SessionOutput:
    """One graph output as produced: a tensor, a sequence, a map, or an optional."""

    name: str
    kind: str
    value: Any

    def as_tensor(self) -> np.ndarray:
        """The output as a numpy array; raises if it is a sequence or map."""
        if self.kind != "tensor":
            raise SequenceOutputError(
                f"output '{self.name}' is a {self.kind}, not a tensor; use .as_sequence() "
                "or .value"
            )
        return self.value

    def as_sequence(self) -> list[Any]:
        """The output as a list; raises if it is not a sequence."""
        if self.kind != "sequence":
            raise SequenceOutputError(f"output '{self.name}' is a {self.kind}, not a sequence")
        return list(self.value)


@dataclass(frozen=True)
class ProviderDecline:
    """A node the requested provider did not take, and why."""

    node_id: int
    node_name: str
    domain: str
    op_type: str
    reason: str


@dataclass(frozen=True)
class ExecutionProviderFallbackReport:
    """Where a session with a requested accelerator runs on the CPU instead, and why.

    `whole_session`: the accelerator could not be used at all (`reason` says why, e.g.
    "torch is not installed"); otherwise `declines` lists each node placed on the fallback
    provider. `assigned_ops` maps each provider to the sorted "domain::op" it runs.
    """

    requested_provider: str
    fallback_provider: str
    whole_session: bool
    reason: str | None
    declines: list[ProviderDecline] = field(default_factory=list)
    assigned_ops: dict[str, list[str]] = field(default_factory=dict)

    def __str__(self) -> str:
        if self.whole_session:
            return (f"{self.requested_provider} unavailable ({self.reason}): the whole session "
                    f"runs on {self.fallback_provider}")
        ops = sorted({f"{d.domain or 'ai.onnx'}::{d.op_type}" for d in self.declines})
        return (f"{len(self.declines)} node(s) fell back from {self.requested_provider} to "
                f"{self.fallback_provider}: {', '.join(ops)}")


@dataclass(frozen=True)
class DeviceAllocationCounts:
    """Device memory activity of a session: allocator calls and bytes (CUDA only)."""

    allocations: int
    frees: int
    bytes_in_use: int
    peak_bytes: int


class SeamKind(enum.Enum):
    """Why a node runs eagerly between captured segments."""

    HOST_CONTROL_FLOW = "host control flow"
    DATA_DEPENDENT_SHAPE = "data-dependent output shape"
    KERNEL_NOT_CAPTURABLE = "kernel not capturable"
    CPU_FALLBACK = "CPU fallback node"
    GROWING_SHAPE = "shape grows step to step"


@dataclass(frozen=True)
class CaptureDecline:
    """One node a capture could not record: where it is, what kind of seam, and why."""

    node_id: int
    node_name: str
    op_type: str
    domain: str
    seam_kind: SeamKind
    reason: str

    def __str__(self) -> str:
        return (f"node {self.node_id} '{self.node_name}' ({self.domain or 'ai.onnx'}::"
                f"{self.op_type}): {self.seam_kind.name}: {self.reason}")


@dataclass(frozen=True)
class Captured:
    """A capture that ran this step and recorded it: `outputs` as in
    run_with_device_bindings, `segments` captured segments (1: the whole graph)."""

    outputs: list[Any]
    segments: int

    @property
    def captured(self) -> bool:
        return True


@dataclass(frozen=True)
class NotCapturable:
    """The audit refused before anything ran or was recorded; an eager retry is safe."""

    declines: list[CaptureDecline]

    @property
    def captured(self) -> bool:
        return False

    def __str__(self) -> str:
        return "not capturable:\n  " + "\n  ".join(str(d) for d in self.declines)


DeviceGraphCaptureResult = Captured | NotCapturable


class CaptureViolation(enum.IntFlag):
    """Bits of the latched capture-safety word (check_device_capture_error): a captured
    kernel clamped an out-of-range index or write instead of stopping the device."""

    NONE = 0
    GATHER_INDEX = 1
    SCATTER_INDEX = 2
    KV_CAPACITY = 4
    POSITION_RANGE = 8
