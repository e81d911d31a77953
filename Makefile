# Everything a newcomer runs goes through here. The virtualenv lives in .venv/.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
OUT    ?= out/sample

.PHONY: help venv demo test lint clean

help:
	@echo "make demo   set up .venv and run the bucketed job on the bundled sample into $(OUT)"
	@echo "make test   set up .venv and run the test suite"
	@echo "make lint   ruff over the code"

$(VENV)/.installed: pyproject.toml setup.py
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test]'
	touch $@

venv: $(VENV)/.installed

demo: venv
	$(VENV)/bin/pretokenize bucketed --input tests/data/finepdfs_sample.parquet --output $(OUT) --runner=FnApiRunner

test: venv
	$(PY) -m pytest -q

lint: venv
	$(VENV)/bin/ruff check .

clean:
	rm -rf $(VENV) out .pytest_cache
