"""The model: building an ONNX Runtime session, running micro-batches, probing the graph, token sequences, images."""
