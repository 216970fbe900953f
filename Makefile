# The two commands a newcomer runs: `make demo` and `make test`. Both install first when needed.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# Integration tests run real training subprocesses; two workers suit a 2-core machine.
PYTEST_ARGS ?= -n 2 --durations=30

.PHONY: install demo test lint typecheck bytecode native unit integration bench realworld \
	realworld-populate clean chromium

install: $(STAMP)

$(STAMP): pyproject.toml constraints.txt pth/torchdoctor.pth
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q -c constraints.txt -e '.[dev]'
	-$(BIN)/python -m torchdoctor.native  # the compiled module; without it the Python kernel
	touch $(STAMP)

demo: install
	$(BIN)/torchdoctor demo

lint: install
	$(BIN)/ruff check src tests benchmarks
	$(BIN)/ruff format --check src tests benchmarks

typecheck: install
	$(BIN)/mypy

test: lint typecheck bytecode native
	$(BIN)/python -m pytest $(PYTEST_ARGS) tests

# The compiled module: the C++ kernel that records python.collectives, sum_of_squares (once per
# torch version; see docs/distributed.md). The tests run collective tracing with it and with the
# Python kernel.
native: install
	$(BIN)/python -m torchdoctor.native

# With PYTHONDONTWRITEBYTECODE set (CI sets it) every training subprocess of the suite would
# compile torchdoctor's sources again (~0.3 s of CPU each, hundreds of them): compiled once here.
bytecode: install
	$(BIN)/python -m compileall -q src tests

unit: install
	$(BIN)/python -m pytest tests/unit

integration: bytecode native
	$(BIN)/python -m pytest $(PYTEST_ARGS) tests/integration

bench: native
	$(BIN)/python benchmarks/overhead.py
	$(BIN)/python benchmarks/gpu_overhead.py
	$(BIN)/python benchmarks/roundtrip.py
	$(BIN)/python benchmarks/nan_guard.py
	$(BIN)/python benchmarks/report.py
	$(BIN)/python benchmarks/ddp_overhead.py
	$(BIN)/python benchmarks/sum_of_squares.py
	$(BIN)/python benchmarks/doctor_share.py
	$(BIN)/python benchmarks/fork_child.py

# The scorecard on public training programs (docs/accuracy.md, ~15 min on 2 cores). The
# programs live in a cache that is never committed (~/.cache/torchdoctor/realworld, or
# TORCHDOCTOR_REALWORLD_CACHE); realworld-populate fills it from local mirrors of their
# repositories (/work/.mirror, made by the search tool's fetch). Without it, realworld says so.
realworld: native
	$(BIN)/python benchmarks/realworld.py

realworld-populate: install
	$(BIN)/python benchmarks/realworld.py --populate

# Headless Chromium (Debian's package) for the test that renders the HTML report; without it
# that test skips and says why.
chromium:
	command -v chromium >/dev/null || \
	  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium)

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache torchdoctor-runs
