"""The batch encoder writes, per request, the bytes encode_response writes for its rows."""

from __future__ import annotations

import numpy as np
import orjson
import pytest

from consumer.oip.encode import BatchEncoder, encode_response
from consumer.schema import ModelSignature

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
        BatchEncoder(SIGNATURE).encode(["a"], [1], [("s", np.array(["x"], dtype=object))])
