# streaminfer, GPU flavour: `make image-gpu` (docker build -f docker/gpu.Dockerfile -t streaminfer:0.1.0-gpu .)
# CUDA 13 runtime with cuDNN; onnxruntime-gpu's CUDA execution provider. The pod must get a GPU
# (nvidia.com/gpu) and the NVIDIA container toolkit; STREAMINFER_REQUIRE_GPU=true makes start-up fail otherwise.
ARG CUDA_IMAGE=nvidia/cuda:13.0.1-cudnn-runtime-ubuntu24.04
FROM ${CUDA_IMAGE} AS build
RUN apt-get update \
 && apt-get install --yes --no-install-recommends python3 python3-venv \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY pyproject.toml README.md ./
COPY consumer consumer
COPY producer_tools producer_tools
COPY models models
RUN python3 -m venv /opt/venv \
 && /opt/venv/bin/pip install --no-cache-dir ".[digits,otel]" \
 && /opt/venv/bin/python models/digits/build.py --out /opt/streaminfer/models \
 && /opt/venv/bin/pip uninstall --yes scikit-learn skl2onnx onnx scipy joblib threadpoolctl

FROM ${CUDA_IMAGE}
RUN apt-get update \
 && apt-get install --yes --no-install-recommends python3 \
 && rm -rf /var/lib/apt/lists/*
COPY --from=build /opt/venv /opt/venv
COPY --from=build /opt/streaminfer/models /opt/streaminfer/models
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    STREAMINFER_MODEL_PATH=/opt/streaminfer/models/digits.onnx \
    STREAMINFER_EXECUTION_PROVIDER=cuda
USER 10001:10001
EXPOSE 9400
ENTRYPOINT ["streaminfer-consumer"]
