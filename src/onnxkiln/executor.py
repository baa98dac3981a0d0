"""Runs a Plan. The plan is compiled to straight-line Python: one local per value,
kernels and constants bound as globals, a `del` after each value's last use. The
hot path therefore does no dict lookups by name, no loop and no slot indexing.
"""

from __future__ import annotations

import itertools
import traceback
from collections.abc import Callable, Sequence
from typing import Any

from onnxkiln.errors import KernelError, SessionError
from onnxkiln.plan import Plan, Step

__all__ = ["CompiledPlan", "SubgraphRunner"]

_counter = itertools.count()


class CompiledPlan:
    """A plan turned into one generated Python function `run(inputs) -> outputs`."""

    def __init__(self, plan: Plan) -> None:
        self.plan = plan
        self.filename = f"<onnxkiln plan {next(_counter)}>"
        source, self._line_steps = _generate(plan)
        namespace: dict[str, Any] = {}
        for i, step in enumerate(plan.steps):
            namespace[f"k{i}"] = step.kernel
        for s, value in plan.constants.items():
            namespace[f"c{s}"] = value
        exec(compile(source, self.filename, "exec"), namespace)
        self._fn: Callable[[Sequence[Any]], list[Any]] = namespace["run"]
        self.source = source

    def __call__(self, inputs: Sequence[Any]) -> list[Any]:
        """Run the plan on values given in `plan.input_slots` order."""
        try:
            return self._fn(inputs)
        except SessionError:
            raise
        except Exception as e:
            step = self._failed_step(e)
            if step is None:
                raise
            raise KernelError(
                f"node '{step.name}' ({step.domain or 'ai.onnx'}::{step.op_type} opset "
                f"{step.opset}, node id {step.node_id}) failed: {type(e).__name__}: {e}",
                node_name=step.name,
                op_type=step.op_type,
            ) from e

    def _failed_step(self, error: BaseException) -> Step | None:
        for frame, lineno in traceback.walk_tb(error.__traceback__):
            if frame.f_code.co_filename == self.filename:
                index = self._line_steps.get(lineno)
                return None if index is None else self.plan.steps[index]
        return None


def _generate(plan: Plan) -> tuple[str, dict[int, int]]:
    """Python source of the run function and a map from line number to step index."""

    def ref(slot: int | None) -> str:
        if slot is None:
            return "None"
        return f"c{slot}" if slot in plan.constants else f"v{slot}"

    lines = ["def run(inputs):"]
    line_steps: dict[int, int] = {}
    if plan.input_slots:
        lines.append(f"    {', '.join(f'v{s}' for s in plan.input_slots)}, = inputs")
    dead_at: dict[int, list[int]] = {}
    for s, last in plan.last_use.items():
        if s not in plan.constants:
            dead_at.setdefault(last, []).append(s)
    if dead_at.get(-1):
        lines.append(f"    del {', '.join(f'v{s}' for s in sorted(dead_at[-1]))}")
    for i, step in enumerate(plan.steps):
        args = ", ".join(ref(s) for s in step.inputs)
        line_steps[len(lines) + 1] = i
        if step.spec.multi_output:
            lines.append(f"    _t = k{i}({args})")
            for j, s in enumerate(step.outputs):
                if s is not None:
                    line_steps[len(lines) + 1] = i
                    lines.append(f"    v{s} = _t[{j}]")
        elif step.outputs and step.outputs[0] is not None:
            lines.append(f"    v{step.outputs[0]} = k{i}({args})")
        else:
            lines.append(f"    k{i}({args})")
        dead = dead_at.get(i)
        if dead:
            lines.append(f"    del {', '.join(f'v{s}' for s in sorted(dead))}")
    lines.append(f"    return [{', '.join(ref(s) for s in plan.output_slots)}]")
    return "\n".join(lines) + "\n", line_steps



class SubgraphRunner:
    """A compiled If/Loop/Scan body: picks its captured values and counts builds and runs."""

    def __init__(self, compiled: CompiledPlan, capture_index: tuple[int, ...], graph, label: str,
                 stats) -> None:
        self._compiled = compiled
        self._index = capture_index
        self._stats = stats
        self._seen: set[tuple] = set()
        self.label = label
        self.input_names = tuple(v.name for v in graph.inputs)
        self.output_names = tuple(v.name for v in graph.outputs)

    def __call__(self, inputs: Sequence[Any], captured: Sequence[Any]) -> list[Any]:
        """Run the body on its formal inputs plus the captured outer values."""
        signature = tuple(_signature(v) for v in inputs)
        if signature not in self._seen:
            self._seen.add(signature)
            self._stats.builds += 1
        self._stats.runs += 1
        return self._compiled([*inputs, *(captured[i] for i in self._index)])


def _signature(value: Any) -> Any:
    shape = getattr(value, "shape", None)
    if shape is not None:
        return (getattr(value, "dtype", None), shape)
    if isinstance(value, list):
        return ("seq", len(value))
    return type(value)
