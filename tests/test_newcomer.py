"""A newcomer's first hour: `pip install .` with no extras into a fresh virtual environment,
then the README's snippet and the command line on a model built in code.

The install reaches the package index (about a minute with pip's cache cold). The
environment must come out without numba, scipy, torch or onnxruntime: the base install
is the numpy runtime alone.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import venv
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
OPTIONAL = ("numba", "scipy", "torch", "onnxruntime", "mkdocs")


def _readme_snippet() -> str:
    return re.search(r"```python\n(.*?)```", (ROOT / "README.md").read_text(), re.DOTALL).group(1)


def _clean_env() -> dict[str, str]:
    drop = ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME", "ONNXKILN_NO_NUMBA")
    return {k: v for k, v in os.environ.items() if k not in drop}


@pytest.fixture(scope="module")
def fresh(tmp_path_factory) -> Path:
    """A virtual environment holding `pip install .` of a copy of the source, no extras."""
    base = tmp_path_factory.mktemp("newcomer")
    source = base / "source"
    shutil.copytree(ROOT / "src", source / "src",
                    ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    env_dir = base / "venv"
    venv.create(env_dir, with_pip=True)
    python = env_dir / "bin" / "python"
    done = subprocess.run([str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check",
                           str(source)], capture_output=True, text=True, timeout=900,
                          env=_clean_env())
    assert done.returncode == 0, f"pip install . failed:\n{done.stdout}\n{done.stderr}"
    return env_dir


def _run(fresh: Path, args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    done = subprocess.run(args, cwd=cwd, capture_output=True, text=True, timeout=300,
                          env=_clean_env())
    assert done.returncode == 0, f"{' '.join(args)} failed:\n{done.stdout}\n{done.stderr}"
    return done


def test_base_install_has_no_optional_dependency(fresh, tmp_path):
    probe = ("import importlib.util, sys; import onnxkiln; "
             f"print([m for m in {OPTIONAL!r} if importlib.util.find_spec(m)])")
    done = _run(fresh, [str(fresh / "bin/python"), "-c", probe], tmp_path)
    assert done.stdout.strip() == "[]"


def test_readme_snippet_runs(fresh, tmp_path):
    (tmp_path / "snippet.py").write_text(_readme_snippet())
    done = _run(fresh, [str(fresh / "bin/python"), "snippet.py"], tmp_path)
    assert "(4, 10)" in done.stdout
    assert (tmp_path / "model.onnx").is_file()


@pytest.mark.parametrize("command", [
    ["info", "model.onnx"],
    ["check", "model.onnx"],
    ["run", "model.onnx", "--repeat", "2"],
    ["profile", "model.onnx", "--runs", "2"],
    ["bench", "model.onnx"],
    ["demo"],
])
def test_cli_commands_run(fresh, tmp_path, command):
    make = "import onnx; from onnxkiln import zoo; onnx.save(zoo.mlp(), 'model.onnx')"
    _run(fresh, [str(fresh / "bin/python"), "-c", make], tmp_path)
    done = _run(fresh, [str(fresh / "bin/onnxkiln"), *command], tmp_path)
    assert done.stdout.strip()


def test_bench_says_onnxruntime_is_needed(monkeypatch, capsys):
    import importlib.util

    from bench import __main__ as bench_main

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "onnxruntime" else real(name, *a))
    assert bench_main.run_main(["--quick"]) == 2
    err = capsys.readouterr().err
    assert "onnxruntime" in err and "onnxkiln[bench]" in err

