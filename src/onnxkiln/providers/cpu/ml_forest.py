"""A compiled tree ensemble (shared by TreeEnsembleClassifier/Regressor 1-4 and TreeEnsemble 5).

Every encoding is compiled once per node and compare dtype into one `Forest`: interior nodes
in flat arrays (feature, threshold, normalised comparison, true/false/NaN successors) plus
one self-looping pseudo node per leaf, and a dense [leaves, targets] weight table.

Two ways to predict, with the same sums: the numba kernel (`_numba_tree.tree_scores`, over
a packed layout built here once) walks each (sample, tree) pair in a tight loop; the numpy
fallback walks all pairs level by level with index arrays, then gathers leaf weights. Both
sum tree by tree in the compare dtype, as onnxruntime does.
"""

from __future__ import annotations

import numpy as np

from onnxkiln.providers.cpu import _numba

__all__ = ["MODE_NAMES", "Forest", "leaf_table"]

_F32 = np.dtype(np.float32)
_F64 = np.dtype(np.float64)
_I32 = np.dtype(np.int32)
_I64 = np.dtype(np.int64)

# normalised comparisons: GT/GTE/NEQ become LEQ/LT/EQ with swapped successors
_LEQ, _LT, _EQ, _MEMBER = 0, 1, 4, 6
MODE_NAMES = {
    "BRANCH_LEQ": 0, "BRANCH_LT": 1, "BRANCH_GTE": 2, "BRANCH_GT": 3,
    "BRANCH_EQ": 4, "BRANCH_NEQ": 5, "BRANCH_MEMBER": 6, "LEAF": 7,
}
_AGG_CODES = {"SUM": 0, "AVERAGE": 1, "MIN": 2, "MAX": 3}
_CHUNK = 1 << 22  # elements of the [samples, trees, targets] gather done at once
# header of the packed int layout (see _numba_tree): kind, aggregate, counts, offsets
_HEADER = 14

_numba.register(
    "tree_scores", "onnxkiln.providers.cpu._numba_tree",
    lambda dt: _tree_scores_signature(dt), (_F32, _F64),
)


def _tree_scores_signature(dt: np.dtype):
    from numba import types

    f = types.float32 if dt == _F32 else types.float64
    return (types.Array(f, 2, "C", readonly=True), types.Array(types.int32, 1, "C", readonly=True),
            types.Array(f, 1, "C", readonly=True), types.Array(f, 2, "C"),
            types.Array(types.uint8, 2, "C"))


class Forest:
    """A compiled tree ensemble: traversal arrays, the leaf weight table, and the numba
    kernel for its compare dtype when numba is on (decided when the forest is built)."""

    def __init__(
        self,
        op: str,
        feature: np.ndarray,
        threshold: np.ndarray,
        mode: np.ndarray,
        true_next: np.ndarray,
        false_next: np.ndarray,
        missing_true: np.ndarray,
        roots: np.ndarray,
        leaf_values: np.ndarray,
        leaf_has: np.ndarray,
        aggregate: str,
        members: list[np.ndarray] | None = None,
        base: np.ndarray | None = None,
        base_all: bool = False,
    ) -> None:
        """Successors and roots are encoded as node index >= 0 or ~leaf index < 0. `base`
        values are added to the targets a leaf scored (a regressor's rule), or to every
        target with `base_all` (a multi-class classifier's, whose classes then all count
        as scored)."""
        self.op = op
        self.aggregate = aggregate
        self.base = None if base is None or base.size == 0 else base.astype(threshold.dtype)
        self.base_all = base_all and self.base is not None
        m = feature.shape[0]
        n_leaves = leaf_values.shape[0]
        self.n_internal = m
        self.n_trees = roots.shape[0]
        self.leaf_values = leaf_values
        self.leaf_has = leaf_has
        self.all_has = bool(leaf_has.all())
        self.dtype = threshold.dtype
        self._table: np.ndarray | None = None  # leaf_values in dtype, for the numpy path

        self._nodes(op, feature, threshold, mode, true_next, false_next, missing_true, roots,
                    n_leaves)
        self.member_keys = None
        self.member_sets: list[np.ndarray] = []
        if members is not None:
            self._members(members)
        self._op_name = op.lower()
        self._fn = None  # the compiled walk, once the first run loaded it
        self._bound = None  # scores() on the numba path, once bound
        self.fast = self._fast_handle()

    def _nodes(self, op: str, feature: np.ndarray, threshold: np.ndarray, mode: np.ndarray,
               true_next: np.ndarray, false_next: np.ndarray, missing_true: np.ndarray,
               roots: np.ndarray, n_leaves: int) -> None:
        """The node arrays: modes normalised (GT/GTE/NEQ become LEQ/LT/EQ with swapped
        successors), the NaN successor, one self-looping pseudo node per leaf."""
        m = self.n_internal

        def enc(succ: np.ndarray) -> np.ndarray:
            succ = np.asarray(succ, dtype=np.int64)
            return np.where(succ < 0, m + ~succ, succ)

        mode = np.asarray(mode, dtype=np.int64)
        if mode.size and ((mode < 0) | (mode > 6)).any():
            raise ValueError(f"{op}: node modes must be BRANCH_* (0..6), got "
                             f"{sorted(set(mode.tolist()))}")
        t, f = enc(true_next), enc(false_next)
        nan_next = np.where(missing_true.astype(bool) | (mode == 5), t, f)
        swap = (mode == 2) | (mode == 3) | (mode == 5)
        t, f = np.where(swap, f, t), np.where(swap, t, f)
        mode = np.select([mode == 2, mode == 3, mode == 5], [_LT, _LEQ, _EQ], mode)
        self.nan_special = bool((nan_next != f).any())
        leaf_ids = np.arange(m, m + n_leaves, dtype=np.int64)
        fill = int(mode[0]) if mode.size else _LEQ
        self.feature = np.concatenate([np.asarray(feature, np.int64), np.zeros(n_leaves, np.int64)])
        self.threshold = np.concatenate([threshold, np.zeros(n_leaves, threshold.dtype)])
        self.mode = np.concatenate([mode, np.full(n_leaves, fill, np.int64)])
        self.true_next = np.concatenate([t, leaf_ids])
        self.false_next = np.concatenate([f, leaf_ids])
        self.nan_next = np.concatenate([nan_next, leaf_ids])
        self.roots = enc(roots)
        self.modes_present = sorted(set(self.mode.tolist()))
        if self.feature.size and self.feature.min() < 0:
            raise ValueError(f"{op}: negative feature id {int(self.feature.min())}")
        self.n_features = int(self.feature[:m].max()) + 1 if m else 0
        for succ in (self.true_next, self.false_next):
            if succ.size and (succ.min() < 0 or succ.max() >= m + n_leaves):
                raise ValueError(f"{op}: a node's successor is out of range")

    def _members(self, members: list[np.ndarray]) -> None:
        # (node, value) pairs as complex numbers: searchsorted orders them lexicographically
        nodes = np.flatnonzero(self.mode == _MEMBER)
        nodes = nodes[nodes < self.n_internal]
        if len(members) < nodes.size:
            raise ValueError(
                f"{self.op}: {nodes.size} BRANCH_MEMBER nodes but {len(members)} member sets"
            )
        self.member_sets = [np.unique(v.astype(_F64)) for _, v in zip(nodes, members)]
        keys = [n + 1j * v for n, v in zip(nodes, self.member_sets)]
        self.member_keys = np.sort(np.concatenate(keys)) if keys else np.zeros(0, complex)

    # the numba path

    def _fast_handle(self) -> _numba.Lazy | None:
        """The numba kernel's handle (loaded on the first run), with the packed operands
        built now; None when numba is off or the forest is cyclic (the numpy walk reports
        the cycle)."""
        self.fast_reason = _numba.disabled_reason()
        if self.fast_reason is not None:
            return self._numpy_path(self.fast_reason)
        depths = self._depths()
        if depths is None:
            return self._numpy_path("the trees contain a cycle")
        handle = _numba.lazy("tree_scores", self.dtype)
        if handle is None:
            return self._numpy_path(f"no numba kernel for {self.dtype}")
        self._iv, self._fv = self._packed(depths)
        self._no_has = np.zeros((0, 0), np.uint8)  # the kernel does not track what scored
        self.variant = f"{self._op_name}.numba"
        return handle

    def _numpy_path(self, reason: str | None) -> None:
        self.fast, self.fast_reason, self.variant = None, reason, f"{self._op_name}.numpy"

    def kernel(self):
        """The compiled walk (loading it on first use), or None for the numpy path."""
        if self._fn is None and self.fast is not None:
            if self.fast.ready():
                self._fn = self.fast.fn
            else:
                self._numpy_path(self.fast.reason)
        return self._fn

    def _depths(self) -> np.ndarray | None:
        """Interior levels on the longest path of each tree; None when a walk never ends
        (the frontier of (tree, node) pairs does not empty within the node count)."""
        m, width = self.n_internal, self.true_next.size
        depth = np.zeros(self.n_trees, dtype=np.int64)
        tree = np.arange(self.n_trees, dtype=np.int64)
        node = self.roots
        for level in range(1, m + 2):
            inner = node < m
            tree, node = tree[inner], node[inner]
            if tree.size == 0:
                return depth
            depth[tree] = level
            key = np.unique(np.concatenate([tree * width + self.true_next[node],
                                            tree * width + self.false_next[node]]))
            tree, node = key // width, key % width
        return None

    def _walk_kind(self) -> int:
        modes = set(self.mode[: self.n_internal].tolist())
        if modes <= {_LEQ}:
            return 2 if self.nan_special else 0
        if modes == {_LT}:
            return 3 if self.nan_special else 1
        return 4

    def _packed(self, depths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The int32 and float operands of `_numba_tree.tree_scores` (layout there)."""
        m, dt = self.n_internal, self.dtype
        aux = self.mode.copy()
        aux[m:] = 0
        aux |= (self.nan_next == self.true_next).astype(np.int64) << 3
        member_nodes = np.flatnonzero(self.mode[:m] == _MEMBER)
        aux[member_nodes] |= np.arange(member_nodes.size, dtype=np.int64) << 4
        nodes = np.stack([self.feature, self.true_next, self.false_next, aux], axis=1)
        # member values in the compare dtype: one that dt cannot hold never equals an input
        sets = [v[v.astype(dt).astype(_F64) == v].astype(dt) for v in self.member_sets]
        rows, cols = np.nonzero(self.leaf_has)
        n_leaves = self.leaf_has.shape[0]
        lptr = np.concatenate([[0], np.cumsum(np.bincount(rows, minlength=n_leaves))])
        lval = self.leaf_values[rows, cols].astype(dt)
        lval_at = self.threshold.size
        mem_at = lval_at + lval.size
        sizes = np.array([s.size for s in sets], dtype=np.int64)
        mptr = mem_at + np.concatenate([[0], np.cumsum(sizes)])
        parts = [nodes.reshape(-1), self.roots, depths, mptr, lptr, cols]
        offsets = np.cumsum([_HEADER] + [p.size for p in parts])[:-1]
        base = np.zeros(0, dt) if self.base is None else self.base
        # base mode: none, targets a leaf scored (all of them when every leaf scores all),
        # or all targets
        based = 0 if self.base is None else 2 if self.base_all or self._has_none() else 1
        header = [self._walk_kind(), _AGG_CODES[self.aggregate], self.n_trees, m, *offsets,
                  lval_at, int(not self._has_none()), int(mptr[-1]), based]
        iv = np.concatenate([np.asarray(header, np.int64), *parts])
        if iv.max(initial=0) > np.iinfo(_I32).max:
            raise ValueError(f"{self.op}: the ensemble is too large for the packed layout")
        fv = np.concatenate([self.threshold, lval, *sets, base]).astype(dt)
        iv = iv.astype(_I32)
        iv.flags.writeable = fv.flags.writeable = False
        return iv, fv

    # prediction

    def check_features(self, x: np.ndarray) -> None:
        if x.shape[1] < self.n_features:
            raise ValueError(
                f"{self.op}: X has {x.shape[1]} features but the trees read feature "
                f"{self.n_features - 1}"
            )

    def scores(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
        """Aggregated leaf weights [N, K] in X's dtype (X is [N, F] in the compare dtype)
        and, unless every leaf scores every target, which targets got a weight [N, K] bool
        (None means all)."""
        self.check_features(x)
        fast = self._bound or self.bound()
        return self._scores_numpy(x) if fast is None else fast(x)

    def bound(self):
        """`scores` on the numba path with everything but X bound (no checks: X is [N, F]
        with enough features, in the compare dtype), or None for the numpy path."""
        if self._bound is not None:
            return self._bound
        fn = self._fn or self.kernel()
        if fn is None:
            return None
        iv, fv, dt, k = self._iv, self._fv, self.dtype, self.leaf_values.shape[1]
        none = self._has_none()
        track = not none or self.aggregate in ("MIN", "MAX")
        give = not (none or self.base_all)
        no_has, zeros, contiguous, u8 = self._no_has, np.zeros, np.ascontiguousarray, np.uint8

        def scores(x: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
            n = x.shape[0]
            out = zeros((n, k), dt)
            has = zeros((n, k), u8) if track else no_has
            fn(contiguous(x), iv, fv, out, has)
            return out, (has.view(bool) if give else None)

        self._bound = scores
        return scores

    def _has_none(self) -> bool:
        """Whether every (sample, target) gets a weight: every leaf scores every target."""
        return self.all_has and self.n_trees > 0

    def leaves(self, x: np.ndarray) -> np.ndarray:
        """Leaf index reached in every tree: [N, T] int64 (the numpy walk)."""
        self.check_features(x)
        n, n_feat = x.shape
        trees = self.n_trees
        m = self.n_internal
        out = np.empty(n * trees, dtype=np.int64)
        if n * trees == 0:
            return out.reshape(n, trees)
        xf = np.ascontiguousarray(x).reshape(-1)
        node = np.tile(self.roots, n)
        pos = np.arange(n * trees)
        base = np.repeat(np.arange(n, dtype=np.int64) * n_feat, trees)
        check_nan = self.nan_special and x.dtype.kind == "f"
        for _ in range(m + 2):  # a path longer than the node count has a cycle
            done = node >= m
            n_done = int(np.count_nonzero(done))
            if n_done == node.size:
                out[pos] = node - m
                break
            if n_done * 4 > node.size:
                out[pos[done]] = node[done] - m
                keep = ~done
                node, pos, base = node[keep], pos[keep], base[keep]
            xv = xf[base + self.feature[node]]
            cond = self._compare(xv, node)
            nxt = np.where(cond, self.true_next[node], self.false_next[node])
            if check_nan:
                nan = np.isnan(xv)
                if nan.any():
                    nxt[nan] = self.nan_next[node[nan]]
            node = nxt
        else:
            raise ValueError(f"{self.op}: the trees contain a cycle (a node reaches itself)")
        return out.reshape(n, trees)

    def _compare(self, xv: np.ndarray, node: np.ndarray) -> np.ndarray:
        if len(self.modes_present) == 1:
            return self._cmp(self.modes_present[0], xv, node)
        mode = self.mode[node]
        cond = np.empty(node.shape[0], dtype=bool)
        for code in self.modes_present:
            sel = np.flatnonzero(mode == code)
            if sel.size:
                cond[sel] = self._cmp(code, xv[sel], node[sel])
        return cond

    def _cmp(self, code: int, xv: np.ndarray, node: np.ndarray) -> np.ndarray:
        if code == _MEMBER:
            keys = self.member_keys
            if keys is None or keys.size == 0:
                return np.zeros(node.shape[0], dtype=bool)
            q = node + 1j * xv.astype(_F64)
            pos = np.minimum(np.searchsorted(keys, q), keys.size - 1)
            return keys[pos] == q
        th = self.threshold[node]
        if code == _LEQ:
            return xv <= th
        if code == _LT:
            return xv < th
        return xv == th

    def _scores_numpy(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
        leaves = self.leaves(x)
        n, trees = leaves.shape
        dt, aggregate = x.dtype, self.aggregate
        if self._table is None:
            self._table = self.leaf_values.astype(dt)
        table = self._table
        k = table.shape[1]
        out = np.zeros((n, k), dtype=dt)
        has = None if self.all_has and trees else np.zeros((n, k), dtype=bool)
        if not trees:
            return self._add_base(out, has)
        step = max(1, _CHUNK // max(1, trees * k))
        for s in range(0, n, step):
            lv = leaves[s : s + step]
            vals = table[lv]  # [n, T, K]
            hv = self.leaf_has[lv] if has is not None else None
            if hv is not None:
                has[s : s + step] = hv.any(axis=1)
            if aggregate in ("SUM", "AVERAGE"):
                out[s : s + step] = np.cumsum(vals, axis=1)[:, -1]
            elif hv is None:
                out[s : s + step] = vals.min(axis=1) if aggregate == "MIN" else vals.max(axis=1)
            else:
                if aggregate == "MIN":
                    red = np.where(hv, vals, np.inf).min(axis=1)
                else:
                    red = np.where(hv, vals, -np.inf).max(axis=1)
                out[s : s + step] = np.where(hv.any(axis=1), red, 0.0)
        if aggregate == "AVERAGE":
            out /= dt.type(trees)
        return self._add_base(out, has)

    def _add_base(self, out: np.ndarray, has: np.ndarray | None):
        if self.base is None:
            return out, has
        if self.base_all:
            out += self.base
            return out, None
        # targets no leaf scored stay 0, without their base value
        out += self.base if has is None else np.where(has, self.base, out.dtype.type(0))
        return out, has


def leaf_table(
    n_leaves: int, k: int, leaf: np.ndarray, target: np.ndarray, weight: np.ndarray,
    aggregate: str, op: str,
) -> tuple[np.ndarray, np.ndarray]:
    """Dense [leaves, K] weights (several weights of one leaf and target combine by the
    aggregate) and the matching has-a-weight mask."""
    if target.size and (target.min() < 0 or target.max() >= k):
        raise ValueError(f"{op}: target/class id {int(target.max())} is out of range [0, {k})")
    values = np.zeros((n_leaves, k), dtype=_F64)
    has = np.zeros((n_leaves, k), dtype=bool)
    w = weight.astype(_F64)
    if k == 1:
        # onnxruntime's single-target trees keep each leaf's first weight (0 without one)
        rev = np.arange(leaf.size)[::-1]
        values[leaf[rev], 0] = w[rev]
        has[:] = True
        return values, has
    if aggregate in ("SUM", "AVERAGE"):
        np.add.at(values, (leaf, target), w)
    else:
        init = np.inf if aggregate == "MIN" else -np.inf
        values.fill(init)
        (np.minimum if aggregate == "MIN" else np.maximum).at(values, (leaf, target), w)
    has[leaf, target] = True
    values[~has] = 0.0
    return values, has
