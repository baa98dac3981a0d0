"""Graph optimizer: rewrite a loaded model, in place, before it is planned.

Levels, each including the ones before it:

- "disabled": the graph runs as loaded.
- "basic": Constant nodes become initializers; shapes are inferred; Identity, inference
  Dropout, same-type Cast and identity Transpose are removed; constants are folded with our
  own kernels; shape computations of static dims are folded, and Reshape targets built from the
  input's own symbolic dims become constants (0 = copy the dim); common subexpressions are
  merged; dead nodes and initializers are dropped.
- "extended": fusions, each exact to float32 rounding: Conv+BatchNormalization folding,
  Conv(+Add)(+activation) -> com.microsoft FusedConv (onnxkiln FusedConv for HardSwish and
  SiLU), GELU (erf and tanh forms) ->
  com.microsoft Gelu/FastGelu/BiasGelu, decomposed LayerNorm/RMSNorm -> LayerNormalization/
  SimplifiedLayerNormalization, Add+LayerNormalization -> com.microsoft
  SkipLayerNormalization, attention -> onnxkiln ScaledDotProductAttention, MatMul+Add ->
  Gemm (2-D) or onnxkiln FusedMatMulBias, Transpose and scalar Mul/Div into com.microsoft
  FusedMatMul, Gemm+activation -> com.microsoft FusedGemm.
- "all" (the default): everything; today the same passes as "extended" (the level where
  layout passes would go).

Fusions target ai.onnx and com.microsoft ops (which onnxruntime also runs) where one fits
exactly, and the onnxkiln domain (providers/cpu/fused.py) otherwise; `portable=True` keeps
to the former. Models holding an ai.onnx.preview.training Gradient node are left as they are
(it names the values it differentiates).

Example:
    >>> model = optimize(loader.load_path("bert.onnx"), "all")
    >>> save(model, "bert.opt.onnx")          # the `optimized_model_path` session option
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Sequence

import onnx_ir as ir

from onnxkiln.errors import InvalidOptionError, ModelLoadError, SessionError
from onnxkiln.optimizer import (
    eliminate,
    fold,
    fuse_attention,
    fuse_conv,
    fuse_gelu,
    fuse_matmul,
    fuse_norm,
    shapes,
)
from onnxkiln.optimizer._graph import Context
from onnxkiln.providers.base import KernelRegistry

__all__ = ["LEVELS", "OptimizeReport", "optimize", "optimize_and_save", "save"]

logger = logging.getLogger(__name__)

LEVELS = ("disabled", "basic", "extended", "all")
_MAX_ROUNDS = 4

Pass = Callable[[Context], bool]

BASIC_LOOP: tuple[Pass, ...] = (
    fold.fold_constants,
    shapes.fold_shapes,
    shapes.fold_reshape_targets,
    eliminate.eliminate_common_subexpressions,
    eliminate.eliminate_dead,
)
FUSIONS: tuple[Pass, ...] = (
    fuse_conv.fold_batch_norm,
    fuse_conv.fuse_conv_activation,
    fuse_gelu.fuse_gelu,
    fuse_gelu.fuse_silu,
    fuse_conv.fuse_conv_swish,
    fuse_norm.fuse_layer_norm,
    fuse_norm.fuse_rms_norm,
    fuse_attention.fuse_attention,
    fuse_norm.fuse_skip_layer_norm,
    fuse_gelu.fuse_bias_gelu,
    fuse_matmul.fuse_matmul_scale,
    fuse_matmul.fuse_matmul_transpose,
    fuse_matmul.fuse_matmul_add,
    fuse_matmul.fuse_gemm_activation,
)


class OptimizeReport(dict):
    """Rewrite counts by pass (e.g. {"constant.fold": 12, "gelu": 12}), and `seconds`."""

    seconds: float = 0.0


def optimize(
    model: ir.Model,
    level: str = "all",
    *,
    registries: Sequence[KernelRegistry] | None = None,
    portable: bool = False,
    report: OptimizeReport | None = None,
) -> ir.Model:
    """Optimize `model` in place at `level` and return it.

    Fusions only emit ops some registry in `registries` (default: the CPU provider's) has a
    kernel for, at the opset the model imports (1 for a domain it does not import yet).
    `portable=True` also keeps out the onnxkiln-domain fused ops, so a saved model runs in
    onnxruntime (at some speed cost here). Pass `report` to receive rewrite counts.
    """
    if level not in LEVELS:
        raise InvalidOptionError(f"optimization level must be one of {list(LEVELS)}, "
                                 f"got {level!r}")
    start = time.perf_counter()
    if registries is None:
        from onnxkiln.providers.cpu import REGISTRY

        registries = (REGISTRY,)
    ctx = Context(model, registries, portable)
    fold.forget_negative_dims(ctx)
    if level != "disabled" and not _names_pinned(model):
        schedule = _Schedule(ctx)
        for p in (fold.lift_constants, fold.infer_shapes, eliminate.eliminate_identities):
            schedule.run(p)
        schedule.fixed_point(BASIC_LOOP)
        if level in ("extended", "all"):
            for fusion in FUSIONS:
                schedule.run(fusion)
            schedule.fixed_point(BASIC_LOOP)
    if report is not None:
        report.update(ctx.stats)
        report.seconds = time.perf_counter() - start
    logger.debug("optimize(%s): %s in %.3fs", level, dict(ctx.stats),
                 time.perf_counter() - start)
    return model


def _names_pinned(model: ir.Model) -> bool:
    """Gradient (ai.onnx.preview.training) differentiates other nodes of its graph, named by
    value: rewriting any of them would change what it computes, so such models stay as is."""
    return any(n.op_type == "Gradient" and n.domain == "ai.onnx.preview.training"
               for n in model.graph.all_nodes())


# Passes whose changes enable no other basic pass: removing nodes and initializers nothing
# reads makes no value constant, no shape known and no two nodes equal (constant folding's
# size guards that count readers remember their refusals in ctx.unfoldable).
_ONLY_REMOVES: frozenset[Pass] = frozenset({eliminate.eliminate_dead})


class _Schedule:
    """Runs passes, counting the changes that may enable others, so a fixed point skips
    the passes that have nothing new to look at: every pass is idempotent (one sweep does
    all it can; a second right after it changes nothing), so a pass whose last run saw the
    graph as it is now is not run again. The result is the one running every pass in
    every round gives."""

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self.changes = 0
        self.seen: dict[Pass, int] = {}  # pass -> `changes` when its last run ended

    def run(self, p: Pass) -> bool:
        changed = _run(p, self.ctx)
        if changed and p not in _ONLY_REMOVES:
            self.changes += 1
        self.seen[p] = self.changes
        return changed

    def fixed_point(self, passes: Sequence[Pass]) -> None:
        """Repeat `passes` in order until a round leaves the graph as it found it."""
        for _ in range(_MAX_ROUNDS):
            before = self.changes
            for p in passes:
                if self.seen.get(p) != self.changes:
                    self.run(p)
            if self.changes == before:
                return


def _run(p: Pass, ctx: Context) -> bool:
    """One pass; an unexpected failure (a malformed model it tripped on, or a bug) becomes a
    ModelLoadError naming the pass, so loading fails cleanly with the way around it."""
    try:
        return p(ctx)
    except SessionError:
        raise
    except Exception as e:
        raise ModelLoadError(
            f"graph optimizer pass {p.__module__.rsplit('.', 1)[-1]}.{p.__name__} failed: "
            f"{type(e).__name__}: {e}. The model may be malformed; "
            "optimization('disabled') loads it without the optimizer") from e


def save(model: ir.Model, path: str | os.PathLike) -> None:
    """Write the (optimized) model as an ONNX file; weights go to `<file>.data` beside it
    when they would push the protobuf past its 2 GB limit."""
    total = sum(v.const_value.nbytes for g in model.graphs() for v in g.initializers.values()
                if v.const_value is not None)
    if total < (1 << 31) - (64 << 20):
        # weights read from the source model's external files are written inline: saved
        # as they are, their references would be relative to the wrong folder
        external = [v for g in model.graphs() for v in g.initializers.values()
                    if isinstance(v.const_value, ir.ExternalTensor)]
        originals = [v.const_value for v in external]
        try:
            for value, tensor in zip(external, originals, strict=True):
                value.const_value = ir.Tensor(tensor.numpy(), name=tensor.name)
            ir.save(model, path)
        finally:
            for value, tensor in zip(external, originals, strict=True):
                value.const_value = tensor
    else:
        ir.save(model, path, external_data=os.path.basename(os.fspath(path)) + ".data")


def optimize_and_save(model: ir.Model, level: str, registries: Sequence[KernelRegistry],
                      save_path: str | None) -> ir.Model:
    """`optimize` at `level` for a session; with a `save_path` (optimized_model_path), keep
    to ops onnxruntime also runs (no onnxkiln-domain fusions) and write the result there."""
    model = optimize(model, level, registries=registries, portable=save_path is not None)
    if save_path:
        try:
            save(model, save_path)
        except OSError as e:
            raise InvalidOptionError(
                f"optimized_model_path: cannot write '{save_path}': {e}") from e
    return model
