"""Results keep request order: on a real broker, thousands of requests on 16 keys (so each key lives on one request
partition and one results partition), mixed row counts and a few poison records, in both delivery modes. A reader
of the results topic sees every key's answers in the order the requests were sent."""

from __future__ import annotations

import random
import uuid
from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest
from aiokafka import AIOKafkaProducer

from consumer.answers.headers import CORRELATION_HEADER
from consumer.oip.client import encode_request
from tests.integration.conftest import AppFactory, read_all

pytestmark = pytest.mark.integration

KEYS = 16
RECORDS = 20000


async def correlation_ids(bootstrap: str, topic: str, want: int, isolation_level: str) -> dict[int, list[bytes]]:
    """Correlation IDs of the first ``want`` records of ``topic``, per partition in log order."""
    out: dict[int, list[bytes]] = defaultdict(list)
    for r in await read_all(bootstrap, topic, want=want, isolation_level=isolation_level):
        out[r.partition].append(next(v for k, v in r.headers if k == CORRELATION_HEADER))
    return out


@pytest.mark.parametrize("delivery", ["at_least_once", "exactly_once"])
async def test_every_keys_results_arrive_in_request_order(
    delivery: str, kafka_bootstrap: str, topics: dict[str, str], start_app: AppFactory, digits_model: Path
) -> None:
    await start_app(delivery=delivery, transactional_id_prefix=f"order-{uuid.uuid4().hex[:6]}")
    x = np.load(digits_model / "heldout.npz")["x"].astype(np.float32)
    rng = random.Random(20261201)
    run = uuid.uuid4().hex[:6]
    sent: dict[int, int] = defaultdict(int)
    poison = 0
    producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap, enable_idempotence=True, linger_ms=5)
    await producer.start()
    try:
        futures = []
        for i in range(RECORDS):
            key = rng.randrange(KEYS)
            cid = f"{run}-{key}-{sent[key]}".encode()
            sent[key] += 1
            if rng.random() < 0.02:
                value = b"{not json"
                poison += 1
            else:
                rows = 8 if rng.random() < 0.2 else 1
                start = (i * 3) % (len(x) - rows)
                value = encode_request(None, {"input": x[start : start + rows]})
            headers = [(CORRELATION_HEADER, cid)]
            futures.append(await producer.send(topics["requests"], value, key=f"key-{key}".encode(), headers=headers))
        for future in futures:
            await future
    finally:
        await producer.stop()

    isolation = "read_committed" if delivery == "exactly_once" else "read_uncommitted"
    results = await correlation_ids(kafka_bootstrap, topics["results"], RECORDS - poison, isolation)
    seen: dict[int, list[int]] = defaultdict(list)
    for ids in results.values():
        for cid in ids:
            _, key, seq = cid.decode().rsplit("-", 2)
            seen[int(key)].append(int(seq))  # a key lives on one results partition: its log order is the order
    assert sum(len(v) for v in seen.values()) == RECORDS - poison  # every result, once
    for key, seqs in seen.items():
        assert seqs == sorted(seqs), f"key {key}: results out of request order"
        assert len(seqs) == len(set(seqs)), f"key {key}: a result twice"
    dead = await correlation_ids(kafka_bootstrap, topics["dlq"], poison, isolation)
    assert sum(len(v) for v in dead.values()) == poison
