"""Variable-length inputs end to end: text, token ids and binary requests of a sequence model, bucketed and padded,
answered exactly as solo runs would be."""

from __future__ import annotations

import uuid
from pathlib import Path

import numpy as np
import pytest

from consumer.config import Settings
from consumer.model.buffers import BatchBuffers
from consumer.model.runner import OnnxRunner
from consumer.model.sequence import TextEncoder
from consumer.model.session import SessionOptions
from consumer.oip.client import encode_request, encode_request_binary
from consumer.oip.wire import BINARY_HEADER
from producer_tools.produce import Outgoing, send_all
from tests.integration.conftest import AppFactory, answers
from tests.text_model import MAX_LENGTH, WORDS

TOLERANCE = 1e-4


def sentences(n: int, seed: int = 3) -> list[str]:
    """``n`` texts of 1 to 40 words (the longest are truncated to the model's 32 tokens)."""
    rng = np.random.default_rng(seed)
    return [" ".join(rng.choice(WORDS, size=int(rng.integers(1, 41)))) for _ in range(n)]


def solo(runner: OnnxRunner, encoder: TextEncoder, text: str) -> dict[str, np.ndarray]:
    feeds = encoder.encode([text])
    return runner.run(feeds, 1)


def test_padded_batch_equals_solo_runs(text_model: tuple[Path, Path]) -> None:
    """No broker: a padded batch of very different lengths gives each row its solo result."""
    model, tokenizer = text_model
    runner = OnnxRunner.load(model, SessionOptions(execution_provider="cpu"))
    spec = runner.signature.sequence
    assert spec is not None
    encoder = TextEncoder(tokenizer, spec)
    texts = sentences(16)
    parts = [encoder.encode([t]) for t in texts]
    buffers = BatchBuffers({s.name: s.dtype for s in runner.signature.inputs}, spec.pad_values)
    feeds, rows, length = buffers.pad(parts)
    assert length == max(p["input_ids"].shape[1] for p in parts)
    batched = runner.run(feeds, rows)
    for i, text in enumerate(texts):
        alone = solo(runner, encoder, text)
        n = parts[i]["input_ids"].shape[1]
        assert np.abs(batched["embedding"][i] - alone["embedding"][0]).max() < TOLERANCE
        assert np.abs(batched["token_embeddings"][i, :n] - alone["token_embeddings"][0]).max() < TOLERANCE


async def test_text_token_and_binary_requests(
    kafka_bootstrap: str, topics: dict[str, str], start_app: AppFactory, text_model: tuple[Path, Path]
) -> None:
    model, tokenizer = text_model
    app = await start_app(model_path=model, tokenizer_path=tokenizer, max_batch_size=16, max_batch_delay_ms=20)
    runner = app.runner
    assert runner.signature.sequence is not None
    encoder = TextEncoder(tokenizer, runner.signature.sequence)
    run = uuid.uuid4().hex[:6]
    texts = sentences(60)
    records: list[Outgoing] = []
    for i, text in enumerate(texts):
        cid = f"{run}-{i}"
        if i % 3 == 0:  # text as JSON
            records.append(Outgoing(cid, encode_request(cid, {"text": [text]})))
        elif i % 3 == 1:  # token ids as JSON (attention_mask and token_type_ids left out)
            ids = encoder.encode([text])["input_ids"]
            records.append(Outgoing(cid, encode_request(cid, {"input_ids": ids})))
        else:  # text in the binary data extension, binary response
            value, n = encode_request_binary(cid, {"text": [text]})
            records.append(Outgoing(cid, value, headers=((BINARY_HEADER, str(n).encode()),)))
    too_long = Outgoing(
        f"{run}-long",
        encode_request(None, {"input_ids": np.full((1, MAX_LENGTH + 1), 5, np.int64)}),
        expected_reason="too_large",
    )
    out_of_vocab = Outgoing(
        f"{run}-oov",
        encode_request(None, {"input_ids": np.array([[2, 999, 3]], np.int64)}),
        expected_reason="out_of_range",
    )
    records += [too_long, out_of_vocab]
    await send_all(kafka_bootstrap, topics["requests"], records, progress=False)
    report = await answers(kafka_bootstrap, topics, records)
    assert report.missing == []
    assert report.reason_mismatches == []
    assert report.dead_letters == 2
    assert report.results == len(texts)
    for i, text in enumerate(texts):
        answer = report.answers[f"{run}-{i}"]
        assert answer.body is not None
        expected = solo(runner, encoder, text)
        got = answer.body["outputs"]
        assert np.abs(got["embedding"] - expected["embedding"]).max() < TOLERANCE
        assert got["token_embeddings"].shape == expected["token_embeddings"].shape  # padding cut off
        assert np.abs(got["token_embeddings"] - expected["token_embeddings"]).max() < TOLERANCE
        if i % 3 == 2:
            assert answer.headers[BINARY_HEADER] is not None
    ratio = app.metrics.registry.get_sample_value("streaminfer_batch_padding_ratio_count")
    assert ratio is not None
    assert ratio > 0


def test_bad_tokenizer_path_fails_at_start(tmp_path: Path, text_model: tuple[Path, Path]) -> None:
    model, _ = text_model
    with pytest.raises(ValueError, match="tokenizer_path"):
        Settings(model_path=model, tokenizer_path=tmp_path / "missing.json")
