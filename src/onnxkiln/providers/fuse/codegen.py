"""Code generation for fused partitions, and the kernel that runs the generated code.

`generate(program, backend)` turns a partition's program (analysis.build_program) into a
context blob: the generated numpy source (always), the numba source (backend "numba"), the
type signature and the format version. `FusedKernel(blob)` only executes that source: no
analysis, no generation (`CODEGEN_CALLS` counts generations, for tests).

All arithmetic runs in float32 (numpy) or float64 (numba loops) whatever the partition's
float types; float16 values are widened on entry and rounded once, at the outputs.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import sys
import threading
from pathlib import Path
from typing import Any

import numpy as np

from onnxkiln.ops import special
from onnxkiln.providers.base import report_variant
from onnxkiln.providers.fuse.ops import OPS, REDUCTIONS, fmt

__all__ = ["CODEGEN_CALLS", "FORMAT", "VERSION", "FusedKernel", "generate", "numba_available"]

FORMAT = "onnxkiln.fuse"
VERSION = 1
CODEGEN_CALLS = [0]  # generations in this process (a list so tests can read it live)
_F32 = np.dtype(np.float32)
_NB_RANK = 4
_jit_cache: dict[str, Any] = {}
CACHE_ENV = "ONNXKILN_FUSE_CACHE"
_jit_lock = threading.Lock()


def numba_available() -> str | None:
    """None when numba can be imported, else why not."""
    try:
        import numba  # noqa: F401
    except ImportError as e:  # pragma: no cover - depends on the environment
        return f"numba is not installed ({e}); install the 'fuse' extra"
    return None


def generate(program: dict, backend: str) -> dict:
    """The context blob (as a dict) for a program; backend "numba" or "numpy"."""
    CODEGEN_CALLS[0] += 1
    numba_src = _numba_source(program) if backend == "numba" else None
    return {
        "format": FORMAT,
        "version": VERSION,
        "backend": "numba" if numba_src else "numpy",
        "signature": {
            "inputs": [i["dtype"] for i in program["inputs"]],
            "const_shapes": [c["shape"] for c in program["consts"]],
            "outputs": [{k: o[k] for k in ("name", "dtype", "deps_i", "deps_c")}
                        for o in program["outputs"]],
            "reduce_output": next((j for j, o in enumerate(program["outputs"])
                                   if program["ops"][o["temp"]]["reduce"]), None),
        },
        "ops": [f"{op['op']}" for op in program["ops"]],
        "numpy_source": _numpy_source(program),
        "numba_source": numba_src,
    }


# ---------------------------------------------------------------------------------- numpy

def _header(program: dict) -> list[str]:
    lines = []
    for k, c in enumerate(program["consts"]):
        lines.append(f"K{k} = np.float32({fmt(c['value'])})")
        lines.append(f"C{k} = np.full({tuple(c['shape'])!r}, K{k})")
    return lines


def _numpy_source(program: dict) -> str:
    """Two functions: `fast` (every output full-shape, scratch buffers given) and `general`."""
    ops, outs = program["ops"], program["outputs"]
    n_in = len(program["inputs"])
    out_of = {o["temp"]: j for j, o in enumerate(outs)}
    last = _last_uses(ops)
    free: list[int] = []
    n_slots = 0
    where: dict[int, str] = {}
    fast: list[str] = []
    general: list[str] = []
    for k, op in enumerate(ops):
        if k in out_of:
            dest = f"o{out_of[k]}"
        else:
            if not free:
                free.append(n_slots)
                n_slots += 1
            dest = f"s[{free.pop()}]"
        where[k] = dest
        args_f = [_np_arg(a, where, fast=True) for a in op["args"]]
        args_g = [_np_arg(a, None, fast=False) for a in op["args"]]
        spec = REDUCTIONS[op["op"]] if op["reduce"] else OPS[op["op"]]
        fast += spec.np_lines(dest, args_f, op["attrs"])
        shape_of = args_g[:1] if op["reduce"] else [a for a in args_g if a is not None]
        general.append(f"t{k} = np.empty(np.broadcast_shapes("
                       f"{', '.join(f'np.shape({a})' for a in shape_of)}), F32)")
        general += spec.np_lines(f"t{k}", args_g, op["attrs"])
        dying = {a[1] for a in op["args"] if a[0] == "t" and last[a[1]] == k}
        free += sorted(int(where[t][2:-1]) for t in dying if t not in out_of)
    ins = ", ".join(f"i{j}" for j in range(n_in))
    outs_s = ", ".join(f"o{j}" for j in range(len(outs)))
    src = ["import numpy as np", *_header(program), f"N_SCRATCH = {n_slots}",
           f"def fast({ins}{', ' if ins else ''}{outs_s}, s):"]
    src += [f"    {line}" for line in fast or ["pass"]]
    src.append(f"def general({ins}):")
    src += [f"    {line}" for line in general]
    results = ", ".join(f"t{o['temp']}" for o in outs)
    src.append(f"    return ({results},)")
    return "\n".join(src) + "\n"


def _np_arg(a: list, where: dict[int, str] | None, fast: bool) -> str | None:
    kind = a[0]
    if kind == "n":
        return None
    if kind == "i":
        return f"i{a[1]}"
    if kind == "c":
        return f"K{a[1]}" if fast else f"C{a[1]}"
    return where[a[1]] if where is not None else f"t{a[1]}"


def _last_uses(ops: list[dict]) -> dict[int, int]:
    last = {}
    for k, op in enumerate(ops):
        for a in op["args"]:
            if a[0] == "t":
                last[a[1]] = k
    return last


# ---------------------------------------------------------------------------------- numba

def _numba_source(program: dict) -> str | None:
    """A rank-4 loop nest computing every output; None when an op has no scalar form."""
    ops, outs = program["ops"], program["outputs"]
    if any(not op["reduce"] and OPS[op["op"]].nb_expr is None for op in ops):
        return None
    idx = "a0, a1, a2, a3"
    float_in = [i["dtype"] in ("FLOAT", "FLOAT16") for i in program["inputs"]]
    consts = [fmt(c["value"]) for c in program["consts"]]

    def arg(a: list) -> str | None:
        kind = a[0]
        if kind == "n":
            return None
        if kind == "i":
            return f"x{a[1]}"
        return consts[a[1]] if kind == "c" else f"t{a[1]}"

    def full(a: list) -> str:  # an operand read in the row loops (scale, bias)
        if a[0] == "i":
            return (f"float(i{a[1]}[{idx}])" if float_in[a[1]] else f"i{a[1]}[{idx}]")
        return consts[a[1]]

    red = next((k for k, op in enumerate(ops) if op["reduce"]), None)
    used = sorted({a[1] for k, op in enumerate(ops) if k != red for a in op["args"]
                   if a[0] == "i"} | ({ops[red]["args"][0][1]} if red is not None
                                      and ops[red]["args"][0][0] == "i" else set()))
    body = [f"x{j} = float(i{j}[{idx}])" if float_in[j] else f"x{j} = i{j}[{idx}]"
            for j in used]
    for k, op in enumerate(ops):
        if k == red:
            continue
        body.append(f"t{k} = {OPS[op['op']].nb_expr([arg(a) for a in op['args']], op['attrs'])}")
    for j, o in enumerate(outs):
        if o["temp"] != red:
            body.append(f"o{j}[{idx}] = t{o['temp']}")
    n_in = len(program["inputs"])
    params = ", ".join([*(f"i{j}" for j in range(n_in)), *(f"o{j}" for j in range(len(outs)))])
    src = ["import math", "import numpy as np"]
    if any("_f16(" in line for line in body):
        src += _F16_ROUND
    src += [f"def kernel({params}):", "    n0, n1, n2, n3 = o0.shape"]
    if red is not None:
        src.append("    r = np.empty(n3, np.float64)")
    src += ["    for a0 in range(n0):", "        for a1 in range(n1):",
            "            for a2 in range(n2):"]
    pad = " " * 16
    if red is None:
        src.append(f"{pad}for a3 in range(n3):")
        src += [f"{pad}    {line}" for line in body]
    else:
        op = ops[red]
        src.append(f"{pad}for a3 in range(n3):")
        src += [f"{pad}    {line}" for line in body]
        src.append(f"{pad}    r[a3] = {arg(op['args'][0])}")
        dest = next(f"o{j}" for j, o in enumerate(outs) if o["temp"] == red)
        src += [f"{pad}{line}" for line in _row_code(op, dest, idx, full)]
    return "\n".join(src) + "\n"


_F16_ROUND = [  # float16 rounding (nearest even, overflow to inf) in float64 arithmetic
    "import numba",
    "@numba.njit(inline='always')",
    "def _f16(x):",
    "    if x == 0.0 or not np.isfinite(x):",
    "        return x",
    "    e = math.frexp(x)[1]",
    "    q = 2.0 ** max(e - 11, -24)",
    "    y = np.rint(x / q) * q",
    "    if abs(y) > 65504.0:",
    "        return math.copysign(np.inf, y)",
    "    return y",
]


def _row_code(op: dict, dest: str, idx: str, full: Any) -> list[str]:
    name, at, args = op["op"], op["attrs"], op["args"]
    if name == "Softmax":
        return ["m = -np.inf", "for a3 in range(n3):", "    m = max(m, r[a3])",
                "z = 0.0", "for a3 in range(n3):", "    e = np.exp(r[a3] - m)",
                "    r[a3] = e", "    z += e", "for a3 in range(n3):",
                f"    {dest}[{idx}] = r[a3] / z"]
    eps = fmt(float(at["epsilon"]))
    scale = full(args[1])
    bias = full(args[2]) if len(args) > 2 and args[2][0] != "n" else None
    if name == "LayerNormalization":
        lines = ["m = 0.0", "for a3 in range(n3):", "    m += r[a3]", "m /= max(n3, 1)",
                 "v = 0.0", "for a3 in range(n3):", "    d = r[a3] - m", "    r[a3] = d",
                 "    v += d * d"]
    else:
        lines = ["v = 0.0", "for a3 in range(n3):", "    v += r[a3] * r[a3]"]
    lines += [f"inv = 1.0 / np.sqrt(v / max(n3, 1) + {eps})", "for a3 in range(n3):",
              f"    {dest}[{idx}] = r[a3] * inv * {scale}" + (f" + {bias}" if bias else "")]
    return lines


def cache_dir() -> Path | None:
    """Where compiled numba loops are kept between processes: $ONNXKILN_FUSE_CACHE ("" or
    "0": nowhere), else $XDG_CACHE_HOME/onnxkiln/fuse (default ~/.cache/onnxkiln/fuse)."""
    env = os.environ.get(CACHE_ENV)
    if env is not None:
        return None if env in ("", "0") else Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "onnxkiln" / "fuse"


def _load_source(source: str, key: str, use_cache: bool = True) -> tuple[dict[str, Any], bool]:
    """The generated module's namespace; from a file in the cache folder when possible, so
    numba can cache its machine code there (returns whether it is file-backed)."""
    folder = cache_dir() if use_cache else None
    if folder is not None:
        try:
            folder.mkdir(parents=True, exist_ok=True)
            path = folder / f"k_{key[:32]}.py"
            if not path.exists() or path.read_text() != source:
                tmp = path.with_suffix(f".{os.getpid()}.tmp")
                tmp.write_text(source)
                tmp.replace(path)
            name = f"onnxkiln_fuse_k_{key[:32]}"
            spec = importlib.util.spec_from_file_location(name, path)
            module = importlib.util.module_from_spec(spec)
            sys.modules[name] = module  # numba's cache re-imports it by name
            spec.loader.exec_module(module)
            return vars(module), True
        except OSError:  # read-only home, full disk: compile in memory instead
            pass
    scope: dict[str, Any] = {}
    exec(compile(source, f"<onnxkiln.fuse {key[:12]}>", "exec"), scope)
    return scope, False


def _jit(source: str, in_dtypes: list[np.dtype], n_out: int) -> Any:
    """The numba dispatcher for a source, compiled once per process (shared by partitions)
    and, through the cache folder, once per machine."""
    key = hashlib.sha256(f"{source}|{in_dtypes}|{n_out}".encode()).hexdigest()
    with _jit_lock:
        fn = _jit_cache.get(key)
        if fn is None:
            import numba
            from numba import types

            ins = [types.Array(numba.from_dtype(d), _NB_RANK, "A", readonly=True)
                   for d in in_dtypes]
            outs = [types.Array(types.float32, _NB_RANK, "A")] * n_out
            sig = types.void(*ins, *outs)
            scope, on_disk = _load_source(source, key)
            try:
                fn = numba.njit(sig, nogil=True, error_model="numpy", cache=on_disk)(
                    scope["kernel"])
            except Exception:  # a stale or unreadable cache entry: compile in memory
                if not on_disk:
                    raise
                scope, _ = _load_source(source, key, use_cache=False)
                fn = numba.njit(sig, nogil=True, error_model="numpy")(scope["kernel"])
            _jit_cache[key] = fn
        return fn


class FusedKernel:
    """Runs a partition from its context blob; `variant` says which generated code ran."""

    def __init__(self, blob: dict, use_numba: bool = True) -> None:
        if blob.get("format") != FORMAT or blob.get("version") != VERSION:
            raise ValueError(f"not a {FORMAT} v{VERSION} context blob "
                             f"(format {blob.get('format')!r}, version {blob.get('version')!r})")
        sig = blob["signature"]
        scope: dict[str, Any] = {"_erf": special.erf, "_expit": special.expit, "F32": _F32}
        exec(compile(blob["numpy_source"], "<onnxkiln.fuse numpy>", "exec"), scope)
        self._fast, self._general = scope["fast"], scope["general"]
        self._n_scratch = scope["N_SCRATCH"]
        self._in_f16 = [d == "FLOAT16" for d in sig["inputs"]]
        self._float_in = [d in ("FLOAT", "FLOAT16") for d in sig["inputs"]]
        self._cshapes = [tuple(s) for s in sig["const_shapes"]]
        self._outs = sig["outputs"]
        self._out_dtypes = [np.dtype(np.float16 if o["dtype"] == "FLOAT16" else np.float32)
                            for o in self._outs]
        self._reduce = sig["reduce_output"]
        self._nb_source = blob.get("numba_source") if use_numba else None
        if self._nb_source and numba_available() is not None:
            self._nb_source = None
        self._nb = None
        self._local = threading.local()
        self._plans: dict[tuple, tuple] = {}
        self.variant = "fuse.numba" if self._nb_source else "fuse.numpy"
        self.variant_reason = None

    def __call__(self, *xs: np.ndarray) -> tuple[np.ndarray, ...]:
        arrs = [x.astype(_F32) if f16 else x for x, f16 in zip(xs, self._in_f16)]
        shapes = tuple(a.shape for a in arrs)
        plan = self._plans.get(shapes)
        if plan is None:
            plan = self._plan(shapes)
        full, out_shapes, mode = plan
        if mode == "general":
            return self._finish(self._general(*arrs), None)
        bufs = [np.empty(full, _F32) for _ in self._outs]
        if mode == "numba":
            self._run_numba(arrs, bufs, full)
        else:
            self._fast(*arrs, *bufs, self._scratch(full))
        report_variant(f"fuse.{mode}")
        return self._finish(bufs, out_shapes, full)

    def _plan(self, shapes: tuple) -> tuple:
        """(iteration shape, output shapes, "numba" | "numpy" | "general") for input shapes."""
        full = np.broadcast_shapes(*shapes, *self._cshapes)
        out_shapes = [np.broadcast_shapes(*(shapes[i] for i in o["deps_i"]),
                                          *(self._cshapes[c] for c in o["deps_c"]))
                      for o in self._outs]
        r = self._reduce
        if r is not None and out_shapes[r][-1:] != full[-1:]:
            mode = "general"  # the row the reduction reads is broadcast along its own axis
        elif self._nb_source and len(full) <= _NB_RANK and 0 not in full:
            mode = "numba"
        else:
            mode = "numpy"
        plan = (full, [None if s == full else s for s in out_shapes], mode)
        if len(self._plans) < 64:
            self._plans[shapes] = plan
        return plan

    def _run_numba(self, arrs: list[np.ndarray], bufs: list[np.ndarray], full: tuple) -> None:
        if self._nb is None:
            dts = [np.dtype(_F32) if f else a.dtype for a, f in zip(arrs, self._float_in)]
            self._nb = _jit(self._nb_source, dts, len(bufs))
        shape4 = (1,) * (_NB_RANK - len(full)) + tuple(full)
        ins = [np.broadcast_to(a.reshape((1,) * (_NB_RANK - a.ndim) + a.shape), shape4)
               for a in arrs]
        self._nb(*ins, *(b.reshape(shape4) for b in bufs))

    def _scratch(self, full: tuple) -> list[np.ndarray]:
        cache = getattr(self._local, "cache", None)
        if cache is None:
            cache = self._local.cache = {}
        bufs = cache.get(full)
        if bufs is None:
            if len(cache) >= 4:
                cache.pop(next(iter(cache)))
            bufs = cache[full] = [np.empty(full, _F32) for _ in range(self._n_scratch)]
        return bufs

    def _finish(self, bufs: Any, out_shapes: list | None, full: tuple = ()) -> tuple:
        res = []
        for j, b in enumerate(bufs):
            if out_shapes is not None and out_shapes[j] is not None:
                b = _extract(b, out_shapes[j])
            dt = self._out_dtypes[j]
            res.append(b if b.dtype == dt else b.astype(dt))
        return tuple(res)


def _extract(buf: np.ndarray, shape: tuple) -> np.ndarray:
    """The part of a full-shape result that a smaller (broadcast-compatible) output holds."""
    lead = buf.ndim - len(shape)
    idx = (0,) * lead + tuple(0 if s == 1 and f != 1 else slice(None)
                              for s, f in zip(shape, buf.shape[lead:]))
    return np.ascontiguousarray(buf[idx]).reshape(shape)


def dumps(blob: dict) -> bytes:
    """The blob's bytes (UTF-8 JSON, so it also fits an ONNX string attribute)."""
    return json.dumps(blob, sort_keys=True).encode()


def loads(data: bytes | str) -> dict:
    """A blob dict from its bytes; ValueError when it is not one."""
    try:
        blob = json.loads(data)
    except (ValueError, UnicodeDecodeError) as e:
        raise ValueError(f"fuse context blob is not valid JSON: {e}") from e
    if not isinstance(blob, dict):
        raise ValueError("fuse context blob is not a JSON object")
    return blob
