"""Fuzz onnxkiln with mutated models: only `SessionError`s may come out, within a time bound.

    python scripts/fuzz.py                      # 10 minutes, reproducers under /tmp/onnxkiln-fuzz
    python scripts/fuzz.py --minutes 120 --seed 7
    python scripts/fuzz.py --executions 5000    # stop after a number of executions
    python scripts/fuzz.py --replay /tmp/onnxkiln-fuzz/bug-1a2b3c.onnx

Each execution takes a valid seed model (zoo models, control flow, shape arithmetic,
sequences, a model-local function, ai.onnx.ml), applies one to four mutations to its
graph structure (huge and negative dims, wrong attribute types, cycles, dangling names,
tensors claiming more data than present, deep subgraph nesting, swapped op types and
opsets...) or to its protobuf bytes, then loads it, reads its metadata and runs it on
inputs made from the declared ones. A finding is any exception that is not a
`SessionError`, a `SessionError` saying it is a bug in onnxkiln, a load or a run slower
than the time bound, or a crash of the worker process (segfault, hard hang, OOM kill).

The executions run in a worker subprocess with its address space capped, so a hostile
allocation is a `MemoryError` (which onnxkiln must turn into a `SessionError`) and never
an OOM kill of the machine; before each execution the worker writes the model to
`current-<pid>.onnx`, so a crash leaves its reproducer. Findings are saved as
`bug-<key>.onnx` with a `.txt` holding the traceback; repeats of a finding (same
exception type at the same source line) are counted, not saved again.
`tests/test_fuzz.py` imports this module for the bounded CI run.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import dataclasses
import faulthandler
import functools
import hashlib
import json
import os
import random
import subprocess
import sys
import threading
import time
import traceback
import warnings
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT / "src") not in sys.path:
    sys.path.insert(0, str(ROOT / "src"))

from onnxkiln import InferenceSession, SessionError  # noqa: E402
from onnxkiln.dtypes import DataType  # noqa: E402

OUT_DIR = Path("/tmp/onnxkiln-fuzz")
MEMORY_LIMIT = 256 << 20  # session memory_limit for half the executions
ADDRESS_HEADROOM = 3 << 30  # virtual memory an execution may add on top of the worker's own
LOAD_SECONDS = 10.0  # a load slower than this is a finding
RUN_SECONDS = 2.0  # the cancel event of a run is set after this long
RUN_GRACE = 10.0  # a run still going this long after its cancel event is a finding

HOSTILE_INTS = [-(1 << 62), -(1 << 31), -65536, -7, -2, -1, 0, 1, 2, 3, 7, 255, 65536,
                (1 << 31) - 1, 1 << 31, (1 << 32) + 1, 1 << 40, (1 << 62), (1 << 63) - 1]
HOSTILE_FLOATS = [float("nan"), float("inf"), float("-inf"), -1.0, 0.0, 1e-45, 1e38, -1e38]
ATTR_NAMES = ["axis", "axes", "perm", "pads", "strides", "kernel_shape", "dilations", "group",
              "to", "mode", "keepdims", "value", "body", "then_branch", "else_branch", "shape",
              "allowzero", "k", "largest", "equation", "split", "num_outputs", "alpha", "beta",
              "transA", "transB", "epsilon", "direction", "exclusive", "reverse", "dtype",
              "seed", "batch_dims", "coordinate_transformation_mode", "auto_pad", "ceil_mode"]
DOMAINS = ["", "ai.onnx", "ai.onnx.ml", "com.microsoft", "ai.onnx.preview.training",
           "bogus.domain", "local"]


# ---- seed models ------------------------------------------------------------------------


def _parse(text: str) -> onnx.ModelProto:
    return onnx.parser.parse_model(text)


_CONTROL = """
<ir_version: 8, opset_import: ["" : 17]>
control (float[N, 4] x, int64 trips, bool flag) => (float[4] total, float[M, 4] steps,
                                                  float[N, 4] chosen, float[4] scanned) {
    zero = Constant <value = float[4] {0, 0, 0, 0}> ()
    keep = Constant <value = bool {1}> ()
    total, steps = Loop (trips, keep, zero) <body = loop_body (int64 i, bool c, float[4] acc)
                                            => (bool c_out, float[4] acc_out, float[4] row) {
        c_out = Identity (c)
        row = Gather <axis = 0> (x, i)
        acc_out = Add (acc, row)
    }>
    chosen = If (flag) <then_branch = then_g () => (float[N, 4] t) { t = Relu (x) },
                        else_branch = else_g () => (float[N, 4] e) { e = Neg (x) }>
    scanned, rows = Scan <num_scan_inputs = 1, body = scan_body (float[4] s, float[4] r)
                                                   => (float[4] s_out, float[4] r_out) {
        s_out = Add (s, r)
        r_out = Mul (s_out, r)
    }> (zero, x)
}
"""

_SHAPES = """
<ir_version: 8, opset_import: ["" : 17]>
shapes (float[N, 6] x, int64[2] dims) => (float[A, B] r, float[2, 3] c, float[P, Q] e,
                                         float[K] s, int64[L] rng, float[T, U] p,
                                         float[2, V] tk, int64[W, X] nz, float[Y, Z] tiled) {
    shape = Shape (x)
    n = Gather <axis = 0> (shape, zero_idx)
    zero_idx = Constant <value = int64 {0}> ()
    target = Constant <value = int64[2] {3, -1}> ()
    r = Reshape (x, target)
    cs = Constant <value = int64[2] {2, 3}> ()
    c = ConstantOfShape <value = float[1] {1.5}> (cs)
    ones = Constant <value = int64[2] {1, 1}> ()
    c1 = ConstantOfShape <value = float[1] {2.5}> (ones)
    e = Expand (c1, dims)
    flat = Flatten <axis = 0> (x)
    starts = Constant <value = int64[1] {1}> ()
    ends = Constant <value = int64[1] {5}> ()
    axes = Constant <value = int64[1] {1}> ()
    sl = Slice (flat, starts, ends, axes)
    s = ReduceSum <keepdims = 0> (sl, zero_idx)
    limit = Cast <to = 7> (n)
    one = Constant <value = int64 {1}> ()
    rng = Range (zero_idx, limit, one)
    pads = Constant <value = int64[4] {1, 0, 0, 2}> ()
    p = Pad <mode = "reflect"> (x, pads)
    kk = Constant <value = int64[1] {2}> ()
    tk, ti = TopK <axis = 1> (x, kk)
    pos = Greater (x, c0)
    c0 = Constant <value = float {0}> ()
    nz = NonZero (pos)
    reps = Constant <value = int64[2] {2, 1}> ()
    tiled = Tile (x, reps)
}
"""

_SEQUENCES = """
<ir_version: 8, opset_import: ["" : 17]>
sequences (float[N, 4] x) => (float[M, 4] joined, int64 count, float[4] first) {
    split = Constant <value = int64[2] {1, 1}> ()
    parts = SplitToSequence <axis = 0, keepdims = 1> (x)
    more = SequenceInsert (parts, x)
    count = SequenceLength (more)
    joined = ConcatFromSequence <axis = 0> (more)
    idx = Constant <value = int64 {0}> ()
    head = SequenceAt (more, idx)
    first = ReduceMax <keepdims = 0, axes = [0]> (head)
}
"""

_FUNCTION = """
<ir_version: 8, opset_import: ["" : 17, "local" : 1]>
with_function (float[N, 4] x, float[4] w) => (float[N, 4] y) {
    h = local.Scale <alpha = 2.0> (x, w)
    y = local.Scale <alpha = 0.5> (h, w)
}
<domain: "local", opset_import: ["" : 17]>
Scale <alpha> (a, b) => (c) {
    k = Constant <value_float: float = @alpha> ()
    m = Mul (a, b)
    c = Mul (m, k)
}
"""

_ML = """
<ir_version: 8, opset_import: ["" : 17, "ai.onnx.ml" : 3]>
ml (float[N, 3] x, int64[N] labels) => (float[N, 3] scaled, string[N] names,
                                         float[N, 3] normed) {
    scaled = ai.onnx.ml.Scaler <offset = [0.5, 0.0, -1.0], scale = [2.0, 1.0, 0.5]> (x)
    names = ai.onnx.ml.LabelEncoder <keys_int64s = [0, 1, 2], values_strings = ["a", "b", "c"],
                                     default_string = "?"> (labels)
    normed = ai.onnx.ml.Normalizer <norm = "L2"> (x)
}
"""


@functools.cache
def seed_models() -> tuple[tuple[str, bytes], ...]:
    """(name, serialized ModelProto) of every valid model the mutations start from."""
    from onnxkiln import zoo

    models = [
        ("mlp", zoo.mlp()),
        ("resnet", zoo.resnet()),
        ("bert", zoo.bert_encoder(layers=1)),
        ("gpt2", zoo.gpt_decoder_step(layers=1)),
        ("control", _parse(_CONTROL)),
        ("shapes", _parse(_SHAPES)),
        ("sequences", _parse(_SEQUENCES)),
        ("function", _parse(_FUNCTION)),
        ("ml", _parse(_ML)),
        *_sklearn_models(),
    ]
    return tuple((name, m.SerializeToString()) for name, m in models)


def _sklearn_models() -> list[tuple[str, onnx.ModelProto]]:
    """ai.onnx.ml models as skl2onnx writes them (tree ensembles with decision_path, whose
    LabelEncoder over an untyped tree output crashes onnx's C++ inference; a ZipMap's
    sequence of maps; SVM, linear, scaler and encoder attributes); none without skl2onnx."""
    try:
        from skl2onnx import to_onnx
        from sklearn.ensemble import GradientBoostingClassifier, RandomForestRegressor
        from sklearn.linear_model import LogisticRegression
        from sklearn.pipeline import make_pipeline
        from sklearn.preprocessing import OneHotEncoder, StandardScaler
        from sklearn.svm import SVC
        from sklearn.tree import DecisionTreeClassifier
    except ImportError:
        return []
    rng = np.random.RandomState(0)
    x = rng.rand(40, 3).astype(np.float32)
    y = (x[:, 0] > 0.5).astype(np.int64) + (x[:, 1] > 0.5)
    path = {"decision_path": True, "zipmap": False}
    fitted = [
        ("sk_tree_path", DecisionTreeClassifier(max_depth=3).fit(x, y), path),
        ("sk_forest_path", RandomForestRegressor(3, max_depth=3, random_state=0).fit(x, y),
         {"decision_path": True}),
        ("sk_boosting", GradientBoostingClassifier(n_estimators=3, max_depth=2).fit(x, y), {}),
        ("sk_logistic_zipmap", LogisticRegression().fit(x, y), {}),
        ("sk_svc", make_pipeline(StandardScaler(), SVC()).fit(x, y), {}),
    ]
    models = [(name, to_onnx(m, x[:1], options={id(m[-1] if hasattr(m, "steps") else m): o},
                             target_opset=17)) for name, m, o in fitted]
    cats = np.array([["a", "x"], ["b", "y"], ["a", "z"]], dtype=object)
    encoder = OneHotEncoder(handle_unknown="ignore").fit(cats)  # the fuzz feeds unknown ones
    models.append(("sk_onehot", to_onnx(encoder, cats[:1], target_opset=17)))
    return models


# ---- structural mutations ---------------------------------------------------------------


def _graphs(model: onnx.ModelProto) -> list[onnx.GraphProto]:
    out, pending = [], [model.graph]
    while pending:
        g = pending.pop()
        out.append(g)
        for n in g.node:
            for a in n.attribute:
                if a.HasField("g"):
                    pending.append(a.g)
                pending.extend(a.graphs)
    return out


def _nodes(model: onnx.ModelProto) -> list[onnx.NodeProto]:
    nodes = [n for g in _graphs(model) for n in g.node]
    nodes.extend(n for f in model.functions for n in f.node)
    return nodes


def _value_infos(model: onnx.ModelProto) -> list[onnx.ValueInfoProto]:
    return [v for g in _graphs(model) for v in (*g.input, *g.output, *g.value_info)]


def _names(model: onnx.ModelProto) -> list[str]:
    names = [v.name for v in _value_infos(model)]
    names += [t.name for g in _graphs(model) for t in g.initializer]
    names += [o for n in _nodes(model) for o in n.output]
    return [n for n in names if n] or ["x"]


def _hostile_int(rng: random.Random) -> int:
    return rng.choice(HOSTILE_INTS)


def m_dims(model: onnx.ModelProto, rng: random.Random) -> str:
    """A declared dim becomes huge, negative, zero or a new symbol; or the shape changes rank."""
    vis = [v for v in _value_infos(model) if v.type.HasField("tensor_type")]
    if not vis:
        return "dims: none"
    vi = rng.choice(vis)
    shape = vi.type.tensor_type.shape
    r = rng.random()
    if r < 0.6 and len(shape.dim):
        d = rng.choice(shape.dim)
        if rng.random() < 0.8:
            d.dim_value = _hostile_int(rng)
        else:
            d.dim_param = rng.choice(["N", "M", "huge", "", "ü"])
    elif r < 0.8:
        for _ in range(rng.choice([1, 2, 9, 40])):
            shape.dim.add().dim_value = rng.choice([1, 2, 1 << 20])
    else:
        vi.type.tensor_type.ClearField("shape")
    return f"dims of '{vi.name}'"


def m_type(model: onnx.ModelProto, rng: random.Random) -> str:
    """A declared element type becomes another (or invalid), or a sequence/optional/map type."""
    vis = _value_infos(model)
    if not vis:
        return "type: none"
    vi = rng.choice(vis)
    r = rng.random()
    if r < 0.6:
        vi.type.tensor_type.elem_type = rng.choice([0, 1, 2, 6, 7, 8, 9, 10, 11, 14, 16, 17,
                                                    21, 23, 25, 40, -3])
    elif r < 0.75:
        inner = onnx.TypeProto()
        inner.CopyFrom(vi.type)
        vi.type.sequence_type.elem_type.CopyFrom(inner)
    elif r < 0.9:
        inner = onnx.TypeProto()
        inner.CopyFrom(vi.type)
        vi.type.optional_type.elem_type.CopyFrom(inner)
    else:
        vi.type.map_type.key_type = rng.choice([7, 8, 1])
        vi.type.map_type.value_type.tensor_type.elem_type = 1
    return f"type of '{vi.name}'"


def _initializers(model: onnx.ModelProto) -> list[onnx.TensorProto]:
    inits = [t for g in _graphs(model) for t in g.initializer]
    inits.extend(a.t for n in _nodes(model) for a in n.attribute if a.HasField("t"))
    return inits


def m_tensor_dims(model: onnx.ModelProto, rng: random.Random) -> str:
    """A tensor claims other dims than its data: giant, negative, extra or none."""
    inits = _initializers(model)
    if not inits:
        return "tensor dims: none"
    t = rng.choice(inits)
    r = rng.random()
    if r < 0.5 and len(t.dims):
        t.dims[rng.randrange(len(t.dims))] = _hostile_int(rng)
    elif r < 0.8:
        t.dims.extend([rng.choice([2, 1 << 20, 1 << 31])] * rng.choice([1, 2, 3]))
    else:
        del t.dims[:]
    return f"dims of tensor '{t.name}'"


def m_tensor_data(model: onnx.ModelProto, rng: random.Random) -> str:
    """A tensor's data is cut, padded, retyped, moved to a bogus field or to external data."""
    inits = _initializers(model)
    if not inits:
        return "tensor data: none"
    t = rng.choice(inits)
    r = rng.random()
    if r < 0.3 and t.raw_data:
        t.raw_data = t.raw_data[: rng.randrange(len(t.raw_data))]
    elif r < 0.4:
        t.raw_data = t.raw_data + bytes(rng.randrange(1, 64))
    elif r < 0.6:
        t.data_type = rng.choice([0, 1, 2, 3, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17,
                                  20, 21, 22, 23, 99, -1])
    elif r < 0.7:
        t.ClearField("raw_data")
        t.float_data.extend(rng.choice(HOSTILE_FLOATS) for _ in range(rng.randrange(0, 5)))
    elif r < 0.8:
        t.ClearField("raw_data")
        t.int64_data.extend(_hostile_int(rng) for _ in range(rng.randrange(0, 5)))
    elif r < 0.9:
        t.data_location = TensorProto.EXTERNAL
        del t.external_data[:]
        for key, value in rng.choice([
            [("location", "weights.bin")],
            [("location", "weights.bin"), ("offset", str(_hostile_int(rng))),
             ("length", str(_hostile_int(rng)))],
            [("location", "../../etc/passwd")],
            [("location", "/etc/hostname")],
            [("location", "")],
            [("location", "weights.bin"), ("offset", "x")],
        ]):
            t.external_data.add(key=key, value=value)
    else:
        t.ClearField("raw_data")
        t.string_data.extend([b"\xff\xfe", b"abc"][: rng.randrange(0, 3)])
    return f"data of tensor '{t.name}'"


def m_int_values(model: onnx.ModelProto, rng: random.Random) -> str:
    """A small integer tensor (shapes, axes, pads, trip counts) gets hostile values."""
    ints = [t for t in _initializers(model)
            if t.data_type in (TensorProto.INT64, TensorProto.INT32)
            and int(np.prod(t.dims, dtype=np.int64)) <= 16]
    if not ints:
        return "int values: none"
    t = rng.choice(ints)
    try:
        array = numpy_helper.to_array(t).copy()
    except Exception:
        return "int values: unreadable"
    flat = array.reshape(-1)
    info = np.iinfo(array.dtype)
    for i in range(flat.size):
        if rng.random() < 0.6:
            flat[i] = min(max(_hostile_int(rng), info.min), info.max)
    t.CopyFrom(numpy_helper.from_array(array, t.name))
    return f"values of int tensor '{t.name}'"


def _random_attr(name: str, rng: random.Random, model: onnx.ModelProto) -> onnx.AttributeProto:
    kind = rng.randrange(8)
    if kind == 0:
        return helper.make_attribute(name, _hostile_int(rng))
    if kind == 1:
        return helper.make_attribute(name, [_hostile_int(rng) for _ in range(rng.randrange(6))])
    if kind == 2:
        return helper.make_attribute(name, rng.choice(HOSTILE_FLOATS))
    if kind == 3:
        return helper.make_attribute(name, rng.choice(["", "constant", "linear", "abc->",
                                                       "\u00e9", "ij,jk->ik"]))
    if kind == 4:
        a = onnx.AttributeProto(name=name, type=onnx.AttributeProto.STRING)
        a.s = bytes(rng.randrange(256) for _ in range(rng.randrange(6)))
        return a
    if kind == 5:
        array = np.array(rng.choice([[1.0], [], [[1, 2]], [1 << 40]]))
        return helper.make_attribute(name, numpy_helper.from_array(array))
    if kind == 6:
        graphs = list(_graphs(model)[1:]) or [onnx.GraphProto(name="empty")]
        return helper.make_attribute(name, copy.deepcopy(rng.choice(graphs)))
    a = onnx.AttributeProto(name=name, type=rng.randrange(0, 16))
    return a


def m_attr(model: onnx.ModelProto, rng: random.Random) -> str:
    """An attribute gets a hostile value, another type, a type tag that lies, or goes away;
    or a node gains an attribute it does not expect."""
    nodes = _nodes(model)
    if not nodes:
        return "attr: none"
    node = rng.choice(nodes)
    r = rng.random()
    if node.attribute and r < 0.45:
        i = rng.randrange(len(node.attribute))
        name = node.attribute[i].name
        node.attribute[i].CopyFrom(_random_attr(name, rng, model))
        return f"attribute '{name}' of '{node.name or node.op_type}' replaced"
    if node.attribute and r < 0.6:
        a = rng.choice(node.attribute)
        a.type = rng.choice([t for t in range(0, 14) if t != a.type])
        return f"attribute '{a.name}' of '{node.name or node.op_type}' mistyped"
    if node.attribute and r < 0.75:
        del node.attribute[rng.randrange(len(node.attribute))]
        return f"attribute of '{node.name or node.op_type}' dropped"
    name = rng.choice(ATTR_NAMES)
    del_same = [i for i, a in enumerate(node.attribute) if a.name == name]
    if del_same and rng.random() < 0.7:
        del node.attribute[del_same[0]]
    node.attribute.append(_random_attr(name, rng, model))
    return f"attribute '{name}' added to '{node.name or node.op_type}'"


def m_cycle(model: onnx.ModelProto, rng: random.Random) -> str:
    """An earlier node reads a later node's output (a cycle), or a node reads its own output."""
    graph = rng.choice(_graphs(model))
    nodes = graph.node
    if len(nodes) < 1:
        return "cycle: none"
    i = rng.randrange(len(nodes))
    j = rng.randrange(i, len(nodes))
    if not nodes[j].output:
        return "cycle: no output"
    if nodes[i].input:
        nodes[i].input[rng.randrange(len(nodes[i].input))] = rng.choice(nodes[j].output)
    else:
        nodes[i].input.append(rng.choice(nodes[j].output))
    return f"cycle {i} <- {j}"


def m_dangling(model: onnx.ModelProto, rng: random.Random) -> str:
    """A name that nothing defines: a node input, a graph output, a removed initializer."""
    r = rng.random()
    graph = rng.choice(_graphs(model))
    if r < 0.5 and graph.node:
        node = rng.choice(graph.node)
        if node.input:
            node.input[rng.randrange(len(node.input))] = rng.choice(["nope", "", " ", "x\x00"])
            return "dangling node input"
    if r < 0.7 and graph.output:
        graph.output[rng.randrange(len(graph.output))].name = rng.choice(["nope", ""])
        return "dangling graph output"
    if graph.initializer:
        del graph.initializer[rng.randrange(len(graph.initializer))]
        return "initializer removed"
    if graph.input:
        del graph.input[rng.randrange(len(graph.input))]
        return "graph input removed"
    return "dangling: none"


def m_duplicate(model: onnx.ModelProto, rng: random.Random) -> str:
    """Two definitions of one name: node outputs, a graph input, an initializer."""
    graph = rng.choice(_graphs(model))
    names = [o for n in graph.node for o in n.output] + [i.name for i in graph.input]
    if not graph.node or not names:
        return "duplicate: none"
    node = rng.choice(graph.node)
    if node.output:
        node.output[rng.randrange(len(node.output))] = rng.choice(names)
    if graph.initializer and rng.random() < 0.3:
        graph.initializer.add().CopyFrom(rng.choice(graph.initializer))
    return "duplicate definition"


@functools.cache
def _op_types() -> tuple[tuple[str, str], ...]:
    from onnxkiln.providers.cpu import REGISTRY

    return tuple(REGISTRY.ops())


def m_op_type(model: onnx.ModelProto, rng: random.Random) -> str:
    """A node becomes another op (any op onnxkiln knows, or an unknown one), keeping its
    inputs, outputs and attributes; or moves to another domain."""
    nodes = _nodes(model)
    if not nodes:
        return "op_type: none"
    node = rng.choice(nodes)
    if rng.random() < 0.85:
        domain, op = rng.choice(_op_types())
        node.op_type, node.domain = op, domain
        if domain and all(o.domain != domain for o in model.opset_import):
            model.opset_import.add(domain=domain, version=rng.choice([1, 3]))
    elif rng.random() < 0.5:
        node.op_type = rng.choice(["", "NoSuchOp", "Loop", "If", "Scan"])
    else:
        node.domain = rng.choice(DOMAINS)
    return f"node '{node.name}' -> {node.domain or 'ai.onnx'}::{node.op_type}"


def m_arity(model: onnx.ModelProto, rng: random.Random) -> str:
    """A node loses or gains inputs or outputs (absent "" ones included)."""
    nodes = _nodes(model)
    if not nodes:
        return "arity: none"
    node = rng.choice(nodes)
    names = _names(model)
    r = rng.random()
    if r < 0.3 and node.input:
        del node.input[rng.randrange(len(node.input)):]
    elif r < 0.6:
        node.input.extend(rng.choice(["", *names]) for _ in range(rng.randrange(1, 4)))
    elif r < 0.8 and node.output:
        del node.output[rng.randrange(len(node.output)):]
    else:
        node.output.extend(rng.choice(["", f"extra{rng.randrange(9)}"])
                           for _ in range(rng.randrange(1, 4)))
    return f"arity of '{node.name or node.op_type}'"


def m_opset(model: onnx.ModelProto, rng: random.Random) -> str:
    """Opset versions and the IR version change; imports appear or vanish."""
    r = rng.random()
    if r < 0.5 and model.opset_import:
        rng.choice(model.opset_import).version = rng.choice(
            [-1, 0, 1, 6, 7, 9, 11, 13, 17, 21, 23, 24, 99, 1 << 31, 1 << 40])
    elif r < 0.7 and model.opset_import:
        del model.opset_import[rng.randrange(len(model.opset_import))]
    elif r < 0.85:
        model.opset_import.add(domain=rng.choice(DOMAINS), version=rng.choice([1, 3, 99]))
    else:
        model.ir_version = rng.choice([0, 1, 3, 4, 7, 10, 11, 99, -5])
    return "opsets"


def _wrap_in_if(graph: onnx.GraphProto, depth: int) -> None:
    """Move `graph`'s nodes into `depth` nested If then-branches (in place, no deep copy)."""
    nodes = list(graph.node)
    outputs = list(graph.output)
    del graph.node[:]
    cond = "fuzz_cond"
    graph.initializer.append(numpy_helper.from_array(np.array(True), cond))
    current = graph
    for level in range(depth):
        node = current.node.add(op_type="If", name=f"nest{level}")
        node.input.append(cond)
        node.output.extend(o.name for o in outputs)
        then = node.attribute.add(name="then_branch", type=onnx.AttributeProto.GRAPH)
        other = node.attribute.add(name="else_branch", type=onnx.AttributeProto.GRAPH)
        other.g.name = f"else{level}"
        for o in outputs:
            other.g.node.add(op_type="Identity", input=[graph.input[0].name if graph.input
                                                        else cond], output=[f"e{level}_{o.name}"])
            vi = other.g.output.add()
            vi.CopyFrom(o)
            vi.name = f"e{level}_{o.name}"
        then.g.name = f"then{level}"
        then.g.output.extend(outputs)
        current = then.g
    current.node.extend(nodes)


def m_nest(model: onnx.ModelProto, rng: random.Random) -> str:
    """The graph moves into nested If bodies: shallow (captures), deep, or past the limit."""
    depth = rng.choice([1, 1, 2, 2, 3, 8, 30, 65, 300])
    _wrap_in_if(model.graph, depth)
    return f"nested {depth} deep"


def m_shuffle(model: onnx.ModelProto, rng: random.Random) -> str:
    """Node order shuffled (the loader must sort it) or a subgraph moved to another node."""
    graph = rng.choice(_graphs(model))
    if rng.random() < 0.7:
        nodes = list(graph.node)
        rng.shuffle(nodes)
        copies = [copy.deepcopy(n) for n in nodes]
        del graph.node[:]
        graph.node.extend(copies)
        return "shuffled"
    subs = _graphs(model)[1:]
    if not subs or not graph.node:
        return "shuffle: none"
    node = rng.choice(graph.node)
    graft = copy.deepcopy(rng.choice(subs))  # it may be an ancestor of `node`: copy it first
    node.attribute.add(name=rng.choice(["body", "then_branch", "else_branch"]),
                       type=onnx.AttributeProto.GRAPH).g.CopyFrom(graft)
    return "subgraph grafted"


def m_sparse(model: onnx.ModelProto, rng: random.Random) -> str:
    """A sparse initializer with hostile indices and dims."""
    graph = model.graph
    values = numpy_helper.from_array(np.array([1.0, 2.0], np.float32), "sp")
    indices = numpy_helper.from_array(
        np.array([_hostile_int(rng), _hostile_int(rng)], np.int64), "sp_i")
    sparse = onnx.SparseTensorProto(values=values, indices=indices)
    sparse.dims.extend([_hostile_int(rng) % (1 << 40), rng.choice([1, 2, -1])])
    graph.sparse_initializer.append(sparse)
    if graph.node and graph.node[0].input:
        graph.node[0].input[0] = "sp"
    return "sparse initializer"


def m_function(model: onnx.ModelProto, rng: random.Random) -> str:
    """A model-local function that is recursive, undefined-valued or called with bad arity."""
    f = onnx.FunctionProto(name="F", domain="fz")
    f.input.extend(["a"])
    f.output.extend(["b"])
    f.opset_import.add(domain="", version=17)
    kind = rng.randrange(3)
    if kind == 0:
        f.node.add(op_type="F", domain="fz", input=["a"], output=["b"])  # calls itself
    elif kind == 1:
        f.node.add(op_type="Add", input=["a", "undefined"], output=["b"])
    else:
        f.node.add(op_type="Relu", input=["a"], output=["b"])
    model.functions.append(f)
    model.opset_import.add(domain="fz", version=1)
    if model.graph.node:
        node = rng.choice(model.graph.node)
        node.op_type, node.domain = "F", "fz"
    return f"local function kind {kind}"


STRUCTURAL: tuple[Callable[[onnx.ModelProto, random.Random], str], ...] = (
    m_dims, m_type, m_tensor_dims, m_tensor_data, m_int_values, m_attr, m_attr, m_cycle,
    m_dangling, m_duplicate, m_op_type, m_op_type, m_arity, m_opset, m_nest, m_shuffle,
    m_sparse, m_function,
)


# ---- byte mutations ---------------------------------------------------------------------


def mutate_bytes(data: bytes, rng: random.Random) -> tuple[bytes, str]:
    """Bit flips, interesting bytes, deleted/duplicated/inserted ranges, truncation, splices."""
    buf = bytearray(data)
    if not buf:
        return bytes(rng.randrange(256) for _ in range(8)), "random bytes"
    kind = rng.randrange(6)
    if kind == 0:
        for _ in range(rng.randrange(1, 9)):
            buf[rng.randrange(len(buf))] ^= 1 << rng.randrange(8)
    elif kind == 1:
        for _ in range(rng.randrange(1, 5)):
            buf[rng.randrange(len(buf))] = rng.choice([0x00, 0x01, 0x7F, 0x80, 0xFF, 0x0A, 0x12])
    elif kind == 2:
        a = rng.randrange(len(buf))
        del buf[a:a + rng.randrange(1, 64)]
    elif kind == 3:
        a = rng.randrange(len(buf))
        chunk = buf[a:a + rng.randrange(1, 64)]
        buf[a:a] = chunk * rng.randrange(1, 4)
    elif kind == 4:
        buf = buf[: rng.randrange(len(buf))]
    else:
        other = rng.choice(seed_models())[1]
        a, b = rng.randrange(len(buf)), rng.randrange(len(other))
        buf = buf[:a] + other[b:b + rng.randrange(1, 256)] + buf[a:]
    return bytes(buf), f"bytes kind {kind}"


def mutate(rng: random.Random) -> tuple[bytes, str, list[str]]:
    """A mutated model: (serialized bytes, seed name, what was done to it)."""
    name, data = rng.choice(seed_models())
    steps: list[str] = []
    if rng.random() < 0.8:
        model = onnx.ModelProto()
        model.ParseFromString(data)
        for _ in range(rng.choice([1, 1, 2, 3, 4])):
            mutation = rng.choice(STRUCTURAL)
            try:
                steps.append(mutation(model, rng))
            except Exception as e:  # protobuf refused the edit (types, nesting depth)
                steps.append(f"{mutation.__name__} not applicable: {type(e).__name__}")
        try:
            data = model.SerializeToString()
        except Exception as e:  # e.g. invalid UTF-8 protobuf refuses to encode
            steps.append(f"serialize failed: {e}")
    if rng.random() < 0.15 or not steps:
        data, what = mutate_bytes(data, rng)
        steps.append(what)
    return data, name, steps


# ---- running one model ------------------------------------------------------------------


@dataclasses.dataclass
class Outcome:
    """What one execution did. `bug` holds the finding's description, else None."""

    stage: str  # "load", "run" or "ok"
    error: str  # the exception class name, "" when none
    seconds: float
    bug: str | None = None
    key: str = ""  # identifies a finding: exception type and innermost onnxkiln frame


def _array_for(meta: Any, sizes: dict[str, int], rng: random.Random) -> Any:
    try:
        dtype = DataType(meta.dtype).numpy if meta.dtype != DataType.UNDEFINED else np.float32
    except (KeyError, ValueError):
        dtype = np.dtype(np.float32)
    dims = []
    for d in meta.shape or ():
        if isinstance(d, int) and 0 <= d <= 64:
            dims.append(d)
        elif isinstance(d, str):
            dims.append(sizes.setdefault(d, rng.choice([1, 2, 3])))
        else:
            dims.append(rng.choice([1, 2]))
    if meta.shape is None:
        dims = [rng.choice([1, 2, 3]) for _ in range(rng.choice([0, 1, 2]))]
    if int(np.prod(dims, dtype=np.float64)) > 1 << 16:  # a rank-40 input of 2s is not the point
        dims = [1] * len(dims)
    dtype = np.dtype(dtype)
    if dtype.kind == "O":
        return np.full(dims, "a", dtype=object)
    if dtype.kind == "b":
        return np.asarray(rng.random() < 0.5) if not dims else np.ones(dims, bool)
    if dtype.kind in "iu":
        values = np.random.default_rng(rng.randrange(1 << 30)).integers(1, 3, size=dims)
        return values.astype(dtype)
    values = np.random.default_rng(rng.randrange(1 << 30)).standard_normal(size=dims)
    return values.astype(dtype)


def feeds_for(session: InferenceSession, rng: random.Random,
              wrong: bool = True) -> dict[str, Any]:
    """Inputs made from the declared ones (symbolic dims small); with `wrong`, now and then
    an unknown name or a wrong dtype."""
    feeds: dict[str, Any] = {}
    sizes: dict[str, int] = {}
    for meta in session.inputs():
        if meta.optional and rng.random() < 0.5:
            continue
        if meta.kind == "map":
            feeds[meta.name] = {1: 1.0}
        elif meta.kind == "sequence":
            feeds[meta.name] = [_array_for(meta, sizes, rng)]
        elif meta.kind == "optional" and rng.random() < 0.5:
            feeds[meta.name] = None
        else:
            feeds[meta.name] = _array_for(meta, sizes, rng)
    r = rng.random() if wrong else 1.0
    if r < 0.03:
        feeds["not_an_input"] = np.zeros(1, np.float32)
    elif r < 0.06 and feeds:
        feeds[rng.choice(list(feeds))] = np.zeros((2, 2), np.float16)
    return feeds


def _finding_key(error: BaseException) -> str:
    frames = traceback.extract_tb(error.__traceback__)
    inner = [f for f in frames if "onnxkiln" in f.filename] or frames
    where = f"{Path(inner[-1].filename).name}:{inner[-1].lineno}" if inner else "?"
    return f"{type(error).__name__}@{where}"


def _classify(stage: str, error: BaseException, seconds: float) -> Outcome:
    if not isinstance(error, SessionError):
        return Outcome(stage, type(error).__name__, seconds,
                       f"{stage}: {type(error).__name__} is not a SessionError: {error}",
                       _finding_key(error))
    if "a bug in onnxkiln" in str(error):
        cause = error.__cause__ or error
        return Outcome(stage, type(error).__name__, seconds, f"{stage}: {error}",
                       _finding_key(cause))
    return Outcome(stage, type(error).__name__, seconds)


def execute(data: bytes, rng: random.Random, external_dir: str | None = None,
            run_seconds: float = RUN_SECONDS) -> Outcome:
    """Load, inspect and run one model; classify what came out."""
    start = time.perf_counter()
    builder = InferenceSession.builder().device("cpu")
    if rng.random() < 0.5:
        builder.memory_limit(MEMORY_LIMIT)
    try:
        session = builder.load_bytes(data, external_data_dir=external_dir)
        session.inputs()
        session.outputs()
        session.model_metadata()
    except Exception as e:
        return _classify("load", e, time.perf_counter() - start)
    loaded = time.perf_counter() - start
    if loaded > LOAD_SECONDS:
        return Outcome("load", "", loaded, f"load took {loaded:.1f}s", "slow-load")
    stop = threading.Event()
    timer = threading.Timer(run_seconds, stop.set)
    timer.daemon = True
    t0 = time.perf_counter()
    try:
        feeds = feeds_for(session, rng)
        timer.start()
        session.run_outputs(feeds, cancel=stop)
    except Exception as e:
        outcome = _classify("run", e, time.perf_counter() - t0)
    else:
        outcome = Outcome("ok", "", time.perf_counter() - t0)
    finally:
        timer.cancel()
    if outcome.bug is None and outcome.seconds > run_seconds + RUN_GRACE:
        outcome.bug, outcome.key = f"run took {outcome.seconds:.1f}s (cancel ignored)", "slow-run"
    return outcome


@contextlib.contextmanager
def address_space_limit(headroom: int = ADDRESS_HEADROOM) -> Iterator[None]:
    """Cap this process's virtual memory at its current size plus `headroom` (Linux), so a
    hostile allocation fails with MemoryError instead of exhausting the machine."""
    try:
        import resource

        with open("/proc/self/statm") as f:
            current = int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    except (ImportError, OSError, ValueError):
        yield
        return
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    cap = current + headroom
    if hard != resource.RLIM_INFINITY:
        cap = min(cap, hard)
    resource.setrlimit(resource.RLIMIT_AS, (cap, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


@contextlib.contextmanager
def quiet() -> Iterator[None]:
    """Silence numpy and onnxkiln warnings and logs from hostile models."""
    import logging

    logging.disable(logging.CRITICAL)
    try:
        with warnings.catch_warnings(), np.errstate(all="ignore"):
            warnings.simplefilter("ignore")
            yield
    finally:
        logging.disable(logging.NOTSET)


def external_dir() -> str:
    """A folder holding a small weights.bin that external-data mutations may point at."""
    folder = OUT_DIR / "external"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "weights.bin").write_bytes(bytes(range(256)) * 16)
    return str(folder)


# ---- the long run: a worker process and its supervisor ----------------------------------


def _save(data: bytes, outcome: Outcome, error_text: str, steps: list[str], seed: str) -> Path:
    digest = hashlib.sha1(outcome.key.encode()).hexdigest()[:8]
    path = OUT_DIR / f"bug-{digest}.onnx"
    path.write_bytes(data)
    path.with_suffix(".txt").write_text(
        f"{outcome.bug}\nkey: {outcome.key}\nseed model: {seed}\nmutations: {steps}\n\n"
        f"{error_text}\nreplay: python scripts/fuzz.py --replay {path}\n")
    return path


def worker(seed: int, deadline: float, max_executions: int) -> None:
    """Run executions until the deadline; one JSON line per finding and per 200 executions."""
    rng = random.Random(seed)
    current = OUT_DIR / f"current-{os.getpid()}.onnx"
    ext = external_dir()
    counts: Counter[str] = Counter()
    done = 0
    seed_models()
    with address_space_limit(), quiet():
        while time.time() < deadline and done < max_executions:
            data, name, steps = mutate(rng)
            current.write_bytes(data)
            faulthandler.dump_traceback_later(LOAD_SECONDS + RUN_SECONDS + RUN_GRACE + 30,
                                              exit=True)
            captured: list[str] = []
            try:
                outcome = execute(data, rng, ext)
            except BaseException as e:  # the harness itself must not stop the run
                outcome = Outcome("harness", type(e).__name__, 0.0, f"harness: {e!r}",
                                  _finding_key(e))
                captured.append(traceback.format_exc())
            faulthandler.cancel_dump_traceback_later()
            done += 1
            counts[f"{outcome.stage}:{outcome.error or '-'}"] += 1
            if outcome.bug is not None:
                text = captured[0] if captured else ""
                path = _save(data, outcome, text or _replay_trace(data, ext), steps, name)
                print(json.dumps({"finding": outcome.bug, "key": outcome.key,
                                  "path": str(path)}), flush=True)
            if done % 200 == 0:
                print(json.dumps({"executions": done, "counts": counts}), flush=True)
    current.unlink(missing_ok=True)
    print(json.dumps({"executions": done, "counts": counts, "final": True}), flush=True)


def _replay_trace(data: bytes, ext: str | None) -> str:
    """The traceback of the first non-SessionError for `data` (deterministic feeds)."""
    for attempt in range(8):
        rng = random.Random(attempt)
        try:
            session = InferenceSession.builder().device("cpu").load_bytes(data, ext)
            session.run_outputs(feeds_for(session, rng), cancel=threading.Event())
        except Exception as e:
            if not isinstance(e, SessionError) or "a bug in onnxkiln" in str(e):
                return "".join(traceback.format_exception(e))
    return "(not reproduced with the replay feeds; see the mutation list)"


def supervise(args: argparse.Namespace) -> int:
    """Run workers back to back until the time or execution budget is spent; report."""
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    deadline = time.time() + args.minutes * 60
    total, findings, crashes = 0, {}, 0
    counts: Counter[str] = Counter()
    seed = args.seed
    started = time.time()
    while time.time() < deadline and total < args.executions:
        cmd = [sys.executable, __file__, "--worker", str(seed), "--deadline", str(deadline),
               "--executions", str(args.executions - total)]
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
        last = 0
        assert proc.stdout is not None
        for line in proc.stdout:
            msg = json.loads(line)
            if "finding" in msg:
                if msg["key"] not in findings:
                    print(f"FINDING {msg['key']}: {msg['finding'][:300]}\n  saved: {msg['path']}")
                findings.setdefault(msg["key"], msg)
            else:
                last = msg["executions"]
                if msg.get("final"):
                    counts.update(msg["counts"])
                elif last % 10000 == 0:
                    print(f"  {total + last} executions, {len(findings)} finding(s) so far",
                          flush=True)
        rc = proc.wait()
        if rc != 0:
            crashes += 1
            current = OUT_DIR / f"current-{proc.pid}.onnx"
            saved = OUT_DIR / f"crash-{seed}.onnx"
            if current.exists():
                current.replace(saved)
            print(f"CRASH: worker exited with {rc} after ~{last} executions; model: {saved}")
            total += last + 1
        else:
            total += last
        seed += 1
        elapsed = time.time() - started
        print(f"{total} executions in {elapsed:.0f}s ({total / max(elapsed, 1e-9):.0f}/s), "
              f"{len(findings)} distinct finding(s), {crashes} crash(es)", flush=True)
    print("outcomes:", dict(sorted(counts.items(), key=lambda kv: -kv[1])))
    return 1 if findings or crashes else 0


def replay(path: str) -> int:
    data = Path(path).read_bytes()
    with address_space_limit(), quiet():
        print(_replay_trace(data, external_dir()))
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--executions", type=int, default=1 << 62)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--replay", help="rerun a saved model and print its traceback")
    parser.add_argument("--worker", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--deadline", type=float, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.replay:
        return replay(args.replay)
    if args.worker is not None:
        worker(args.worker, args.deadline, args.executions)
        return 0
    return supervise(args)


if __name__ == "__main__":
    sys.exit(main())
