"""Event chunks (consumer/events/decode.py): JSON and Avro values -> requests whose tensors are rows of one block, or
each bad record's reason; tombstones kept apart. Every event reason is given a real bad record here."""

from __future__ import annotations

import io
from typing import Any

import fastavro
import numpy as np
import orjson
import pytest

from consumer.errors import DeadLetterReason as R
from consumer.errors import DecodeError, RecordError
from consumer.events.avro import frame
from consumer.events.avro import parse as avro_parse
from consumer.events.decode import TOMBSTONE, EventDecoder
from consumer.events.mapping import load_mapping
from consumer.events.registry import Schemas, schema_ids
from consumer.json_object import record_json
from consumer.signature import ModelSignature, TensorSpec
from consumer.timeouts import Backoff
from consumer.work import DecodedRequest, Limits
from tests.unit.consumer.events.fakes import PAYMENT, FlakyRegistry, InstantClock

F32 = np.dtype(np.float32)
SIGNATURE = ModelSignature("m", "1", (TensorSpec("amount", F32, (None, 1)),), (TensorSpec("score", F32, (None,)),))
MAPPING = load_mapping(SIGNATURE, None, enrich=True)


def outcome(o: Any) -> str:
    if o is TOMBSTONE:
        return "tombstone"
    if isinstance(o, RecordError):
        return o.reason.value
    assert isinstance(o, DecodedRequest)
    return "request"


def test_json_events_become_rows_of_one_block() -> None:
    decoder = EventDecoder("json", MAPPING, Limits(max_record_bytes=200), result_fields=["score"])
    values = [
        orjson.dumps({"amount": 12.5, "merchant": "a"}),
        b"\x00\x00\x00\x00\x07" + orjson.dumps({"amount": 3}),  # a JSON Schema serializer's frame: skipped
        None,  # a tombstone
        b"{not json",
        b"[1, 2]",
        orjson.dumps({"amount": "12"}),
        orjson.dumps({"other": 1}),
        orjson.dumps({"amount": 1, "score": 0.5}),  # the result would overwrite it
        orjson.dumps({"amount": 1, "pad": "x" * 300}),
        orjson.dumps({"amount": 7}),
    ]
    out = decoder.decode(values)
    assert [outcome(o) for o in out] == [
        "request",
        "request",
        "tombstone",
        R.INVALID_JSON,
        R.NOT_AN_OBJECT,
        R.WRONG_TYPE,
        R.MISSING_FIELD,
        R.FIELD_CLASH,
        R.TOO_LARGE,
        "request",
    ]
    requests = [o for o in out if isinstance(o, DecodedRequest)]
    assert [r.inputs["amount"].tolist() for r in requests] == [[[12.5]], [[3.0]], [[7.0]]]
    assert requests[0].block is requests[2].block  # one tensor for the chunk
    assert [r.start for r in requests] == [0, 1, 2]
    assert requests[0].event is not None
    assert requests[0].event.fields == {"amount": 12.5, "merchant": "a"}
    assert requests[0].shape_key == (("amount", (1,)),)
    # the messages are every JSON record's (consumer.json_object.record_json), word for word
    for bad in (b"{not json", b"[1, 2]", b"\x00\x00\x00\x00\x07 7", b""):
        (error,) = decoder.decode([bad])
        with pytest.raises(DecodeError) as expected:
            record_json(bad[5:] if bad[:1] == b"\x00" else bad)
        assert isinstance(error, DecodeError)
        assert (error.reason, str(error)) == (expected.value.reason, str(expected.value))


def avro_bytes(schema: dict[str, Any], datum: dict[str, Any]) -> bytes:
    out = io.BytesIO()
    fastavro.schemaless_writer(out, fastavro.parse_schema(schema, named_schemas={}), datum)
    return out.getvalue()


async def test_avro_events_through_their_writer_schemas() -> None:
    registry, clock = FlakyRegistry(), InstantClock()
    good_id = await registry.add("payments-value", PAYMENT)
    no_amount = dict(PAYMENT, name="Old", fields=[f for f in PAYMENT["fields"] if f["name"] != "amount"])
    old_id = await registry.add("payments-value", no_amount)
    schemas = Schemas(registry, MAPPING, SIGNATURE, "scored-value", register=True, unknown_retries=0,
                      backoff=Backoff(0.1, 1.0), clock=clock, sleep=clock.sleep)  # fmt: skip
    decoder = EventDecoder("avro", MAPPING, Limits(), schemas, ["score"])
    datum = {"id": "p-1", "amount": 12.5, "device": {"age_days": 3}, "at": 1_764_000_000_000}
    payload = avro_bytes(PAYMENT, datum)
    values = [
        frame(good_id, payload),
        frame(old_id, avro_bytes(no_amount, {"id": "p-2", "device": None, "at": 1})),  # the schema lacks a field
        orjson.dumps({"amount": 1}),  # not framed
        frame(999, payload),  # an ID the registry does not know
        frame(good_id, payload[:-3]),  # truncated
        frame(good_id, payload + b"\x00"),  # a byte left over
        None,
    ]
    await decoder.prepare(values)
    out = decoder.decode(values)
    assert [outcome(o) for o in out] == [
        "request",
        R.MISSING_FIELD,
        R.NOT_IN_WIRE_FORMAT,
        R.UNKNOWN_SCHEMA_ID,
        R.INVALID_AVRO,
        R.INVALID_AVRO,
        "tombstone",
    ]
    request = out[0]
    assert isinstance(request, DecodedRequest)
    assert request.event is not None
    assert request.event.schema_id == good_id
    assert request.event.fields == datum  # timestamp-millis read raw: its long, not a datetime
    assert request.inputs["amount"].tolist() == [[12.5]]


async def test_a_refused_result_schema_dead_letters_its_writer_schemas_records() -> None:
    registry, clock = FlakyRegistry(), InstantClock()
    good_id = await registry.add("payments-value", PAYMENT)
    registry.refuse_register = True
    schemas = Schemas(registry, MAPPING, SIGNATURE, "scored-value", register=True, unknown_retries=0,
                      backoff=Backoff(0.1, 1.0), clock=clock, sleep=clock.sleep)  # fmt: skip
    decoder = EventDecoder("avro", MAPPING, Limits(), schemas, ["score"])
    value = frame(good_id, avro_bytes(PAYMENT, {"id": "p", "amount": 1.0, "device": None, "at": 0}))
    await decoder.prepare([value])
    (out,) = decoder.decode([value])
    assert outcome(out) == R.RESULT_SCHEMA_REFUSED
    assert "409" in str(out)
    assert "scored-value" in str(out)


def test_only_plain_numeric_avro_fields_skip_the_type_scan() -> None:
    def schema(t: Any) -> Any:
        return avro_parse({"type": "record", "name": "R", "fields": [{"name": "amount", "type": t}]})

    assert MAPPING.numeric(schema("double"))
    assert MAPPING.numeric(schema("long"))
    assert not MAPPING.numeric(schema(["null", "double"]))  # a null: missing_field, found by the scan
    assert not MAPPING.numeric(schema("string"))
    assert not MAPPING.numeric(avro_parse({"type": "record", "name": "R", "fields": [{"name": "x", "type": "double"}]}))
    # the scan skipped or not, the tensors are the same
    events = [{"amount": 1}, {"amount": 2.5}, {"amount": -0.0}]
    typed, errors = MAPPING.tensors(events, numbers=True)
    scanned, _ = MAPPING.tensors(events)
    assert errors == [None] * 3
    assert typed["amount"].tobytes() == scanned["amount"].tobytes()
    assert typed["amount"].dtype == np.float32
    _huge, errors = MAPPING.tensors([{"amount": 1e300}], numbers=True)  # the range is still checked
    assert errors[0] is not None
    assert errors[0].reason == R.WRONG_TYPE


# ------------------------------------------------------------------------------------------------ the uniform chunk
def general(decoder: EventDecoder) -> EventDecoder:
    """The same decoder with the uniform chunk's fast path off: record by record, the oracle."""
    oracle = EventDecoder.__new__(EventDecoder)
    oracle.__dict__.update(decoder.__dict__)
    oracle._uniform = lambda values: None  # type: ignore[method-assign]
    return oracle


def same_outcomes(got: list[Any], want: list[Any]) -> None:
    assert [outcome(o) for o in got] == [outcome(o) for o in want]
    for a, b in zip(got, want, strict=True):
        if isinstance(a, RecordError):
            assert (a.reason, str(a)) == (b.reason, str(b))
        elif isinstance(a, DecodedRequest):
            assert a.start == b.start
            assert a.shape_key == b.shape_key
            assert {k: v.tobytes() for k, v in a.inputs.items()} == {k: v.tobytes() for k, v in b.inputs.items()}
            assert a.event is not None
            assert b.event is not None
            assert (a.event.fields, bytes(a.event.raw), a.event.schema_id) == (
                b.event.fields,
                bytes(b.event.raw),
                b.event.schema_id,
            )


JSON_GOOD = [orjson.dumps({"amount": 1.5 * i, "merchant": f"m{i}"}) for i in range(6)] + [orjson.dumps({"amount": 4})]
JSON_ODD = [
    b"\x00\x00\x00\x00\x07" + orjson.dumps({"amount": 3}),
    None,
    b"{not json",
    b"[1, 2]",
    orjson.dumps({"amount": "12"}),
    orjson.dumps({"amount": True}),
    orjson.dumps({"amount": None}),
    orjson.dumps({"other": 1}),
    orjson.dumps({"amount": 1, "score": 0.5}),
    orjson.dumps({"amount": 1, "pad": "x" * 300}),
    b"",
    b"{}",
]


def test_a_uniform_json_chunk_is_decoded_at_once_as_record_by_record() -> None:
    decoder = EventDecoder("json", MAPPING, Limits(max_record_bytes=200), result_fields=["score"])
    assert decoder._uniform(JSON_GOOD) is not None
    out = decoder.decode(JSON_GOOD)
    same_outcomes(out, general(decoder).decode(JSON_GOOD))
    assert len({id(o.block) for o in out if isinstance(o, DecodedRequest)}) == 1


@pytest.mark.parametrize("odd", JSON_ODD)
def test_an_unusual_json_record_among_uniform_ones_decodes_as_record_by_record(odd: bytes | None) -> None:
    decoder = EventDecoder("json", MAPPING, Limits(max_record_bytes=200), result_fields=["score"])
    values = [*JSON_GOOD[:3], odd, *JSON_GOOD[3:]]
    same_outcomes(decoder.decode(values), general(decoder).decode(values))


async def test_uniform_avro_chunks_decode_as_record_by_record() -> None:
    registry, clock = FlakyRegistry(), InstantClock()
    good_id = await registry.add("payments-value", PAYMENT)
    other = dict(PAYMENT, name="Other", fields=[*PAYMENT["fields"], {"name": "note", "type": "string", "default": ""}])
    other_id = await registry.add("payments-value", other)
    schemas = Schemas(registry, MAPPING, SIGNATURE, "scored-value", register=True, unknown_retries=0,
                      backoff=Backoff(0.1, 1.0), clock=clock, sleep=clock.sleep)  # fmt: skip
    decoder = EventDecoder("avro", MAPPING, Limits(), schemas, ["score"])
    payloads = [
        avro_bytes(PAYMENT, {"id": f"p-{i}", "amount": 0.5 * i, "device": {"age_days": i} if i % 2 else None, "at": i})
        for i in range(6)
    ]
    good = [frame(good_id, p) for p in payloads]
    odd = [
        frame(good_id, payloads[1][:-3]),  # truncated
        frame(good_id, payloads[1] + b"\x00"),  # a byte left over
        frame(other_id, avro_bytes(other, {"id": "q", "amount": 2.0, "device": None, "at": 0, "note": "n"})),
        frame(999, payloads[0]),
        orjson.dumps({"amount": 1}),
        b"\x00\x00",
        None,
    ]
    await decoder.prepare([*good, *odd])
    assert decoder._uniform(good) is not None
    out = decoder.decode(good)
    same_outcomes(out, general(decoder).decode(good))
    assert [o.event.schema_id for o in out if isinstance(o, DecodedRequest) and o.event] == [good_id] * 6
    for value in odd:
        values = [*good[:2], value, *good[2:]]
        assert decoder._uniform(values) is None
        same_outcomes(decoder.decode(values), general(decoder).decode(values))


async def test_a_chunk_of_a_strings_and_numbers_schema_is_read_at_once_as_record_by_record() -> None:
    simple = {"type": "record", "name": "Simple", "fields": [{"name": "id", "type": "string"},
              {"name": "amount", "type": "double"}, {"name": "note", "type": "string"}]}  # fmt: skip
    registry, clock = FlakyRegistry(), InstantClock()
    schema_id = await registry.add("payments-value", simple)
    schemas = Schemas(registry, MAPPING, SIGNATURE, "scored-value", register=True, unknown_retries=0,
                      backoff=Backoff(0.1, 1.0), clock=clock, sleep=clock.sleep)  # fmt: skip
    decoder = EventDecoder("avro", MAPPING, Limits(), schemas, ["score"])
    good = [frame(schema_id, avro_bytes(simple, {"id": f"p{i}", "amount": i / 3, "note": "é" * i})) for i in range(5)]
    await decoder.prepare(good)
    out = decoder.decode(good)
    assert decoder._layouts[schema_id] is not None  # read by the layout
    same_outcomes(out, general(decoder).decode(good))
    for bad in (good[1][:-1], good[1] + b"\x00"):
        values = [*good[:2], bad, *good[2:]]
        same_outcomes(decoder.decode(values), general(decoder).decode(values))


async def test_an_avro_chunk_read_at_once_feeds_the_tensors_from_its_number_columns_as_the_events_would() -> None:
    schema = {"type": "record", "name": "Two", "fields": [{"name": "id", "type": "string"},
              {"name": "amount", "type": "double"}, {"name": "ratio", "type": "float"}]}  # fmt: skip
    signature = ModelSignature(
        "m",
        "1",
        (TensorSpec("amount", F32, (None, 1)), TensorSpec("ratio", np.dtype(np.float64), (None,))),
        (TensorSpec("score", F32, (None,)),),
    )
    mapping = load_mapping(signature, None, enrich=True)
    registry, clock = FlakyRegistry(), InstantClock()
    schema_id = await registry.add("payments-value", schema)
    schemas = Schemas(registry, mapping, signature, "scored-value", register=True, unknown_retries=0,
                      backoff=Backoff(0.1, 1.0), clock=clock, sleep=clock.sleep)  # fmt: skip
    decoder = EventDecoder("avro", mapping, Limits(), schemas, ["score"])
    datums = [{"id": f"p{i}", "amount": (i - 3) / 7 * 10.0**i, "ratio": 1 / (i + 3)} for i in range(8)]
    good = [frame(schema_id, avro_bytes(schema, d)) for d in datums]
    await decoder.prepare(good)
    uniform = decoder._uniform(good)
    assert uniform is not None
    assert uniform[3] is not None  # read by the layout, with its number columns
    assert mapping.number_columns(uniform[3][1], len(good)) is not None
    out = decoder.decode(good)
    first = out[0]
    assert isinstance(first, DecodedRequest)
    assert first.event is not None
    assert first.event._fields is None  # built only when looked at (nothing on the serving path does)
    same_outcomes(out, general(decoder).decode(good))
    assert first.event._fields is not None  # (built by the comparison, and kept)
    assert [o.inputs["ratio"].dtype for o in out if isinstance(o, DecodedRequest)] == [np.float64] * 8
    for odd in (float("nan"), float("inf"), 1e39):  # not finite, or beyond float32: the events' path decides
        values = [*good[:2], frame(schema_id, avro_bytes(schema, {**datums[2], "amount": odd})), *good[3:]]
        uniform = decoder._uniform(values)
        assert uniform is not None
        assert uniform[3] is not None
        assert mapping.number_columns(uniform[3][1], len(values)) is None
        got = decoder.decode(values)
        assert outcome(got[2]) == ("request" if odd != odd else R.WRONG_TYPE)  # as the general path has it
        want = general(decoder).decode(values)
        same_outcomes(got[:2] + got[3:], want[:2] + want[3:])
        if isinstance(got[2], DecodedRequest):  # a NaN is no NaN's equal: compared by its text and bytes
            assert isinstance(want[2], DecodedRequest)
            assert got[2].event is not None
            assert want[2].event is not None
            assert repr(got[2].event.fields) == repr(want[2].event.fields)
            assert got[2].inputs["amount"].tobytes() == want[2].inputs["amount"].tobytes()
        else:
            same_outcomes(got[2:3], want[2:3])


def test_schema_ids_of_a_chunk_with_and_without_tombstones() -> None:
    values: list[bytes | None] = [frame(7, b"a"), frame(7, b""), frame(300, b"xyz"), b"", b"\x00\x00\x00", b"{}"]
    values += [b"\x01\x00\x00\x00\x09", frame(2**31, b"z")]
    assert schema_ids(values) == {7, 300, 2**31}  # short, empty and unframed values have none
    assert schema_ids([*values, None]) == {7, 300, 2**31}  # the record-by-record loop
    assert schema_ids([None]) == set()
    assert schema_ids([]) == set()
