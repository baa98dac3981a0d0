"""The capture audit: for one bound plan, which steps are recorded, which are
computed once at capture (static), and which run eagerly as seams between captured segments.

A step is static when its outputs cannot change between replays: it reads only constants,
inputs given as plain arrays at capture (they are frozen for the graph's life), and shapes
that are fixed. Everything else is recorded unless the step is a seam:

- HOST_CONTROL_FLOW: If, Loop, Scan and other nodes with graph attributes;
- DATA_DEPENDENT_SHAPE: a kernel declaring it (NonZero, Unique, ...), an op whose output
  shape follows an input value that changes between steps (Reshape to a computed shape,
  Slice to a position...), or a step reading a value whose shape follows such a node;
- KERNEL_NOT_CAPTURABLE: a kernel declaring host synchronisation, a host scalar read or a
  per-call allocation, a device kernel reading a host operand that changes, a copy between
  host and device of a value that changes;
- CPU_FALLBACK: a node a device session placed on the CPU;
- GROWING_SHAPE: a step reading or writing a value whose shape grows with a KV binding that
  grows in place (an appended Concat, an attention kernel writing its new positions) or
  with an input-only binding that follows it (a mask): measured by running the plan at two
  past lengths (onnxkiln.device_graph).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import onnx_ir as ir

from onnxkiln.plan import Plan, Step
from onnxkiln.providers.base import CaptureSupport
from onnxkiln.types import CaptureDecline, SeamKind

__all__ = ["Audit", "audit", "has_subgraphs"]

# input positions whose values decide an op's output shape (ai.onnx); None: every input
VALUE_SHAPED: dict[str, tuple[int, ...] | None] = {
    "Reshape": (1,), "Slice": (1, 2, 3, 4), "Tile": (1,), "Expand": (1,),
    "ConstantOfShape": None, "Range": None, "Pad": (1, 3), "Resize": (1, 2, 3),
    "Upsample": (1,), "Squeeze": (1,), "Unsqueeze": (1,), "Split": (1,), "TopK": (1,),
    "OneHot": (1,), "CenterCropPad": (1, 2), "MaxUnpool": (2,), "Col2Im": (1, 2),
    "BlackmanWindow": None, "HannWindow": None, "HammingWindow": None, "DFT": (1, 2),
    "STFT": (1, 2, 3), "MelWeightMatrix": None,
    **{f"Reduce{r}": (1,) for r in ("Sum", "Mean", "Max", "Min", "Prod", "L1", "L2", "LogSum",
                                    "LogSumExp", "SumSquare")},
}
NONDETERMINISTIC = frozenset({"RandomNormal", "RandomUniform", "RandomNormalLike",
                              "RandomUniformLike", "Multinomial", "Bernoulli", "Dropout",
                              "Sampling"})  # com.microsoft Sampling draws tokens
_SHAPE_OF = frozenset({"Shape", "Size"})
_COPIES = frozenset({"MemcpyToHost", "MemcpyFromHost"})


@dataclass
class Audit:
    """Per step of the plan: `seams[i]` (kind, reason) or None, `static[i]`; the declines in
    plan order."""

    seams: list[tuple[SeamKind, str] | None]
    static: list[bool]
    declines: list[CaptureDecline] = field(default_factory=list)

    @property
    def captured_steps(self) -> int:
        return sum(1 for s, st in zip(self.seams, self.static) if s is None and not st)

    def segment_count(self) -> int:
        """Maximal runs of recorded steps between seams (static steps separate nothing)."""
        count, inside = 0, False
        for seam, static in zip(self.seams, self.static):
            if static:
                continue
            if seam is None and not inside:
                count += 1
            inside = seam is None
        return count


@dataclass
class AuditInputs:
    """What the audit knows beyond the plan: which input slots are frozen (plain arrays
    given at capture, or defaults), the slots measured to grow (appended inputs included),
    the device provider's name (None on a host-only session), the placer's fallback
    reasons, and the bound input slots (on a device session their upload is the tensor
    itself)."""

    frozen: frozenset[int]
    growing: frozenset[int]
    growth_source: str = ""
    device_provider: str | None = None
    fallback_reasons: Mapping[int, str] = field(default_factory=dict)
    on_device: frozenset[int] = frozenset()  # bound input slots: already device tensors


def audit(plan: Plan, graph: ir.Graph, facts: AuditInputs) -> Audit:
    """Classify every step of `plan` (see the module docstring)."""
    state = _State(plan.slot_names, set(plan.constants) | set(facts.frozen), facts.growing)
    state.derived.update(state.static)
    seams: list[tuple[SeamKind, str] | None] = []
    statics: list[bool] = []
    declines: list[CaptureDecline] = []
    for step in plan.steps:
        ins = [s for s in step.inputs if s is not None]
        outs = [s for s in step.outputs if s is not None]
        if _is_static(step, ins, state):
            state.static.update(outs)
            state.derived.update(outs)
            seams.append(None)
            statics.append(True)
            continue
        seam = _classify(step, graph, facts, state)
        seams.append(seam)
        statics.append(False)
        state.follow(step, ins, outs, graph)
        if seam is not None:
            declines.append(CaptureDecline(step.node_id, step.name, step.op_type,
                                           step.domain, seam[0], seam[1]))
    return Audit(seams, statics, declines)


@dataclass
class _State:
    """What the audit knows about slots so far.

    `static`: the same value every replay. `derived`: computed from shapes and constants
    only, so the growth probe saw every way its value can change. `dd_from`: slots whose
    shape follows data (not just the KV length), with the node it comes from.
    """

    names: Sequence[str]
    static: set[int]
    growing: frozenset[int]
    derived: set[int] = field(default_factory=set)
    dd_from: dict[int, str] = field(default_factory=dict)

    def fixed(self, slot: int) -> bool:
        """Whether the slot has the same shape on every replay."""
        return slot not in self.growing and slot not in self.dd_from

    def follow(self, step: Step, ins: list[int], outs: list[int], graph: ir.Graph) -> None:
        """Record the outputs of a step that is not static."""
        origin = next((self.dd_from[s] for s in ins if s in self.dd_from), None)
        if _content_shaped(step, graph, self):
            origin = step.name
        for s in outs:
            if origin is not None:
                self.dd_from[s] = origin
        if step.op_type not in NONDETERMINISTIC and (
                (step.domain == "" and step.op_type in _SHAPE_OF)
                or all(s in self.derived for s in ins)):
            self.derived.update(outs)


def _content_shaped(step: Step, graph: ir.Graph, state: _State) -> bool:
    """Whether the step's output shape can follow the contents of a non-derived value."""
    if step.node_id >= 0 and has_subgraphs(graph.node(step.node_id)):
        return step.op_type != "If"
    if step.spec.capture is CaptureSupport.DATA_DEPENDENT_SHAPE:
        return any(s is not None and s not in state.derived for s in step.inputs)
    shape_input = _changing_shape_input(step, state.static)
    return shape_input is not None and shape_input not in state.derived


def _is_static(step: Step, ins: list[int], state: _State) -> bool:
    if step.op_type in NONDETERMINISTIC:
        return False
    if step.domain == "" and step.op_type in _SHAPE_OF and ins:
        return state.fixed(ins[0])
    return all(s in state.static for s in ins)


def _classify(step: Step, graph: ir.Graph, facts: AuditInputs, state: _State
              ) -> tuple[SeamKind, str] | None:
    """The seam kind and reason of a step that is not static, or None (recorded)."""
    op, names = f"{step.domain or 'ai.onnx'}::{step.op_type}", state.names
    if step.node_id >= 0 and has_subgraphs(graph.node(step.node_id)):
        what = ("the branch is chosen on the host each step; a flip retires the graph"
                if step.op_type == "If" else "its iterations are driven from the host")
        return SeamKind.HOST_CONTROL_FLOW, f"{op}: {what}"
    if step.spec.capture is CaptureSupport.DATA_DEPENDENT_SHAPE:
        return SeamKind.DATA_DEPENDENT_SHAPE, f"{op}: the kernel's output shape depends on data"
    if step.spec.capture is not CaptureSupport.CAPTURABLE:
        return SeamKind.KERNEL_NOT_CAPTURABLE, f"{op}: the kernel {step.spec.capture.value}"
    if (facts.device_provider is not None and step.node_id >= 0
            and step.provider != facts.device_provider):
        why = facts.fallback_reasons.get(step.node_id, "placed on the host")
        return SeamKind.CPU_FALLBACK, f"{op} runs on {step.provider}: {why}"
    touched = [s for s in (*step.inputs, *step.outputs) if s is not None]
    grows = next((s for s in touched if s in facts.growing), None)
    if grows is not None:
        return (SeamKind.GROWING_SHAPE, f"'{names[grows]}' changes shape every step (it "
                f"follows the appended binding(s) {facts.growth_source})")
    if step.op_type == "MemcpyFromHost" and step.inputs[0] in facts.on_device:
        return None  # an upload of a bound input is the tensor itself
    if step.op_type in _COPIES and step.domain == "onnxkiln":
        where = "host" if step.op_type == "MemcpyToHost" else "device"
        return (SeamKind.KERNEL_NOT_CAPTURABLE,
                f"copies '{names[step.inputs[0]]}', which changes each step, to the {where}")
    varying = next((s for s in step.inputs if s is not None and s in state.dd_from), None)
    if varying is not None:
        return (SeamKind.DATA_DEPENDENT_SHAPE, f"input '{names[varying]}' has a shape that "
                f"follows the data through node '{state.dd_from[varying]}'")
    shape_input = _changing_shape_input(step, state.static)
    if shape_input is not None and shape_input not in state.derived:
        return (SeamKind.DATA_DEPENDENT_SHAPE, f"{op}: its output shape follows the value of "
                f"input '{names[shape_input]}', which changes between steps")
    host = next((step.inputs[i] for i in sorted(step.spec.host_inputs)
                 if i < len(step.inputs) and step.inputs[i] is not None
                 and step.inputs[i] not in state.static), None)
    if host is not None and facts.device_provider == step.provider:
        return (SeamKind.KERNEL_NOT_CAPTURABLE,
                f"{op}: reads host operand '{names[host]}', which changes between steps")
    return None


def _changing_shape_input(step: Step, static: set[int]) -> int | None:
    if step.domain != "" or step.op_type not in VALUE_SHAPED:
        return None
    positions = VALUE_SHAPED[step.op_type]
    if positions is None:
        positions = tuple(range(len(step.inputs)))
    for i in positions:
        if i < len(step.inputs) and step.inputs[i] is not None and step.inputs[i] not in static:
            return step.inputs[i]
    return None


def has_subgraphs(node: ir.Node) -> bool:
    """Whether the node carries a graph attribute (If, Loop, Scan, SequenceMap...)."""
    return any(a.type in (ir.AttributeType.GRAPH, ir.AttributeType.GRAPHS)
               for a in node.attributes.values())
