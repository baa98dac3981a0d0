"""MatMulNBits (contrib_nbits.py) against onnxruntime's CPU kernel at every accuracy_level,
with the numba kernel and the numpy fallback, which must agree bit for bit at level 4.

What onnxruntime 1.32 computes (probed here, see contrib_nbits' module doc): float32 at levels
0-3; at level 4, with constant B/scales/zero points, no g_idx and no float zero points, A
quantized to int8 per block (amax / 127, round half even). Tolerances are float rounding
(a few 1e-7 of the largest output): one activation quantized a step differently moves an
output by ~1e-4 of it, and the float32 result differs from the int8 one by ~5e-3.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from onnxkiln import InferenceSession
from onnxkiln.errors import SessionError
from onnxkiln.providers.cpu import _numba, contrib_nbits
from onnxkiln.testing import node_model, run_ort

MS = "com.microsoft"
F32 = np.float32
ROWS = (1, 3, 64)  # a decode step, a few rows (numba kernel), a prefill (one GEMM)
TIGHT = 2e-6  # of the largest |output|: float rounding


def _other_lanes() -> tuple[int, ...]:
    """The 4-bit kernels this CPU runs besides its best: AVX2's and the float one."""
    try:
        import numba  # noqa: F401
    except ImportError:
        return ()
    best = contrib_nbits.host_lanes()
    return tuple(n for n in (8, 0) if n < best) or ((0,) if best else ())


OTHER_LANES = _other_lanes()


def pack(q: np.ndarray, bits: int) -> np.ndarray:
    """Values in [0, 2^bits) packed 8 // bits to a byte along the last axis, low bits first."""
    per = 8 // bits
    pad = (-q.shape[-1]) % per
    q = np.concatenate([q, np.zeros((*q.shape[:-1], pad), q.dtype)], -1).astype(np.uint16)
    q = q.reshape(*q.shape[:-1], -1, per)
    out = np.zeros(q.shape[:-1], np.uint16)
    for i in range(per):
        out |= q[..., i] << (bits * i)
    return out.astype(np.uint8)


def weights(rng, k, n, bits, block, zp):
    """(initializers, input names) of a random packed weight with `zp` zero points."""
    nb = -(-k // block)
    inits = {"B": pack(rng.integers(0, 2**bits, (n, nb, block)), bits),
             "scales": rng.uniform(0.01, 0.2, (n, nb)).astype(F32)}
    if zp == "packed":
        inits["zp"] = pack(rng.integers(0, 2**bits, (n, nb)), bits)
    elif zp == "float":
        inits["zp"] = rng.uniform(0, 2**bits - 1, (n, nb)).astype(F32)
    return inits, ["A", "B", "scales"] + (["zp"] if zp else [])


def nbits_model(k, n, bits, block, level, inits, names, a_shape=("M",), dtype=F32, feeds=None):
    a = {"A": np.zeros((1,) * len(a_shape) + (k,), dtype)} if feeds is None else feeds
    m = node_model("MatMulNBits", a, initializers=inits, domain=MS, input_names=names, K=k,
                   N=n, bits=bits, block_size=block, accuracy_level=level)
    if feeds is None:  # A's leading dims symbolic: one model serves every row count
        dims = m.graph.input[0].type.tensor_type.shape.dim
        for d, name in zip(dims, a_shape):
            d.dim_param = name
    return m


def ours(model, feeds, numba: bool, monkeypatch, lanes: int | None = None) -> np.ndarray:
    """Three runs (generic, recording, specialised) must agree; the last is returned.
    `lanes` picks the 4-bit kernel: None the CPU's best, 8 AVX2's, 0 the float kernel."""
    monkeypatch.setattr(_numba, "ENABLED", numba)
    monkeypatch.setattr(contrib_nbits, "INT_LANES", lanes)
    sess = InferenceSession.builder().from_graph(model)
    outs = [sess.run(dict(feeds))[0] for _ in range(3)]
    for o in outs[1:]:
        np.testing.assert_array_equal(o, outs[0])
    return outs[-1]


def check(model, rng, k, monkeypatch, rows=ROWS, tol=TIGHT, dtype=F32):
    """Ours with and without numba vs onnxruntime for each row count; at level 4 the two
    paths give the same bits."""
    level = next(a.i for a in model.graph.node[0].attribute if a.name == "accuracy_level")
    for m in rows:
        feeds = {"A": rng.standard_normal((m, k)).astype(dtype)}
        ref = run_ort(model, feeds)[0]
        big = float(np.abs(ref.astype(F32)).max())
        fast, slow = (ours(model, feeds, flag, monkeypatch) for flag in (True, False))
        others = [ours(model, feeds, True, monkeypatch, lanes) for lanes in OTHER_LANES]
        for got in (fast, slow, *others):
            assert got.dtype == ref.dtype and got.shape == ref.shape
            np.testing.assert_allclose(got.astype(F32), ref.astype(F32), rtol=0,
                                       atol=tol * big, err_msg=f"M={m}")
        if level == 4:
            np.testing.assert_array_equal(fast, slow, err_msg=f"M={m}: numba vs numpy")
            for lanes, got in zip(OTHER_LANES, others):
                np.testing.assert_array_equal(got, slow, err_msg=f"M={m}: {lanes} lanes")


GRID = [(bits, block, k, zp) for bits in (2, 4, 8)
        for block, k in ((16, 80), (32, 200), (64, 256), (128, 300), (256, 512))
        for zp in (None, "packed", "float") if not (bits == 8 and zp == "float")]


@pytest.mark.parametrize("level", [0, 4])
@pytest.mark.parametrize("bits,block,k,zp", GRID)
def test_levels_0_and_4_every_form(bits, block, k, zp, level, monkeypatch):
    """Every bits / block size (K a multiple of it or not) / zero-point form; level 4 with
    float zero points, and 2 bits at block 16 or 256, are float32 in onnxruntime too."""
    rng = np.random.default_rng(bits * 1000 + block + k)
    inits, names = weights(rng, k, 40, bits, block, zp)
    check(nbits_model(k, 40, bits, block, level, inits, names), rng, k, monkeypatch)


@pytest.mark.parametrize("level", [1, 2, 3])
@pytest.mark.parametrize("bits,zp", [(4, None), (4, "packed"), (8, "packed"), (2, "float")])
def test_levels_1_to_3_are_float32(bits, zp, level, monkeypatch):
    rng = np.random.default_rng(level * 10 + bits)
    inits, names = weights(rng, 96, 24, bits, 32, zp)
    check(nbits_model(96, 24, bits, 32, level, inits, names), rng, 96, monkeypatch)


def test_level_4_rounding_and_scale(monkeypatch):
    """Ties round to even, and the multiplier is 127 / amax (not 1 / (amax / 127)): rows
    where those choices give different int8 values, checked against onnxruntime."""
    rng = np.random.default_rng(5)
    k = n = 32
    q = np.full((n, k), 8)
    np.fill_diagonal(q, 9)  # W = identity: Y[j] = a_scale * int8(A[j])
    inits = {"B": pack(q, 4).reshape(n, 1, 16), "scales": np.ones((n, 1), F32)}
    model = nbits_model(k, n, 4, 32, 4, inits, ["A", "B", "scales"])
    ties = np.zeros((1, k), F32)
    ties[0, :6] = [127, 2.5, -3.5, 0.5, 1.5, -0.5]  # amax 127: a * 127 / amax = a
    picked = [ties[0]]
    while len(picked) < 9:
        a = (rng.standard_normal(k) * rng.uniform(0.1, 10)).astype(F32)
        amax = np.abs(a).max()
        one = np.rint(a * (F32(127) / amax))
        if not (np.array_equal(one, np.rint(a * (F32(1) / (amax / F32(127)))))
                and np.array_equal(one, np.rint(a / (amax / F32(127))))):
            picked.append(a)
    feeds = {"A": np.stack(picked)}
    ref = run_ort(model, feeds)[0]
    np.testing.assert_allclose(ref[0, :6] / ref[0, 0] * 127, [127, 2, -4, 0, 2, -0])
    # onnxruntime subtracts the zero point's share as a float term (zp * scale * sum(int8 A)),
    # which cancels: 1e-4 of a row's largest value is its rounding here, while an activation
    # quantized a step differently moves an output by 1/127 of it
    row_max = np.abs(ref).max(axis=1, keepdims=True)
    for numba in (True, False):
        got = ours(model, feeds, numba, monkeypatch)
        assert (np.abs(got - ref) <= 1e-4 * row_max).all(), np.abs(got - ref) / row_max


def test_level_4_float32_cases(monkeypatch):
    """Where onnxruntime computes level 4 in float32: g_idx given, B fed at run time."""
    rng = np.random.default_rng(9)
    k, n, block = 128, 16, 32
    inits, names = weights(rng, k, n, 4, block, "float")
    inits["g"] = rng.permutation(np.arange(k) // block).astype(np.int32)
    check(nbits_model(k, n, 4, block, 4, inits, [*names, "g"]), rng, k, monkeypatch, rows=(1, 5))
    inits, names = weights(rng, k, n, 4, block, "packed")
    a = rng.standard_normal((2, k)).astype(F32)
    feeds = {"A": a, "B": inits.pop("B")}
    model = nbits_model(k, n, 4, block, 4, inits, names, feeds=feeds)
    ref = run_ort(model, feeds)[0]
    for numba in (True, False):
        got = ours(model, feeds, numba, monkeypatch)
        np.testing.assert_allclose(got, ref, rtol=0, atol=TIGHT * np.abs(ref).max())


@pytest.mark.parametrize("level", [0, 4])
def test_bias_batch_dims_and_float16(level, monkeypatch):
    rng = np.random.default_rng(3 + level)
    k, n = 64, 20
    inits, names = weights(rng, k, n, 4, 16, "packed")
    inits["bias"] = rng.standard_normal(n).astype(F32)
    model = nbits_model(k, n, 4, 16, level, inits, [*names, "", "bias"], a_shape=("B", "S"))
    for shape in ((2, 3), (1, 1), (4, 17)):
        feeds = {"A": rng.standard_normal((*shape, k)).astype(F32)}
        ref = run_ort(model, feeds)[0]
        for numba in (True, False):
            got = ours(model, feeds, numba, monkeypatch)
            np.testing.assert_allclose(got, ref, rtol=0, atol=TIGHT * np.abs(ref).max())
    inits16 = {**inits, "scales": inits["scales"].astype(np.float16),
               "bias": inits["bias"].astype(np.float16)}
    model16 = nbits_model(k, n, 4, 16, level, inits16, [*names, "", "bias"], dtype=np.float16)
    # float16 out: one rounding of the float32 result (onnxruntime's and ours may straddle)
    check(model16, rng, k, monkeypatch, rows=(1, 3), tol=2e-3, dtype=np.float16)


def test_numba_kernel_is_used_for_few_rows(monkeypatch):
    pytest.importorskip("numba", reason="numba (the `fast` extra) is not installed")
    from onnxkiln.trace import TraceContext

    rng = np.random.default_rng(2)
    inits, names = weights(rng, 64, 8, 4, 32, None)
    model = nbits_model(64, 8, 4, 32, 4, inits, names)
    fast = {16: "int8_vnni", 8: "int8_avx2"}.get(contrib_nbits.host_lanes(), "int8_numba")
    for numba, m, variant in ((True, 2, fast), (True, 64, "int8_blas"), (False, 2, "int8_blas")):
        monkeypatch.setattr(_numba, "ENABLED", numba)
        ctx = TraceContext.in_memory()
        sess = InferenceSession.builder().trace(ctx).from_graph(model)
        sess.run({"A": rng.standard_normal((m, 64)).astype(F32)})
        span = [s for s in ctx.spans if s.category == "node"][-1]
        assert span.attributes["kernel_variant"] == f"matmulnbits.{variant}"
        if variant == "int8_blas":
            assert span.attributes.get("kernel_variant_reason")


def test_bfloat16_and_empty_rows(monkeypatch):
    """bfloat16 A (onnxruntime's CPU has no such kernel) rounds the float32 result once;
    zero rows give an empty result."""
    rng = np.random.default_rng(4)
    inits, names = weights(rng, 64, 8, 4, 32, "packed")
    a = rng.standard_normal((3, 64)).astype(F32)
    ref = ours(nbits_model(64, 8, 4, 32, 4, inits, names), {"A": a}, True, monkeypatch)
    model = nbits_model(64, 8, 4, 32, 4, {**inits, "scales": inits["scales"]}, names,
                        dtype=ml_dtypes.bfloat16)
    got = ours(model, {"A": a.astype(ml_dtypes.bfloat16)}, True, monkeypatch)
    assert got.dtype == ml_dtypes.bfloat16
    np.testing.assert_allclose(got.astype(F32), ref, rtol=2e-2, atol=0.05)
    for numba in (True, False):
        empty = ours(nbits_model(64, 8, 4, 32, 4, inits, names), {"A": a[:0]}, numba,
                     monkeypatch)
        assert empty.shape == (0, 8)


BAD = [
    ({"N": 9}, None, "B must have shape"),
    ({"K": 96}, None, "B must have shape"),
    ({"bits": 3}, None, "bits must be one of"),
    ({"block_size": 24}, None, "block_size must be a power of 2"),
    ({}, {"B": np.zeros((8, 2, 15), np.uint8)}, "B must have shape"),
    ({}, {"scales": np.ones((8, 3), F32)}, "scales must have"),
    ({}, {"zp": np.zeros((8, 2), np.uint8)}, "packed uint8 zero_points"),
    ({}, {"zp": np.zeros((8, 3), F32)}, "zero_points of type float32"),
]


@pytest.mark.parametrize("attrs,replace,match", BAD)
def test_bad_weights_refused(attrs, replace, match):
    rng = np.random.default_rng(6)
    inits, names = weights(rng, 64, 8, 4, 32, "packed")
    if replace and "zp" in replace and replace["zp"].dtype == F32:
        inits["zp"] = replace["zp"]
    elif replace:
        inits.update(replace)
    a = {"A": np.zeros((1, 64), F32)}
    node_attrs = {"K": 64, "N": 8, "bits": 4, "block_size": 32, **attrs}
    model = node_model("MatMulNBits", a, initializers=inits, domain=MS, input_names=names,
                       accuracy_level=4, **node_attrs)
    with pytest.raises(SessionError, match=match):
        InferenceSession.builder().from_graph(model).run(a)


def test_bad_activations_refused():
    """A whose last dim is not K (the graph leaves it open) is refused by the kernel."""
    rng = np.random.default_rng(8)
    inits, names = weights(rng, 64, 8, 4, 32, None)
    model = nbits_model(64, 8, 4, 32, 4, inits, names)
    model.graph.input[0].type.tensor_type.shape.dim[1].dim_param = "K"
    sess = InferenceSession.builder().from_graph(model)
    with pytest.raises(SessionError, match="A's last dim must be K = 64"):
        sess.run({"A": np.zeros((2, 63), F32)})


@pytest.mark.parametrize("lanes", [None, 8, 0])
def test_column_chunks_across_threads_give_the_same_bits(lanes, monkeypatch):
    """The kernel's column tiles split across the pool (forced: no timing threshold) give
    the single-thread result exactly."""
    pytest.importorskip("numba", reason="numba (the `fast` extra) is not installed")
    from onnxkiln.pool import pool_for
    from onnxkiln.providers.cpu import _gemm

    rng = np.random.default_rng(12)
    inits, names = weights(rng, 256, 200, 4, 32, "packed")
    model = nbits_model(256, 200, 4, 32, 4, inits, names)
    feeds = {"A": rng.standard_normal((3, 256)).astype(F32)}
    monkeypatch.setattr(contrib_nbits, "INT_LANES", lanes)
    one = InferenceSession.builder().intra_op_threads(1).from_graph(model)
    expected = [one.run(feeds)[0] for _ in range(3)][-1]
    monkeypatch.setattr(_gemm, "SPLIT_MIN_S", 0.0)
    pool = pool_for(2)
    before = pool.dispatched + pool.inline  # inline: the pool backed off (a busy machine)
    two = InferenceSession.builder().intra_op_threads(2).from_graph(model)
    for _ in range(3):
        np.testing.assert_array_equal(two.run(feeds)[0], expected)
    assert pool.dispatched + pool.inline > before
