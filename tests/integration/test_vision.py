"""Images end to end on a real broker and ONNX Runtime: the tiny colour classifier (tests/image_model.py) served from
JPEG/PNG bytes (JSON base64 and binary) and decoded pixels, its fused uint8 twin (producer_tools.fuse) giving the
same answers, and a fuzz run of corrupted images that the consumer answers or dead-letters and survives."""

from __future__ import annotations

import io
import uuid
from pathlib import Path

import numpy as np
import onnx
from PIL import Image

from consumer.model.runner import OnnxRunner
from consumer.model.session import SessionOptions
from consumer.model.vision import ImageEncoder
from consumer.oip.client import encode_request, encode_request_binary
from consumer.oip.wire import BINARY_HEADER
from producer_tools.fuse import TOLERANCE, fuse
from producer_tools.produce import Outgoing, send_all
from tests.image_model import CLASSES, DECLARED, corruptions, jpeg, png
from tests.integration.conftest import AppFactory, answers

COLOURS = {"red": (230, 20, 25), "green": (15, 220, 30), "blue": (20, 30, 240), "grey": (128, 128, 128)}


def fused_copy(model: Path, out: Path) -> Path:
    onnx.save(fuse(onnx.load(str(model)), DECLARED), str(out))
    return out


def test_fused_model_equals_the_plain_one_on_the_same_pixels(image_model: Path, tmp_path: Path) -> None:
    """No broker: the fused (uint8 NHWC) model's probabilities equal the plain model's within TOLERANCE."""
    plain = OnnxRunner.load(image_model, SessionOptions(execution_provider="cpu"))
    fused = OnnxRunner.load(fused_copy(image_model, tmp_path / "fused.onnx"), SessionOptions(execution_provider="cpu"))
    assert plain.signature.image is not None
    assert fused.signature.image is not None
    assert (fused.signature.image.layout, fused.signature.image.dtype) == ("NHWC", np.dtype(np.uint8))
    rng = np.random.default_rng(5)
    images = [jpeg(tuple(int(v) for v in rng.integers(0, 256, 3)), size=(50, 40)) for _ in range(12)]
    float_rows = ImageEncoder(plain.signature.image, threads=1)
    uint8_rows = ImageEncoder(fused.signature.image, threads=1)
    try:
        a = np.stack([float_rows.preprocess(i) for i in images])
        b = np.stack([uint8_rows.preprocess(i) for i in images])
    finally:
        float_rows.close()
        uint8_rows.close()
    got_plain = plain.run({"pixels": a}, len(images))
    got_fused = fused.run({"pixels": b}, len(images))
    assert np.abs(got_plain["probabilities"] - got_fused["probabilities"]).max() < TOLERANCE
    assert (got_plain["top_k_labels"] == got_fused["top_k_labels"]).all()


async def test_images_in_every_form_get_their_class(
    kafka_bootstrap: str, topics: dict[str, str], start_app: AppFactory, image_model: Path, tmp_path: Path
) -> None:
    for model in (image_model, fused_copy(image_model, tmp_path / "fused.onnx")):
        app = await start_app(model_path=model, max_batch_size=16, max_batch_delay_ms=10, image_threads=2)
        run = uuid.uuid4().hex[:6]
        records: list[Outgoing] = []
        expected: dict[str, list[str]] = {}
        for i in range(40):
            names = [list(COLOURS)[(i + k) % 4] for k in range(1 + i % 3)]  # 1 to 3 images per record
            pictures = [(png if k % 2 else jpeg)(COLOURS[n], size=(30 + i, 20 + k)) for k, n in enumerate(names)]
            cid = f"{run}-{i}"
            expected[cid] = names
            if i % 3 == 0:  # base64 in JSON
                records.append(Outgoing(cid, encode_request(cid, {"image": pictures})))
            elif i % 3 == 1:  # binary data extension
                value, n = encode_request_binary(cid, {"image": pictures})
                records.append(Outgoing(cid, value, headers=((BINARY_HEADER, str(n).encode()),)))
            else:  # decoded pixels, one UINT8 [rows, H, W, 3] tensor
                pixels = np.stack([np.asarray(Image.new("RGB", (24, 20), COLOURS[n])) for n in names])
                records.append(Outgoing(cid, encode_request(cid, {"image": pixels})))
        bad = Outgoing(
            f"{run}-bad", encode_request(None, {"image": [b"GIF89a broken"]}), expected_reason="invalid_image"
        )
        records.append(bad)
        await send_all(kafka_bootstrap, topics["requests"], records, progress=False)
        report = await answers(kafka_bootstrap, topics, records)
        assert report.missing == []
        assert report.reason_mismatches == []
        assert report.results == 40
        for cid, names in expected.items():
            body = report.answers[cid].body
            assert body is not None
            assert [str(row[0]) for row in body["outputs"]["top_k_labels"]] == names, cid
            assert body["outputs"]["probabilities"].shape == (len(names), len(CLASSES))
        seconds = app.metrics.registry.get_sample_value("streaminfer_image_preprocess_seconds_count")
        assert seconds is not None
        assert seconds >= 80
        await app.stop()


async def test_fuzzed_images_are_answered_or_dead_lettered_and_the_consumer_survives(
    kafka_bootstrap: str, topics: dict[str, str], start_app: AppFactory, image_model: Path
) -> None:
    app = await start_app(model_path=image_model, max_batch_size=32, image_threads=2, image_max_pixels=1_000_000)
    run = uuid.uuid4().hex[:6]
    bomb = io.BytesIO()
    Image.new("1", (4000, 4000)).save(bomb, "PNG")  # 16 megapixels in a few kB
    images = [*corruptions(seed=29, n=300), bomb.getvalue(), b""]
    records = [Outgoing(f"{run}-{i}", encode_request(None, {"image": [image]})) for i, image in enumerate(images)]
    after = Outgoing(f"{run}-after", encode_request(None, {"image": [png(COLOURS["blue"])]}))
    await send_all(kafka_bootstrap, topics["requests"], [*records, after], progress=False)
    report = await answers(kafka_bootstrap, topics, [*records, after])
    assert report.missing == []
    assert report.duplicates == 0
    reasons = {a.reason for a in report.answers.values() if a.body is None}
    assert reasons <= {"invalid_image", "too_large"}
    assert "invalid_image" in reasons
    assert report.answers[f"{run}-{len(images) - 2}"].reason == "too_large"
    assert report.answers[f"{run}-{len(images) - 1}"].reason == "invalid_image"
    body = report.answers[after.correlation_id].body
    assert body is not None
    assert str(body["outputs"]["top_k_labels"][0][0]) == "blue"
    assert app.failed is None
    assert report.dead_letters > 0
