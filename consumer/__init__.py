"""streaminfer consumer: Kafka in, ONNX Runtime micro-batches, results and dead letters out."""

__version__ = "0.1.0"
