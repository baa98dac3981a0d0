"""EPContext export/import: configuration, the context model's form, loading it back
through the providers' source keys, and the errors around both."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnxkiln import InferenceSession, ep_context, ep_context_load, loader
from onnxkiln import builder as builder_module
from onnxkiln.ep_context import CompiledPartition, EpContextDumpConfig
from onnxkiln.errors import EpContextError
from onnxkiln.options import SessionConfig
from onnxkiln.partition import Placement
from onnxkiln.providers.cpu.provider import CpuProvider
from onnxkiln.providers.fuse import FuseProvider, codegen
from onnxkiln.types import DeviceId, DeviceType

F32 = TensorProto.FLOAT
X = np.random.default_rng(0).standard_normal((3, 8)).astype(np.float32)



def _dump_config(options, model_path):
    """ep_context_config over option strings, as a session parses them."""
    return ep_context.ep_context_config(SessionConfig.from_options(options), model_path)

def _proto():
    """MatMul (cpu) -> Add/Tanh/Mul (fuse) -> Transpose (cpu) -> Add/Sigmoid (fuse)."""
    rng = np.random.default_rng(1)
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"], name="mm"),
             helper.make_node("Add", ["h", "b"], ["a"], name="add"),
             helper.make_node("Tanh", ["a"], ["t"], name="tanh"),
             helper.make_node("Mul", ["t", "a"], ["m"], name="mul"),
             helper.make_node("Transpose", ["m"], ["tr"], name="tr"),
             helper.make_node("Add", ["tr", "c"], ["u"], name="add2"),
             helper.make_node("Sigmoid", ["u"], ["y"], name="sig")]
    inits = [numpy_helper.from_array(rng.standard_normal((8, 8)).astype(np.float32), "w"),
             numpy_helper.from_array(rng.standard_normal(8).astype(np.float32), "b"),
             numpy_helper.from_array(np.array(0.25, np.float32), "c")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", F32, ["n", 8])],
                              [helper.make_tensor_value_info("y", F32, [8, "n"]),
                               helper.make_tensor_value_info("m", F32, ["n", 8])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.fixture
def model_file(tmp_path):
    path = tmp_path / "model.onnx"
    onnx.save(_proto(), path)
    return path


def _use(monkeypatch, *providers):
    placement = Placement((*providers, CpuProvider()), DeviceId(DeviceType.CPU), "cpu", None)
    monkeypatch.setattr(builder_module, "select_providers", lambda *_: placement)


def _run(model):
    return InferenceSession.builder().optimization("disabled").from_graph(model).run({"x": X})


def _expected():
    return InferenceSession.builder().optimization("disabled").from_graph(_proto()).run({"x": X})


# ------------------------------------------------------------------------------- config

def test_config_defaults_follow_the_model_path():
    cfg = _dump_config({}, "models/bert.onnx")
    assert cfg == EpContextDumpConfig(False, Path("models/bert_ctx.onnx"), 1, "")
    cfg = _dump_config({"ep.context_enable": "1", "ep.context_embed_mode": "0",
                                        "ep.context_node_name_prefix": "p_",
                                        "ep.context_file_path": "out/c.onnx"}, None)
    assert cfg == EpContextDumpConfig(True, Path("out/c.onnx"), 0, "p_")


def test_config_folder_and_missing_path_are_errors(tmp_path):
    with pytest.raises(EpContextError, match="is a folder"):
        _dump_config({"ep.context_file_path": str(tmp_path)}, None)
    with pytest.raises(EpContextError, match="set ep.context_file_path"):
        _dump_config({"ep.context_enable": "1"}, None)
    assert _dump_config({}, None).file_path is None  # disabled: fine


# ------------------------------------------------------------------------------- export

@pytest.mark.parametrize("embed", [1, 0])
def test_round_trip_restores_partitions_without_code_generation(model_file, embed,
                                                                 monkeypatch):
    fuse = FuseProvider("numpy")
    _use(monkeypatch, fuse)
    cfg = _dump_config({"ep.context_enable": "1",
                                        "ep.context_embed_mode": str(embed)}, model_file)
    model, parts = ep_context_load.apply_fuse(loader.load_path(model_file), fuse, cfg, model_file)
    assert [p.covered_nodes for p in parts] == [(1, 2, 3), (5, 6)]
    fresh = _run(model)
    ctx_path = model_file.with_name("model_ctx.onnx")
    assert cfg.file_path == ctx_path and ctx_path.exists()

    proto = onnx.load(ctx_path)
    onnx.checker.check_model(proto, full_check=True)
    assert [n.op_type for n in proto.graph.node] == ["MatMul", "EPContext", "Transpose",
                                                     "EPContext"]
    assert {o.domain for o in proto.opset_import} >= {"", "com.microsoft"}
    node = proto.graph.node[1]
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    assert attrs["source"] == b"onnxkiln.fuse" and attrs["partition_name"] == b"fuse_0"
    assert attrs["embed_mode"] == embed and attrs["ep_sdk_version"].startswith(b"onnxkiln.fuse")
    assert set(attrs) == {"main_context", "ep_cache_context", "embed_mode", "ep_sdk_version",
                          "partition_name", "source", "hardware_architecture", "notes"}
    assert list(node.input) == ["h", "b"] and list(node.output) == ["m"]
    assert {vi.name for vi in proto.graph.value_info} == {"h", "tr"}  # typed boundary values
    assert sorted(t.name for t in proto.graph.initializer) == ["b", "w"]  # c baked in
    second = {a.name: helper.get_attribute_value(a) for a in proto.graph.node[3].attribute}
    if embed == 1:
        assert json.loads(attrs["ep_cache_context"])["format"] == "onnxkiln.fuse"
        assert attrs["main_context"] == 1 and second["main_context"] == 1
    else:
        assert attrs["ep_cache_context"] == b"model_ctx_fuse.bin"
        assert (model_file.parent / "model_ctx_fuse.bin").exists()
        assert attrs["main_context"] == 1 and second["main_context"] == 0

    before = codegen.CODEGEN_CALLS[0]
    loaded = ep_context_load.load_with_contexts(loader.load_path(ctx_path), ctx_path.parent,
                                           [FuseProvider("numpy")])
    assert codegen.CODEGEN_CALLS[0] == before
    assert [n.op_type for n in loaded.graph] == ["MatMul", "FusedPartition", "Transpose",
                                                 "FusedPartition"]
    again = _run(loaded)
    for a, b, c in zip(fresh, again, _expected()):
        np.testing.assert_array_equal(a, b)
        np.testing.assert_allclose(a, c, rtol=1e-5, atol=1e-6)


def test_onnxruntime_reads_the_context_model_up_to_the_missing_provider(model_file):
    ort = pytest.importorskip("onnxruntime", reason="onnxruntime checks the exported model")
    fuse = FuseProvider("numpy")
    cfg = _dump_config({"ep.context_enable": "1"}, model_file)
    ep_context_load.apply_fuse(loader.load_path(model_file), fuse, cfg, model_file)
    with pytest.raises(Exception, match="EPContext node generated by 'onnxkiln.fuse' is not "
                                        "compatible with any execution provider"):
        ort.InferenceSession(str(cfg.file_path), providers=["CPUExecutionProvider"])


def test_node_name_prefix(model_file):
    cfg = EpContextDumpConfig(True, model_file.with_name("c.onnx"), 1, "kiln_")
    ep_context_load.apply_fuse(loader.load_path(model_file), FuseProvider("numpy"), cfg, model_file)
    names = [n.name for n in onnx.load(cfg.file_path).graph.node if n.op_type == "EPContext"]
    assert names == ["kiln_fuse_0", "kiln_fuse_1"]


def test_disabled_writes_nothing_and_returns_the_path(model_file):
    model = loader.load_path(model_file)
    fuse = FuseProvider("numpy")
    parts = fuse.compile(model.graph)
    cfg = _dump_config({}, model_file)
    path = ep_context.export_ep_context(model, model_file, parts, [fuse], cfg)
    assert path == model_file.with_name("model_ctx.onnx") and not path.exists()
    assert sorted(os.listdir(model_file.parent)) == ["model.onnx"]


def test_existing_output_file_is_an_error(model_file):
    target = model_file.with_name("model_ctx.onnx")
    target.write_bytes(b"keep me")
    cfg = _dump_config({"ep.context_enable": "1"}, model_file)
    with pytest.raises(EpContextError, match="already exists"):
        ep_context_load.apply_fuse(loader.load_path(model_file), FuseProvider("numpy"), cfg,
                              model_file)
    assert target.read_bytes() == b"keep me"


def test_auto_dump_writes_the_default_path_and_reloads(model_file, monkeypatch):
    fuse = FuseProvider("numpy")
    _use(monkeypatch, fuse)
    cfg = _dump_config({"ep.context_enable": "1"}, model_file)
    model, _ = ep_context_load.apply_fuse(loader.load_path(model_file), fuse, cfg, model_file)
    ctx = model_file.with_name("model_ctx.onnx")
    assert ctx.exists()
    loaded = ep_context_load.load_with_contexts(loader.load_path(ctx), ctx.parent, [fuse])
    # building from a context model neither compiles nor dumps again
    again, parts = ep_context_load.apply_fuse(loaded, fuse, cfg, ctx)
    assert parts == [] and again is loaded
    for a, b in zip(_run(model), _run(again)):
        np.testing.assert_array_equal(a, b)


def test_non_convex_partition_is_rejected(model_file):
    model = loader.load_path(model_file)
    fuse = FuseProvider("numpy")
    part = CompiledPartition("fuse", "bad", (3, 5))  # Mul -> Transpose (outside) -> Add
    cfg = EpContextDumpConfig(True, model_file.with_name("c.onnx"), 1, "")
    with pytest.raises(EpContextError, match="not a convex subgraph: node 4 \\('tr'"):
        ep_context.export_ep_context(model, model_file, [part], [fuse], cfg)
    assert not cfg.file_path.exists()


def test_overlapping_or_unknown_node_ids_are_rejected(model_file):
    model = loader.load_path(model_file)
    cfg = EpContextDumpConfig(True, model_file.with_name("c.onnx"), 1, "")
    fuse = FuseProvider("numpy")
    with pytest.raises(EpContextError, match="is in partitions 'a' and 'b'"):
        ep_context.export_ep_context(model, None, [CompiledPartition("fuse", "a", (1, 2)),
                                                   CompiledPartition("fuse", "b", (2, 3))],
                                     [fuse], cfg)
    with pytest.raises(EpContextError, match="node id 99"):
        ep_context.export_ep_context(model, None, [CompiledPartition("fuse", "a", (99,))],
                                     [fuse], cfg)


# ------------------------------------------------------------------- a user's provider

class ToyProvider:
    """A compiling provider from outside onnxkiln: runs Add->Tanh->Mul as one numpy kernel."""

    name = "toy"

    def __init__(self):
        self.loaded = []

    def compile(self, graph, node_ids=None):
        return [CompiledPartition("toy", "toy_a", (1, 2, 3)),
                CompiledPartition("toy", "toy_b", (5, 6))]

    def save_context(self, partition):
        return json.dumps({"name": partition.partition_name}).encode(), "toy 0.1"

    def context_source_keys(self):
        return ["toy.v1", "toy"]

    def load_context(self, attributes, blob):
        name = json.loads(blob)["name"]
        self.loaded.append((attributes["partition_name"], attributes["main_context"], name))
        if name == "toy_a":
            return lambda h, b: (np.tanh(h + b) * (h + b),)
        return lambda tr, c: 1.0 / (1.0 + np.exp(-(tr + c)))  # single output, not a tuple


@pytest.mark.parametrize("embed", [1, 0])
def test_mock_partitions_of_a_user_provider_round_trip(model_file, embed, monkeypatch):
    toy = ToyProvider()
    model = loader.load_path(model_file)
    cfg = EpContextDumpConfig(True, model_file.with_name("toy_ctx.onnx"), embed, "")
    path = ep_context.export_ep_context(model, model_file, toy.compile(model.graph), [toy], cfg)
    proto = onnx.load(path)
    onnx.checker.check_model(proto, full_check=True)
    sources = [helper.get_attribute_value(a) for n in proto.graph.node for a in n.attribute
               if a.name == "source"]
    assert sources == [b"toy.v1", b"toy.v1"]
    assert [list(n.input) for n in proto.graph.node if n.op_type == "EPContext"] == \
        [["h", "b"], ["tr", "c"]]
    assert (model_file.parent / "toy_ctx_toy.bin").exists() == (embed == 0)

    loaded = ep_context_load.load_with_contexts(loader.load_path(path), path.parent, [toy])
    assert toy.loaded == [("toy_a", 1, "toy_a"), ("toy_b", 1 if embed else 0, "toy_b")]
    assert [n.op_type for n in loaded.graph] == ["MatMul", "LoadedPartition", "Transpose",
                                                 "LoadedPartition"]
    _use(monkeypatch, ep_context_load.ContextProvider())
    for got, want in zip(_run(loaded), _expected()):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_unclaimed_node_names_source_and_partition(model_file):
    toy = ToyProvider()
    model = loader.load_path(model_file)
    cfg = EpContextDumpConfig(True, model_file.with_name("toy_ctx.onnx"), 1, "")
    path = ep_context.export_ep_context(model, model_file, toy.compile(model.graph), [toy], cfg)
    with pytest.raises(EpContextError, match=r"(?s)2 EPContext node\(s\) are claimed by no "
                                             r"provider.*source 'toy.v1', partition_name "
                                             r"'toy_a'.*fuse \(\['onnxkiln.fuse'\]\)"):
        ep_context_load.load_with_contexts(loader.load_path(path), path.parent, [FuseProvider()])


def _context_model(tmp_path, cache, embed=0, main=1):
    node = helper.make_node("EPContext", ["x"], ["y"], name="ctx", domain="com.microsoft",
                            ep_cache_context=cache, embed_mode=embed, main_context=main,
                            source="toy", partition_name="toy_a")
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", F32, [2])],
                              [helper.make_tensor_value_info("y", F32, [2])])
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                    helper.make_opsetid("com.microsoft", 1)])
    folder = tmp_path / "models"
    folder.mkdir(exist_ok=True)
    onnx.save(proto, folder / "m.onnx")
    return folder


@pytest.mark.parametrize("cache", ["../secret.bin", "/etc/passwd", "sub/../../secret.bin",
                                   "C:\\secret.bin"])
def test_blob_paths_may_not_leave_the_model_folder(tmp_path, cache):
    (tmp_path / "secret.bin").write_bytes(b'{"name": "toy_a"}')
    folder = _context_model(tmp_path, cache)
    with pytest.raises(EpContextError, match="escapes the model folder"):
        ep_context_load.load_with_contexts(loader.load_path(folder / "m.onnx"), folder,
                                      [ToyProvider()])


@pytest.mark.parametrize(("cache", "message"), [
    ("blob\0.bin", "NUL byte"), ("x" * 300, "longer than a file path"),
    ("fifo", "not a regular file"), ("gone.bin", "is missing")])
def test_odd_blob_names_are_refused_clearly_never_read(tmp_path, cache, message):
    """A NUL byte or an over-long name (OSError/ValueError inside pathlib), a FIFO (whose
    read would block forever), a missing file: each its own EpContextError."""
    folder = _context_model(tmp_path, cache)
    os.mkfifo(folder / "fifo")
    with pytest.raises(EpContextError, match=message):
        ep_context_load.load_with_contexts(loader.load_path(folder / "m.onnx"), folder,
                                           [ToyProvider()])


def test_blob_symlink_out_of_the_model_folder_is_refused(tmp_path):
    (tmp_path / "secret.bin").write_bytes(b'{"name": "toy_a"}')
    folder = _context_model(tmp_path, "blob.bin")
    (folder / "blob.bin").symlink_to(tmp_path / "secret.bin")
    with pytest.raises(EpContextError, match="outside the model folder"):
        ep_context_load.load_with_contexts(loader.load_path(folder / "m.onnx"), folder,
                                      [ToyProvider()])
    (folder / "blob.bin").unlink()
    (folder / "blob.bin").write_bytes(b'{"name": "toy_a"}')  # inside: fine
    model = ep_context_load.load_with_contexts(loader.load_path(folder / "m.onnx"), folder,
                                          [ToyProvider()])
    assert [n.op_type for n in model.graph] == ["LoadedPartition"]


def test_secondary_without_primary_and_bytes_model_are_errors(tmp_path):
    folder = _context_model(tmp_path, "", embed=1, main=0)
    with pytest.raises(EpContextError, match="main_context=0, but no main_context=1 node"):
        ep_context_load.load_with_contexts(loader.load_path(folder / "m.onnx"), folder,
                                      [ToyProvider()])
    folder = _context_model(tmp_path, "blob.bin")
    with pytest.raises(EpContextError, match="not loaded from a file"):
        ep_context_load.load_with_contexts(loader.load_path(folder / "m.onnx"), None,
                                      [ToyProvider()])


def test_provider_load_failure_names_the_node(tmp_path):
    folder = _context_model(tmp_path, "not json", embed=1)
    with pytest.raises(EpContextError, match="EPContext node 'ctx'.*cannot load its context"):
        ep_context_load.load_with_contexts(loader.load_path(folder / "m.onnx"), folder,
                                      [ToyProvider()])


# ------------------------------------------------------------------ through the session API

def test_session_with_fuse_dumps_at_build_and_reloads_without_codegen(model_file):
    s = (InferenceSession.builder().providers(["fuse", "cpu"]).optimization("disabled")
         .option("ep.context_enable", "1").load(model_file))
    ctx = model_file.with_name("model_ctx.onnx")
    assert s.ep_context_config().enable and s.ep_context_config().file_path == ctx
    assert ctx.exists()
    assert [p.covered_nodes for p in s.compiled_partitions()] == [(1, 2, 3), (5, 6)]
    assert [n.op_type for n in s.graph()].count("FusedPartition") == 2
    first = s.run({"x": X})
    before = codegen.CODEGEN_CALLS[0]
    again = InferenceSession.builder().optimization("disabled").load(ctx)  # default device
    assert codegen.CODEGEN_CALLS[0] == before
    assert [n.op_type for n in again.graph()].count("FusedPartition") == 2
    assert again.compiled_partitions() == []  # nothing compiled: loaded from the context
    for a, b, c in zip(first, again.run({"x": X}), _expected()):
        np.testing.assert_array_equal(a, b)
        np.testing.assert_allclose(a, c, rtol=1e-5, atol=1e-6)


def test_session_context_dump_refuses_an_existing_file_and_bytes_without_a_path(model_file):
    model_file.with_name("model_ctx.onnx").write_bytes(b"keep me")
    with pytest.raises(EpContextError, match="exists"):
        (InferenceSession.builder().providers(["fuse", "cpu"]).optimization("disabled")
         .option("ep.context_enable", "1").load(model_file))
    assert model_file.with_name("model_ctx.onnx").read_bytes() == b"keep me"
    with pytest.raises(EpContextError, match="ep.context_file_path"):
        (InferenceSession.builder().providers(["fuse", "cpu"])
         .option("ep.context_enable", "1").load_bytes(model_file.read_bytes()))


def test_session_exports_a_user_providers_partitions_of_its_graph(model_file):
    toy = ToyProvider()
    out = model_file.with_name("user_ctx.onnx")
    s = (InferenceSession.builder().optimization("disabled")
         .option("ep.context_enable", "1").option("ep.context_file_path", str(out))
         .load(model_file))
    path = s.export_ep_context(model_file, toy.compile(s.graph()), [toy])
    assert path == out and out.exists()
    proto = onnx.load(out)
    assert [n.op_type for n in proto.graph.node] == ["MatMul", "EPContext", "Transpose",
                                                     "EPContext"]
    # onnxkiln has no provider for source "toy.v1": loading it names what is unclaimed
    with pytest.raises(EpContextError, match=r"toy\.v1.*toy_a|toy_a.*toy\.v1"):
        InferenceSession.load(out)
    disabled = InferenceSession.builder().optimization("disabled").load(model_file)
    target = disabled.export_ep_context(model_file, toy.compile(disabled.graph()), [toy])
    assert target == model_file.with_name("model_ctx.onnx") and not target.exists()
