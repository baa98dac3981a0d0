"""CPU kernels: smaller com.microsoft ops: ScaledSiLU, GatedAdd, GatedRMSNorm, BranchwiseRMSNorm,
MRotaryEmbedding, MurmurHash3, CropAndResize, NGramRepeatBlock, BifurcationDetector,
DynamicTimeWarping and WordConvEmbedding."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from onnxkiln.ops import special
from onnxkiln.providers.base import CaptureSupport, NodeInfo
from onnxkiln.providers.cpu.contrib_transformer import MS, rotary_embedding_ms
from onnxkiln.providers.cpu.registry import kernel

_F32 = np.dtype(np.float32)


def _attr_str(info: NodeInfo, name: str, default: str) -> str:
    v = info.attrs.get(name, default)
    return v.decode() if isinstance(v, bytes) else str(v)


@kernel("ScaledSiLU", since=1, domain=MS, factory=True, variant="scaledsilu.expit")
def scaled_silu(info: NodeInfo) -> Callable[..., np.ndarray]:
    """Z = T(scale * X), Y = T(Z * T(sigmoid(Z))), scale from the optional scalar input or
    `alpha`; each step rounded to X's type."""
    alpha = float(info.attrs.get("alpha", 1.0))

    def run(x: np.ndarray, scale: np.ndarray | None = None) -> np.ndarray:
        if x.dtype.kind not in "fV":
            raise TypeError(f"ScaledSiLU: X must be a float tensor, got {x.dtype}")
        if scale is not None and scale.size != 1:
            raise ValueError(f"ScaledSiLU: scale must be a scalar, got shape {scale.shape}")
        s = alpha if scale is None else float(scale.reshape(-1)[0].astype(_F32))
        z = (x.astype(_F32) * _F32.type(s)).astype(x.dtype)
        sig = special.expit(z.astype(_F32)).astype(x.dtype)
        return (z.astype(_F32) * sig.astype(_F32)).astype(x.dtype)

    return run


@kernel("GatedAdd", since=1, domain=MS, variant="gatedadd.numpy")
def gated_add(x: np.ndarray, y: np.ndarray, gate: np.ndarray,
              gate_weight: np.ndarray | None = None) -> np.ndarray:
    """X + T(Y * gate) with gate (..., 1) per row; X, Y (..., C) of one float type. The projected
    mode (gate_weight) is refused, as by onnxruntime's CPU provider."""
    op = "GatedAdd"
    if gate_weight is not None:
        raise ValueError(f"{op}: gate_weight (the projected mode) is not supported on CPU")
    if x.dtype.kind not in "fV" or y.dtype != x.dtype or gate.dtype != x.dtype:
        raise TypeError(f"{op}: X, Y and gate must share a float type, got {x.dtype}, "
                        f"{y.dtype}, {gate.dtype}")
    if y.shape != x.shape or x.ndim == 0 or gate.shape != (*x.shape[:-1], 1):
        raise ValueError(f"{op}: X {x.shape} and Y {y.shape} must match and gate be "
                         f"{(*x.shape[:-1], 1)}, got {gate.shape}")
    if x.dtype == _F32 or x.dtype == np.float64:
        return x + y * gate
    prod = (y.astype(_F32) * gate.astype(_F32)).astype(x.dtype)
    return (x.astype(_F32) + prod.astype(_F32)).astype(x.dtype)


@kernel("GatedRMSNorm", since=1, domain=MS, factory=True, variant="gatedrmsnorm.numpy")
def gated_rms_norm(info: NodeInfo) -> Callable[..., np.ndarray]:
    """Y = X * rsqrt(mean(X^2) + epsilon) * scale * act(gate) over each group of len(scale)
    trailing elements; act silu/swish (default) or sigmoid; float32 arithmetic, Y in X's type."""
    op = "GatedRMSNorm"
    act = _attr_str(info, "activation", "silu")
    if act not in ("silu", "swish", "sigmoid"):
        raise ValueError(f"{op}: activation must be silu, swish or sigmoid, got {act!r}")
    eps = float(info.attrs.get("epsilon", 1e-5))

    def run(x: np.ndarray, scale: np.ndarray, gate: np.ndarray) -> np.ndarray:
        if x.dtype.kind not in "fV" or scale.dtype != x.dtype or gate.dtype != x.dtype:
            raise TypeError(f"{op}: X, scale and gate must share a float type, got {x.dtype}, "
                            f"{scale.dtype}, {gate.dtype}")
        c = scale.size
        if scale.ndim != 1 or x.ndim == 0 or c == 0 or x.shape[-1] % c or gate.shape != x.shape:
            raise ValueError(f"{op}: X's last dim {x.shape[-1] if x.ndim else None} must be a "
                             f"multiple of scale's length {c} (1-D) and gate {gate.shape} match X "
                             f"{x.shape}")
        xf = x.astype(_F32).reshape(*x.shape[:-1], -1, c)
        g = gate.astype(_F32).reshape(xf.shape)
        inv = 1.0 / np.sqrt(np.mean(xf * xf, axis=-1, keepdims=True) + _F32.type(eps))
        sig = special.expit(g)
        y = xf * inv * scale.astype(_F32) * (sig if act == "sigmoid" else g * sig)
        return y.reshape(x.shape).astype(x.dtype)

    return run


@kernel("BranchwiseRMSNorm", since=1, domain=MS, factory=True, variant="branchrmsnorm.numpy")
def branchwise_rms_norm(info: NodeInfo) -> Callable[..., np.ndarray]:
    """RMS normalization of each branch: X (..., C, H), or (..., C * H) with num_branches = C;
    optional scale (C * H), (C, H) or (H); float32 arithmetic, Y in X's type and shape."""
    op = "BranchwiseRMSNorm"
    branches = int(info.attrs.get("num_branches", 0))
    eps = float(info.attrs.get("epsilon", 1e-5))
    if branches < 0:
        raise ValueError(f"{op}: num_branches must be >= 0, got {branches}")

    def run(x: np.ndarray, scale: np.ndarray | None = None) -> np.ndarray:
        if x.dtype.kind not in "fV":
            raise TypeError(f"{op}: X must be a float tensor, got {x.dtype}")
        if branches:
            if x.ndim < 1 or x.shape[-1] % branches:
                raise ValueError(f"{op}: X's last dim must be a multiple of num_branches "
                                 f"{branches}, got shape {x.shape}")
            xf = x.astype(_F32).reshape(*x.shape[:-1], branches, -1)
        else:
            if x.ndim < 2:
                raise ValueError(f"{op}: grouped X must be (..., C, H), got shape {x.shape}")
            xf = x.astype(_F32)
        c, h = xf.shape[-2:]
        y = xf / np.sqrt(np.mean(xf * xf, axis=-1, keepdims=True) + _F32.type(eps))
        if scale is not None:
            if scale.shape not in ((c * h,), (c, h), (h,)):
                raise ValueError(f"{op}: scale must be ({c * h},), ({c}, {h}) or ({h},), got "
                                 f"{scale.shape}")
            y *= scale.astype(_F32).reshape(-1, h)
        return y.reshape(x.shape).astype(x.dtype)

    return run


def _mrope_streams(section: tuple[int, ...], layout: int) -> np.ndarray:
    """Which position stream (0 T, 1 H, 2 W) feeds each cos/sin column."""
    width = sum(section)
    if layout == 0:
        return np.repeat(np.arange(3), section)
    streams = np.zeros(width, np.int64)
    streams[1 : section[1] * 3 : 3] = 1
    streams[2 : section[2] * 3 : 3] = 2
    return streams


@kernel("MRotaryEmbedding", since=1, domain=MS, factory=True, variant="mrope.numpy")
def m_rotary_embedding(info: NodeInfo) -> Callable[..., np.ndarray]:
    """Multimodal RoPE (Qwen-VL): each cos/sin column comes from the T, H or W position stream
    of position_ids (3, B, S), by mrope_section in chunks (mrope_layout 0) or interleaved (1);
    then RotaryEmbedding."""
    op = "MRotaryEmbedding"
    section = tuple(int(v) for v in info.attrs.get("mrope_section", ()))
    layout = int(info.attrs.get("mrope_layout", 0))
    if len(section) != 3 or min(section) < 0:
        raise ValueError(f"{op}: mrope_section must be 3 non-negative integers, got {section}")
    if layout not in (0, 1):
        raise ValueError(f"{op}: mrope_layout must be 0 or 1, got {layout}")
    if int(info.attrs.get("is_packed_batching", 0)):
        raise ValueError(f"{op}: is_packed_batching is not supported")
    streams = _mrope_streams(section, layout)
    width = streams.size
    rope = rotary_embedding_ms(info)

    def run(x, position_ids, cos_cache, sin_cache):
        if x.ndim not in (3, 4):
            raise ValueError(f"{op}: input must be 3-D or 4-D, got {x.shape}")
        b, s = x.shape[0], x.shape[-2 if x.ndim == 4 else 1]
        pid = np.asarray(position_ids, np.int64)
        if pid.shape != (3, b, s):
            raise ValueError(f"{op}: position_ids shape {pid.shape} expected {(3, b, s)}")
        if cos_cache.ndim != 2 or sin_cache.shape != cos_cache.shape or (
                cos_cache.shape[1] < width):
            raise ValueError(f"{op}: cos_cache/sin_cache must be one 2-D shape at least "
                             f"{width} wide (sum of mrope_section), got {cos_cache.shape}, "
                             f"{sin_cache.shape}")
        if pid.size and (pid.min() < 0 or pid.max() >= cos_cache.shape[0]):
            raise IndexError(f"{op}: position ids must lie in [0, {cos_cache.shape[0]})")
        cols = np.arange(width)
        rows = pid[streams]  # (width, B, S): each column's position
        cos = cos_cache[rows, cols[:, None, None]].transpose(1, 2, 0).reshape(b * s, width)
        sin = sin_cache[rows, cols[:, None, None]].transpose(1, 2, 0).reshape(b * s, width)
        return rope(x, np.arange(b * s).reshape(b, s), cos, sin)

    return run


# ------------------------------------------------------------------------------------ MurmurHash3

_M32 = np.uint64(0xFFFFFFFF)


def _rotl(v: np.ndarray, r: int) -> np.ndarray:
    return ((v << np.uint64(r)) | (v >> np.uint64(32 - r))) & _M32


def _mix_block(k: np.ndarray) -> np.ndarray:
    k = (k * np.uint64(0xCC9E2D51)) & _M32
    return (_rotl(k, 15) * np.uint64(0x1B873593)) & _M32


def _murmur_words(words: np.ndarray, n_bytes: int, seed: int) -> np.ndarray:
    """MurmurHash3_x86_32 of keys made of whole 4-byte words: words [keys, n_words] (uint64
    holding uint32 values)."""
    return _finish(_blocks(np.full(words.shape[0], seed, np.uint64), words), n_bytes)


def _blocks(h: np.ndarray, words: np.ndarray) -> np.ndarray:
    for j in range(words.shape[1]):
        h ^= _mix_block(words[:, j])
        h = (_rotl(h, 13) * np.uint64(5) + np.uint64(0xE6546B64)) & _M32
    return h


def _finish(h: np.ndarray, n_bytes) -> np.ndarray:
    h ^= np.asarray(n_bytes, np.uint64)
    h ^= h >> np.uint64(16)
    h = (h * np.uint64(0x85EBCA6B)) & _M32
    h ^= h >> np.uint64(13)
    h = (h * np.uint64(0xC2B2AE35)) & _M32
    return h ^ (h >> np.uint64(16))


def _murmur_bytes(data: bytes, seed: int) -> int:
    n = len(data)
    whole = n - n % 4
    words = np.frombuffer(data[:whole], "<u4").astype(np.uint64)[None, :]
    h = _blocks(np.full(1, seed, np.uint64), words)
    if n % 4:
        tail = int.from_bytes(data[whole:], "little")
        h ^= _mix_block(np.array([tail], np.uint64))
    return int(_finish(h, n)[0])


@kernel("MurmurHash3", since=1, domain=MS, factory=True, variant="murmurhash3.numpy")
def murmur_hash3(info: NodeInfo) -> Callable[[np.ndarray], np.ndarray]:
    """MurmurHash3_x86_32 of each element's bytes (numbers little-endian, strings UTF-8) with
    `seed`; uint32 out when `positive` (default), else int32."""
    seed = int(info.attrs.get("seed", 0)) & 0xFFFFFFFF
    out = np.uint32 if int(info.attrs.get("positive", 1)) else np.int32

    def run(x: np.ndarray) -> np.ndarray:
        if x.dtype.kind in "OU":
            flat = [_murmur_bytes(str(v).encode(), seed) for v in x.reshape(-1)]
            h = np.array(flat, np.uint64)
        elif x.dtype in (np.int32, np.uint32, np.int64, np.uint64, np.float32, np.float64):
            raw = np.ascontiguousarray(x.reshape(-1)).astype(x.dtype.newbyteorder("<"))
            words = raw.view("<u4").reshape(raw.size, -1).astype(np.uint64)
            h = _murmur_words(words, x.dtype.itemsize, seed)
        else:
            raise TypeError(f"MurmurHash3: X must be (u)int32, (u)int64, float, double or "
                            f"string, got {x.dtype}")
        return h.astype(np.uint32).view(out).reshape(x.shape)

    return run


# --------------------------------------------------------------------------------- CropAndResize


def _crop_coords(lo: np.ndarray, hi: np.ndarray, size: int, crop: int) -> np.ndarray:
    """Sample positions [rois, crop] in input pixels, corner aligned (TensorFlow's rule)."""
    if crop > 1:
        step = (hi - lo) * (size - 1) / (crop - 1)
        return lo[:, None] * (size - 1) + np.arange(crop, dtype=_F32)[None, :] * step[:, None]
    return (0.5 * (lo + hi) * (size - 1))[:, None]


@kernel("CropAndResize", since=1, domain=MS, factory=True, variant="cropandresize.gather")
def crop_and_resize(info: NodeInfo) -> Callable[..., np.ndarray]:
    """Crops of X (N, C, H, W) at normalized [y1, x1, y2, x2] boxes, resized bilinearly (or
    nearest) to crop_size: (num_rois, C, crop_h, crop_w); samples outside X take
    extrapolation_value."""
    op = "CropAndResize"
    mode = _attr_str(info, "mode", "bilinear")
    if mode not in ("bilinear", "nearest"):
        raise ValueError(f"{op}: mode must be bilinear or nearest, got {mode!r}")
    fill = float(info.attrs.get("extrapolation_value", 0.0))

    def run(x, rois, batch_indices, crop_size):
        if x.ndim != 4 or rois.ndim != 2 or rois.shape[1] != 4:
            raise ValueError(f"{op}: X must be 4-D and rois (num_rois, 4); got {x.shape}, "
                             f"{rois.shape}")
        if batch_indices.shape != (rois.shape[0],):
            raise ValueError(f"{op}: batch_indices must have shape ({rois.shape[0]},), got "
                             f"{batch_indices.shape}")
        if crop_size.size != 2 or (crop_size <= 0).any():
            raise ValueError(f"{op}: crop_size must be two positive values, got {crop_size}")
        n, _, h, w = x.shape
        if batch_indices.size and (batch_indices.min() < 0 or batch_indices.max() >= n):
            raise IndexError(f"{op}: batch_indices must lie in [0, {n})")
        ch, cw = (int(v) for v in crop_size.reshape(-1))
        r = rois.astype(_F32)
        ys = _crop_coords(r[:, 0], r[:, 2], h, ch)  # [R, ch]
        xs = _crop_coords(r[:, 1], r[:, 3], w, cw)  # [R, cw]
        outside = ((ys < 0) | (ys > h - 1))[:, :, None] | ((xs < 0) | (xs > w - 1))[:, None, :]
        img = x[batch_indices.astype(np.int64)].astype(_F32)  # [R, C, H, W]
        ridx = np.arange(r.shape[0])[:, None, None]
        if mode == "nearest":
            # halves round up (C round(), not numpy's half-to-even)
            yi = np.clip(np.floor(ys + 0.5), 0, h - 1).astype(np.int64)[:, :, None]
            xi = np.clip(np.floor(xs + 0.5), 0, w - 1).astype(np.int64)[:, None, :]
            y = img[ridx, :, yi, xi]  # [R, ch, cw, C]
        else:
            y0 = np.clip(np.floor(ys), 0, h - 1).astype(np.int64)
            x0 = np.clip(np.floor(xs), 0, w - 1).astype(np.int64)
            y1, x1 = np.minimum(y0 + 1, h - 1), np.minimum(x0 + 1, w - 1)
            fy = (ys - np.floor(ys))[:, :, None, None]
            fx = (xs - np.floor(xs))[:, None, :, None]

            def at(yy, xx):
                return img[ridx, :, yy[:, :, None], xx[:, None, :]]

            top = at(y0, x0) + (at(y0, x1) - at(y0, x0)) * fx
            bottom = at(y1, x0) + (at(y1, x1) - at(y1, x0)) * fx
            y = top + (bottom - top) * fy
        y = np.where(outside[..., None], _F32.type(fill), y)
        return np.ascontiguousarray(np.moveaxis(y, -1, 1)).astype(x.dtype, copy=False)

    return run


@kernel("NGramRepeatBlock", since=1, domain=MS, factory=True, variant="ngramrepeatblock.windows")
def ngram_repeat_block(info: NodeInfo) -> Callable[..., np.ndarray]:
    """scores with -inf at every token that would repeat an ngram_size-gram of input_ids if
    appended to it (the last ngram_size - 1 ids matching an earlier run)."""
    op = "NGramRepeatBlock"
    size = int(info.attrs.get("ngram_size", 0))
    if size <= 0:
        raise ValueError(f"{op}: ngram_size must be positive, got {size}")

    def run(ids: np.ndarray, scores: np.ndarray) -> np.ndarray:
        if ids.ndim != 2 or scores.ndim != 2 or ids.shape[0] != scores.shape[0]:
            raise ValueError(f"{op}: input_ids (batch, seq) and scores (batch, vocab) expected, "
                             f"got {ids.shape} and {scores.shape}")
        out = scores.copy()
        seq = ids.shape[1]
        if seq < size:
            return out
        grams = np.lib.stride_tricks.sliding_window_view(ids, size, axis=1)  # [b, seq-size+1, n]
        tail = ids[:, seq - size + 1:]
        hit = (grams[:, :, : size - 1] == tail[:, None, :]).all(axis=2)
        rows, cols = np.nonzero(hit)
        banned = grams[rows, cols, size - 1]
        if banned.size and (banned.min() < 0 or banned.max() >= scores.shape[1]):
            raise IndexError(f"{op}: input_ids must lie in [0, {scores.shape[1]})")
        out[rows, banned] = -np.inf
        return out

    return run


@kernel("DynamicTimeWarping", since=1, domain=MS, variant="dtw.rows")
def dynamic_time_warping(cost: np.ndarray) -> np.ndarray:
    """The cheapest monotone path through cost (M, N) or (1, M, N) from (0, 0) to (M-1, N-1)
    with steps down, right or diagonal: int32 [2, steps] (rows, columns); ties prefer the
    diagonal, then down."""
    op = "DynamicTimeWarping"
    if cost.ndim == 3 and cost.shape[0] == 1:
        cost = cost[0]
    if cost.ndim != 2 or min(cost.shape) == 0:
        raise ValueError(f"{op}: input must be (M, N) or (1, M, N) with M, N > 0, got "
                         f"{cost.shape}")
    m, n = cost.shape
    x = cost.astype(_F32)
    acc = np.full((m + 1, n + 1), np.inf, _F32)
    acc[0, 0] = 0
    trace = np.full((m + 1, n + 1), -1, np.int8)
    for d in range(2, m + n + 1):  # anti-diagonals i + j = d: each needs the two before it
        i = np.arange(max(1, d - n), min(m, d - 1) + 1)
        j = d - i
        c0, c1, c2 = acc[i - 1, j - 1], acc[i - 1, j], acc[i, j - 1]
        t = np.where((c0 < c1) & (c0 < c2), 0, np.where((c1 < c0) & (c1 < c2), 1, 2))
        acc[i, j] = x[i - 1, j - 1] + np.choose(t, (c0, c1, c2))
        trace[i, j] = t
    trace[0, :] = 2
    trace[:, 0] = 1
    i, j, path = m, n, []
    while i > 0 or j > 0:
        path.append((i - 1, j - 1))
        t = trace[i, j]
        if t == 0:
            i, j = i - 1, j - 1
        elif t == 1:
            i -= 1
        else:
            j -= 1
    return np.array(path[::-1], np.int32).T.copy()


def _occurrences(src: np.ndarray, gram: np.ndarray) -> np.ndarray:
    """Start positions of gram as a contiguous run of src."""
    if gram.size > src.size:
        return np.zeros(0, np.int64)
    windows = np.lib.stride_tricks.sliding_window_view(src, gram.size)
    return np.nonzero((windows == gram).all(axis=1))[0]


@kernel("BifurcationDetector", since=1, domain=MS, factory=True, multi_output=True,
        variant="bifurcation.numpy", capture=CaptureSupport.DATA_DEPENDENT_SHAPE)
def bifurcation_detector(info: NodeInfo) -> Callable[..., tuple]:
    """Aggressive decoding's merge step: tokens = cur_tokens + pred_tokens up to and including
    the first one that leaves src_tokens[prev_suffix_match_idx:]; then the suffix match index:
    for n-grams of tokens' tail from min_ngram_size up, the end in src_tokens of a unique
    match (-1 while matches repeat), stopping at no match or a match ending src_tokens."""
    op = "BifurcationDetector"
    lo, hi = int(info.attrs.get("min_ngram_size", 1)), int(info.attrs.get("max_ngram_size", 3))
    if lo <= 0 or hi < lo:
        raise ValueError(f"{op}: need 0 < min_ngram_size <= max_ngram_size, got {lo}, {hi}")

    def run(src, cur, prev_idx, pred=None):
        for name, t in (("src_tokens", src), ("cur_tokens", cur), ("pred_tokens", pred)):
            if t is not None and (t.dtype != np.int64 or t.ndim != 1):
                raise TypeError(f"{op}: {name} must be 1-D int64, got {t.dtype} {t.shape}")
        if prev_idx.size != 1:
            raise ValueError(f"{op}: prev_suffix_match_idx must be a scalar")
        tokens = cur
        if pred is not None:
            start = int(prev_idx.reshape(-1)[0])
            if not 0 <= start <= src.size or pred.size != src.size + 1 - start:
                raise ValueError(f"{op}: pred_tokens must hold len(src_tokens) + 1 - "
                                 f"prev_suffix_match_idx = {src.size + 1 - start} tokens, got "
                                 f"{pred.size}")
            n = src.size - start
            differ = np.nonzero(pred[:n] != src[start:])[0]
            keep = (int(differ[0]) if differ.size else n) + 1
            tokens = np.concatenate([cur, pred[:keep]])
        found = -1
        for n in range(lo, hi + 1):
            if n > tokens.size:
                break
            hits = _occurrences(src, tokens[tokens.size - n:])
            if hits.size == 0:
                break
            end = int(hits[0]) + n
            if end >= src.size:
                found = end
                break
            found = end if hits.size == 1 else -1
        return tokens.copy(), np.full(prev_idx.shape, found, np.int64)

    return run


@kernel("WordConvEmbedding", since=1, domain=MS, factory=True, variant="wordconv.windows")
def word_conv_embedding(info: NodeInfo) -> Callable[..., np.ndarray]:
    """Per word of Sequence [words, chars] (int32 char ids; a word's length counts its ids > 0,
    0 when its first id is 0): char embeddings C, a width-W convolution W [M, 1, W, E] + B,
    tanh, max over the windows of its max(length, W) leading chars: [words, M]. Empty words
    give zeros (onnxruntime leaves them unset)."""
    op = "WordConvEmbedding"
    want = {k: int(info.attrs.get(k, -1)) for k in ("embedding_size", "conv_window_size",
                                                    "char_embedding_size")}

    def run(seq, w, b, chars):
        if seq.ndim != 2 or seq.dtype != np.int32:
            raise TypeError(f"{op}: Sequence must be 2-D int32, got {seq.dtype} {seq.shape}")
        if w.ndim != 4 or chars.ndim != 2 or w.shape[1] != 1 or w.shape[3] != chars.shape[1]:
            raise ValueError(f"{op}: W must be [M, 1, window, E] with C [chars, E], got "
                             f"{w.shape} and {chars.shape}")
        m, _, width, e = w.shape
        for key, got in (("embedding_size", m), ("conv_window_size", width),
                         ("char_embedding_size", e)):
            if want[key] != -1 and want[key] != got:
                raise ValueError(f"{op}: {key} attribute {want[key]} does not match {got}")
        if b.shape != (m,):
            raise ValueError(f"{op}: B must have shape ({m},), got {b.shape}")
        n_words, n_chars = seq.shape
        if width > n_chars:
            raise ValueError(f"{op}: conv window {width} exceeds the word length {n_chars}")
        lengths = np.where(seq[:, 0] > 0, (seq > 0).sum(axis=1), 0)
        span = np.where(lengths > 0, np.maximum(lengths, width), 0)
        used = np.arange(n_chars)[None, :] < span[:, None]
        ids = np.where(used, seq, 0)
        if ids.size and (ids.min() < 0 or ids.max() >= chars.shape[0]):
            raise IndexError(f"{op}: char ids must lie in [0, {chars.shape[0]})")
        emb = chars.astype(_F32)[ids]  # [words, chars, E]
        windows = np.lib.stride_tricks.sliding_window_view(emb, width, axis=1)  # [.., u, E, W]
        flat = windows.transpose(0, 1, 3, 2).reshape(n_words, n_chars - width + 1, width * e)
        conv = np.tanh(flat @ w.reshape(m, width * e).T.astype(_F32) + b.astype(_F32))
        valid = np.arange(n_chars - width + 1)[None, :] < (span - width + 1)[:, None]
        conv = np.where(valid[..., None], conv, -np.inf)
        out = conv.max(axis=1, initial=-np.inf)
        return np.where(lengths[:, None] > 0, out, 0).astype(_F32)

    return run
