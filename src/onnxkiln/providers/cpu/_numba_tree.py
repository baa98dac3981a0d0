"""The numba tree-ensemble walk behind `ml_forest` (imported only through `_numba.load`).

One function, `tree_scores`, compiled per compare dtype (float32, float64) with an explicit
signature. Its operands are a packed layout `ml_forest.Forest` builds once per node:

- `iv` (int32): a header (HEADER entries, slots below), then 4 ints per node (feature, true
  successor, false successor, aux) for the interior nodes followed by one self-looping
  pseudo node per leaf (leaf l is node n_interior + l), the tree roots and depths, the
  member-set bounds and the leaf entry table (CSR: per leaf the range of its (target,
  weight) entries, and the targets). aux = mode | nan_goes_true << 3 | member_set << 4,
  the mode normalised to LEQ 0, LT 1, EQ 4, MEMBER 6.
- `fv` (the compare dtype): the node thresholds, the leaf weights, the member values and
  the base values (added to targets a leaf scored, or to all targets, by the header's BASED).

A walk is latency-bound (load the feature, compare, load the successor), so pairs of
(sample, tree) are walked G at a time in lockstep for as many levels as the deepest tree
of the group: G independent chains the CPU overlaps, branch-free (a pseudo leaf loops to
itself). Few samples: G trees of one sample; more: one tree for G samples of a block,
every tree per block so a tree's nodes stay in cache. Each sample still sums its trees in
tree order (the order of the numpy path and onnxruntime: the float sums are identical).
Mixed modes, EQ and MEMBER nodes walk one pair at a time. No fastmath: IEEE order.
"""

from __future__ import annotations

import numba
import numpy as np

# header slots of iv
(KIND, AGG, TREES, INTERIOR, NODES, ROOTS, DEPTHS, MPTR, LPTR, LTGT, LVAL, TRACK, BASE,
 BASED) = range(14)
HEADER = 14
BASE_NONE, BASE_SCORED, BASE_ALL = range(3)
# walk kinds: all nodes LEQ / LT (NaN follows the comparison), the same with per-node NaN
# routing, or anything (per-node mode, EQ, MEMBER)
WALK_LEQ, WALK_LT, WALK_LEQ_NAN, WALK_LT_NAN, WALK_ANY = range(5)
G = 8  # pairs walked in lockstep (_walk8 holds them in registers)
BLOCK = 64  # samples per block when walking tree by tree


def _jit(**opts):
    def wrap(fn):
        try:
            return numba.njit(cache=True, nogil=True, error_model="numpy", **opts)(fn)
        except RuntimeError:  # "cannot cache function ...: no locator available"
            return numba.njit(nogil=True, error_model="numpy", **opts)(fn)

    return wrap


@_jit(inline="always")
def _member(fv, lo, hi, v):
    """Whether v is in the sorted values fv[lo:hi] (binary search)."""
    end = hi
    while lo < hi:
        mid = (lo + hi) >> 1
        if fv[mid] < v:
            lo = mid + 1
        else:
            hi = mid
    return lo < end and fv[lo] == v


@_jit(inline="always")
def _step(x, s, iv, fv, node, on, leq, nan):
    """One level of an LEQ/LT walk: the successor of `node` for sample s (branch-free)."""
    b = on + 4 * node
    v = x[s, iv[b]]
    th = fv[node]
    go = (1 if v <= th else 0) if leq else (1 if v < th else 0)
    if nan:
        go |= (1 if v != v else 0) & (iv[b + 3] >> 3) & 1
    return iv[b + 2 - go]


@_jit(inline="always")
def _walk_any(x, s, iv, fv, node, on, m, om):
    """Leaf node reached from `node` with per-node modes, NaN routing and set membership."""
    while node < m:
        b = on + 4 * node
        v = x[s, iv[b]]
        aux = iv[b + 3]
        if v != v:
            go = (aux >> 3) & 1
        else:
            mode = aux & 7
            th = fv[node]
            if mode == 0:
                go = 1 if v <= th else 0
            elif mode == 1:
                go = 1 if v < th else 0
            elif mode == 4:
                go = 1 if v == th else 0
            else:
                k = om + (aux >> 4)
                go = 1 if _member(fv, iv[k], iv[k + 1], v) else 0
        node = iv[b + 2 - go]
    return node


@_jit(inline="always")
def _add_leaf(out, has, s, iv, fv, leaf, agg, track, lptr, ltgt, lval):
    """Fold a leaf's weights into sample s's scores (SUM/AVERAGE add, MIN/MAX pick; a NaN
    weight propagates as numpy's min/max do) and mark the targets it scored."""
    for e in range(iv[lptr + leaf], iv[lptr + leaf + 1]):
        j = iv[ltgt + e]
        v = fv[lval + e]
        if agg <= 1:
            out[s, j] += v
        elif has[s, j] == 0:
            out[s, j] = v
        else:
            cur = out[s, j]
            if v != v or (v < cur if agg == 2 else v > cur):
                out[s, j] = v
        if track:
            has[s, j] = 1


@_jit(inline="always")
def _walk8(x, rows, iv, fv, c, levels, on, leq, nan):
    """`levels` steps of 8 walks at once: nodes c (a tuple of 8) for the samples rows (a
    tuple of 8); eight independent chains held in registers for the CPU to overlap."""
    c0, c1, c2, c3, c4, c5, c6, c7 = c
    r0, r1, r2, r3, r4, r5, r6, r7 = rows
    for _ in range(levels):
        c0 = _step(x, r0, iv, fv, c0, on, leq, nan)
        c1 = _step(x, r1, iv, fv, c1, on, leq, nan)
        c2 = _step(x, r2, iv, fv, c2, on, leq, nan)
        c3 = _step(x, r3, iv, fv, c3, on, leq, nan)
        c4 = _step(x, r4, iv, fv, c4, on, leq, nan)
        c5 = _step(x, r5, iv, fv, c5, on, leq, nan)
        c6 = _step(x, r6, iv, fv, c6, on, leq, nan)
        c7 = _step(x, r7, iv, fv, c7, on, leq, nan)
    return c0, c1, c2, c3, c4, c5, c6, c7


@_jit(inline="always")
def _lockstep(x, iv, fv, out, has, leq, nan):
    """Walk every (sample, tree) pair 8 at a time; `leq` and `nan` are constants at each
    call site, so every walk kind gets its own branch-free inner loop. A group short of 8
    pads with a pseudo leaf (few trees) or repeats its last sample (few samples)."""
    n = x.shape[0]
    agg, n_trees, m = iv[AGG], iv[TREES], iv[INTERIOR]
    on, roots, depths = iv[NODES], iv[ROOTS], iv[DEPTHS]
    lptr, ltgt, lval = iv[LPTR], iv[LTGT], iv[LVAL]
    track = iv[TRACK] != 0 or agg >= 2
    cur = np.empty(G, np.int64)
    if n < G:  # G trees of one sample at a time
        for s in range(n):
            rows = (s, s, s, s, s, s, s, s)
            for t0 in range(0, n_trees, G):
                g = min(G, n_trees - t0)
                levels = 0
                for i in range(G):
                    cur[i] = iv[roots + t0 + i] if i < g else m
                    if i < g:
                        levels = max(levels, iv[depths + t0 + i])
                c = (cur[0], cur[1], cur[2], cur[3], cur[4], cur[5], cur[6], cur[7])
                c = _walk8(x, rows, iv, fv, c, levels, on, leq, nan)
                for i in range(g):
                    _add_leaf(out, has, s, iv, fv, c[i] - m, agg, track, lptr, ltgt, lval)
        return
    for s0 in range(0, n, BLOCK):  # one tree for G samples at a time, all trees per block
        s1 = min(n, s0 + BLOCK)
        for t in range(n_trees):
            root, levels = iv[roots + t], iv[depths + t]
            for g0 in range(s0, s1, G):
                g = min(G, s1 - g0)
                last = s1 - 1
                rows = (g0, min(g0 + 1, last), min(g0 + 2, last), min(g0 + 3, last),
                        min(g0 + 4, last), min(g0 + 5, last), min(g0 + 6, last),
                        min(g0 + 7, last))
                c = _walk8(x, rows, iv, fv, (root, root, root, root, root, root, root, root),
                           levels, on, leq, nan)
                for i in range(g):
                    _add_leaf(out, has, g0 + i, iv, fv, c[i] - m, agg, track, lptr, ltgt,
                              lval)


def tree_scores(x, iv, fv, out, has):
    """Aggregated leaf weights of every sample into out [N, K] (zeros on entry) and, when
    the header asks (or for MIN/MAX), which targets got a weight into has [N, K] (zeros on
    entry); AVERAGE divides by the tree count, then the base values are added."""
    n = x.shape[0]
    kind, agg, n_trees, m = iv[KIND], iv[AGG], iv[TREES], iv[INTERIOR]
    if kind == WALK_LEQ:
        _lockstep(x, iv, fv, out, has, True, False)
    elif kind == WALK_LT:
        _lockstep(x, iv, fv, out, has, False, False)
    elif kind == WALK_LEQ_NAN:
        _lockstep(x, iv, fv, out, has, True, True)
    elif kind == WALK_LT_NAN:
        _lockstep(x, iv, fv, out, has, False, True)
    else:
        on, roots, om = iv[NODES], iv[ROOTS], iv[MPTR]
        lptr, ltgt, lval = iv[LPTR], iv[LTGT], iv[LVAL]
        track = iv[TRACK] != 0 or agg >= 2
        for s0 in range(0, n, BLOCK):
            for t in range(n_trees):
                for s in range(s0, min(n, s0 + BLOCK)):
                    node = _walk_any(x, s, iv, fv, iv[roots + t], on, m, om)
                    _add_leaf(out, has, s, iv, fv, node - m, agg, track, lptr, ltgt, lval)
    if agg == 1 and n_trees > 0:
        for s in range(n):
            for j in range(out.shape[1]):
                out[s, j] = out[s, j] / n_trees
    based, base = iv[BASED], iv[BASE]
    if based != BASE_NONE:
        for s in range(n):
            for j in range(out.shape[1]):
                if based == BASE_ALL or has[s, j] != 0:
                    out[s, j] += fv[base + j]
