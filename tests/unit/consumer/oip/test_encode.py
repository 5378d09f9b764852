"""The batch encoder writes, per request, the bytes encode_response writes for its rows."""

from __future__ import annotations

import numpy as np
import orjson
import pytest

from consumer.oip.encode import BatchEncoder, encode_response, encode_response_binary
from consumer.signature import BF16, ModelSignature, TensorSpec

SIGNATURE = ModelSignature(name='odd"name%s', version="1", inputs=(), outputs=())


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16, np.int64, np.int32, np.uint8, np.bool_])
@pytest.mark.parametrize("rows", [[1, 1, 1], [1, 2, 3, 1], [4]])
def test_batch_encoding_equals_per_record_encoding(dtype: type, rows: list[int]) -> None:
    rng = np.random.default_rng(0)
    total = sum(rows)
    outputs = [
        ("scores%", (rng.random((total, 3, 2)) * 100).astype(dtype)),
        ("label", (rng.random(total) * 10).astype(dtype)),
        ("empty", np.zeros((total, 0), dtype)),
    ]
    ids = [f'id-{i}"\\' for i in range(len(rows))]
    got = BatchEncoder(SIGNATURE).encode(ids, rows, outputs)
    start = 0
    for response_id, n, value in zip(ids, rows, got, strict=True):
        want = encode_response(response_id, SIGNATURE, [(name, arr[start : start + n]) for name, arr in outputs])
        assert value == want
        assert orjson.loads(value)["outputs"][0]["shape"] == [n, 3, 2]
        start += n


def test_an_output_oip_json_cannot_carry_raises() -> None:
    with pytest.raises(TypeError):  # orjson.JSONEncodeError: the caller falls back to per-record encoding
        BatchEncoder(SIGNATURE).encode(["a"], [1], [("s", np.array([{1}], dtype=object))])


#: Outputs of the kinds converters produce: string labels, bfloat16, a ZipMap as a dense tensor with its class
#: labels, and a table without a batch axis.
KINDS = ModelSignature(
    name="kinds",
    version="2",
    inputs=(),
    outputs=(
        TensorSpec("label", np.dtype(object), (None,)),
        TensorSpec("half", BF16, (None, 2)),
        TensorSpec("probability", np.dtype(np.float32), (None, 3), labels=("a", 'b"],[', "c")),
        TensorSpec("table", np.dtype(np.int64), (2,), batched=False),
    ),
)


@pytest.mark.parametrize("rows", [[1, 1, 1], [2, 1, 3]])
def test_batch_encoding_of_strings_bf16_labels_and_whole_outputs(rows: list[int]) -> None:
    total = sum(rows)
    labels = np.array([f'cls"],[{i}' for i in range(total)], dtype=object)  # text that looks like the row split
    outputs = [
        ("label", labels),
        ("half", (np.arange(total * 2, dtype=np.float32).reshape(total, 2) / 4).astype(BF16)),
        ("probability", np.full((total, 3), 0.25, np.float32)),
        ("table", np.array([7, 9], np.int64)),
    ]
    got = BatchEncoder(KINDS).encode([str(i) for i in range(len(rows))], rows, outputs)
    start = 0
    for i, (n, value) in enumerate(zip(rows, got, strict=True)):
        part = [(name, arr if name == "table" else arr[start : start + n]) for name, arr in outputs]
        assert value == encode_response(str(i), KINDS, part)
        body = orjson.loads(value)["outputs"]
        assert body[0] == {
            "name": "label",
            "shape": [n],
            "datatype": "BYTES",
            "data": labels[start : start + n].tolist(),
        }
        assert body[1]["datatype"] == "BF16"
        assert body[1]["data"] == [v / 4 for v in range(start * 2, (start + n) * 2)]
        assert body[2]["parameters"] == {"classes": ["a", 'b"],[', "c"]}
        assert body[2]["shape"] == [n, 3]
        assert body[3] == {"name": "table", "shape": [2], "datatype": "INT64", "data": [7, 9]}
        start += n


def test_binary_bytes_and_bf16_follow_triton_layout() -> None:
    value, json_length = encode_response_binary(
        "x", KINDS, [("label", np.array(["ab", "é"], dtype=object)), ("half", np.array([[1.0, -2.0]], BF16))]
    )
    head = orjson.loads(value[:json_length])
    sizes = [o["parameters"]["binary_data_size"] for o in head["outputs"]]
    assert sizes == [4 + 2 + 4 + 2, 4]
    tail = value[json_length:]
    assert tail[:12] == b"\x02\x00\x00\x00ab\x02\x00\x00\x00\xc3\xa9"
    assert np.frombuffer(tail[12:], "<u2").view(BF16).tolist() == [1.0, -2.0]


#: Correlation IDs spliced as they are (plain ASCII, ``%`` and DEL included) and ones that are not: a quote, a
#: backslash, control characters, UTF-8 text, bytes that are not UTF-8.
PLAIN_IDS = [b"req-1", b"a%sb%%", b"{}[],:/\x7f", b""]
ODD_IDS = [b'q"uote', b"back\\slash", b"tab\there\n", "caf\u00e9 \u2603".encode(), b"\xff\xfe-not-utf8"]


@pytest.mark.parametrize("ids", [PLAIN_IDS, ODD_IDS, PLAIN_IDS + ODD_IDS[:1]])
@pytest.mark.parametrize("rows", [None, 2])
@pytest.mark.parametrize("whole", [False, True])
def test_encode_ids_equals_encode_of_the_ids_as_text(ids: list[bytes], rows: int | None, whole: bool) -> None:
    counts = [1] * len(ids) if rows is None else [rows] * len(ids)
    total = sum(counts)
    encoder = BatchEncoder(KINDS)
    for width in (3, 3, 4):  # the layout is cached for a width, and made again for another
        outputs = [
            ("label", np.array([f"c{i}" for i in range(total)], dtype=object)),
            ("probability", np.arange(total * width, dtype=np.float32).reshape(total, width) / 8),
            ("table", np.array([width, total], np.int64)),  # whole: its data is never cached
        ][: 3 if whole else 2]
        texts = [i.decode("utf-8", "backslashreplace") for i in ids]
        assert encoder.encode_ids(ids, counts, outputs) == encoder.encode(texts, counts, outputs)
        start = 0
        for text, n, value in zip(texts, counts, encoder.encode_ids(ids, counts, outputs), strict=True):
            part = [(name, arr if name == "table" else arr[start : start + n]) for name, arr in outputs]
            assert value == encode_response(text, KINDS, part)
            start += n
