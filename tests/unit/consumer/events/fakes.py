"""Fakes for the events path: a schema registry (confluent-kafka's in-process mock client) that can stop answering or
refuse, and a clock whose sleep moves it at once."""

from __future__ import annotations

import json
from typing import Any

import httpx2
from confluent_kafka.schema_registry import RegisteredSchema, Schema
from confluent_kafka.schema_registry._async.mock_schema_registry_client import AsyncMockSchemaRegistryClient
from confluent_kafka.schema_registry.error import SchemaRegistryError

#: A writer schema for the tests: a record with an amount, a nested device age and a category.
PAYMENT = {
    "type": "record",
    "name": "Payment",
    "namespace": "example",
    "fields": [
        {"name": "id", "type": "string"},
        {"name": "amount", "type": "double"},
        {
            "name": "device",
            "type": ["null", {"type": "record", "name": "Device", "fields": [{"name": "age_days", "type": "long"}]}],
            "default": None,
        },
        {"name": "at", "type": {"type": "long", "logicalType": "timestamp-millis"}},
    ],
}


class InstantClock:
    """Monotonic seconds that a ``sleep`` moves at once (the pauses it was asked for are kept)."""

    def __init__(self) -> None:
        self.now = 100.0
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


class FlakyRegistry:
    """confluent-kafka's ``AsyncMockSchemaRegistryClient`` behind a switch: ``down`` calls fail as a connection
    would, ``refuse_register`` answers registrations 409, ``calls`` counts the requests."""

    def __init__(self) -> None:
        self.mock = AsyncMockSchemaRegistryClient({"url": "mock://registry"})
        self.down = 0  # the next N calls fail to connect
        self.refuse_register = False
        self.calls: list[str] = []
        self.closed = False
        #: What ``get_schema_types`` answers (a real registry's list) or raises.
        self.types: list[str] | BaseException = ["JSON", "PROTOBUF", "AVRO"]

    def _enter(self, what: str) -> None:
        self.calls.append(what)
        if self.down:
            self.down -= 1
            raise httpx2.ConnectError("connection refused")

    async def get_schema(self, schema_id: int) -> Schema:
        self._enter("get_schema")
        return await self.mock.get_schema(schema_id)

    async def lookup_schema(self, subject_name: str, schema: Schema) -> RegisteredSchema:
        self._enter("lookup_schema")
        return await self.mock.lookup_schema(subject_name, schema)

    async def register_schema(self, subject_name: str, schema: Schema) -> int:
        self._enter("register_schema")
        if self.refuse_register:
            raise SchemaRegistryError(409, 409, "Schema being registered is incompatible with an earlier schema")
        return await self.mock.register_schema(subject_name, schema)

    async def get_latest_version(self, subject_name: str) -> RegisteredSchema:
        self._enter("get_latest_version")
        return await self.mock.get_latest_version(subject_name)

    async def get_schema_types(self) -> list[str]:
        self._enter("get_schema_types")
        if isinstance(self.types, BaseException):
            raise self.types
        return self.types

    async def aclose(self) -> None:
        self.closed = True

    async def add(self, subject: str, schema: dict[str, Any]) -> int:
        """Register a writer schema (as a producer's serializer would); its ID."""
        return await self.mock.register_schema(subject, Schema(json.dumps(schema), "AVRO"))
