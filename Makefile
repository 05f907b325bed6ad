# Every target makes and uses a project-local virtual environment by itself.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
TORCH_VERSION ?= 2.13.0
TF_VENV := .venv-tf
TF_VERSION ?= 2.21.0

.PHONY: bytecode test stress fuzz demo bench bench-plot bench-tf docs docs-serve lint typecheck proto clean

# The compiled modules (convoy.io._native, convoy.distribute._row_index and _sparse_rows) are
# built by the editable install: their sources rebuild them.
$(STAMP): pyproject.toml setup.py src/convoy/io/_native.cpp src/convoy/distribute/_row_index.cpp \
		src/convoy/distribute/_sparse_rows.cpp
	$(PYTHON) -m venv $(VENV)
	# The CPU build of PyTorch, pinned, first: an unpinned torch (torchdata asks for one)
	# resolves to a multi-GB CUDA build.
	$(PY) -m pip install --quiet 'torch==$(TORCH_VERSION)'
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

# Two test processes (pytest-xdist), each drawing its servers' ports from its own slice
# (convoy.testing.free_ports); TEST_WORKERS=0 runs the suite in this one process. Measured
# on 2 cores shared with other test runs (load 4-14): 27 minutes, 35 before the chaos, S3,
# full-disk and state tests were cut (about 19 on a quiet machine before the cuts).
TEST_WORKERS ?= 2

# Bytecode of the sources, refreshed where they changed: every server process a test, the demo
# or the bench starts imports convoy, and where PYTHONDONTWRITEBYTECODE is set (as in many
# containers) nothing else writes it, so each process compiled every module again: `import
# convoy` took 1.65 s rather than 0.97.
bytecode: $(STAMP)
	$(PY) -m compileall -q src

test: bytecode
	$(PY) -m pytest -q -n $(TEST_WORKERS) --durations=30

# The heavy test matrices in full (make test runs one case of each behaviour) and the stress
# tests longer: CONVOY_STRESS=n runs n times their epochs. See docs/architecture.md, "The tests".
STRESS ?= 5
stress: bytecode
	CONVOY_STRESS=$(STRESS) $(PY) -m pytest -q -n $(TEST_WORKERS) tests/torch \
		tests/distribute/test_convergence.py tests/chaos/test_full_disk.py \
		tests/chaos/test_chaos.py

# The parsers' fuzz test, longer, against a build of the compiled parser with AddressSanitizer
# and UndefinedBehaviorSanitizer (into build/fuzz; the installed one is left alone).
FUZZ_EXAMPLES ?= 20000
SANITIZER_RUNTIMES = $$(g++ -print-file-name=libasan.so) $$(g++ -print-file-name=libubsan.so)

fuzz: $(STAMP)
	CONVOY_SANITIZE=1 $(PY) setup.py -q build_ext --build-lib build/fuzz --build-temp build/fuzz-temp
	LD_PRELOAD="$(SANITIZER_RUNTIMES)" ASAN_OPTIONS=detect_leaks=0 \
		UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
		CONVOY_FUZZ_NATIVE="$$(ls build/fuzz/convoy/io/_native*.so)" \
		CONVOY_FUZZ_EXAMPLES=$(FUZZ_EXAMPLES) \
		$(PY) -m pytest -q -p no:xdist -p no:cacheprovider tests/io/test_parsing_fuzz.py

demo: bytecode
	$(PY) examples/demo.py
	$(PY) examples/resume.py
	$(PY) examples/recommend.py

bench: bytecode
	$(PY) bench/run.py

# The pictures of the newest bench/results/*.json, into docs/img (committed: the docs show them)
bench-plot: $(STAMP)
	$(PY) bench/plot.py

# The docs site, into site/; --strict fails on a broken link, a missing page or a reference to
# a name that does not exist. Offline: no web fonts, no external inventories.
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --quiet

docs-serve: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs serve

# TensorFlow for the side-by-side figures of `make bench`, in its own environment: bench/run.py
# runs TensorFlow's side of each workload with $(TF_VENV)/bin/python whenever it exists.
bench-tf: $(TF_VENV)/.installed

$(TF_VENV)/.installed:
	$(PYTHON) -m venv $(TF_VENV)
	$(TF_VENV)/bin/python -m pip install --quiet 'tensorflow-cpu==$(TF_VERSION)' numpy
	touch $@

lint: $(STAMP)
	$(VENV)/bin/ruff check src tests bench examples

typecheck: $(STAMP)
	$(VENV)/bin/mypy

clean:
	rm -rf $(VENV) .venv-tf build dist .pytest_cache site

proto: $(STAMP)
	$(PY) -m grpc_tools.protoc -Isrc --python_out=src --pyi_out=src src/convoy/data/service/service.proto
	$(PY) -m grpc_tools.protoc -Isrc --python_out=src --pyi_out=src src/convoy/io/tensor.proto \
		src/convoy/io/struct.proto src/convoy/io/snapshot.proto \
		src/convoy/io/example.proto
