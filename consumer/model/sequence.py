"""Variable-length token inputs: detect them in the graph, tokenize text, bucket by length, pad to the longest.

A *sequence model* is one whose inputs are all rank-2 integer tensors ``[batch, sequence]`` with both axes
dynamic, one of them named ``input_ids`` (the Hugging Face export convention: ``input_ids``, ``attention_mask``,
``token_type_ids``). Requests of such a model carry ``[rows, length]`` token ids (or text, tokenized here with the
``tokenizers`` library from a ``tokenizer.json``); they are micro-batched with requests of similar length (the
length *bucket*) and padded to the longest length in the batch: ``input_ids`` with the model's pad token id,
every other input with 0, so padded positions have ``attention_mask`` 0 and do not change the result.

The model's ONNX metadata (``custom_metadata_map``, written by ``models/minilm/build.py``) may give::

    max_sequence_length   longest accepted length, tokens (default 512, BERT's position table)
    pad_token_id          the id padding uses in input_ids (default 0, BERT's [PAD])
    input_ranges          JSON {"input_ids": [0, 30521], ...}: inclusive value range per input, validated
"""

from __future__ import annotations

import bisect
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import orjson

from consumer.errors import ModelError
from consumer.signature import ModelSignature, SequenceSpec

IDS = "input_ids"
MASK = "attention_mask"
TYPES = "token_type_ids"

#: Length buckets on a GPU (tokens): a request of length L waits with requests whose bucket is the smallest bound
#: >= L. Neighbouring bounds differ by at most 1.5x, so a batch padded to its longest row wastes at most a third of
#: its tokens (measured on the MiniLM bench corpus: 1.16 padded / real tokens, against 1.3 with powers of two), one
#: long record never pads a batch of short ones, and warmup covers every bucket in a few runs per batch size.
GPU_BUCKETS: tuple[int, ...] = (8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512)


def _geometric(first: int, last: int, ratio: float) -> tuple[int, ...]:
    bounds = [first]
    while bounds[-1] < last:
        bounds.append(min(last, max(bounds[-1] + 1, round(bounds[-1] * ratio))))
    return tuple(bounds)


#: Length buckets on CPU: each bound the one before x 1.125, rounded (8, 9, 10, ... 418, 470, 512; 37 bounds).
#: ONNX Runtime's CPU kernels cost nothing per new shape, so finer buckets only cut padding: 1.04 padded / real
#: tokens on the MiniLM bench corpus against 1.16 with :data:`GPU_BUCKETS`.
CPU_BUCKETS: tuple[int, ...] = _geometric(8, 512, 1.125)


def detect(signature: ModelSignature, metadata: Mapping[str, str]) -> SequenceSpec | None:
    """The model's sequence layout, or None when it is not a sequence model (fixed-shape inputs).

    Raises:
        ModelError: metadata ``max_sequence_length`` or ``pad_token_id`` is not an integer.
    """
    specs = signature.inputs
    names = {s.name for s in specs}
    if IDS not in names:
        return None
    for s in specs:
        if len(s.shape) != 2 or s.shape[1] is not None or s.dtype.kind not in "iu":
            return None
    try:
        max_length = int(metadata.get("max_sequence_length", "512"))
        pad_id = int(metadata.get("pad_token_id", "0"))
    except ValueError as exc:
        raise ModelError(f"model metadata: {exc}") from None
    if max_length < 1:
        raise ModelError(f"model metadata: max_sequence_length must be >= 1, got {max_length}")
    optional = {n: v for n, v in ((MASK, 1), (TYPES, 0)) if n in names}
    pads = {s.name: (pad_id if s.name == IDS else 0) for s in specs}
    return SequenceSpec(inputs=tuple(s.name for s in specs), pad_values=pads, max_length=max_length, optional=optional)


def input_ranges(metadata: Mapping[str, str]) -> dict[str, tuple[int, int]]:
    """Inclusive value range per input from metadata ``input_ranges`` (JSON object of ``[low, high]``).

    Raises:
        ModelError: the metadata is not a JSON object of integer pairs.
    """
    raw = metadata.get("input_ranges")
    if not raw:
        return {}
    try:
        parsed = orjson.loads(raw)
        return {str(k): (int(v[0]), int(v[1])) for k, v in parsed.items()}
    except (orjson.JSONDecodeError, AttributeError, TypeError, ValueError, IndexError) as exc:
        raise ModelError(f"model metadata input_ranges is not {{name: [low, high]}}: {exc}") from None


def length_buckets(max_length: int, bounds: Sequence[int] = GPU_BUCKETS) -> tuple[int, ...]:
    """The bucket bounds used for a model taking at most ``max_length`` tokens: ``bounds`` (tokens, ascending;
    :data:`GPU_BUCKETS` or :data:`CPU_BUCKETS`) below it, then ``max_length`` itself."""
    return (*(b for b in bounds if b < max_length), max_length)


def bucket(length: int, buckets: Sequence[int]) -> int:
    """The bucket bound for a sequence of ``length`` tokens: the smallest bound >= length (or the last)."""
    i = bisect.bisect_left(buckets, length)
    return buckets[min(i, len(buckets) - 1)]


class TextEncoder:
    """Text -> token ids with a Hugging Face ``tokenizers`` tokenizer (Rust; thread-safe; releases the GIL).

    Args:
        tokenizer_path: a ``tokenizer.json`` (the file shipped next to a Hugging Face model).
        spec: the model's sequence layout; texts are truncated to ``spec.max_length`` tokens.
        input_name: the request input that carries text (OIP ``BYTES``, shape ``[rows]`` or ``[rows, 1]``).

    Raises:
        ModelError: the file cannot be read as a tokenizer.
    """

    def __init__(self, tokenizer_path: Path, spec: SequenceSpec, input_name: str = "text") -> None:
        self.input_name = input_name
        from tokenizers import Tokenizer  # import only when text is served

        try:
            self._tokenizer = Tokenizer.from_file(str(tokenizer_path))
        except Exception as exc:
            raise ModelError(f"cannot load tokenizer {str(tokenizer_path)!r}: {exc}") from exc
        self._tokenizer.no_padding()
        self._tokenizer.enable_truncation(max_length=spec.max_length)
        self._spec = spec

    def encode(self, texts: Sequence[str]) -> dict[str, np.ndarray]:
        """Tokenize ``texts`` (one per row) into the model's inputs.

        Returns:
            input name -> int array ``[rows, L]`` of the model's dtype, L = the longest text's token count;
            shorter rows are padded (``attention_mask`` 0 there).
        """
        encodings = self._tokenizer.encode_batch(list(texts))
        length = max(len(e.ids) for e in encodings)
        rows = len(encodings)
        fields = {IDS: "ids", MASK: "attention_mask", TYPES: "type_ids"}
        out: dict[str, np.ndarray] = {}
        for name in self._spec.inputs:
            arr = np.full((rows, length), self._spec.pad_values[name], dtype=np.int64)
            field = fields.get(name)
            for r, e in enumerate(encodings):
                values: list[int] = getattr(e, field) if field else [0] * len(e.ids)
                arr[r, : len(values)] = values
            out[name] = arr
        return out
