"""The repository's documentation: generated tables up to date, examples that run, paths that
exist, and nothing pointing outside the repository. (`make docs`, part of `make test`,
builds the site with warnings as errors.)"""

from __future__ import annotations

import importlib.util
import re
import subprocess
from pathlib import Path

import onnx
import pytest

from onnxkiln import zoo

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", ROOT / "BENCHMARKS.md", *sorted((ROOT / "docs").glob("*.md"))]

# Written in two parts so that this file does not match itself.
OUTSIDE = re.compile("|".join([
    re.escape("../" + "shared"), re.escape("/work/" + "shared"),
    "SP" + r"EC\s*(§|section|\d)", "SP" + r"EC\.md", "DES" + r"IGN\.md", "STY" + r"LE\.md",
]))


def _repository_files() -> list[Path]:
    listed = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"],
                            cwd=ROOT, capture_output=True, text=True, check=True).stdout
    return [ROOT / name for name in listed.splitlines() if (ROOT / name).is_file()]


def test_no_file_refers_outside_the_repository():
    found = []
    for path in _repository_files():
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue  # binary files (models, images)
        for n, line in enumerate(text.splitlines(), 1):
            if OUTSIDE.search(line):
                found.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()}")
    assert not found, "references to notes outside the repository:\n" + "\n".join(found)


def test_pages_speak_of_the_projects_own_targets():
    said = [f"{p.name}: {line.strip()}" for p in PAGES for line in p.read_text().splitlines()
            if re.search(r"\bthe issue\b", line, re.IGNORECASE)]
    assert not said


def test_paths_the_pages_name_exist():
    path = re.compile(r"`((?:docs|examples|scripts|bench|src|tests|\.ci)/[\w./-]+\.(?:md|py|sh))`")
    missing = [f"{p.name}: {m}" for p in PAGES for m in path.findall(p.read_text())
               if not (ROOT / m).exists() and not (ROOT / "docs" / m).exists()]
    assert not missing


def test_docs_pages_are_in_the_site_navigation():
    nav = (ROOT / "mkdocs.yml").read_text()
    pages = {p.name for p in (ROOT / "docs").glob("*.md")}
    assert pages == set(re.findall(r":\s*([\w-]+\.md)\s*$", nav, re.MULTILINE))


def test_kernel_table_is_up_to_date():
    pytest.importorskip("torch")  # the CUDA provider's registry imports torch
    spec = importlib.util.spec_from_file_location("gen_kernels", ROOT / "scripts/gen_kernels.py")
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    text = gen.render()
    assert (ROOT / "docs/kernels.md").read_text() == text, \
        "docs/kernels.md is stale: run python scripts/gen_kernels.py"
    assert "| ai.onnx | Gelu | 20+ | 20+ |" in text and "| com.microsoft | Gelu | 1+ | 1+ |" in text
    assert "| onnxkiln.fuse | FusedPartition |  |  | 1+ |" in text


def _first_python_block(page: Path) -> str:
    return re.search(r"```python\n(.*?)```", page.read_text(), re.DOTALL).group(1)


def test_compat_page_example_runs(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    onnx.save(zoo.mlp(), "model.onnx")
    scope: dict = {}
    exec(compile(_first_python_block(ROOT / "docs/compat.md"), "compat.md", "exec"), scope)
    assert scope["probs"].shape == (4, 10)
    assert scope["x"].name == "x" and scope["x"].type == "tensor(float)"


def test_capture_decode_page_example_runs():
    scope: dict = {}
    exec(compile(_first_python_block(ROOT / "docs/capture-decode.md"), "capture-decode.md",
                 "exec"), scope)
    assert scope["ids"].shape == (1, 1)
    assert scope["session"].decode_memo_counts()[2] >= 3  # the one-token steps replayed the memo
