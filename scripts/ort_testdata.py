"""Builds the small models onnxruntime's Python API tests load from `testdata/`, for a copy
of onnxruntime/test/python that came without onnxruntime's binary test data.

    python scripts/ort_testdata.py /path/to/onnxruntime/test/python

Each model is made from what the tests assert about it (names, types, shapes, results);
the three onnxruntime ships in `onnxruntime.datasets` are copied from the installed wheel.
Models are written to FOLDER/testdata, which the tests search first (they also write their
own files there).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

FLOAT, INT64, STRING, BOOL, DOUBLE = (TensorProto.FLOAT, TensorProto.INT64, TensorProto.STRING,
                                      TensorProto.BOOL, TensorProto.DOUBLE)
ML = "ai.onnx.ml"
SHIPPED = ("mul_1.onnx", "sigmoid.onnx", "logreg_iris.onnx")  # in onnxruntime.datasets


def _tensor(name: str, elem: int, shape: list | None) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, elem, shape)


def _model(nodes: list, inputs: list, outputs: list, inits: tuple = (), opset: int = 13,
           ml: int | None = None, name: str = "g") -> onnx.ModelProto:
    opsets = [helper.make_opsetid("", opset)] + ([helper.make_opsetid(ML, ml)] if ml else [])
    model = helper.make_model(helper.make_graph(nodes, name, inputs, outputs, list(inits)),
                              opset_imports=opsets)
    model.ir_version = 8
    return model


def _const(name: str, array: np.ndarray) -> onnx.TensorProto:
    return numpy_helper.from_array(array, name)


def basic_models() -> dict[str, onnx.ModelProto]:
    """The plain ai.onnx models of onnxruntime_test_python.py and _backend.py."""
    w = _const("W", np.array([[1.0], [2.0]], np.float32))
    seq_f = helper.make_sequence_type_proto(helper.make_tensor_type_proto(FLOAT, None))
    seq_i = helper.make_sequence_type_proto(helper.make_tensor_type_proto(INT64, None))
    free = _tensor("x", FLOAT, ["Dim1", "Dim2", 5])
    for dim, denotation in zip(free.type.tensor_type.shape.dim, ("DATA_BATCH", "DATA_CHANNEL"),
                               strict=False):
        dim.denotation = denotation
    return {
        "matmul_1.onnx": _model([helper.make_node("MatMul", ["X", "W"], ["Y"])],
                                [_tensor("X", FLOAT, [3, 2])], [_tensor("Y", FLOAT, [3, 1])], (w,)),
        "matmul_2.onnx": _model([helper.make_node("MatMul", ["X", "W"], ["Y"])],
                                [_tensor("X", FLOAT, ["None", 2])],
                                [_tensor("Y", FLOAT, ["None", 1])], (w,)),
        "identity_string.onnx": _model([helper.make_node("Identity", ["input:0"], ["output:0"])],
                                       [_tensor("input:0", STRING, [2, 2])],
                                       [_tensor("output:0", STRING, [2, 2])]),
        "logicaland.onnx": _model([helper.make_node("And", ["input1:0", "input:0"], ["output:0"])],
                                  [_tensor(n, BOOL, [2, 2]) for n in ("input1:0", "input:0")],
                                  [_tensor("output:0", BOOL, [2, 2])]),
        "identity_opt.onnx": _model(
            [helper.make_node("Identity", ["x"], ["y"])],
            [helper.make_value_info("x", helper.make_optional_type_proto(seq_f))],
            [helper.make_value_info("y", helper.make_optional_type_proto(seq_f))], opset=16),
        "sequence_length.onnx": _model([helper.make_node("SequenceLength", ["X"], ["Y"])],
                                       [helper.make_value_info("X", seq_f)],
                                       [_tensor("Y", INT64, [])]),
        "sequence_construct.onnx": _model(
            [helper.make_node("SequenceConstruct", ["tensor1", "tensor2"], ["output_sequence"])],
            [_tensor(n, INT64, [2, 3]) for n in ("tensor1", "tensor2")],
            [helper.make_value_info("output_sequence", seq_i)]),
        "sequence_insert.onnx": _model(
            [helper.make_node("SequenceInsert", ["input_seq", "tensor"], ["output_sequence"])],
            [helper.make_value_info("input_seq", seq_i), _tensor("tensor", INT64, [2, 3])],
            [helper.make_value_info("output_sequence", seq_i)]),
        "abs_free_dimensions.onnx": _model([helper.make_node("Abs", ["x"], ["y"])], [free],
                                           [_tensor("y", FLOAT, ["Dim1", "Dim2", 5])]),
        "add_mul_add.onnx": _model(
            [helper.make_node("Add", ["A", "B"], ["t0"], name="add_0"),
             helper.make_node("Mul", ["t0", "B"], ["t1"], name="mul_0"),
             helper.make_node("Add", ["t1", "A"], ["C"], name="add_1")],
            [_tensor(n, FLOAT, [2]) for n in "AB"], [_tensor("C", FLOAT, [2])]),
        "alloc_tensor_reuse.onnx": _model(
            [helper.make_node("Add", ["inp0", "inp1"], ["tsor0"]),
             helper.make_node("Sub", ["inp0", "inp1"], ["tsor1"]),
             helper.make_node("Neg", ["tsor0"], ["outp0"]),
             helper.make_node("Neg", ["tsor1"], ["outp1"])],
            [_tensor(n, FLOAT, [10]) for n in ("inp0", "inp1")],
            [_tensor(n, FLOAT, [10]) for n in ("outp0", "outp1")]),
        # a LoRA-style model: output = x @ W + (x @ A) @ B; A and B are inputs, zero by default
        "lora/two_params_lora_model.onnx": _model(
            [helper.make_node("MatMul", ["input_x", "W"], ["base"]),
             helper.make_node("MatMul", ["input_x", "lora_param_a"], ["xa"]),
             helper.make_node("MatMul", ["xa", "lora_param_b"], ["xab"]),
             helper.make_node("Add", ["base", "xab"], ["output"])],
            [_tensor("input_x", FLOAT, [4, 4]), _tensor("lora_param_a", FLOAT, [4, 2]),
             _tensor("lora_param_b", FLOAT, [2, 4])], [_tensor("output", FLOAT, [4, 4])],
            (_const("W", np.arange(1, 17, dtype=np.float32).reshape(4, 4)),
             _const("lora_param_a", np.zeros((4, 2), np.float32)),
             _const("lora_param_b", np.zeros((2, 4), np.float32)))),
    }


def mnist_like() -> onnx.ModelProto:
    """A small convolution classifier whose weights exceed the tests' 100-byte threshold
    for writing initializers to an external file."""
    rng = np.random.default_rng(0)
    inits = (_const("conv_w", rng.standard_normal((8, 1, 5, 5)).astype(np.float32)),
             _const("conv_b", rng.standard_normal(8).astype(np.float32)),
             _const("fc_w", rng.standard_normal((8 * 12 * 12, 10)).astype(np.float32) / 30),
             _const("flat", np.array([1, -1], np.int64)))
    nodes = [helper.make_node("Conv", ["Input3", "conv_w", "conv_b"], ["c"], pads=[0, 0, 0, 0]),
             helper.make_node("Relu", ["c"], ["r"]),
             helper.make_node("MaxPool", ["r"], ["p"], kernel_shape=[2, 2], strides=[2, 2]),
             helper.make_node("Reshape", ["p", "flat"], ["f"]),
             helper.make_node("MatMul", ["f", "fc_w"], ["Plus214_Output_0"])]
    return _model(nodes, [_tensor("Input3", FLOAT, [1, 1, 28, 28])],
                  [_tensor("Plus214_Output_0", FLOAT, [1, 10])], inits, name="mnist")


def ml_models() -> dict[str, onnx.ModelProto]:
    """The ai.onnx.ml models of onnxruntime_test_python_mlops.py."""
    zip_in, zip_out = [_tensor("X", FLOAT, [None, 3])], "Z"
    vectorized = helper.make_tensor_value_info("variable1", FLOAT, [1, 1])
    vectorized_map = helper.make_value_info(
        "float_input", helper.make_map_type_proto(INT64, helper.make_tensor_type_proto(FLOAT, [])))
    # output = 2 * x[0] - 0.247246: 49.752754 for the tests' x[0] = 25
    vectorize = _model(
        [helper.make_node("DictVectorizer", ["float_input"], ["v"], domain=ML,
                          int64_vocabulary=[0, 1, 2, 3, 4]),
         helper.make_node("LinearRegressor", ["v"], ["variable1"], domain=ML,
                          coefficients=[2.0, 0.0, 0.0, 0.0, 0.0], intercepts=[-0.247246])],
        [vectorized_map], [vectorized], ml=1)
    label = _model([helper.make_node("LabelEncoder", ["input"], ["variable"], domain=ML,
                                     classes_strings=["1", "2", "3", "4", "5"], default_int64=-1)],
                   [_tensor("input", STRING, [1, 1])], [_tensor("variable", INT64, [1, 1])], ml=1)
    # one-hot over categories that hold zero bytes, as ML.NET's encoder writes them
    mlnet = _model(
        [helper.make_node("Identity", ["C0"], ["C00"]),
         helper.make_node("OneHotEncoder", ["C1"], ["C12"], domain=ML, zeros=1,
                          cats_strings=["B\0B\0", "D\0D\0", "C\0C\0", "E\0E\0"])],
        [_tensor("C0", FLOAT, [1, 1]), _tensor("C1", STRING, [1, 3])],
        [_tensor("C00", FLOAT, [1, 1]), _tensor("C12", FLOAT, [1, 3, 4])], ml=1)
    # one split of feature 2 at a double threshold that float32 cannot hold apart; the
    # regressor's float output cast to double
    tree = _model(
        [helper.make_node(
            "TreeEnsembleRegressor", ["X"], ["variable32"], domain=ML, n_targets=1,
            nodes_treeids=[0, 0, 0], nodes_nodeids=[0, 1, 2], nodes_featureids=[2, 0, 0],
            nodes_modes=["BRANCH_LEQ", "LEAF", "LEAF"], nodes_truenodeids=[1, 0, 0],
            nodes_falsenodeids=[2, 0, 0], nodes_missing_value_tracks_true=[0, 0, 0],
            nodes_hitrates=[1.0, 1.0, 1.0],
            nodes_values_as_tensor=_const("", np.array([1.7999999523162842, 0, 0], np.float64)),
            target_treeids=[0, 0], target_nodeids=[1, 2], target_ids=[0, 0],
            target_weights_as_tensor=_const(
                "", np.array([0.7284910678863525, 0.9134243130683899], np.float64))),
         helper.make_node("Cast", ["variable32"], ["variable"], to=DOUBLE)],
        [_tensor("X", DOUBLE, [None, 4])], [_tensor("variable", DOUBLE, [None, 1])],
        opset=15, ml=3)
    return {
        "zipmap_stringfloat.onnx": _model(
            [helper.make_node("ZipMap", ["X"], [zip_out], domain=ML,
                              classlabels_strings=["class1", "class2", "class3"])],
            zip_in, [helper.make_value_info(zip_out, helper.make_sequence_type_proto(
                helper.make_map_type_proto(STRING, helper.make_tensor_type_proto(FLOAT, []))))],
            ml=1),
        "zipmap_int64float.onnx": _model(
            [helper.make_node("ZipMap", ["X"], [zip_out], domain=ML,
                              classlabels_int64s=[10, 20, 30])],
            zip_in, [helper.make_value_info(zip_out, helper.make_sequence_type_proto(
                helper.make_map_type_proto(INT64, helper.make_tensor_type_proto(FLOAT, []))))],
            ml=1),
        "pipeline_vectorize.onnx": vectorize, "LabelEncoder.onnx": label,
        "mlnet_encoder.onnx": mlnet, "tree_ensemble_as_tensor.onnx": tree,
    }


def _ort_config(mul_1: Path) -> onnx.ModelProto:
    """mul_1 with session options in its `ort_config` metadata (the tests compare them)."""
    model = onnx.load(mul_1)
    helper.set_model_props(model, {"ort_config": json.dumps({"session_options": {
        "inter_op_num_threads": 5, "intra_op_num_threads": 2, "graph_optimization_level": 99,
        "enable_profiling": 1}})})
    return model


def _external(out: Path) -> None:
    """The two models whose initializers live in files beside them."""
    pads = _const("Pads_not_on_disk", np.array([0, 0, 1, 1], np.int64))
    pads.ClearField("raw_data")
    pads.data_location = TensorProto.EXTERNAL
    for key, value in (("location", "Pads_not_on_disk.bin"), ("offset", "0"), ("length", "32")):
        entry = pads.external_data.add()
        entry.key, entry.value = key, value
    onnx.save(_model([helper.make_node("Add", ["X", "Pads_not_on_disk"], ["Y"])],
                     [_tensor("X", INT64, [4])], [_tensor("Y", INT64, [4])], (pads,)),
              out / "model_with_external_initializer_come_from_user.onnx")
    weights = np.arange(64, dtype=np.float32).reshape(8, 8) / 64
    model = _model([helper.make_node("MatMul", ["X", "W"], ["XW"]),
                    helper.make_node("Add", ["XW", "b"], ["Y"])],
                   [_tensor("X", FLOAT, [2, 8])], [_tensor("Y", FLOAT, [2, 8])],
                   (_const("W", weights), _const("b", np.ones(8, np.float32))))
    onnx.save(model, out / "model_with_orig_ext_data.onnx", save_as_external_data=True,
              all_tensors_to_one_file=True, location="model_with_orig_ext_data.bin",
              size_threshold=0)


def _adapter(out: Path) -> bool:
    """The LoRA adapter (A all ones, B making x @ A @ B add 126..180 per column), written
    by onnxruntime's AdapterFormat; False where that is missing."""
    try:
        import onnxruntime
    except ImportError:
        return False
    if not hasattr(onnxruntime, "AdapterFormat"):
        return False
    b = np.tile(np.array([126.0, 144.0, 162.0, 180.0], np.float32) / 8, (2, 1))
    params = {"lora_param_a": np.ones((4, 2), np.float32), "lora_param_b": b}
    adapter = onnxruntime.AdapterFormat()
    adapter.set_adapter_version(1)
    adapter.set_model_version(1)
    adapter.set_parameters({k: onnxruntime.OrtValue.ortvalue_from_numpy(v)
                            for k, v in params.items()})
    adapter.export_adapter(str(out / "lora" / "two_params_lora_model.onnx_adapter"))
    return True


def shipped_models() -> Path:
    """The folder of the models the installed onnxruntime wheel ships (no import of it)."""
    import importlib.util

    spec = importlib.util.find_spec("onnxruntime")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("onnxruntime is not installed: mul_1.onnx, sigmoid.onnx and "
                         "logreg_iris.onnx are copied from its datasets folder")
    return Path(next(iter(spec.submodule_search_locations))) / "datasets"


def build(folder: Path, log: Callable[[str], None] = print) -> list[str]:
    """Writes every model into folder/testdata; returns their names."""
    out = folder / "testdata"
    (out / "lora").mkdir(parents=True, exist_ok=True)
    for name in SHIPPED:
        shutil.copyfile(shipped_models() / name, out / name)
    for name, model in {**basic_models(), **ml_models(), "mnist.onnx": mnist_like()}.items():
        onnx.checker.check_model(model)
        onnx.save(model, out / name)
    onnx.save(_ort_config(out / "mul_1.onnx"), out / "model_with_valid_ort_config_json.onnx")
    _external(out)
    if not _adapter(out):
        log("onnxruntime.AdapterFormat unavailable: lora/two_params_lora_model.onnx_adapter "
            "not written")
    return sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("folder", type=Path, help="onnxruntime/test/python")
    args = parser.parse_args()
    print("\n".join(build(args.folder)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
