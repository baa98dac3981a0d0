"""Generated cases for the block-quantized matmuls and gathers and the quantized layers
(contrib_quant.py, contrib_quant_layers.py, contrib_dqlstm.py): packed 2/4-bit values at 0 and
2^bits - 1 in the first and last slot of a byte, odd K (a half-filled last byte), zero points
at both ends, uint8/int8 activations at their limits."""

from __future__ import annotations

import dataclasses

import ml_dtypes
import numpy as np
from contrib_cases_qlinear import _weights
from contrib_cases_quant import pack
from contrib_harness import F16, F32, I32, I64, U8, Case, normal, qvalues, scalar, spec

INT4, UINT4 = ml_dtypes.int4, ml_dtypes.uint4


def _nibbles(rng, shape, bits):
    """Values in [0, 2^bits) with the extremes in the first and last slots of each row."""
    q = rng.integers(0, 2**bits, shape)
    q[..., 0], q[..., -1] = 2**bits - 1, 0
    if shape[-1] > 2:
        q[..., 1] = 0
    return q


@spec("MatMulNBits")
def matmul_nbits(rng):
    cases = []
    for bits, block, k, zp in ((4, 16, 32, "packed"), (4, 32, 40, None), (4, 16, 48, "float"),
                               (2, 16, 32, "packed"), (8, 16, 32, "packed")):
        n, nb = 5, -(-k // block)
        q = _nibbles(rng, (n, nb, block), bits)
        consts = {"B": pack(q, bits), "scales": rng.uniform(0.01, 0.2, (n, nb)).astype(F32)}
        names = ["a", "B", "scales"]
        if zp == "packed":
            zq = rng.integers(0, 2**bits, (n, nb))
            zq[0, 0], zq[-1, -1] = 0, 2**bits - 1
            consts["zp"] = pack(zq, bits)
            names.append("zp")
        elif zp == "float":
            consts["zp"] = rng.uniform(0, 2**bits - 1, (n, nb)).astype(F32)
            names.append("zp")
        cases.append(Case(f"bits{bits}-block{block}-k{k}-zp{zp}",
                          {"a": normal(rng, (2, 3, k))}, {"K": k, "N": n, "bits": bits,
                                                          "block_size": block},
                          consts, names, rtol=1e-5, atol=1e-4))
    k, n = 32, 4
    q = _nibbles(rng, (n, 2, 16), 4)
    consts = {"B": pack(q, 4), "scales": rng.uniform(0.01, 0.2, (n, 2)).astype(F16),
              "zp": pack(np.array([[0, 15]] * n), 4), "bias": normal(rng, (n,), F16)}
    cases.append(Case("float16-bias-accuracy4", {"a": normal(rng, (3, k), F16)},
                      {"K": k, "N": n, "bits": 4, "block_size": 16, "accuracy_level": 4},
                      consts, ["a", "B", "scales", "zp", "", "bias"], rtol=2e-3, atol=2e-3))
    return cases


@spec("GatherBlockQuantized")
def gather_block_quantized(rng):
    cases = []
    for dt, (lo, hi) in ((INT4, (-8, 7)), (UINT4, (0, 15))):
        data = rng.integers(lo, hi + 1, (6, 33)).astype(dt)  # odd last axis: a half byte
        data[0, 0], data[-1, -1] = lo, hi
        consts = {"data": data, "scales": rng.uniform(0.1, 1, (6, 3)).astype(F32),
                  "zp": np.array([[lo, hi, 0]] * 6, dt)}
        cases.append(Case(f"{np.dtype(dt).name}", {"i": np.array([[0, 5], [-1, 2]], I64)},
                          {"block_size": 16, "quantize_axis": 1, "gather_axis": 0}, consts,
                          ["data", "i", "scales", "zp"]))
    for bits in (4, 8):
        q = _nibbles(rng, (5, 32), bits)
        zq = np.array([[0, 2**bits - 1]] * 5)
        consts = {"data": pack(q, bits), "scales": rng.uniform(0.01, 0.1, (5, 2)).astype(F16),
                  "zp": pack(zq, bits)}
        cases.append(Case(f"uint8-bits{bits}", {"i": np.array([4, 0, -5], I32)},
                          {"bits": bits, "block_size": 16}, consts, ["data", "i", "scales", "zp"],
                          rtol=1e-3, atol=1e-4))
    for dt in (ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e5m2):
        data = normal(rng, (32, 6), dt, 3)
        consts = {"data": data, "scales": rng.uniform(0.1, 1, (2, 6)).astype(F32)}
        cases.append(Case(f"{np.dtype(dt).name}-gather-axis1", {"i": np.array([1, 5], I64)},
                          {"block_size": 16, "quantize_axis": 0, "gather_axis": 1}, consts,
                          ["data", "i", "scales"], rtol=0, atol=0))
    return cases


@spec("MatMulBnb4")
def matmul_bnb4(rng):
    cases = []
    for quant_type in (0, 1):
        k, n, block = 20, 3, 16  # n * k odd blocks: the last block is partial
        q = rng.integers(0, 16, n * k)
        q[:2], q[-2:] = [0, 15], [15, 0]
        consts = {"b": pack(q, 4), "absmax": rng.uniform(0.1, 2, -(-n * k // block)).astype(F32)}
        cases.append(Case(f"type{quant_type}", {"a": normal(rng, (2, k))},
                          {"K": k, "N": n, "block_size": block, "quant_type": quant_type},
                          consts, ["a", "b", "absmax"], rtol=1e-5, atol=1e-5))
    return cases


@spec("QAttention")
def qattention(rng):
    cases = []
    b, s, d, heads = 2, 4, 8, 2
    for wdt, xz, masked in ((np.int8, 0, False), (np.uint8, 255, True), (np.int8, 128, True)):
        x = qvalues(rng, (b, s, d), U8)
        consts = {"w": _weights(rng, wdt, (d, 3 * d)), "bias": normal(rng, (3 * d,)),
                  "xs": scalar(0.02, F32), "ws": rng.uniform(0.005, 0.02, 3 * d).astype(F32),
                  "xz": scalar(xz, U8), "wz": np.zeros(3 * d, wdt)}
        feeds = {"x": x}
        if masked:
            feeds["mask"] = np.array([4, 2], I32)
        names = ["x", "w", "bias", "xs", "ws", "mask" if masked else "", "xz", "wz"]
        cases.append(Case(f"{np.dtype(wdt).name}-xz{xz}-mask{int(masked)}", feeds,
                          {"num_heads": heads, "unidirectional": int(masked and xz == 128)},
                          consts, names, rtol=1e-4, atol=1e-4))
    return cases


@spec("QEmbedLayerNormalization")
def qembed_layer_normalization(rng):
    cases = []
    b, s, d, vocab = 2, 5, 8, 11
    for qdt, zps in ((U8, (0, 128, 255)), (np.int8, (-128, 0, 127))):
        z = [scalar(zps[i % 3], qdt) for i in range(5)]
        consts = {"word": qvalues(rng, (vocab, d), qdt), "pos": qvalues(rng, (s, d), qdt),
                  "segt": qvalues(rng, (2, d), qdt), "gamma": qvalues(rng, (d,), qdt),
                  "beta": qvalues(rng, (d,), qdt), "ws": scalar(0.01, F32),
                  "ps": scalar(0.02, F32), "ss": scalar(0.015, F32), "gs": scalar(0.01, F32),
                  "bs": scalar(0.005, F32), "wz": z[0], "pz": z[1], "sz": z[2], "gz": z[3],
                  "bz": z[4]}
        mask = np.ones((b, s), I32)
        mask[1, 3:] = 0
        feeds = {"ids": rng.integers(0, vocab, (b, s)).astype(I32),
                 "seg": rng.integers(0, 2, (b, s)).astype(I32), "mask": mask}
        names = ["ids", "seg", "word", "pos", "segt", "gamma", "beta", "mask", "ws", "ps", "ss",
                 "gs", "bs", "wz", "pz", "sz", "gz", "bz"]
        cases.append(Case(np.dtype(qdt).name, feeds, {"epsilon": 1e-12}, consts, names,
                          n_out=2, rtol=1e-4, atol=1e-4))
    return cases


@spec("DynamicQuantizeLSTM")
def dynamic_quantize_lstm(rng):
    cases = []
    seq, batch, inp, hid = 3, 2, 4, 5
    for wdt, direction in ((np.int8, "forward"), (np.uint8, "bidirectional")):
        nd = 2 if direction == "bidirectional" else 1
        wz = np.zeros((nd,), wdt) if wdt == np.int8 else np.full((nd,), 128, wdt)
        consts = {"W": _weights(rng, wdt, (nd, inp, 4 * hid)),
                  "R": _weights(rng, wdt, (nd, hid, 4 * hid)),
                  "B": normal(rng, (nd, 8 * hid), F32, 0.3),
                  "ws": rng.uniform(0.005, 0.01, nd).astype(F32), "wz": wz,
                  "rs": rng.uniform(0.005, 0.01, nd).astype(F32), "rz": wz.copy()}
        names = ["x", "W", "R", "B", "", "", "", "", "ws", "wz", "rs", "rz"]
        # both requantize each step's hidden state; onnxruntime on one intra-op thread, as
        # with more it quantizes each thread's batch rows apart (see contrib_dqlstm.py)
        cases.append(Case(f"{np.dtype(wdt).name}-{direction}", {"x": normal(rng, (seq, batch,
                                                                                inp))},
                          {"hidden_size": hid, "direction": direction}, consts, names,
                          n_out=3, rtol=0, atol=1e-5,  # measured: 2e-7 at most
                          ort_runner=_ort_one_thread))
    return cases


def _ort_one_thread(model, feeds) -> list:
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    opts.intra_op_num_threads = 1
    opts.log_severity_level = 3
    session = ort.InferenceSession(model.SerializeToString(), opts,
                                   providers=["CPUExecutionProvider"])
    return session.run(None, dict(feeds))


@spec("QMoE")
def qmoe(rng):
    """MoE with 2/4/8-bit expert weights (rows little-endian bit streams, extremes in the first
    and last slots), per-row or per-block scales, packed zero points or the 2^(bits-1)
    default. The output is compared relative to its largest value, as the quantized sums
    are large."""
    e, hidden, inter, tokens = 4, 32, 32, 5
    cases = []
    for bits, block, with_zp, act in ((4, 0, False, "relu"), (4, 16, True, "silu"),
                                      (8, 32, True, "gelu"), (2, 16, False, "identity")):
        feeds = {"x": normal(rng, (tokens, hidden)), "r": normal(rng, (tokens, e))}
        consts, names = {}, ["x", "r"]
        for j, (n, k) in enumerate(((inter, hidden), (hidden, inter)), start=1):
            groups = (e, n, k // block) if block else (e, n)
            consts[f"q{j}"] = pack(_nibbles(rng, (e, n, k), bits), bits)
            consts[f"s{j}"] = rng.uniform(0.01, 0.06, groups).astype(F32)
            consts[f"b{j}"] = normal(rng, (e, n), F32, 1 / 3)
            if with_zp:
                zq = rng.integers(0, 2**bits, groups)
                zq.reshape(-1)[:2] = [0, 2**bits - 1]
                consts[f"z{j}"] = pack(zq, bits)
            names += [f"q{j}", f"s{j}", f"b{j}"]
        names += ["", "", ""] + (["z1", "z2"] if with_zp else [])
        attrs = {"k": 2, "activation_type": act, "normalize_routing_weights": 1,
                 "expert_weight_bits": bits, "weights_prepacked": 0}
        if block:
            attrs["block_size"] = block
        case = Case(f"bits{bits}-block{block}-zp{int(with_zp)}-{act}", feeds, attrs, consts,
                    names, rtol=2e-5, atol=2e-4)
        cases.append(case)
        if bits == 8 and block:
            # onnxruntime computes 8-bit block-quantized constant weights on another path
            # than the same weights fed at run time; onnxkiln agrees with the latter
            cases[-1] = dataclasses.replace(case, xfail=QMOE_8BIT_BLOCK_CONST)
            cases.append(dataclasses.replace(case, id=case.id + "-runtime-weights",
                                             feeds={**feeds, **consts}, consts={}))
    return cases


QMOE_8BIT_BLOCK_CONST = (
    "onnxruntime 1.32's QMoE gives other values for 8-bit block-quantized weights when they are "
    "constant initializers than when the same weights are graph inputs: 0.4-0.9% of the "
    "output's largest value apart (its run-time-weight path and onnxkiln agree to 2e-7); "
    "a lower-precision prepacked path, to be decided by contrib_qmoe.py's owner")
