"""Import contracts that keep onnxkiln's layers apart, read from the source with `ast` (so
imports inside functions count too): no provider imports another, the provider-neutral
`onnxkiln.ops` imports no provider (but the shared `providers.base`) nor the session, and
the imports executed at module level form no cycle."""

from __future__ import annotations

import ast
from dataclasses import dataclass
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src"
PACKAGE = SRC / "onnxkiln"
PROVIDERS = "onnxkiln.providers"
SHARED = frozenset({PROVIDERS, f"{PROVIDERS}.base", f"{PROVIDERS}.capture_safe"})
"""providers/__init__.py, base.py and capture_safe.py belong to every provider, not to one."""
OPS_MAY_NOT = ("onnxkiln.session", "onnxkiln.executor")


@dataclass(frozen=True)
class Import:
    source: str  # the importing module
    path: Path
    line: int
    target: str  # the module imported (a submodule when `from package import submodule`)
    module_level: bool  # executed when the importing module is (not in a function body)

    def where(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line} imports {self.target}"


def _within(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


@cache
def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _resolve(node: ast.ImportFrom, module: str, is_package: bool) -> str:
    """The absolute module a `from ... import` names (relative imports resolved)."""
    if not node.level:
        return node.module or ""
    base = module.split(".")
    base = base if is_package else base[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join([*base, node.module] if node.module else base)


def _targets(node: ast.Import | ast.ImportFrom, module: str, is_package: bool) -> list[str]:
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    origin = _resolve(node, module, is_package)
    known = _modules()
    out = [f"{origin}.{a.name}" for a in node.names if f"{origin}.{a.name}" in known]
    if len(out) < len(node.names):  # some names are attributes of `origin` itself
        out.append(origin)
    return out


def _walk(node: ast.AST, in_function: bool, typing_only: bool):
    """(import node, executed at module level) for every import under `node`."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, (ast.Import, ast.ImportFrom)):
            yield child, not (in_function or typing_only)
        elif isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            yield from _walk(child, True, typing_only)
        elif isinstance(child, ast.If) and _is_type_checking(child.test):
            for stmt in child.body:
                yield from _walk(ast.Module(body=[stmt], type_ignores=[]), in_function, True)
            for stmt in child.orelse:
                yield from _walk(ast.Module(body=[stmt], type_ignores=[]), in_function,
                                 typing_only)
        else:
            yield from _walk(child, in_function, typing_only)


@cache
def _imports() -> tuple[Import, ...]:
    found = []
    for module, path in _modules().items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for node, module_level in _walk(tree, False, False):
            targets = _targets(node, module, path.name == "__init__.py")
            found.extend(Import(module, path, node.lineno, target, module_level)
                         for target in targets if _within(target, "onnxkiln"))
    return tuple(found)


def _provider(module: str) -> str | None:
    """The provider package (`onnxkiln.providers.cpu`...) a module belongs to, if any."""
    if not _within(module, PROVIDERS) or module in SHARED:
        return None
    return ".".join(module.split(".")[:3])


def test_the_scanner_sees_imports_in_functions_and_both_forms():
    tree = ast.parse("import onnxkiln.a\nfrom onnxkiln import b\n"
                     "def f():\n    from onnxkiln.c import d\n"
                     "if TYPE_CHECKING:\n    import onnxkiln.e\n")
    seen = [(type(n).__name__, n.lineno, top) for n, top in _walk(tree, False, False)]
    assert seen == [("Import", 1, True), ("ImportFrom", 2, True), ("ImportFrom", 4, False),
                    ("Import", 6, False)]
    assert any(i.target.startswith("onnxkiln.providers.") for i in _imports())


def test_no_provider_imports_another_provider():
    bad = [f"{i.where()}: {_provider(i.source)} must not import {_provider(i.target)}"
           for i in _imports()
           if _provider(i.source) and _provider(i.target)
           and _provider(i.source) != _provider(i.target)]
    assert not bad, ("a provider imports another; move what they share (op semantics, host "
                     "numerics) into onnxkiln/ops/:\n" + "\n".join(bad))


def test_ops_import_no_provider_and_no_session():
    bad = []
    for i in _imports():
        if not _within(i.source, "onnxkiln.ops"):
            continue
        provider = _within(i.target, PROVIDERS) and not _within(i.target, f"{PROVIDERS}.base")
        if provider or any(_within(i.target, m) for m in OPS_MAY_NOT):
            bad.append(i.where())
    assert not bad, ("onnxkiln.ops is provider-neutral: it may import onnxkiln.providers.base "
                     "only, and never the session or executor:\n" + "\n".join(bad))


def _cycle(graph: dict[str, dict[str, Import]]) -> list[Import] | None:
    """One cycle of module-level imports (as the imports that close it), or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[Import] = []

    def visit(module: str) -> list[Import] | None:
        state[module] = 1
        for target, imp in sorted(graph.get(module, {}).items()):
            if state.get(target) == 1:  # back to a module on the path: the cycle closes
                start = next(k for k, e in enumerate(path) if e.source == target)
                return [*path[start:], imp]
            if target not in state:
                path.append(imp)
                found = visit(target)
                if found:
                    return found
                path.pop()
        state[module] = 2
        return None

    for module in sorted(graph):
        if module not in state:
            found = visit(module)
            if found:
                return found
    return None


def test_the_cycle_finder_names_the_imports_that_close_a_cycle():
    def edge(a: str, b: str) -> Import:
        return Import(a, SRC / f"{a}.py", 1, b, True)

    graph = {"a": {"b": edge("a", "b")}, "b": {"c": edge("b", "c")},
             "c": {"a": edge("c", "a")}, "d": {"a": edge("d", "a")}}
    assert [(i.source, i.target) for i in _cycle(graph)] == [("a", "b"), ("b", "c"), ("c", "a")]
    del graph["c"]["a"]
    assert _cycle(graph) is None


def test_module_level_imports_have_no_cycle():
    graph: dict[str, dict[str, Import]] = {}
    known = _modules()
    for i in _imports():
        if i.module_level and i.target in known and i.target != i.source:
            graph.setdefault(i.source, {}).setdefault(i.target, i)
    cycle = _cycle(graph)
    assert cycle is None, ("module-level imports form a cycle (import one side inside the "
                           "function that needs it, or move the shared part):\n"
                           + "\n".join(i.where() for i in cycle))
