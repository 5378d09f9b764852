"""A protobuf ModelInferRequest built with Triton's compiled messages, through a real consumer and broker: the
answer is a ModelInferResponse those messages parse, with the outputs of the same request sent as JSON."""

from __future__ import annotations

import uuid
from pathlib import Path

import numpy as np
import pytest
from aiokafka import AIOKafkaProducer
from tritonclient.grpc import service_pb2 as triton

from consumer.answers.headers import CORRELATION_HEADER
from consumer.oip.client import encode_request
from producer_tools.produce import Outgoing
from tests.integration.conftest import AppFactory, answers, read_all

pytestmark = pytest.mark.integration


async def test_a_protobuf_request_gets_a_protobuf_response_equal_to_the_json_one(
    kafka_bootstrap: str, topics: dict[str, str], start_app: AppFactory, digits_model: Path
) -> None:
    x = np.load(digits_model / "heldout.npz")["x"][:3].astype(np.float32)
    run = uuid.uuid4().hex[:6]
    typed = triton.ModelInferRequest(model_name="digits", id=f"{run}-typed")
    typed.inputs.add(name="input", datatype="FP32", shape=[3, 64]).contents.fp32_contents.extend(x.ravel().tolist())
    raw = triton.ModelInferRequest(model_name="digits", id=f"{run}-raw", raw_input_contents=[x.tobytes()])
    raw.inputs.add(name="input", datatype="FP32", shape=[3, 64])
    raw.outputs.add(name="probabilities")
    records = [
        (Outgoing(f"{run}-typed", typed.SerializeToString()), [("seldon-infer-type", b"proto/InferModelRequest")]),
        (Outgoing(f"{run}-raw", raw.SerializeToString()), [("content-type", b"application/x-protobuf")]),
        (Outgoing(f"{run}-json", encode_request(f"{run}-json", {"input": x})), []),
    ]
    await start_app()
    producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap)
    await producer.start()
    try:
        for rec, headers in records:
            cid = rec.correlation_id.encode()
            await producer.send_and_wait(topics["requests"], rec.value, headers=[(CORRELATION_HEADER, cid), *headers])
    finally:
        await producer.stop()
    report = await answers(kafka_bootstrap, topics, [rec for rec, _ in records])
    assert report.missing == []
    assert report.results == 3
    as_json = report.answers[f"{run}-json"].body
    assert as_json is not None
    values = {
        dict(r.headers)[CORRELATION_HEADER].decode(): r.value
        for r in await read_all(kafka_bootstrap, topics["results"])
    }
    for name, wanted in (("typed", ["label", "probabilities"]), ("raw", ["probabilities"])):
        answer = report.answers[f"{run}-{name}"]
        assert answer.headers["seldon-infer-type"] == b"proto/InferModelResponse"
        assert answer.headers["content-type"] == b"application/x-protobuf"
        assert answer.body is not None  # streaminfer-results reads it too
        parsed = triton.ModelInferResponse.FromString(values[f"{run}-{name}"])
        assert parsed.id == f"{run}-{name}"  # the correlation ID, as for JSON
        assert [o.name for o in parsed.outputs] == wanted
        for tensor, blob in zip(parsed.outputs, parsed.raw_output_contents, strict=True):
            dtype = {"INT64": "<i8", "FP32": "<f4"}[tensor.datatype]
            got = np.frombuffer(blob, dtype=dtype).reshape(tuple(tensor.shape))
            np.testing.assert_array_equal(got, as_json["outputs"][tensor.name])
