# Every target makes and uses a project-local virtual environment by itself.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: test demo bench lint proto clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

test: $(STAMP)
	$(PY) -m pytest -q

demo: $(STAMP)
	$(PY) examples/demo.py

bench: $(STAMP)
	$(PY) bench/run.py

lint: $(STAMP)
	$(VENV)/bin/ruff check src tests bench examples

clean:
	rm -rf $(VENV) build dist .pytest_cache

proto: $(STAMP)
	$(PY) -m grpc_tools.protoc -Isrc --python_out=src --pyi_out=src src/convoy/data/service/service.proto
