"""decode_chunk gives, record for record, exactly what decode_request gives: the same arrays (dtype and bits), the
same ids, rows and requested outputs, the same dead-letter reason and message, whatever the chunk mixes."""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import orjson
import pytest

from consumer.errors import RecordError
from consumer.oip.chunk import decode_chunk
from consumer.oip.client import encode_request_binary
from consumer.oip.decode import decode_one
from consumer.oip.wire import BINARY_HEADER
from consumer.signature import ModelSignature, TensorSpec
from consumer.work import DecodedRequest, Limits
from producer_tools.poison import catalogue

LIMITS = Limits(max_record_bytes=100_000, max_record_rows=16)

TWO_INPUTS = ModelSignature(
    name="two",
    version="1",
    inputs=(
        TensorSpec("a", np.dtype(np.float32), (None, 3)),
        TensorSpec("b", np.dtype(np.int64), (None, 2)),
    ),
    outputs=(TensorSpec("y", np.dtype(np.float32), (None,)),),
)


def req(*inputs: dict[str, Any], **extra: Any) -> bytes:
    return orjson.dumps({"inputs": list(inputs), **extra})


def inp(name: str, shape: list[Any], datatype: str, data: Any) -> dict[str, Any]:
    return {"name": name, "shape": shape, "datatype": datatype, "data": data}


def same(a: DecodedRequest | RecordError, b: DecodedRequest | RecordError) -> None:
    assert type(a) is type(b), (a, b)
    if isinstance(a, RecordError):
        assert isinstance(b, RecordError)
        assert (a.reason, a.message) == (b.reason, b.message)
        return
    assert isinstance(b, DecodedRequest)
    assert (a.id, a.rows, a.outputs, a.binary_output, a.length) == (b.id, b.rows, b.outputs, b.binary_output, b.length)
    assert a.shape_key == b.shape_key
    assert list(a.inputs) == list(b.inputs)
    for name in a.inputs:
        x, y = a.inputs[name], b.inputs[name]
        assert x.dtype == y.dtype
        assert x.shape == y.shape
        assert x.tobytes() == y.tobytes(), name


def check(values: list[bytes | None], signature: ModelSignature, headers: list[Any] | None = None) -> None:
    headers = headers or [[] for _ in values]
    chunk = decode_chunk(values, headers, signature, LIMITS)
    assert len(chunk) == len(values)
    for value, hdrs, got in zip(values, headers, chunk, strict=True):
        same(got, decode_one(value, hdrs, signature, LIMITS))


def digits_variants(rng: random.Random) -> list[bytes | None]:
    row = [float(rng.randrange(17)) for _ in range(64)]
    nested2 = [[rng.random() for _ in range(64)] for _ in range(2)]
    return [
        req(inp("input", [1, 64], "FP32", row)),
        req(inp("input", [1, 64], "FP32", [row])),  # nested
        req(inp("input", [2, 64], "FP32", nested2)),
        req(inp("input", [2, 64], "FP32", [x for r in nested2 for x in r]), id="two"),
        req(inp("input", [1, 64], "FP64", [rng.random() * 1e3 for _ in range(64)])),
        req(inp("input", [1, 64], "INT64", [rng.randrange(-5, 17) for _ in range(64)])),
        req(inp("input", [1, 64], "INT32", [2**40] + [0] * 63)),  # out of range for INT32
        req(inp("input", [1, 64], "INT64", [2**24 + 1] + [0] * 63)),  # not exact in float32
        req(inp("input", [1, 64], "FP32", [2**60 + 1] + [0.5] * 63)),  # an int beyond float64's exactness
        # all ints: int64 -> float32 rounds up; via float64 (the midpoint) it would round to even, down
        req(inp("input", [1, 64], "FP32", [2**60 + 2**36 + 1] + [0] * 63)),
        req(inp("input", [1, 64], "FP32", [True] + [0.0] * 63)),
        req(inp("input", [1, 64], "FP32", [None] + [0.0] * 63)),
        req(inp("input", [1, 64], "FP32", ["1"] + [0.0] * 63)),
        req(inp("input", [1, 64], "FP32", [1e39] + [0.0] * 63)),
        req(inp("input", [1, 64], "FP32", [0.0] * 63)),
        req(inp("input", [1, 64], "FP32", [[0.0] * 32, [0.0] * 32])),
        req(inp("input", [1, 64], "FP32", row), outputs=[{"name": "probabilities"}]),
        req(inp("input", [1, 64], "FP32", row), outputs=[{"name": "nope"}]),
        req(inp("input", [1, 64], "FP32", row), parameters={"binary_data_output": True}),
        req(inp("input", [1.0, 64], "FP32", row)),
        req(inp("input", [True, 64], "FP32", row)),
        req(inp("input", [20, 64], "FP32", [0.0] * 64 * 20)),  # above max_record_rows
        req({**inp("input", [1, 64], "FP32", row), "parameters": {"x": 1}}),
        req(inp("input", [1, 64], "FP32", row), inp("input", [1, 64], "FP32", row)),
        orjson.dumps({"inputs": [inp("input", [1, 64], "FP32", row)], "id": 3}),
        req(inp("input", [1, 64], "FP32", row), id="truest"),  # "true" in the bytes, not in the data
        b'{"inputs": [{"name": "input", "shape": [1, 64], "datatype": "FP32", "data": [' + b"1.5," * 63 + b"2]}]}",
        *(p.value for p in catalogue()),
    ]


def test_a_mixed_digits_chunk_decodes_as_record_by_record(digits_signature: ModelSignature) -> None:
    rng = random.Random(11)
    values = [v for _ in range(3) for v in digits_variants(rng)]
    rng.shuffle(values)
    check(values, digits_signature)


def test_a_chunk_of_valid_records_is_decoded_as_one_block(digits_signature: ModelSignature) -> None:
    rng = random.Random(5)
    values = [req(inp("input", [1, 64], "FP32", [rng.random() for _ in range(64)])) for _ in range(50)]
    chunk = decode_chunk(values, [[]] * 50, digits_signature, LIMITS)
    blocks = {id(r.block) for r in chunk if isinstance(r, DecodedRequest)}
    assert len(blocks) == 1  # one array for the whole group
    assert [r.start for r in chunk if isinstance(r, DecodedRequest)] == list(range(50))
    check(values, digits_signature)


def test_one_bad_record_does_not_change_its_groups_neighbours(digits_signature: ModelSignature) -> None:
    good = [req(inp("input", [1, 64], "FP32", [float(i)] * 64)) for i in range(10)]
    bad = req(inp("input", [1, 64], "FP32", [None] * 64))
    values = [*good[:5], bad, *good[5:]]
    chunk = decode_chunk(values, [[]] * 11, digits_signature, LIMITS)
    assert isinstance(chunk[5], RecordError)
    assert chunk[5].reason.value == "null_value"
    assert [float(r.inputs["input"][0, 0]) for r in chunk if isinstance(r, DecodedRequest)] == list(range(10))
    check(values, digits_signature)


@pytest.mark.parametrize("bad", [[None] + [0.0] * 63, ["1"] + [0.0] * 63, [1e39] + [0.0] * 63, [0.5] * 63])
def test_a_large_stack_with_a_bad_record_keeps_most_of_it_in_blocks(digits_signature: ModelSignature, bad: Any) -> None:
    """A failed stack is tried again in halves: the culprit is decoded on its own (its own reason and message),
    and the records of every half that passes still share a block."""
    rng = random.Random(9)
    values = [req(inp("input", [1, 64], "FP32", [rng.random() for _ in range(64)]), id=f"g{i}") for i in range(200)]
    values[137] = req(inp("input", [1, 64], "FP32", bad), id="bad")
    chunk = decode_chunk(values, [[]] * len(values), digits_signature, LIMITS)
    assert isinstance(chunk[137], RecordError)
    stacked = [k for k, r in enumerate(chunk) if isinstance(r, DecodedRequest) and r.block is not None]
    assert len(stacked) >= 180
    assert 137 not in stacked
    check(values, digits_signature)


@pytest.mark.parametrize("bad", [[None] + [0.0] * 63, ["1"] + [0.0] * 63, [0.5, "x"] + [0.0] * 62])
@pytest.mark.parametrize("tag", ["g", "label-"])
def test_a_string_or_null_in_a_large_stack_leaves_the_rest_one_block(
    digits_signature: ModelSignature, bad: Any, tag: str
) -> None:
    """A record whose bytes may hold a string or null (its quotes, a null) is checked apart once its stack failed:
    the others stay one block of numbers, whatever their ids hold (an l too)."""
    rng = random.Random(2)
    values = [req(inp("input", [1, 64], "FP32", [rng.random() for _ in range(64)]), id=f"{tag}{i}") for i in range(200)]
    values[61] = req(inp("input", [1, 64], "FP32", bad), id="bad")
    chunk = decode_chunk(values, [[]] * len(values), digits_signature, LIMITS)
    assert isinstance(chunk[61], RecordError)
    blocks = {id(r.block) for r in chunk if isinstance(r, DecodedRequest)}
    assert len(blocks) == 1
    check(values, digits_signature)


def numbers_variants(rng: random.Random) -> list[bytes]:
    """Plain one-input records whose bytes hold no l (no null, no false), so a chunk of them may take the float
    path (its data read straight into float64), and what may sneak a non-number past it."""
    row = [rng.random() for _ in range(64)]
    ints = [rng.randrange(17) for _ in range(64)]
    return [
        req(inp("input", [1, 64], "FP32", ints), id="ints"),  # integers only: int64 when numpy picks
        req(inp("input", [1, 64], "FP32", [2**60 + 2**36 + 1] + [0] * 63)),  # beyond float64's exactness
        req(inp("input", [1, 64], "FP32", [2**63 + 5] + [0.5] * 63)),  # uint64 range
        req(inp("input", [1, 64], "FP32", ["1", *row[1:]]), id="numeric string"),
        req(inp("input", [1, 64], "FP32", [{}, *row[1:]])),  # an object without a string in it
        req(inp("input", [1, 64], "FP32", [[], *row[1:]])),
        req(inp("input", [1, 64], "FP32", [row])),  # nested
        req(inp("input", [2, 64], "FP32", [row, row])),
        req(inp("input", [1, 64], "FP32", row[:63])),
        req(inp("input", [1, 64], "FP64", [x * 1e300 for x in row])),  # beyond float32
        req(inp("input", [1, 64], "INT64", ints)),
        req(inp("input", [1, 64], "FP16", row)),
        req({**inp("input", [1, 64], "FP32", row), "extra": 5}),
        req({**inp("input", [1, 64], "FP32", ["1", *row[1:]]), "extra": "x"}),
        req(inp("input", [1, 64], "FP32", ["2", *row[1:]]), id='a"b'),  # an escaped quote in a counted string
        req(inp("input", [1, 64], "FP32", ["3", *row[1:]]), id="\u0022"),
        orjson.dumps({"inputs": [inp("input", [1, 64], "FP32", row)], "id": "x", "parameters": {}}),
    ]


@pytest.mark.parametrize("which", range(len(numbers_variants(random.Random(0)))))
def test_a_chunk_of_numbers_only_decodes_as_record_by_record(
    digits_signature: ModelSignature, which: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Clean records (ids without an l) around one variant: the float path is taken for the clean chunk, and
    whatever the variant, every record gets decode_one's outcome (a numeric string is datatype_mismatch)."""
    from consumer.oip import chunk

    rng = random.Random(which)
    clean = [req(inp("input", [1, 64], "FP32", [rng.random() for _ in range(64)]), id=f"r{i}") for i in range(40)]
    seen: list[bool] = []
    decode_stack = chunk._decode_stack

    def spy(stack: Any, signature: ModelSignature, limits: Limits, numbers: bool = False) -> Any:
        seen.append(numbers)
        return decode_stack(stack, signature, limits, numbers)

    monkeypatch.setattr(chunk, "_decode_stack", spy)
    check(list(clean), digits_signature)
    assert seen == [True]
    values = [*clean[:23], numbers_variants(random.Random(0))[which], *clean[23:]]
    check(values, digits_signature)
    if which == 3:
        got = decode_chunk(values, [[]] * len(values), digits_signature, LIMITS)[23]
        assert isinstance(got, RecordError)
        assert got.reason.value == "datatype_mismatch"


def test_a_chunk_of_all_numbers_variants_decodes_as_record_by_record(digits_signature: ModelSignature) -> None:
    rng = random.Random(4)
    values = [v for _ in range(4) for v in numbers_variants(rng)]
    values += [req(inp("input", [1, 64], "FP32", [rng.random() for _ in range(64)])) for _ in range(40)]
    rng.shuffle(values)
    check(values, digits_signature)


def test_binary_records_and_headers_are_decoded_on_their_own(digits_signature: ModelSignature) -> None:
    x = np.arange(128, dtype=np.float32).reshape(2, 64)
    value, length = encode_request_binary("b", {"input": x})
    values: list[bytes | None] = [value, req(inp("input", [1, 64], "FP32", [0.0] * 64)), value]
    headers = [[(BINARY_HEADER, str(length).encode())], [], [(BINARY_HEADER.upper(), b"x")]]
    check(values, digits_signature, headers)


@pytest.mark.parametrize("seed", range(4))
def test_two_input_models(seed: int) -> None:
    rng = random.Random(seed)
    values: list[bytes | None] = []
    for _ in range(40):
        rows = rng.choice([1, 2])
        a = inp("a", [rows, 3], rng.choice(["FP32", "FP64", "INT32"]), [rng.randrange(9) for _ in range(3 * rows)])
        b = inp("b", [rows, 2], rng.choice(["INT64", "INT8", "FP32"]), [rng.randrange(-3, 3) for _ in range(2 * rows)])
        order = [a, b] if rng.random() < 0.5 else [b, a]
        if rng.random() < 0.1:
            order = [a]  # a missing input
        if rng.random() < 0.1:
            b["shape"] = [rows + 1, 2]  # rows disagree
        values.append(req(*order))
    check(values, TWO_INPUTS)


def test_integers_beyond_float64_exactness_keep_their_own_cast(digits_signature: ModelSignature) -> None:
    """2**60 + 2**36 + 1 as int64 -> float32 rounds up; through float64 (where it is the midpoint) it would round to
    even, down. A chunk holding it next to float records must not take the float64 path."""
    big = 2**60 + 2**36 + 1
    values = [req(inp("input", [1, 64], "FP32", [0.5] * 64)) for _ in range(3)]
    values.append(req(inp("input", [1, 64], "FP32", [big] + [0] * 63)))
    chunk = decode_chunk(values, [[]] * 4, digits_signature, LIMITS)
    last = chunk[-1]
    assert isinstance(last, DecodedRequest)
    assert float(last.inputs["input"][0, 0]) == float(np.float32(np.int64(big)))
    check(values, digits_signature)


def test_a_group_of_integer_and_float_rows_decodes_as_one_block(digits_signature: ModelSignature) -> None:
    rng = random.Random(3)
    values = []
    for i in range(30):
        data: list[Any] = [rng.randrange(17) for _ in range(64)] if i % 2 else [rng.random() for _ in range(64)]
        values.append(req(inp("input", [1, 64], "FP32", data), id=f"r{i}"))
    chunk = decode_chunk(values, [[]] * 30, digits_signature, LIMITS)
    assert all(isinstance(r, DecodedRequest) and r.block is not None for r in chunk)
    check(values, digits_signature)


def binary_record(
    header: dict[str, Any], payload: bytes, *, length_delta: int = 0
) -> tuple[bytes, list[tuple[str, bytes | None]]]:
    """A binary-extension record: the JSON part, then ``payload``; the length header off by ``length_delta``."""
    head = orjson.dumps(header)
    return head + payload, [(BINARY_HEADER, str(len(head) + length_delta).encode())]


def binary_input(shape: list[Any], datatype: str, size: Any, **extra: Any) -> dict[str, Any]:
    return {"name": "input", "shape": shape, "datatype": datatype, "parameters": {"binary_data_size": size}, **extra}


def binary_variants(rng: random.Random) -> list[tuple[bytes, list[tuple[str, bytes | None]]]]:
    one = np.array([rng.random() for _ in range(64)], dtype="<f4").tobytes()
    two = np.array([rng.random() for _ in range(128)], dtype="<f4").tobytes()
    nan = np.array([np.nan] + [0.0] * 63, dtype="<f4").tobytes()
    ints = np.array([rng.randrange(-5, 17) for _ in range(64)], dtype="<i8").tobytes()
    big = np.array([2**40] + [0] * 63, dtype="<i8").tobytes()
    f64 = np.array([rng.random() for _ in range(64)], dtype="<f8").tobytes()
    return [
        binary_record({"inputs": [binary_input([1, 64], "FP32", 256)]}, one),
        binary_record({"inputs": [binary_input([2, 64], "FP32", 512)], "id": "two"}, two),
        binary_record({"inputs": [binary_input([1, 64], "FP64", 512)]}, f64),
        binary_record({"inputs": [binary_input([1, 64], "INT64", 512)]}, ints),
        binary_record({"inputs": [binary_input([1, 64], "INT32", 256)]}, big[:256]),
        binary_record({"inputs": [binary_input([1, 64], "INT64", 512)]}, big),  # 2**40: in range, exact as float32
        binary_record({"inputs": [binary_input([1, 64], "FP32", 256)]}, nan),
        binary_record({"inputs": [binary_input([1, 64], "FP32", 255)]}, one),  # size one short of the bytes
        binary_record({"inputs": [binary_input([1, 64], "FP32", 256)]}, one + b"\0"),  # a byte left over
        binary_record({"inputs": [binary_input([1, 64], "FP32", 256)]}, one, length_delta=-1),
        binary_record({"inputs": [binary_input([1, 64], "FP32", 256)]}, one, length_delta=10_000),
        binary_record({"inputs": [binary_input([1, 64], "FP32", True)]}, one),
        binary_record({"inputs": [binary_input([1, 64], "FP32", -256)]}, one),
        binary_record({"inputs": [binary_input([1, 64], "FP32", 256.0)]}, one),
        binary_record({"inputs": [binary_input([1, 64], "FP32", 256, data=[0.0] * 64)]}, one),
        binary_record({"inputs": [binary_input([], "FP32", 4)]}, one[:4]),
        binary_record({"inputs": [binary_input([1, 32], "FP32", 128)]}, one[:128]),
        binary_record({"inputs": [binary_input([2, 64], "FP32", 256)]}, one),  # shape needs 512 bytes
        binary_record({"inputs": [binary_input([20, 64], "FP32", 5120)]}, one * 20),  # above max_record_rows
        binary_record({"inputs": [{**binary_input([1, 64], "FP32", 256), "name": "other"}]}, one),
        binary_record({"inputs": [binary_input([1, 64], "BYTES", 256)]}, one),
        binary_record({"inputs": [binary_input([1, 64], "FP32", 256)], "outputs": [{"name": "nope"}]}, one),
        binary_record({"inputs": [binary_input([1, 64], "FP32", 256)], "outputs": [{"name": "probabilities"}]}, one),
        binary_record(
            {"inputs": [binary_input([1, 64], "FP32", 256)], "parameters": {"binary_data_output": True}}, one
        ),
        binary_record({"inputs": [binary_input([1, 64], "FP32", 256)], "id": 3}, one),
        binary_record({"inputs": [binary_input([1, 64], "FP32", 256), binary_input([1, 64], "FP32", 256)]}, one + one),
        binary_record({"inputs": [binary_input([True, 64], "FP32", 256)]}, one),
        binary_record({"inputs": {"name": "input"}}, one),
        (b"[1, 2]" + one, [(BINARY_HEADER, b"6")]),
        (one, [(BINARY_HEADER, b"-1")]),
    ]


def test_chunks_of_binary_records_decode_as_record_by_record(digits_signature: ModelSignature) -> None:
    rng = random.Random(7)
    records = [r for _ in range(3) for r in binary_variants(rng)]
    records += [(v, []) for v in digits_variants(rng)]  # JSON neighbours in the same chunk
    rng.shuffle(records)
    check([v for v, _ in records], digits_signature, [h for _, h in records])


def test_a_chunk_of_valid_binary_records_is_decoded_as_one_block(digits_signature: ModelSignature) -> None:
    x = np.random.default_rng(3).random((30, 64), dtype=np.float32)
    records = [encode_request_binary(None, {"input": x[i : i + 1]}) for i in range(30)]
    values: list[bytes | None] = [v for v, _ in records]
    headers = [[(BINARY_HEADER, str(n).encode())] for _, n in records]
    chunk = decode_chunk(values, headers, digits_signature, LIMITS)
    assert len({id(r.block) for r in chunk if isinstance(r, DecodedRequest)}) == 1
    assert all(isinstance(r, DecodedRequest) for r in chunk)
    assert np.array_equal(np.concatenate([r.inputs["input"] for r in chunk]), x)  # type: ignore[union-attr]
    check(values, digits_signature, headers)


@pytest.mark.parametrize("which", range(len(binary_variants(random.Random(0)))))
def test_each_binary_variant_among_valid_neighbours(digits_signature: ModelSignature, which: int) -> None:
    """One variant between valid records of the same declaration: a check the stack path skipped would show here
    (in a mixed chunk a bad neighbour sends the whole group to the per-record decoder)."""
    variants = binary_variants(random.Random(0))
    valid = variants[0]
    records = [valid, variants[which], valid]
    check([v for v, _ in records], digits_signature, [h for _, h in records])


# ------------------------------------------------------------------------------------------- chunks of uniform records
def uniform(rng: random.Random, n: int, nested: bool = False) -> list[bytes | None]:
    """``n`` well-formed one-row digits records as the bench writes them (flat ``data``, or all nested): ids or none,
    ints or floats, an id now and then (a string, or null)."""
    out: list[bytes | None] = []
    for i in range(n):
        row: list[Any] = [rng.randrange(17) if i % 3 == 0 else rng.random() * 16 for _ in range(64)]
        data = [row] if nested else row
        extra: dict[str, Any] = {"id": f"r{i}"} if i % 2 else {}
        if i % 7 == 3:
            extra["id"] = None
        out.append(req(inp("input", [1, 64], "FP32", data), **extra))
    return out


def correlation_headers(n: int) -> list[Any]:
    return [[("correlation_id", f"c{i}".encode())] for i in range(n)]


@pytest.mark.parametrize("nested", [False, True])
def test_a_uniform_chunk_is_one_stack_and_decodes_as_record_by_record(
    digits_signature: ModelSignature, nested: bool
) -> None:
    values = uniform(random.Random(7), 40, nested)
    headers = correlation_headers(40)
    chunk = decode_chunk(values, headers, digits_signature, LIMITS)
    requests = [r for r in chunk if isinstance(r, DecodedRequest)]
    assert len(requests) == 40
    assert len({id(r.block) for r in requests}) == 1
    assert [r.start for r in requests] == list(range(40))
    check(values, digits_signature, headers)


@pytest.mark.parametrize("which", range(len(digits_variants(random.Random(0)))))
def test_each_digits_variant_among_uniform_neighbours(digits_signature: ModelSignature, which: int) -> None:
    """One variant (a hostile record, a different declaration, an unusual field) in a chunk of uniform records:
    decode_chunk gives the record-by-record outcome for every record."""
    rng = random.Random(which)
    values = uniform(rng, 12)
    values.insert(5, digits_variants(rng)[which])
    check(values, digits_signature, correlation_headers(len(values)))


@pytest.mark.parametrize(
    "odd",
    [
        None,
        b"",
        req(inp("input", [1, 64], "FP32", [0.5] * 64), id=7),
        req(inp("input", [1, 64], "FP32", [0.5] * 64), id='say "hi"'),
        req(inp("input", [1, 64], "FP32", [0.5] * 64), trace={"n": 1}),
        req({**inp("input", [1, 64], "FP32", [0.5] * 64), "note": "x"}),
        req(inp("input", [1, 64], "FP32", ["1"] + [0.5] * 63)),
        req(inp("input", [1, 64], "FP32", [["1"] + [0.5] * 63])),
        req(inp("input", [1.0, 64], "FP32", [0.5] * 64)),
        req(inp("input", [1, 64], "FP32", [0.5] * 64), parameters={}),
        req(inp("input", [1, 64], "FP32", [0.5] * 64), outputs=[{"name": "label"}]),
        req(inp("other", [1, 64], "FP32", [0.5] * 64)),
        req(inp("input", [1, 64], "FP64", [0.5] * 64)),
        req(inp("input", [2, 64], "FP32", [0.5] * 128)),
        req(inp("input", [1, 64], "FP32", [0.5] * 64), inp("input", [1, 64], "FP32", [0.5] * 64)),
        req({**inp("input", [1, 64], "FP32", [0.5] * 64), "parameters": {}}),
        req({"name": "input", "shape": [1, 64], "datatype": "FP32"}),
        req(inp("input", [1, 64], "FP32", "x")),
        req(inp("input", [1, 64], ["FP32"], [0.5] * 64)),
        req(inp("input", [[1], 64], "FP32", [0.5] * 64)),
        req(inp("input", [1, -64], "FP32", [0.5] * 64)),
        req(inp("input", [1, 64], "FP32", [0.5] * 63 + [None])),
        req(inp("input", [1, 64], "FP32", [0.5] * 63 + [False])),
        orjson.dumps({"inputs": {"name": "input"}}),
        orjson.dumps([1, 2]),
        b'{"inputs": [',
        b"x" * (LIMITS.max_record_bytes + 1),
    ],
)
def test_an_unusual_record_among_uniform_ones_decodes_as_record_by_record(
    digits_signature: ModelSignature, odd: bytes | None
) -> None:
    values = uniform(random.Random(1), 8)
    values.insert(3, odd)
    check(values, digits_signature, correlation_headers(len(values)))


@pytest.mark.parametrize(
    "header",
    [(BINARY_HEADER, b"12"), ("content-type", b"application/x-protobuf"), ("seldon-infer-type", b"x"), ("X" * 12, b"")],
)
def test_a_header_classify_reads_in_a_uniform_chunk_decodes_as_record_by_record(
    digits_signature: ModelSignature, header: tuple[str, bytes]
) -> None:
    values = uniform(random.Random(2), 6)
    headers = correlation_headers(6)
    headers[4] = [*headers[4], header]
    check(values, digits_signature, headers)
