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
LOCK_ARGS ?=
BASE_IMAGE ?=
CONTAINER_TESTS ?= tests/integration/test_end_to_end.py tests/integration/test_order.py \
	tests/integration/test_exactly_once.py tests/integration/test_dlq.py tests/integration/test_containers.py

.DEFAULT_GOAL := help
.PHONY: help venv model demo test bench soak faults unit integration lint docs docs-check docs-serve image-cpu image-gpu k8s kafka-start kafka-stop \
	registry-start registry-stop clean lock lock-check docker-engine docker-engine-stop image-kafka image-e2e test-containers \
	cluster cluster-stop test-cluster

help: ## list the targets
	@awk -v tag='$(IMAGE_TAG)' 'BEGIN {FS = ":.*## "} /^[a-zA-Z0-9_-]+:.*## / {gsub(/\$$\(IMAGE_TAG\)/, tag, $$2); printf "  make %-18s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

# The venv is made from the lock (locks/dev.txt, exported from uv.lock): exactly those versions, every hash checked,
# and nothing else (lock sync removes what the lock does not list, e.g. an old onnxruntime-gpu, before installing);
# a pyproject.toml whose dependencies changed since `make lock` stops here, before anything is installed.
$(STAMP): pyproject.toml uv.lock locks/dev.txt
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "streaminfer needs Python >= 3.11; set PYTHON=python3.11")'
	$(PYTHON) -m harness.lock check
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m harness.lock sync dev
	$(PY) -m pip install --quiet --disable-pip-version-check --require-hashes --no-deps -r locks/dev.txt
	$(PY) -m pip install --quiet --disable-pip-version-check --no-deps -e .
	$(PY) -m pip check
	@# harness/ is repository-only (never in the wheel): the dev venv finds it, and tests/, through a .pth file
	$(PY) -c 'import pathlib, sysconfig; pathlib.Path(sysconfig.get_paths()["purelib"], "streaminfer-repo.pth").write_text(str(pathlib.Path.cwd()))'
	@touch $@

venv: $(STAMP) ## create .venv from the lock (locks/dev.txt: the cpu, dev, digits, bench and docs extras)

lock: ## refresh uv.lock and locks/*.txt after a dependency change in pyproject.toml (LOCK_ARGS=--upgrade: newest)
	$(PYTHON) -m harness.lock refresh $(LOCK_ARGS)

lock-check: $(STAMP) ## the lock agrees with pyproject.toml (uv lock --check; every export regenerates identically)
	$(PY) -m harness.lock verify

$(MODEL): models/digits/build.py $(STAMP)
	$(PY) models/digits/build.py

$(TABULAR): models/breast_cancer/build.py models/breast_cancer/events.avsc $(STAMP)
	$(PY) models/breast_cancer/build.py

# Validation records (streaminfer-model record) beside the models, over comparison sets of their held-out data:
# digits' held-out requests (labels in parameters.label), the breast-cancer held-out events (labels in true_label).
MODEL_RECORD := models/digits/artifacts/digits.record.json
TABULAR_RECORD := models/breast_cancer/artifacts/breast_cancer.record.json
RECORD_ARGS ?= --max-seconds 0.5 --min-runs 10

$(MODEL_RECORD): $(MODEL) producer_tools/model.py producer_tools/evaluate.py producer_tools/modelset.py
	$(PY) -m producer_tools.model set --model $(MODEL) --jsonl models/digits/artifacts/requests.jsonl \
		--label-field parameters.label --out models/digits/artifacts/heldout.set.jsonl
	$(PY) -m producer_tools.model record --model $(MODEL) --set models/digits/artifacts/heldout.set.jsonl \
		--out $@ $(RECORD_ARGS)

$(TABULAR_RECORD): $(TABULAR) producer_tools/model.py producer_tools/evaluate.py producer_tools/modelset.py
	$(PY) -m producer_tools.model set --model $(TABULAR) --request-format json \
		--jsonl models/breast_cancer/artifacts/events.jsonl --label-field true_label \
		--out models/breast_cancer/artifacts/heldout.set.jsonl
	$(PY) -m producer_tools.model record --model $(TABULAR) --set models/breast_cancer/artifacts/heldout.set.jsonl \
		--out $@ $(RECORD_ARGS)

model: $(MODEL) $(TABULAR) $(MODEL_RECORD) $(TABULAR_RECORD) ## build the digits and breast-cancer ONNX models, their held-out splits, events.jsonl and validation records

demo: $(STAMP) $(MODEL) $(MODEL_RECORD) ## end to end on a local broker: serve the digits model, end with a summary line
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

docs: $(STAMP) ## regenerate docs/settings.md, fetch Mermaid (npm, cached), build the site into site/ (strict: broken links and anchors fail)
	$(PY) scripts/settings_table.py
	$(PY) -m harness.docsite vendor
	$(VENV)/bin/zensical build --strict

docs-check: docs ## open every page of site/ in headless Chromium: no console error, no request off the machine, diagrams drawn, links resolve
	$(PY) -m harness.docsite check

DOCS_ADDR ?= 127.0.0.1:8000
docs-serve: $(STAMP) ## serve the site at http://127.0.0.1:8000/ (DOCS_ADDR=host:port), rebuilt as the pages change
	$(PY) -m harness.docsite vendor
	$(VENV)/bin/zensical serve --dev-addr $(DOCS_ADDR)

docker-engine: $(STAMP) ## use the Docker engine that answers, or start one here (docker.io; own socket: prints DOCKER_HOST)
	$(PY) -m harness.docker engine start

docker-engine-stop: $(STAMP) ## stop the engine docker-engine started, its containers and processes
	$(PY) -m harness.docker engine stop

image-cpu: $(STAMP) ## build streaminfer:$(IMAGE_TAG)-cpu (BASE_IMAGE=...; a local Debian base where no registry answers)
	$(PY) -m harness.docker build cpu --tag streaminfer:$(IMAGE_TAG)-cpu $(if $(BASE_IMAGE),--base $(BASE_IMAGE))

image-gpu: $(STAMP) ## build streaminfer:$(IMAGE_TAG)-gpu (nvidia/cuda, or the local base with CUDA from nvidia-* wheels)
	$(PY) -m harness.docker build gpu --tag streaminfer:$(IMAGE_TAG)-gpu $(if $(BASE_IMAGE),--base $(BASE_IMAGE))

image-kafka: $(STAMP) ## build apache/kafka:<the local broker's version> from its jars (the tests' Docker broker)
	$(PY) -m harness.docker kafka-image

image-e2e: $(STAMP) $(MODEL) ## the CPU image as the Deployment runs it: SASL_SSL broker, the demo's records, docker stop
	$(PY) -m harness.docker serve --image streaminfer:$(IMAGE_TAG)-cpu

test-containers: $(STAMP) $(MODEL) ## end-to-end, order, exactly-once, dead-letter and container tests on testcontainers' broker
	env -u KAFKA_BOOTSTRAP_SERVERS DOCKER_TESTS_REQUIRED=1 $(PY) -m pytest $(CONTAINER_TESTS) $(PYTEST_ARGS)

k8s: $(STAMP) ## render every overlay (cpu, gpu, cpu-hpa) into build/k8s-*.yaml
	@mkdir -p build
	@for overlay in k8s/overlays/*/; do name=$$(basename $$overlay); \
		$(VENV)/bin/kubectl kustomize $$overlay > build/k8s-$$name.yaml && echo "build/k8s-$$name.yaml"; done

cluster: $(STAMP) ## a one-node Kubernetes on this machine, pods on a private bridge (binaries built once into ~/.cache/streaminfer/k8s; CRDs installed); prints KUBECONFIG
	$(PY) -m harness.cluster start

cluster-stop: $(STAMP) ## stop the one-node cluster and remove everything it made (.cluster/, cgroups, pods' bridge and netns)
	$(PY) -m harness.cluster stop

test-cluster: $(STAMP) $(MODEL) ## every overlay applied to the running cluster, the CPU image as a pod serving (needs make cluster, make image-cpu)
	CLUSTER_TESTS_REQUIRED=1 $(PY) -m pytest tests/cluster $(PYTEST_ARGS)

kafka-start: ## start the local KRaft broker (prints its bootstrap address; scripts/kafka-local --help for more)
	scripts/kafka-local start

kafka-stop: ## stop the local broker
	scripts/kafka-local stop

registry-start: ## start a local schema registry (Apicurio, JDK >= 21; prints its Confluent-compatible URL last)
	scripts/registry-local start

registry-stop: ## stop the local schema registry (deleting its schemas)
	scripts/registry-local stop

clean: ## remove the venv, built models and caches
	rm -rf $(VENV) models/digits/artifacts models/breast_cancer/artifacts .demo .bench bench-results .docker-e2e .pytest_cache .mypy_cache .ruff_cache *.egg-info site
