"""Which provider runs each node: device requests -> providers, node placement, device copies.

A session asks for providers in priority order (`device("cuda")` means cuda then cpu). Each
node goes to the first provider that claims it; the others fall back, the reason recorded.
Shape computations (Shape -> Gather -> Concat -> ...) whose inputs are all host-side shape
values stay on the host, so a device session does not sync to read a shape back. Copies are
inserted only where a value crosses between host and device, once per value and direction.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import onnx_ir as ir

from onnxkiln.errors import ExecutionProviderUnavailableError, InvalidOptionError
from onnxkiln.options import SessionConfig
from onnxkiln.plan import BodyOptions, Plan, Step, build_plan, lifetimes
from onnxkiln.providers.base import (
    ControlFlowCounter,
    ExecutionProvider,
    KernelRegistry,
    KernelSpec,
    NodeInfo,
)
from onnxkiln.types import DeviceId, ExecutionProviderFallbackReport, ProviderDecline

__all__ = [
    "BodyPlacement",
    "Placement",
    "Placer",
    "insert_copies",
    "place",
    "select_providers",
    "with_context_providers",
]

logger = logging.getLogger(__name__)
KNOWN_PROVIDERS = ("cpu", "cuda", "fuse")
_warned: set[str] = set()
_INTEGER_KINDS = "iub"
_MAKES_CONTAINERS = frozenset({"SequenceConstruct", "SequenceEmpty", "SequenceInsert",
                               "SequenceErase", "SplitToSequence", "Optional", "SequenceMap"})
_MAKES_DATA = frozenset({"ConstantOfShape", "Cast", "CastLike", "EyeLike"})  # from a shape


@dataclass(frozen=True)
class Placement:
    """The providers a session uses in priority order, its device, and what was asked.

    `strict`: the accelerator was requested without "cpu", so any node it declines is an
    error rather than a fallback. `fallback_reason`: why a requested accelerator could not
    be used at all (the whole session runs on the CPU).
    """

    providers: tuple[ExecutionProvider, ...]
    device: DeviceId
    requested: str
    fallback_reason: str | None
    strict: bool = False

    @property
    def registries(self) -> tuple[KernelRegistry, ...]:
        """The providers' kernel registries, in priority order."""
        return tuple(p.registry for p in self.providers)

    @property
    def on_device(self) -> bool:
        """Whether a provider other than the host's runs nodes."""
        return any(not p.on_host for p in self.providers)


def select_providers(device: str, providers: Sequence[str] | None,
                     options: SessionConfig | None = None) -> Placement:
    """Resolve `device("auto"|"cpu"|"cuda[:N]")` and `providers([...])` to providers."""
    from onnxkiln.providers.cpu.provider import CpuProvider

    cpu = CpuProvider()
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
    if wanted == "fuse":  # a host compiler: what it does not take runs on the CPU provider
        from onnxkiln.providers.fuse import FuseProvider

        return Placement((FuseProvider(), cpu), cpu.device, "fuse", None)
    if wanted == "cpu":
        return Placement((cpu,), cpu.device, wanted, None)
    on_torch_cpu = options is not None and options.testing_cuda_on_torch_cpu
    strict = names is not None and "cpu" not in names
    reason = _cuda_unavailable_reason(wanted) if not on_torch_cpu else None
    if reason is None:
        import torch

        from onnxkiln.providers.cuda.provider import TorchProvider

        target = torch.device("cpu") if on_torch_cpu else torch.device(_cuda_name(wanted))
        gpu = TorchProvider(target)
        chain = (gpu,) if strict else (gpu, cpu)
        return Placement(chain, gpu.device, "cuda", None, strict)
    if wanted == "auto":  # no accelerator here: the CPU serves the session, nothing to report
        return Placement((cpu,), cpu.device, "cpu", None)
    if strict:
        raise ExecutionProviderUnavailableError(
            f"provider 'cuda' was requested without 'cpu' and cannot run: {reason}. "
            "Add 'cpu' to the providers list to allow fallback."
        )
    if reason not in _warned:
        _warned.add(reason)
        logger.warning("CUDA requested but unavailable (%s); the session runs on the CPU", reason)
    return Placement((cpu,), cpu.device, "cuda", reason)


def with_context_providers(placement: Placement) -> Placement:
    """The placement plus the host providers that run loaded EPContext partitions (the fuse
    provider's FusedPartition, other compilers' LoadedPartition), before the CPU provider."""
    from onnxkiln.ep_context_load import ContextProvider
    from onnxkiln.providers.fuse import FuseProvider

    have = {p.name for p in placement.providers}
    extra = tuple(p for p in (FuseProvider(), ContextProvider()) if p.name not in have)
    if not extra:
        return placement
    chain = list(placement.providers)
    at = next((i for i, p in enumerate(chain) if p.name == "cpu"), len(chain))
    chain[at:at] = extra
    return dataclasses.replace(placement, providers=tuple(chain))


def _cuda_name(wanted: str) -> str:
    return wanted if wanted.startswith("cuda:") else "cuda:0"


def _cuda_unavailable_reason(wanted: str) -> str | None:
    """Why CUDA cannot run here, or None when it can. Checks cheap signs of a GPU before
    importing torch, so a CPU-only machine with torch installed pays nothing for "auto"."""
    if importlib.util.find_spec("torch") is None:
        return "torch is not installed"
    if not os.path.exists("/dev/nvidiactl") and "torch" not in __import__("sys").modules:
        return "no CUDA device"
    import torch

    if not torch.cuda.is_available():
        return "no CUDA device"
    index = int(wanted.split(":")[1]) if wanted.startswith("cuda:") else 0
    if index >= torch.cuda.device_count():
        return f"no CUDA device {index} (this machine has {torch.cuda.device_count()})"
    return None


_DEVICE_CONTROL_FLOW = frozenset({"If", "Loop", "Scan"})
_SHAPE_MATH = ("shape computation kept on the host, where its inputs are (avoids a device "
               "round trip)")
# conversions and views converters put between ops: on the host they cost no more than
# the copies they would need on the device (compute ops stay where the user asked)
_CONVERSIONS = frozenset({"Cast", "CastLike", "Identity", "Reshape", "Squeeze", "Unsqueeze",
                          "Flatten"})
_BODY_HOST_INPUTS = {"Loop": (0, 1)}  # iteration_num and cond arrive as host values
_BODY_HOST_OUTPUTS = {"Loop": frozenset({0})}  # the cond the driver reads


@dataclass
class Placer:
    """Chooses a provider per node while one graph's plan is built, recording every decline.

    Each graph (the main graph, every subgraph body) gets its own Placer, since slot numbers
    are per graph; body placers share the declines list. `host_only`: a body run by a host
    kernel, whose nodes all run on the host.
    """

    placement: Placement
    declines: list[ProviderDecline] = field(default_factory=list)
    host_only: bool = False
    _shape_slots: set[int] = field(default_factory=set)
    _container_slots: set[int] = field(default_factory=set)  # sequences, optionals
    _host_made: set[int] = field(default_factory=set)  # outputs of nodes on the host
    _device_bodies: dict[int, frozenset[int]] = field(default_factory=dict)
    _host_bodies: dict[int, str] = field(default_factory=dict)
    host_positions: tuple[int, ...] = ()  # input positions that arrive as host values

    @property
    def host(self) -> ExecutionProvider:
        """The host provider (Constant nodes and host bodies always run there)."""
        for p in self.placement.providers:
            if p.on_host:
                return p
        from onnxkiln.providers.cpu.provider import CpuProvider

        return CpuProvider()

    @property
    def _device(self) -> ExecutionProvider | None:
        return next((p for p in self.placement.providers if not p.on_host), None)

    def bodies(self, node_id: int, info: NodeInfo, in_slots: Sequence[int | None],
               constants: dict[int, Any]) -> BodyPlacement:
        """Where the subgraph bodies of a node go: on the device with an If/Loop/Scan that
        the device runs (its decisions read on the host), else on the host. `in_slots`:
        the node's inputs, then its captured outer values."""
        reason = self._bodies_stay_on_host(info, in_slots, constants)
        if reason is not None:
            if info.domain == "" and info.op_type in _DEVICE_CONTROL_FLOW:
                self._host_bodies[node_id] = reason
            return BodyPlacement(self, False, info.op_type, frozenset())
        host = frozenset(i for i, s in enumerate(in_slots)  # captured host shape values
                         if i >= info.n_inputs and s in self._shape_slots)
        self._device_bodies[node_id] = host
        return BodyPlacement(self, True, info.op_type,
                             frozenset(i - info.n_inputs for i in host))

    def _bodies_stay_on_host(self, info: NodeInfo, in_slots: Sequence[int | None],
                             constants: dict[int, Any]) -> str | None:
        device = self._device
        if self.host_only or device is None:
            return "runs on the host"
        if info.domain != "" or info.op_type not in _DEVICE_CONTROL_FLOW:
            return "its kernel runs its subgraphs on the host"
        if any(s in self._container_slots for s in in_slots):
            return "reads a sequence or optional: those stay on the host"
        if self._is_shape_math(info, in_slots, constants):
            return _SHAPE_MATH
        node = info.node
        for attr in (node.attributes.values() if node is not None else ()):
            if attr.type != ir.AttributeType.GRAPH:
                continue
            for v in (*attr.value.inputs, *attr.value.outputs):
                if v.type is not None and not isinstance(v.type, ir.TensorType):
                    return (f"its body carries '{v.name}', a {v.type}: sequences and "
                            "optionals stay on the host")
        return device.claims(info)

    def choose(self, node_id: int, info: NodeInfo, in_slots: Sequence[int | None],
               out_slots: Sequence[int | None], constants: dict[int, Any]
               ) -> tuple[KernelSpec | None, str]:
        """The kernel spec and provider name for a node; (None, "") when nobody runs it.
        `in_slots`: the node's inputs, then the outer values its subgraphs capture."""
        providers = self.placement.providers
        on_device = not self.placement.providers[0].on_host
        if self.host_only or (info.op_type == "Constant" and info.domain == ""):
            providers = (self.host,)
        elif node_id in self._device_bodies:
            return self._device_control_flow(node_id, info)
        elif node_id in self._host_bodies:
            providers = (self.host,)
            if on_device:
                self._decline(node_id, info, self._host_bodies[node_id])
        elif self._is_shape_math(info, in_slots, constants) and len(providers) > 1:
            providers = (self.host,)
            if on_device:
                self._decline(node_id, info, _SHAPE_MATH)
        elif any(s in self._container_slots for s in in_slots) and len(providers) > 1:
            providers = (self.host,)
            if info.op_type in ("Identity", "If", "Loop"):  # pass containers through
                self._container_slots.update(s for s in out_slots if s is not None)
            if on_device:
                self._decline(node_id, info, "reads a sequence or optional: those stay on the "
                                             "host")
        elif on_device and len(providers) > 1 and self._between_host_nodes(info, in_slots,
                                                                            constants):
            providers = (self.host,)
            self._decline(node_id, info, "its inputs come from host nodes and its outputs go "
                                         "only to host nodes or graph outputs: kept on the "
                                         "host, which saves copying them up and back")
        if info.op_type in _MAKES_CONTAINERS or _container_outputs(info):
            self._container_slots.update(s for s in out_slots if s is not None)
        reasons: list[str] = []
        for provider in providers:
            reason = provider.claims(info)
            if reason is not None:
                reasons.append(reason)
                continue
            spec = provider.registry.resolve(info.domain, info.op_type, info.opset)
            if reasons and not self.host_only:
                self._decline(node_id, info, reasons[0])
            if spec.host_outputs or (provider.on_host
                                     and self._is_shape_math(info, in_slots, constants)):
                self._shape_slots.update(s for s in out_slots if s is not None)
            if provider.on_host:
                self._host_made.update(s for s in out_slots if s is not None)
            return spec, provider.name
        if self.placement.strict and not self.host_only and reasons:
            # the session will refuse to build, listing every decline: plan on the host
            self._decline(node_id, info, reasons[0])
            spec = self.host.registry.resolve(info.domain, info.op_type, info.opset)
            return spec, (self.host.name if spec is not None else "")
        return None, ""

    def _device_control_flow(self, node_id: int, info: NodeInfo) -> tuple[KernelSpec, str]:
        """An If/Loop/Scan on the device: captured host shape values stay host inputs."""
        device = self._device
        spec = device.registry.resolve(info.domain, info.op_type, info.opset)
        extra = self._device_bodies[node_id]
        if extra:
            spec = dataclasses.replace(spec, host_inputs=spec.host_inputs | extra)
        return spec, device.name

    def _between_host_nodes(self, info: NodeInfo, in_slots: Sequence[int | None],
                            constants: dict[int, Any]) -> bool:
        """Whether the node is a conversion whose every input comes from a host node and
        whose every reader is a graph output or a node the device provider has no kernel
        for (a Cast after an ai.onnx.ml op, say): on the device it would be a round trip."""
        node = info.node
        live = [s for s in in_slots if s is not None and s not in constants]
        if (node is None or info.domain != "" or info.op_type not in _CONVERSIONS or not live
                or not all(s in self._host_made for s in live)):
            return False
        device = self._device
        if device.claims(info) is not None:  # it falls back anyway, with the device's reason
            return False
        registry = device.registry
        for value in node.outputs:
            for use in value.uses():
                reader = use.node
                if reader.graph is not node.graph or registry.versions(reader.domain,
                                                                       reader.op_type):
                    return False
        return True

    def _is_shape_math(self, info: NodeInfo, in_slots: Sequence[int | None],
                       constants: dict[int, Any]) -> bool:
        live = [s for s in in_slots if s is not None and s not in constants]
        if not live or not all(s in self._shape_slots for s in live):
            return False
        if info.op_type in _MAKES_DATA:
            return False
        return all(d is None or d.numpy.kind in _INTEGER_KINDS for d in info.output_dtypes)

    def _decline(self, node_id: int, info: NodeInfo, reason: str) -> None:
        self.declines.append(ProviderDecline(node_id, info.name, info.domain, info.op_type,
                                             reason))


@dataclass(frozen=True)
class BodyPlacement:
    """How the bodies of one subgraph node are placed: a Placer per body, and the copies
    a device body needs (its outputs stay on the device but for the values its driver
    reads on the host)."""

    parent: Placer
    on_device: bool
    op_type: str
    host_captures: frozenset[int]  # positions among the node's captured values

    def placer(self, graph: ir.Graph, index: Sequence[int]) -> Placer:
        """The placer of one body; `index[j]`: its capture j among the node's captures."""
        child = Placer(self.parent.placement, self.parent.declines, host_only=not self.on_device)
        if self.on_device:
            n = len(graph.inputs)
            child.host_positions = (*_BODY_HOST_INPUTS.get(self.op_type, ()),
                                    *(n + j for j, k in enumerate(index)
                                      if k in self.host_captures))
            child._shape_slots.update(child.host_positions)  # a body's inputs are slots 0..
        return child

    def finish(self, plan: Plan, placer: Placer) -> Plan:
        """A device body's plan with its copies; a host body's plan as it is."""
        if not self.on_device:
            return plan
        host_outputs = _BODY_HOST_OUTPUTS.get(self.op_type, frozenset())
        on_host = frozenset(plan.input_slots[p] for p in placer.host_positions)
        return insert_copies(
            plan, self.parent.placement.providers,
            outputs_on_device=[i not in host_outputs for i in range(len(plan.output_slots))],
            inputs_on_host=on_host, inputs_on_device=frozenset(plan.input_slots) - on_host)


def place(model: ir.Model, placement: Placement, counter: ControlFlowCounter,
          bodies: BodyOptions | None = None
          ) -> tuple[Plan, ExecutionProviderFallbackReport | None]:
    """Plan `model` on the placement's providers; the plan has no copies yet (see
    insert_copies). Returns it with the fallback report, None when the requested
    provider runs everything. A strict placement (no "cpu") refuses any decline.
    `bodies`: the options subgraph bodies compile with."""
    placer = Placer(placement) if placement.on_device else None
    with contextlib.ExitStack() as scopes:
        for p in placement.providers:
            if hasattr(p, "planning"):
                scopes.enter_context(p.planning())
        plan = build_plan(model, placement.registries, counter, placer,
                          bodies if bodies is not None else BodyOptions())
    declines = placer.declines if placer is not None else []
    if placement.strict and declines:
        lines = [f"'{d.node_name}' {d.domain or 'ai.onnx'}::{d.op_type}: {d.reason}"
                 for d in declines]
        raise ExecutionProviderUnavailableError(
            f"provider 'cuda' was requested without 'cpu', but {len(lines)} node(s) cannot run "
            "on it:\n  " + "\n  ".join(lines) + "\nAdd 'cpu' to the providers list to let "
            "them fall back.")
    if placement.fallback_reason is not None:
        return plan, ExecutionProviderFallbackReport(
            placement.requested, "cpu", True, placement.fallback_reason, [], _assigned(plan))
    if not declines:
        return plan, None
    report = ExecutionProviderFallbackReport(placement.requested, "cpu", False, None,
                                             list(declines), _assigned(plan))
    logger.warning("%s", report)
    return plan, report


def _container_outputs(info: NodeInfo) -> bool:
    node = info.node
    return node is not None and any(
        v is not None and v.type is not None and not isinstance(v.type, ir.TensorType)
        for v in node.outputs)


def _assigned(plan: Plan) -> dict[str, list[str]]:
    ops: dict[str, set[str]] = {}
    for step in plan.steps:
        if step.node_id >= 0:
            ops.setdefault(step.provider, set()).add(f"{step.domain or 'ai.onnx'}::{step.op_type}")
    return {k: sorted(v) for k, v in ops.items()}


_COPY_TO_DEVICE = KernelSpec("onnxkiln", "MemcpyFromHost", 1, None, lambda x: x,
                             variant="memcpy.host_to_device")
_COPY_TO_HOST = KernelSpec("onnxkiln", "MemcpyToHost", 1, None, lambda x: x,
                           variant="memcpy.device_to_host")


def insert_copies(plan: Plan, providers: Sequence[ExecutionProvider],
                  keep_on_device: frozenset[int] = frozenset(),
                  outputs_on_device: Sequence[bool] | None = None,
                  inputs_on_host: frozenset[int] = frozenset(),
                  inputs_on_device: frozenset[int] = frozenset()) -> Plan:
    """Add host<->device copy steps where a value crosses, and device copies of constants.

    Graph inputs arrive on the host (a device tensor passed in is taken as it is by the
    upload), or known host or device values for the slots in `inputs_on_host` and
    `inputs_on_device` (a device body's inputs); graph outputs are
    brought to the host, except the slots in `keep_on_device` (outputs bound to device
    buffers) and, for a device body, the outputs `outputs_on_device` marks, which are
    brought to the device. Each value is copied at most once per direction; constants a
    device kernel reads are uploaded here, once, at plan time.
    """
    by_name = {p.name: p for p in providers}
    if all(p.on_host for p in providers):
        return plan
    names = list(plan.slot_names)
    constants = dict(plan.constants)
    device = next(p for p in providers if not p.on_host)
    where: dict[int, str] = dict.fromkeys(plan.input_slots, "caller")  # numpy or device
    where.update(dict.fromkeys(inputs_on_host, "host"))
    where.update(dict.fromkeys(inputs_on_device, device.name))
    copies: dict[tuple[int, str], int] = {}
    steps: list[Step] = []

    def new_slot(label: str) -> int:
        names.append(label)
        return len(names) - 1

    def on(slot: int, target: ExecutionProvider | None) -> int:
        """`slot`'s value where `target` (None: the host) reads it."""
        dest = "host" if target is None or target.on_host else target.name
        if slot in plan.constants:
            if dest == "host":
                return slot
            key = (slot, dest)
            if key not in copies:
                copies[key] = new_slot(f"{names[slot]}@{dest}")
                constants[copies[key]] = target.to_device(plan.constants[slot])
            return copies[key]
        src = where.get(slot, "host")
        if src == dest:
            return slot
        key = (slot, dest)
        if key not in copies:
            if dest == "host":
                owner = device if src == "caller" else by_name[src]
                mover, spec, provider = owner.to_host, _COPY_TO_HOST, owner.name
            else:
                if src not in ("host", "caller", dest):  # between two devices: via the host
                    slot = on(slot, None)
                mover, spec, provider = target.to_device, _COPY_TO_DEVICE, dest
            out = copies[key] = new_slot(f"{names[slot]}@{dest}")
            steps.append(Step(-1, f"copy '{names[slot]}' to {dest}", spec.op_type, spec.domain,
                              1, provider, spec, mover, (slot,), (out,)))
            where[out] = dest
        return copies[key]

    for step in plan.steps:
        provider = by_name[step.provider]
        inputs = tuple(
            None if s is None
            else on(s, None if i in step.spec.host_inputs else provider)
            for i, s in enumerate(step.inputs)
        )
        steps.append(dataclasses.replace(step, inputs=inputs))
        dest = "host" if provider.on_host or step.spec.host_outputs else provider.name
        where.update((s, dest) for s in step.outputs if s is not None)
    if outputs_on_device is not None:  # an upload may hand back the tensor it was given
        outputs = [on(s, device if d else None) for s, d in zip(plan.output_slots,
                                                               outputs_on_device)]
        may_alias = list(plan.output_may_alias)
    else:
        outputs = [s if s in keep_on_device else on(s, None) for s in plan.output_slots]
        may_alias = [alias and new == old for alias, new, old
                     in zip(plan.output_may_alias, outputs, plan.output_slots)]
    last_use = lifetimes(steps, plan.input_slots, outputs, constants)
    return Plan(steps, names, plan.input_slots, plan.input_defaults, outputs, constants,
                last_use, may_alias)
