"""A small variable-length sentence encoder for tests, built with onnx.helper (no torch), and its tokenizer.

Graph (the interface of models/minilm: Hugging Face BERT inputs, a pooled embedding out)::

    input_ids, attention_mask, token_type_ids   INT64 [batch, sequence]   (both axes dynamic)
    h = word[input_ids] + type[token_type_ids] + position[0:sequence]      FP32 [batch, sequence, DIM]
    token_embeddings = tanh(h)                                             FP32 [batch, sequence, DIM]
    embedding = sum(token_embeddings * mask) / max(sum(mask), 1)           FP32 [batch, DIM]  (masked mean)

Padded positions carry attention_mask 0, so a row's ``embedding`` does not depend on how far it was padded, and
its ``token_embeddings`` up to its own length neither: batched and solo runs agree exactly (up to float sums).
The tokenizer is a word-level ``tokenizers`` tokenizer with ``[CLS] ... [SEP]`` around each text.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

WORDS = (
    "the",
    "quick",
    "brown",
    "fox",
    "jumps",
    "over",
    "lazy",
    "dog",
    "kafka",
    "stream",
    "batch",
    "model",
    "tensor",
    "record",
    "offset",
    "partition",
    "consumer",
    "group",
    "commit",
    "result",
    "error",
    "token",
    "sequence",
    "padding",
    "length",
    "bucket",
)
SPECIALS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]")
DIM = 8
MAX_LENGTH = 32


def build(out_dir: Path) -> tuple[Path, Path]:
    """Write ``text.onnx`` and ``tokenizer.json`` into ``out_dir``; returns their paths."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper
    from tokenizers import Tokenizer, models, pre_tokenizers, processors

    vocab = {tok: i for i, tok in enumerate((*SPECIALS, *WORDS))}
    rng = np.random.default_rng(7)
    word = rng.normal(size=(len(vocab), DIM)).astype(np.float32)
    types = rng.normal(size=(2, DIM)).astype(np.float32)
    position = rng.normal(size=(MAX_LENGTH, DIM)).astype(np.float32) * 0.1
    inits = [
        numpy_helper.from_array(word, "word"),
        numpy_helper.from_array(types, "types"),
        numpy_helper.from_array(position, "position"),
        numpy_helper.from_array(np.array([0], np.int64), "zero"),
        numpy_helper.from_array(np.array([1], np.int64), "one"),
        numpy_helper.from_array(np.array([1.0], np.float32), "one_f"),
    ]
    nodes = [
        helper.make_node("Gather", ["word", "input_ids"], ["w"]),
        helper.make_node("Gather", ["types", "token_type_ids"], ["t"]),
        helper.make_node("Shape", ["input_ids"], ["shape"]),
        helper.make_node("Slice", ["shape", "one", "two"], ["seq_len"]),
        helper.make_node("Slice", ["position", "zero", "seq_len", "zero"], ["p"]),
        helper.make_node("Add", ["w", "t"], ["wt"]),
        helper.make_node("Add", ["wt", "p"], ["h"]),
        helper.make_node("Tanh", ["h"], ["token_embeddings"]),
        helper.make_node("Cast", ["attention_mask"], ["m"], to=TensorProto.FLOAT),
        helper.make_node("Unsqueeze", ["m", "axis2"], ["m3"]),
        helper.make_node("Mul", ["token_embeddings", "m3"], ["masked"]),
        helper.make_node("ReduceSum", ["masked", "one"], ["summed"], keepdims=0),
        helper.make_node("ReduceSum", ["m", "one"], ["count"], keepdims=1),
        helper.make_node("Max", ["count", "one_f"], ["denominator"]),
        helper.make_node("Div", ["summed", "denominator"], ["embedding"]),
    ]
    inits.append(numpy_helper.from_array(np.array([2], np.int64), "axis2"))
    inits.append(numpy_helper.from_array(np.array([2], np.int64), "two"))
    ints = [
        helper.make_tensor_value_info(n, TensorProto.INT64, ["batch", "sequence"])
        for n in ("input_ids", "attention_mask", "token_type_ids")
    ]
    outs = [
        helper.make_tensor_value_info("embedding", TensorProto.FLOAT, ["batch", DIM]),
        helper.make_tensor_value_info("token_embeddings", TensorProto.FLOAT, ["batch", "sequence", DIM]),
    ]
    graph = helper.make_graph(nodes, "text", ints, outs, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    for key, value in {
        "model_name": "text",
        "max_sequence_length": str(MAX_LENGTH),
        "pad_token_id": "0",
        "input_ranges": f'{{"input_ids": [0, {len(vocab) - 1}], "attention_mask": [0, 1], "token_type_ids": [0, 1]}}',
    }.items():
        entry = model.metadata_props.add()
        entry.key, entry.value = key, value
    onnx.checker.check_model(model)
    out_dir.mkdir(parents=True, exist_ok=True)
    model_path = out_dir / "text.onnx"
    onnx.save(model, str(model_path))

    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", special_tokens=[("[CLS]", vocab["[CLS]"]), ("[SEP]", vocab["[SEP]"])]
    )
    tokenizer_path = out_dir / "tokenizer.json"
    tokenizer.save(str(tokenizer_path))
    return model_path, tokenizer_path
