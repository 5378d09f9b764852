"""The schema cache (consumer/events/registry.py) on confluent-kafka's mock registry and an instant clock: an
unanswering registry is waited out (never a dead letter), an unknown ID is asked again a bounded number of times,
result schemas are looked up, registered once, or refused."""

from __future__ import annotations

import json
import logging

import numpy as np
import pytest
from confluent_kafka.schema_registry.error import SchemaRegistryError

from consumer.errors import ConfigError, ModelError
from consumer.errors import DeadLetterReason as R
from consumer.events.mapping import InputMapping, load_mapping
from consumer.events.registry import UNKNOWN_TTL_S, Schemas
from consumer.signature import ModelSignature, TensorSpec
from consumer.timeouts import Backoff
from tests.unit.consumer.events.fakes import PAYMENT, FlakyRegistry, InstantClock

F32, I64 = np.dtype(np.float32), np.dtype(np.int64)
SIGNATURE = ModelSignature("m", "1", (TensorSpec("amount", F32, (None, 1)),), (TensorSpec("score", F32, (None,)),))


def schemas_of(
    registry: FlakyRegistry, clock: InstantClock, *, enrich: bool = True, register: bool = True, retries: int = 2
) -> tuple[Schemas, list[bool]]:
    mapping: InputMapping = load_mapping(SIGNATURE, None, enrich)
    seen: list[bool] = []
    schemas = Schemas(
        registry,
        mapping,
        SIGNATURE,
        "scored-value" if enrich else None,
        register=register,
        unknown_retries=retries,
        backoff=Backoff(0.1, 2.0),
        clock=clock,
        sleep=clock.sleep,
        reachable=seen.append,
        url="mock://registry",
    )
    return schemas, seen


async def test_a_writer_schema_is_fetched_once_checked_and_its_result_schema_registered() -> None:
    registry, clock = FlakyRegistry(), InstantClock()
    writer_id = await registry.add("payments-value", PAYMENT)
    schemas, _ = schemas_of(registry, clock)
    await schemas.resolve([writer_id, writer_id])
    await schemas.resolve([writer_id])
    known = schemas.get(writer_id)
    assert known is not None
    assert known.error is None
    assert known.result_id is not None
    assert registry.calls == ["get_schema", "lookup_schema", "register_schema"]  # once, however often asked
    result = await registry.mock.get_schema(known.result_id)
    fields = [f["name"] for f in json.loads(result.schema_str)["fields"]]
    assert fields == ["id", "amount", "device", "at", "score"]


async def test_a_registry_that_does_not_answer_is_waited_out_and_said_once(caplog: pytest.LogCaptureFixture) -> None:
    registry, clock = FlakyRegistry(), InstantClock()
    writer_id = await registry.add("payments-value", PAYMENT)
    schemas, seen = schemas_of(registry, clock, enrich=False)
    registry.down = 5
    waited: list[float] = []

    async def idle(
        seconds: float,
    ) -> None:  # the delivery mode's idle (Source.idle): here it checks the state meanwhile
        waited.append(seconds)
        assert schemas.down_since is not None

    with caplog.at_level(logging.INFO, logger="consumer.events.registry"):
        await schemas.resolve([writer_id], idle)
    assert waited == [0.1, 0.2, 0.4, 0.8, 1.6]  # capped exponential backoff, as long as it takes
    assert schemas.get(writer_id) is not None
    assert schemas.down_since is None
    assert seen == [True, False, True]
    lines = [r.getMessage() for r in caplog.records]
    assert sum("does not answer" in line for line in lines) == 1
    assert sum("answers again" in line for line in lines) == 1


async def test_an_unknown_id_is_asked_again_then_its_records_are_dead_lettered_for_a_while() -> None:
    registry, clock = FlakyRegistry(), InstantClock()
    schemas, _ = schemas_of(registry, clock, retries=2)
    await schemas.resolve([404])
    assert registry.calls == ["get_schema"] * 3
    assert schemas.get(404) is None
    await schemas.resolve([404])  # remembered as unknown
    assert len(registry.calls) == 3
    clock.now += UNKNOWN_TTL_S + 1  # then asked again
    await schemas.resolve([404])
    assert len(registry.calls) == 6


async def test_a_schema_that_cannot_feed_the_model_gives_its_records_one_reason() -> None:
    registry, clock = FlakyRegistry(), InstantClock()
    no_amount = dict(PAYMENT, fields=[f for f in PAYMENT["fields"] if f["name"] != "amount"])
    text_amount = dict(PAYMENT, name="P2", fields=[{"name": "amount", "type": "string"}])
    clash = dict(PAYMENT, name="P3", fields=[*PAYMENT["fields"], {"name": "score", "type": "float"}])
    decimal = dict(
        PAYMENT,
        name="P4",
        fields=[{"name": "amount", "type": {"type": "bytes", "logicalType": "decimal", "precision": 9, "scale": 2}}],
    )
    ids = [await registry.add(f"s{i}-value", s) for i, s in enumerate((no_amount, text_amount, clash, decimal))]
    schemas, _ = schemas_of(registry, clock)
    await schemas.resolve(ids)
    errors = [schemas.get(i).error for i in ids]  # type: ignore[union-attr]
    assert [e.reason if e else None for e in errors] == [R.MISSING_FIELD, R.WRONG_TYPE, R.FIELD_CLASH, R.WRONG_TYPE]
    assert "no field 'amount'" in str(errors[0])
    assert "decimal" in str(errors[3])
    assert "register_schema" not in registry.calls  # no result schema for a schema that cannot be answered


async def test_result_schemas_refused_or_missing() -> None:
    registry, clock = FlakyRegistry(), InstantClock()
    writer_id = await registry.add("payments-value", PAYMENT)
    refused, _ = schemas_of(registry, clock)
    registry.refuse_register = True
    await refused.resolve([writer_id])
    assert refused.get(writer_id).error.reason is R.RESULT_SCHEMA_REFUSED  # type: ignore[union-attr]
    registry.refuse_register = False
    lookup_only, _ = schemas_of(registry, clock, register=False)
    await lookup_only.resolve([writer_id])
    error = lookup_only.get(writer_id).error  # type: ignore[union-attr]
    assert error is not None
    assert "register_result_schema is false" in str(error)


async def test_start_up_stops_when_the_result_schema_may_not_be_registered() -> None:
    registry, clock = FlakyRegistry(), InstantClock()
    await registry.add("payments-value", PAYMENT)
    schemas, _ = schemas_of(registry, clock, register=False)
    with pytest.raises(ConfigError, match="not under subject scored-value and register_result_schema is false"):
        await schemas.start("payments-value")
    fine, _ = schemas_of(registry, clock)
    await fine.start("payments-value")  # registers it
    await fine.start("no-such-subject-value")  # a subject without versions yet: nothing to check
    await schemas.start("payments-value")  # registered now: the lookup finds it
    await schemas.close()
    assert registry.closed


async def test_start_up_stops_when_the_mapping_names_a_field_the_latest_writer_schema_lacks() -> None:
    registry, clock = FlakyRegistry(), InstantClock()
    renamed = [dict(f, name="amont") if f["name"] == "amount" else f for f in PAYMENT["fields"]]
    await registry.add("payments-value", dict(PAYMENT, fields=renamed))
    schemas, _ = schemas_of(registry, clock, enrich=False)
    with pytest.raises(
        ConfigError,
        match=r"^input_mapping names a field the latest writer schema of payments-value "
        r"\(id \d+\) lacks: .*'amount'.*did you mean 'amont'\? its fields: id, amont, device, at",
    ):
        await schemas.start("payments-value")
    await registry.add("payments-value", PAYMENT)  # a fixed version: the latest now feeds it
    await schemas.start("payments-value")


async def test_start_up_stops_when_the_latest_writer_schema_cannot_feed_the_model() -> None:
    registry, clock = FlakyRegistry(), InstantClock()
    retyped = [dict(f, type="string") if f["name"] == "amount" else f for f in PAYMENT["fields"]]
    await registry.add("payments-value", dict(PAYMENT, fields=retyped))
    schemas, _ = schemas_of(registry, clock, enrich=False)
    with pytest.raises(ModelError, match=r"latest writer schema of payments-value \(id \d+\).*wrong_type.*amount"):
        await schemas.start("payments-value")


@pytest.mark.parametrize(
    ("answer", "expected"),
    [
        (
            SchemaRegistryError(404, -1, "not found"),
            r"HTTP 404\); for Apicurio Registry add .*mock://registry/apis/ccompat/v7",
        ),
        (SchemaRegistryError(302, -1, "found"), r"HTTP 302\)"),
        (json.JSONDecodeError("Expecting value", "<html>", 0), r"an answer that is not JSON"),
        ({"subjects": []}, r"JSON that is not a list of schema types"),
    ],
)
async def test_a_url_that_answers_but_not_as_the_registry_api_stops_start_up(answer: object, expected: str) -> None:
    registry, clock = FlakyRegistry(), InstantClock()
    registry.types = answer  # type: ignore[assignment]
    schemas, _ = schemas_of(registry, clock)
    with pytest.raises(
        ConfigError,
        match=r"^schema_registry_url=mock://registry answers, but not as a "
        r"Confluent-compatible Schema Registry API \(GET mock://registry/schemas/types: " + expected,
    ):
        await schemas.start("payments-value")
    assert registry.calls == ["get_schema_types"]  # nothing else asked: no subject read as empty


async def test_apicurios_own_api_path_is_answered_with_its_compatible_path() -> None:
    registry, clock = FlakyRegistry(), InstantClock()
    registry.types = SchemaRegistryError(404, -1, "not found")
    schemas, _ = schemas_of(registry, clock)
    schemas._url = "http://host:8080/apis/registry/v2"  # as the settings would give it
    with pytest.raises(ConfigError, match=r"ends in /apis/ccompat/v7 \(http://host:8080/apis/registry/v2/apis"):
        await schemas.start("payments-value")


@pytest.mark.parametrize("status", [401, 403])
async def test_refused_registry_credentials_stop_start_up_naming_the_settings(status: int) -> None:
    registry, clock = FlakyRegistry(), InstantClock()
    registry.types = SchemaRegistryError(status, status, "unauthorized")
    schemas, _ = schemas_of(registry, clock)
    with pytest.raises(ConfigError, match=r"refused the credentials.*schema_registry_username"):
        await schemas.start("payments-value")


async def test_a_registry_without_avro_stops_start_up() -> None:
    registry, clock = FlakyRegistry(), InstantClock()
    registry.types = ["JSON", "PROTOBUF"]
    schemas, _ = schemas_of(registry, clock)
    with pytest.raises(ConfigError, match="serves no Avro schemas"):
        await schemas.start("payments-value")


async def test_an_unreachable_registry_at_start_up_is_waited_out_naming_its_url(
    caplog: pytest.LogCaptureFixture,
) -> None:
    registry, clock = FlakyRegistry(), InstantClock()
    await registry.add("payments-value", PAYMENT)
    schemas, seen = schemas_of(registry, clock, enrich=False)
    registry.down = 4
    with caplog.at_level(logging.INFO, logger="consumer.events.registry"):
        await schemas.start("payments-value")
    assert registry.calls[:5] == ["get_schema_types"] * 5  # asked until it answered, then the subject
    assert registry.calls[5:] == ["get_latest_version", "get_schema"]
    assert clock.slept == [0.1, 0.2, 0.4, 0.8]
    assert seen == [True, False, True]
    lines = [r.getMessage() for r in caplog.records]
    assert [line for line in lines if "does not answer" in line] == [
        "schema registry mock://registry does not answer (connection refused); holding the records that need a "
        "schema, retrying"
    ]
    assert "checking the schema registry at mock://registry (GET /schemas/types)" in lines
