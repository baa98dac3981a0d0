"""Kernel specs, the per-provider kernel registry, and the facts a kernel factory sees."""

from __future__ import annotations

import enum
import functools
import inspect
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from onnxkiln.dtypes import DataType

__all__ = [
    "CaptureSupport",
    "CompilingProvider",
    "ControlFlowCounter",
    "ExecutionProvider",
    "HostProvider",
    "KernelRegistry",
    "KernelSpec",
    "NodeInfo",
    "Subgraph",
    "normalize_domain",
    "registry_claims",
    "report_variant",
    "reported_variant",
]

Kernel = Callable[..., Any]

_choice = threading.local()


def report_variant(variant: str, reason: str | None = None) -> None:
    """Say which variant this call of a kernel ran, and why a faster one was not taken
    (None: it was), for the trace span of the step in progress on this thread.

    For kernels that choose per call. A kernel's own `variant` attribute is for what is
    fixed when it is built: set per call, it would race between two threads running one
    session with different shapes."""
    _choice.made = (variant, reason)


def reported_variant() -> tuple[str, str | None] | None:
    """The report made on this thread since the last call (None: none), taken."""
    made = getattr(_choice, "made", None)
    if made is not None:
        _choice.made = None
    return made


class CaptureSupport(enum.Enum):
    """Whether a kernel can be recorded into a device graph (issue: capture)."""

    CAPTURABLE = "capturable"
    HOST_SYNC = "host synchronisation"
    DATA_DEPENDENT_SHAPE = "data-dependent output shape"
    READS_HOST_SCALAR = "reads a host scalar"
    ALLOCATES = "allocates per call"


def normalize_domain(domain: str) -> str:
    """ONNX spells the default domain both "" and "ai.onnx"; we use ""."""
    return "" if domain in ("", "ai.onnx") else domain


class Subgraph(Protocol):
    """A compiled graph attribute: `run(inputs, captured) -> outputs`."""

    input_names: tuple[str, ...]
    output_names: tuple[str, ...]

    def __call__(self, inputs: Sequence[Any], captured: Sequence[Any]) -> list[Any]: ...


class ControlFlowCounter:
    """Counts subgraph specialisations built and subgraph runs, for control_flow_stats()."""

    def __init__(self) -> None:
        self.builds = 0
        self.runs = 0


@dataclass(frozen=True, slots=True)
class NodeInfo:
    """What a kernel factory may read about its node, fixed at plan time.

    Nodes with graph attributes (If, Loop, Scan...) get each one compiled in
    `subgraphs[attr_name]`; the kernel is then called as `kernel(*inputs, *captured)`
    where `captured` are the outer values the subgraphs read, and runs a body with
    `subgraphs[name](body_inputs, captured)`.

    `attrs` holds every attribute the node sets, plus schema defaults for the rest.
    `const_inputs[i]` is input i's value when it is an initializer or Constant
    (known before any run), else None. Dtypes and shapes are None where unknown.
    """

    name: str
    op_type: str
    domain: str
    opset: int
    attrs: Mapping[str, Any]
    n_inputs: int
    n_outputs: int
    input_present: tuple[bool, ...] = ()
    output_present: tuple[bool, ...] = ()
    input_dtypes: tuple[DataType | None, ...] = ()
    output_dtypes: tuple[DataType | None, ...] = ()
    input_shapes: tuple[tuple[int | str | None, ...] | None, ...] = ()
    const_inputs: tuple[np.ndarray | None, ...] = ()
    subgraphs: Mapping[str, Subgraph] = field(default_factory=dict)
    node: Any = None  # the onnx_ir.Node, for ops that read their surroundings (Gradient)

    def describe(self) -> str:
        """`'name' domain::Op opset N`, for error messages."""
        return f"'{self.name}' {self.domain or 'ai.onnx'}::{self.op_type} opset {self.opset}"


@dataclass(frozen=True, slots=True)
class KernelSpec:
    """One registered kernel: which op and opsets it serves and how to build it.

    `fn` is either the kernel itself, called as `fn(*inputs, **attrs)` with the
    node's attributes bound as keyword-only arguments (absent optional inputs are
    None), or, when `factory` is True, `fn(info: NodeInfo) -> kernel`, called once
    per node at plan time. A kernel returns one array, or a tuple of arrays when
    `multi_output` is True (one per node output, in order; extra ones are ignored).

    Device providers (arrays not in host memory) also say: `host_inputs`, the input
    positions the kernel reads as host numpy arrays (shape-like operands such as Reshape's
    shape: kept on the host, never uploaded); `host_outputs`, whether its outputs are host
    numpy arrays (Shape, Size); `supports(info) -> None | reason`, whether it serves this
    node (dtypes, attributes), the reason recorded when it declines.

    `inplace`: input positions whose buffer the kernel may write its result into, when the
    executor passes it as `out=` (the input dies at this step; see onnxkiln.memory). The
    kernel checks shape and dtype itself and allocates when the buffer does not fit.

    `specialize(kernel, dtypes, shapes, consts) -> callable | None`: the per-signature
    specialisation (onnxkiln.specialize) of kernels that cannot carry a `specialize`
    attribute of their own (a bare numpy ufunc).
    """

    domain: str
    op_type: str
    since: int
    until: int | None
    fn: Callable[..., Any]
    factory: bool = False
    multi_output: bool = False
    types: Mapping[str, frozenset[DataType]] = field(default_factory=dict)
    view: bool = False
    capture: CaptureSupport = CaptureSupport.CAPTURABLE
    variant: str = ""
    host_inputs: frozenset[int] = frozenset()
    host_outputs: bool = False
    supports: Callable[[NodeInfo], str | None] | None = None
    inplace: tuple[int, ...] = ()
    specialize: Callable[..., Any] | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.op_type, str) or not self.op_type:
            raise TypeError(f"kernel op_type must be a non-empty str, got {self.op_type!r}")
        if not isinstance(self.since, int) or self.since < 1:
            raise TypeError(f"{self.op_type}: since must be an int >= 1, got {self.since!r}")
        if self.until is not None and (not isinstance(self.until, int) or self.until < self.since):
            raise TypeError(f"{self.op_type}: until must be None or an int >= since")
        if not callable(self.fn):
            raise TypeError(f"{self.op_type}: fn must be callable")
        if not isinstance(self.capture, CaptureSupport):
            raise TypeError(f"{self.op_type}: capture must be a CaptureSupport")

    def covers(self, opset: int) -> bool:
        """Whether this kernel serves the given opset version of its domain."""
        return self.since <= opset and (self.until is None or opset <= self.until)

    def build(self, info: NodeInfo) -> Kernel:
        """The callable the executor runs for this node, attributes already bound."""
        if self.factory:
            return self.fn(info)
        names = _keyword_only(self.fn)
        if not names:
            return self.fn
        bound = {name: info.attrs.get(name) for name in names}
        return functools.partial(self.fn, **bound)


@functools.cache
def _keyword_only(fn: Callable[..., Any]) -> tuple[str, ...]:
    params = inspect.signature(fn).parameters.values()
    return tuple(p.name for p in params if p.kind is inspect.Parameter.KEYWORD_ONLY)


class KernelRegistry:
    """The kernels of one provider, looked up by (domain, op_type, opset) at plan time."""

    def __init__(self, provider: str, default_variant: str = "numpy") -> None:
        self.provider = provider
        self.default_variant = default_variant
        self._specs: dict[tuple[str, str], list[KernelSpec]] = {}

    def kernel(
        self,
        op_type: str,
        since: int = 1,
        until: int | None = None,
        *,
        domain: str = "",
        factory: bool = False,
        multi_output: bool = False,
        types: Mapping[str, Iterable[DataType]] | None = None,
        view: bool = False,
        capture: CaptureSupport = CaptureSupport.CAPTURABLE,
        variant: str = "",
        host_inputs: Iterable[int] = (),
        host_outputs: bool = False,
        supports: Callable[[NodeInfo], str | None] | None = None,
        inplace: Iterable[int] = (),
        specialize: Callable[..., Any] | None = None,
    ) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        """Decorator registering `fn` for `op_type` in opsets `since..until` (inclusive)."""

        def register(fn: Callable[..., Any]) -> Callable[..., Any]:
            spec = KernelSpec(
                domain=normalize_domain(domain),
                op_type=op_type,
                since=since,
                until=until,
                fn=fn,
                factory=factory,
                multi_output=multi_output,
                types={k: frozenset(v) for k, v in (types or {}).items()},
                view=view,
                capture=capture,
                variant=variant or f"{op_type.lower()}.{self.default_variant}",
                host_inputs=frozenset(host_inputs),
                host_outputs=host_outputs,
                supports=supports,
                inplace=tuple(inplace),
                specialize=specialize,
            )
            self.add(spec)
            return fn

        return register

    def add(self, spec: KernelSpec) -> None:
        """Register a spec; overlapping opset ranges for the same op are an error."""
        specs = self._specs.setdefault((spec.domain, spec.op_type), [])
        for other in specs:
            lo = max(spec.since, other.since)
            hi_a = spec.until if spec.until is not None else 1 << 30
            hi_b = other.until if other.until is not None else 1 << 30
            if lo <= min(hi_a, hi_b):
                raise ValueError(
                    f"duplicate registration of {spec.domain or 'ai.onnx'}::{spec.op_type} "
                    f"on {self.provider}: opsets {spec.since}-{spec.until} overlap "
                    f"{other.since}-{other.until} ({other.fn.__module__}.{other.fn.__qualname__})"
                )
        specs.append(spec)

    def resolve(self, domain: str, op_type: str, opset: int) -> KernelSpec | None:
        """The spec serving this op at this opset, or None."""
        for spec in self._specs.get((normalize_domain(domain), op_type), ()):
            if spec.covers(opset):
                return spec
        return None

    def versions(self, domain: str, op_type: str) -> list[tuple[int, int | None]]:
        """Opset ranges registered for an op (for error messages)."""
        specs = self._specs.get((normalize_domain(domain), op_type), ())
        return sorted((s.since, s.until) for s in specs)

    def ops(self) -> list[tuple[str, str]]:
        """Every (domain, op_type) with at least one kernel."""
        return sorted(self._specs)

    def __iter__(self):
        for specs in self._specs.values():
            yield from specs


class ExecutionProvider(Protocol):
    """A device with kernels: the CPU (numpy) and CUDA (torch) providers implement this.

    Values a provider's kernels read and write live on its device (`on_host`: numpy
    arrays in host memory). `claims(info)` returns None when the provider runs the node,
    else the reason it declines (no kernel, an unsupported dtype or attribute).
    """

    name: str
    on_host: bool
    registry: KernelRegistry

    @property
    def device(self) -> Any: ...

    def claims(self, info: NodeInfo) -> str | None: ...

    def to_device(self, value: Any) -> Any: ...

    def to_host(self, value: Any) -> np.ndarray: ...

    def synchronize(self) -> None: ...

    def empty(self, dtype: DataType, shape: Sequence[int]) -> Any: ...

    def allocation_counts(self) -> Any: ...


class CompilingProvider(ExecutionProvider, Protocol):
    """A provider that compiles whole partitions and can save and load them as
    EPContext nodes (onnxkiln.ep_context; the `fuse` provider implements it)."""

    def compile(self, graph: Any, node_ids: Iterable[int] | None = None) -> list[Any]: ...

    def save_context(self, partition: Any) -> tuple[bytes, str]: ...

    def context_source_keys(self) -> list[str]: ...

    def load_context(self, attributes: Mapping[str, Any], blob: bytes) -> Kernel: ...


class HostProvider:
    """What every host-memory provider shares (CPU, fuse, loaded EPContext partitions):
    values are numpy arrays, copies are no-ops, kernels finish before they return. A
    subclass sets `name` and `registry`; `claims` asks that registry."""

    name = "cpu"
    on_host = True
    registry: KernelRegistry

    @property
    def device(self) -> Any:
        """The host CPU."""
        from onnxkiln.types import DeviceId, DeviceType

        return DeviceId(DeviceType.CPU)

    def claims(self, info: NodeInfo) -> str | None:
        """None when this provider's registry has a kernel for the node, else why not."""
        return registry_claims(self.registry, info)

    def to_device(self, value: Any) -> Any:
        """Host arrays stay as they are; other arrays (dlpack, torch) come to the host."""
        if value is None or isinstance(value, np.ndarray | list | dict):
            return value
        if hasattr(value, "__dlpack__") and not hasattr(value, "__array__"):
            return np.from_dlpack(value)
        return np.asarray(value)

    def to_host(self, value: Any) -> Any:
        """Already on the host."""
        return value

    def synchronize(self) -> None:
        """Host kernels finish before they return."""

    def empty(self, dtype: DataType, shape: Sequence[int]) -> np.ndarray:
        """A zeroed host buffer."""
        return np.zeros(tuple(shape), DataType(dtype).numpy)

    def allocation_counts(self) -> None:
        """Host allocations are not counted (numpy uses malloc)."""
        return None


def registry_claims(registry: KernelRegistry, info: NodeInfo) -> str | None:
    """The common half of `claims`: a kernel exists for the opset and accepts the node."""
    spec = registry.resolve(info.domain, info.op_type, info.opset)
    if spec is None:
        versions = registry.versions(info.domain, info.op_type)
        if not versions:
            return f"no {registry.provider} kernel for {info.domain or 'ai.onnx'}::{info.op_type}"
        return (f"no {registry.provider} kernel for {info.domain or 'ai.onnx'}::{info.op_type} "
                f"at opset {info.opset}")
    return spec.supports(info) if spec.supports is not None else None
