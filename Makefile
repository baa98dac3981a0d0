# Two commands do everything on a fresh clone: `make demo` and `make test`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test lint docs bench bench-models bench-exported clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test]'
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/onnxkiln demo

# ruff, and the import contracts between the layers (no provider imports another; ops/
# imports no provider): tests/test_layers.py, which the full suite runs too.
lint: $(STAMP)
	$(VENV)/bin/ruff check src tests bench scripts examples
	$(PY) -m pytest tests/test_layers.py

# The documentation site (mkdocs + mkdocstrings) into build/site; any warning fails it.
docs: $(STAMP)
	$(VENV)/bin/mkdocs build --strict --quiet

test: $(STAMP) lint docs
	$(PY) -m pytest -n 2 --dist loadfile tests

bench: $(STAMP)
	$(PY) -m bench

# The exported-model suite: torchvision/transformers/skl2onnx exports need torch 2.14.1 with
# torchvision 0.29.1, which do not import beside the project's CPU torch: their own venv.
EXPORT_VENV := .venv-export
EXPORT_STAMP := $(EXPORT_VENV)/.installed
EXPORT_PACKAGES := torch==2.14.1 torchvision==0.29.1 transformers onnxscript onnx skl2onnx scikit-learn

$(EXPORT_STAMP):
	$(PYTHON) -m venv $(EXPORT_VENV)
	$(EXPORT_VENV)/bin/python -m pip install -q --upgrade pip
	$(EXPORT_VENV)/bin/python -m pip install -q $(EXPORT_PACKAGES)
	touch $(EXPORT_STAMP)

bench-models: $(EXPORT_STAMP)
	$(EXPORT_VENV)/bin/python -m bench.exported.build --out bench/models

bench-exported: $(STAMP) bench-models
	$(PY) -m bench --suite exported --threads 1,2

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .ruff_cache
