# streaminfer — the README's commands. `make help` lists them.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
MODEL  := models/digits/artifacts/digits.onnx
TABULAR := models/breast_cancer/artifacts/breast_cancer.onnx
PYTEST_ARGS ?=
IMAGE_TAG ?= 0.1.0
FAULTS_ARGS ?=
BENCH_ARGS ?=
SOAK_ARGS ?=

.DEFAULT_GOAL := help
.PHONY: help venv model demo test bench soak faults unit integration lint docs image-cpu image-gpu k8s kafka-start kafka-stop registry-start registry-stop clean

help: ## list the targets
	@awk -v tag='$(IMAGE_TAG)' 'BEGIN {FS = ":.*## "} /^[a-zA-Z0-9_-]+:.*## / {gsub(/\$$\(IMAGE_TAG\)/, tag, $$2); printf "  make %-12s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

$(STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "streaminfer needs Python >= 3.11; set PYTHON=python3.11")'
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -e '.[dev,digits,bench,docs]'
	@# harness/ is repository-only (never in the wheel): the dev venv finds it, and tests/, through a .pth file
	$(PY) -c 'import pathlib, sysconfig; pathlib.Path(sysconfig.get_paths()["purelib"], "streaminfer-repo.pth").write_text(str(pathlib.Path.cwd()))'
	@touch $@

venv: $(STAMP) ## create .venv and install streaminfer with the dev, digits, bench and docs extras

$(MODEL): models/digits/build.py $(STAMP)
	$(PY) models/digits/build.py

$(TABULAR): models/breast_cancer/build.py models/breast_cancer/events.avsc $(STAMP)
	$(PY) models/breast_cancer/build.py

model: $(MODEL) $(TABULAR) ## build the digits and breast-cancer ONNX models, their held-out splits and events.jsonl

demo: $(STAMP) $(MODEL) ## end to end on a local broker: serve the digits model, end with a summary line
	scripts/demo

test: $(STAMP) $(MODEL) ## the whole suite: unit, then integration against a real broker
	$(PY) -m pytest $(PYTEST_ARGS)

bench: $(STAMP) $(MODEL) $(TABULAR) ## benchmark vs naive, the Kafka client alone, bare ORT and the image decoder (digits, MiniLM, EfficientNet-Lite0, JSON and Avro events) -> bench-results/, docs/benchmarks.md; ~20 min + one-time exports
	scripts/bench --docs docs/benchmarks.md $(BENCH_ARGS)

soak: $(STAMP) $(MODEL) ## 10 minutes at half the measured maximum (digits): RSS, fds, tasks, p99 -> soak-results/
	scripts/soak $(SOAK_ARGS)

faults: $(STAMP) $(MODEL) ## fault injection in full (20,000 records, 10 kills, 1,000,000 backlog): table + summary
	$(PY) -m harness.faults $(FAULTS_ARGS)

unit: $(STAMP) ## unit tests only (no Kafka, no ONNX session)
	$(PY) -m pytest tests/unit $(PYTEST_ARGS)

integration: $(STAMP) $(MODEL) ## integration tests only (real broker)
	$(PY) -m pytest tests/integration $(PYTEST_ARGS)

lint: $(STAMP) ## ruff, mypy --strict and the import layers (lint-imports)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports --no-cache

docs: $(STAMP) ## regenerate docs/settings.md from consumer/config.py, then build the site into site/ (strict: broken links and anchors fail)
	$(PY) scripts/settings_table.py
	$(VENV)/bin/zensical build --strict

image-cpu: ## build the CPU image streaminfer:$(IMAGE_TAG)-cpu (needs a Docker engine)
	docker build -f docker/cpu.Dockerfile -t streaminfer:$(IMAGE_TAG)-cpu .

image-gpu: ## build the GPU image streaminfer:$(IMAGE_TAG)-gpu (needs a Docker engine)
	docker build -f docker/gpu.Dockerfile -t streaminfer:$(IMAGE_TAG)-gpu .

k8s: $(STAMP) ## render every overlay (cpu, gpu, cpu-hpa) into build/k8s-*.yaml
	@mkdir -p build
	@for overlay in k8s/overlays/*/; do name=$$(basename $$overlay); \
		$(VENV)/bin/kubectl kustomize $$overlay > build/k8s-$$name.yaml && echo "build/k8s-$$name.yaml"; done

kafka-start: ## start the local KRaft broker (prints its bootstrap address; scripts/kafka-local --help for more)
	scripts/kafka-local start

kafka-stop: ## stop the local broker
	scripts/kafka-local stop

registry-start: ## start a local schema registry (Apicurio, JDK >= 21; prints its Confluent-compatible URL last)
	scripts/registry-local start

registry-stop: ## stop the local schema registry (deleting its schemas)
	scripts/registry-local stop

clean: ## remove the venv, built models and caches
	rm -rf $(VENV) models/digits/artifacts models/breast_cancer/artifacts .demo .bench bench-results .pytest_cache .mypy_cache .ruff_cache *.egg-info site
