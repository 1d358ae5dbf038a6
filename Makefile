# The two commands of the README: `make demo` and `make test`. Works on a fresh Linux machine.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
# torch is pinned here so pip never resolves an unpinned (multi-GB CUDA) build; GPU users override it.
TORCH_SPEC ?= torch==2.13.0

.PHONY: venv install install-test demo test test-fast lint bench clean docker-lint docker-build docs docs-serve docs-check

$(VENV)/.installed: pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet "$(TORCH_SPEC)"
	$(PY) -m pip install --quiet -e ".[test,rich]"
	touch $@

venv install: $(VENV)/.installed

demo: $(VENV)/.installed
	$(VENV)/bin/accelerando launch --cpu --num_processes 2 examples/demo_train.py --output_dir demo_output

test: $(VENV)/.installed
	$(PY) -m pytest -q tests

test-fast: $(VENV)/.installed
	$(PY) -m pytest -q tests/unit

# CI (.ci/run) runs this before the tests: lint rules, formatting, types.
lint: $(VENV)/.installed
	$(VENV)/bin/ruff check src tests benchmarks examples scripts
	$(VENV)/bin/ruff format --check src tests benchmarks examples scripts
	$(VENV)/bin/mypy

# The documentation site (mkdocs.yml) into site/, warnings as errors; docs-check opens it in a
# headless Chromium (apt-get install chromium; not in CI) and leaves screenshots in docs-check/.
$(VENV)/.docs-installed: pyproject.toml $(VENV)/.installed
	$(PY) -m pip install --quiet --no-build-isolation -e ".[docs]"
	touch $@

docs: $(VENV)/.docs-installed
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --quiet

docs-serve: $(VENV)/.docs-installed
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs serve

docs-check: docs
	$(PY) scripts/check_docs_site.py --site site --out docs-check

# The release images (docs/release.md). Lint needs no Docker engine; building does (the release job).
DOCKER_TAGS ?= cpu gpu gpu-deepspeed gpu-fp8-transformerengine
VERSION = $(shell sed -n 's/^__version__ = "\(.*\)"$$/\1/p' src/accelerando/_version.py)

docker-lint: $(VENV)/.installed
	$(VENV)/bin/hadolint --config docker/.hadolint.yaml $(foreach tag,$(DOCKER_TAGS),docker/$(tag)/Dockerfile)

docker-build:
	set -e; for tag in $(DOCKER_TAGS); do \
		docker build -f docker/$$tag/Dockerfile -t accelerando:$(VERSION)-$$tag -t accelerando:$$tag .; \
	done

bench: $(VENV)/.installed
	$(PY) benchmarks/loop_overhead.py

clean:
	rm -rf $(VENV) build dist *.egg-info demo_output site docs-check
