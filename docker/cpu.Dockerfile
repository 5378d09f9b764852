# streaminfer, CPU flavour: `make image-cpu` (docker build -f docker/cpu.Dockerfile -t streaminfer:0.1.0-cpu .)
# The digits model is built into the image; mount your own model and set STREAMINFER_MODEL_PATH to serve another.
FROM python:3.11-slim AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY consumer consumer
COPY producer_tools producer_tools
COPY models models
RUN python -m venv /opt/venv \
 && /opt/venv/bin/pip install --no-cache-dir ".[digits,otel]" \
 && /opt/venv/bin/python models/digits/build.py --out /opt/streaminfer/models \
 && /opt/venv/bin/pip uninstall --yes scikit-learn skl2onnx onnx scipy joblib threadpoolctl

FROM python:3.11-slim
COPY --from=build /opt/venv /opt/venv
COPY --from=build /opt/streaminfer/models /opt/streaminfer/models
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    STREAMINFER_MODEL_PATH=/opt/streaminfer/models/digits.onnx \
    STREAMINFER_EXECUTION_PROVIDER=cpu
# Non-root, matching the Deployment's runAsUser; the root filesystem can be mounted read-only.
USER 10001:10001
EXPOSE 9400
ENTRYPOINT ["streaminfer-consumer"]
