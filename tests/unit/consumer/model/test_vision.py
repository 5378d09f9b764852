"""Image requests without Kafka or ONNX Runtime: the preprocessing declaration, every request form, every bad image
(each answered or dead-lettered with its documented reason), and a fuzz run of corrupted files."""

from __future__ import annotations

import base64
import io
import json
from collections.abc import Iterator

import numpy as np
import pytest
from PIL import Image

from consumer.errors import ConfigError, ModelError, RecordError
from consumer.errors import DeadLetterReason as R
from consumer.model.vision import ImageEncoder, Preprocessing, cpus_given, preprocessing
from consumer.oip.chunk import decode_chunk
from consumer.oip.client import encode_request, encode_request_binary
from consumer.oip.wire import BINARY_HEADER
from consumer.signature import ModelSignature, TensorSpec
from consumer.work import DecodedRequest, Limits
from tests.image_model import DECLARED, RESIZE, SIZE, corruptions, encoded, jpeg, png

ROW = (3, SIZE, SIZE)


def signature(shape: tuple[int | None, ...] = (None, 3, SIZE, SIZE), dtype: type = np.float32) -> ModelSignature:
    return ModelSignature(
        name="colours",
        version="1",
        inputs=(TensorSpec("pixels", np.dtype(dtype), shape),),
        outputs=(TensorSpec("probabilities", np.dtype(np.float32), (None, 4)),),
    )


def prep_of(declared: dict[str, object] | None = None, sig: ModelSignature | None = None) -> Preprocessing:
    found = preprocessing(sig or signature(), {"streaminfer.image": json.dumps(declared or DECLARED)})
    assert found is not None
    return found


@pytest.fixture
def encoder() -> Iterator[ImageEncoder]:
    enc = ImageEncoder(prep_of(), max_pixels=1_000_000, threads=2, max_images=8)
    yield enc
    enc.close()


def decode(encoder: ImageEncoder, *values: bytes, binary: list[int | None] | None = None) -> list[object]:
    sig = signature()
    sig = ModelSignature(sig.name, sig.version, sig.inputs, sig.outputs, image=encoder.prep)
    headers = [[] if n is None else [(BINARY_HEADER, str(n).encode())] for n in (binary or [None] * len(values))]
    return decode_chunk(list(values), headers, sig, Limits(max_record_bytes=4_000_000), images=encoder)


def reason(outcome: object) -> R | None:
    return outcome.reason if isinstance(outcome, RecordError) else None


def pixels_of(outcome: object) -> np.ndarray:
    assert isinstance(outcome, DecodedRequest), outcome
    return outcome.inputs["pixels"]


# --- the declaration -------------------------------------------------------------------------------------------


def test_no_declaration_is_not_an_image_model() -> None:
    assert preprocessing(signature(), {}) is None


def test_declaration_from_metadata_and_the_override_wins() -> None:
    prep = prep_of()
    assert (prep.input, prep.layout, prep.height, prep.width, prep.resize) == ("pixels", "NCHW", SIZE, SIZE, RESIZE)
    assert prep.mean == (127.0, 127.0, 127.0)
    assert prep.row_shape == ROW
    assert prep.row_bytes == 3 * SIZE * SIZE * 4
    override = preprocessing(signature(), {"streaminfer.image": json.dumps(DECLARED)}, '{"mean": 0.5}')
    assert override is not None
    assert (override.mean, override.resize) == ((0.5, 0.5, 0.5), 0)


def test_nhwc_and_uint8_found_from_the_graph() -> None:
    prep = prep_of({}, signature((None, SIZE, SIZE, 3), np.uint8))
    assert (prep.layout, prep.dtype, prep.row_shape) == ("NHWC", np.dtype(np.uint8), (SIZE, SIZE, 3))


@pytest.mark.parametrize(
    ("declared", "match"),
    [
        ({"colour": 1}, "unknown key 'colour'"),
        ({"input": "nope"}, "no input 'nope'"),
        ({"size": [8, 8]}, "disagrees"),
        ({"resize": 4}, "smaller than the crop"),
        ({"std": [1, 0, 1]}, "'std' values must be > 0"),
        ({"mean": "grey"}, "'mean' must be"),
        ({"interpolation": "lanczos"}, "'interpolation'"),
    ],
)
def test_bad_declarations_name_the_key(declared: dict[str, object], match: str) -> None:
    with pytest.raises(ModelError, match=match):
        preprocessing(signature(), {"streaminfer.image": json.dumps(declared)})


def test_a_bad_setting_is_a_config_error_and_bad_metadata_a_model_error() -> None:
    with pytest.raises(ConfigError, match="image_preprocessing is not JSON"):
        preprocessing(signature(), {}, "{size")
    with pytest.raises(ConfigError, match=r"image_preprocessing: .*rank 2"):
        preprocessing(signature((None, 64)), {}, "{}")
    with pytest.raises(ConfigError, match="'resize' must be an integer"):
        preprocessing(signature(), {}, '{"resize": true}')
    with pytest.raises(ModelError, match=r"model metadata .streaminfer\.image. is not JSON"):
        preprocessing(signature(), {"streaminfer.image": "{size"})


def test_cpus_given_reads_the_cgroup_quota(tmp_path: object) -> None:
    from pathlib import Path

    quota = Path(str(tmp_path)) / "cpu.max"
    quota.write_text("150000 100000\n")
    assert cpus_given(str(quota)) == min(2, cpus_given("/nonexistent"))
    quota.write_text("max 100000\n")
    assert cpus_given(str(quota)) == cpus_given("/nonexistent")


# --- preprocessing ---------------------------------------------------------------------------------------------


def test_a_red_image_is_normalised_per_channel(encoder: ImageEncoder) -> None:
    row = encoder.preprocess(png((255, 0, 0)))
    assert row.shape == ROW
    assert row.dtype == np.float32
    np.testing.assert_allclose(row[0], (255 - 127) / 128, atol=1e-6)
    np.testing.assert_allclose(row[1:], -127 / 128, atol=1e-6)


def test_resize_and_centre_crop_in_one_pass_equals_two_steps(encoder: ImageEncoder) -> None:
    rng = np.random.default_rng(1)
    pixels = rng.integers(0, 256, size=(45, 60, 3), dtype=np.uint8)  # height 45, width 60
    image = Image.fromarray(pixels)
    scaled = image.resize((round(60 * RESIZE / 45), RESIZE), Image.Resampling.BILINEAR)  # 24 x 18
    left, top = (scaled.width - SIZE) // 2, (scaled.height - SIZE) // 2
    two_steps = np.asarray(scaled.crop((left, top, left + SIZE, top + SIZE)), dtype=np.float32)
    one = encoder.preprocess(pixels).transpose(1, 2, 0) * 128 + 127
    assert np.abs(one - two_steps).mean() < 6  # a resampling difference, not a shifted crop (that gives ~60)


def test_jpeg_is_decoded_at_a_reduced_scale_with_the_same_result(encoder: ImageEncoder) -> None:
    big = jpeg((10, 200, 30), size=(800, 600))
    row = encoder.preprocess(big)
    assert row.shape == ROW
    np.testing.assert_allclose(
        row[:, 4:-4, 4:-4].mean(axis=(1, 2)), np.array([10, 200, 30]) / 128 - 127 / 128, atol=0.05
    )


def test_uint8_model_input_gets_raw_pixels_nhwc() -> None:
    enc = ImageEncoder(prep_of({"size": [SIZE, SIZE]}, signature((None, SIZE, SIZE, 3), np.uint8)), threads=1)
    try:
        row = enc.preprocess(png((1, 2, 3)))
    finally:
        enc.close()
    assert row.dtype == np.uint8
    assert row.shape == (SIZE, SIZE, 3)
    assert row[5, 5].tolist() == [1, 2, 3]


@pytest.mark.parametrize("mode", ["L", "LA", "RGBA", "P", "I;16", "CMYK", "1"])
def test_every_colour_mode_is_converted_to_rgb(encoder: ImageEncoder, mode: str) -> None:
    fmt = "JPEG" if mode in ("CMYK", "L") else "PNG"
    row = encoder.preprocess(encoded((200, 200, 200), (30, 30), fmt, mode if mode != "I;16" else "L"))
    if mode == "I;16":
        image = Image.fromarray(np.full((30, 30), 40000, dtype=np.uint16))
        out = io.BytesIO()
        image.save(out, "PNG")
        row = encoder.preprocess(out.getvalue())
        np.testing.assert_allclose(row, (40000 / 65535 * 255 - 127) / 128, atol=0.02)
    assert row.shape == ROW
    assert np.isfinite(row).all()


def test_alpha_is_composited_onto_white(encoder: ImageEncoder) -> None:
    clear = Image.new("RGBA", (20, 20), (0, 0, 0, 0))
    out = io.BytesIO()
    clear.save(out, "PNG")
    row = encoder.preprocess(out.getvalue())
    np.testing.assert_allclose(row, (255 - 127) / 128, atol=1e-6)


def test_exif_orientation_is_applied(encoder: ImageEncoder) -> None:
    image = Image.new("RGB", (40, 20), (255, 0, 0))
    image.paste((0, 0, 255), (20, 0, 40, 20))  # left red, right blue
    exif = Image.Exif()
    exif[0x0112] = 6  # rotate 90 degrees clockwise to display: left half becomes the top
    out = io.BytesIO()
    image.save(out, "JPEG", quality=95, exif=exif.tobytes())
    row = encoder.preprocess(out.getvalue())
    assert row[0, :4].mean() > 0.8  # top rows red
    assert row[2, -4:].mean() > 0.8  # bottom rows blue


# --- request forms ---------------------------------------------------------------------------------------------


def test_base64_binary_and_pixel_requests_agree(encoder: ImageEncoder) -> None:
    image = png((0, 255, 0))
    as_json = encode_request("a", {"image": [image, image]})
    as_binary, n = encode_request_binary("b", {"image": [image]})
    pixels = np.asarray(Image.open(io.BytesIO(image)).convert("RGB"))[None]
    as_pixels = encode_request("c", {"image": pixels})
    outcomes = decode(encoder, as_json, as_binary, as_pixels, binary=[None, n, None])
    a, b, c = (pixels_of(o) for o in outcomes)
    assert a.shape == (2, *ROW)
    np.testing.assert_array_equal(a[0], b[0])
    np.testing.assert_array_equal(b, c)
    assert isinstance(outcomes[1], DecodedRequest)
    assert outcomes[1].binary_output


def test_float_tensors_for_the_model_input_still_work(encoder: ImageEncoder) -> None:
    value = encode_request("t", {"pixels": np.zeros((1, *ROW), np.float32)})
    assert pixels_of(decode(encoder, value)[0]).shape == (1, *ROW)


def bad_requests() -> list[tuple[str, bytes, R]]:
    good = base64.b64encode(png((1, 1, 1))).decode()
    bomb = Image.new("1", (2000, 1000))  # 2 megapixels in a few hundred bytes
    out = io.BytesIO()
    bomb.save(out, "PNG")
    truncated = jpeg((9, 9, 9), size=(64, 64))[:200]

    def one(data: object, datatype: str = "BYTES", shape: list[int] | None = None) -> bytes:
        entry = {"name": "image", "datatype": datatype, "shape": shape or [1], "data": data}
        return json.dumps({"inputs": [entry]}).encode()

    return [
        ("not base64", one(["%%%"]), R.DATATYPE_MISMATCH),
        ("not a string", one([7]), R.DATATYPE_MISMATCH),
        ("null", one([None]), R.NULL_VALUE),
        ("count mismatch", one([good], shape=[2]), R.SHAPE_MISMATCH),
        ("wrong datatype", one([1.0], "FP32"), R.DATATYPE_MISMATCH),
        ("empty", one([""]), R.INVALID_IMAGE),
        ("garbage", one([base64.b64encode(b"hello, not an image").decode()]), R.INVALID_IMAGE),
        ("truncated jpeg", one([base64.b64encode(truncated).decode()]), R.INVALID_IMAGE),
        ("pdf", one([base64.b64encode(b"%PDF-1.4\n%\xe2\xe3\xcf\xd3\n1 0 obj").decode()]), R.INVALID_IMAGE),
        ("bomb", one([base64.b64encode(out.getvalue()).decode()]), R.TOO_LARGE),
        ("too many images", one([good] * 9, shape=[9]), R.TOO_LARGE),
        ("pixels of rank 3", one([[[0, 0, 0]]], "UINT8", [1, 1, 3]), R.SHAPE_MISMATCH),
        ("pixels over 255", one([[[[256, 0, 0]]]], "UINT8", [1, 1, 1, 3]), R.OUT_OF_RANGE),
        ("pixel fractions", one([1.5, 0, 0], "UINT8", [1, 1, 1, 3]), R.DATATYPE_MISMATCH),
        ("pixel booleans", one([True, 0, 0], "UINT8", [1, 1, 1, 3]), R.DATATYPE_MISMATCH),
        ("pixel strings", one(["1", 0, 0], "UINT8", [1, 1, 1, 3]), R.DATATYPE_MISMATCH),
        ("pixel null", one([None, 0, 0], "UINT8", [1, 1, 1, 3]), R.NULL_VALUE),
        ("ragged pixels", one([[[[1, 2, 3]], [[1, 2]]]], "UINT8", [1, 2, 1, 3]), R.RAGGED),
        ("pixels nested wrong", one([[1, 2, 3, 4, 5, 6]], "UINT8", [1, 1, 2, 3]), R.SHAPE_MISMATCH),
        ("pixel 1e30", one([1e30, 0, 0], "UINT8", [1, 1, 1, 3]), R.OUT_OF_RANGE),
        ("pixels over the budget", one([], "UINT8", [1, 2000, 1000, 3]), R.TOO_LARGE),
    ]


@pytest.mark.parametrize(("kind", "value", "expected"), bad_requests(), ids=lambda v: v if isinstance(v, str) else "")
def test_every_bad_image_gets_its_reason(encoder: ImageEncoder, kind: str, value: bytes, expected: R) -> None:
    good = encode_request("ok", {"image": [png((9, 9, 9))]})
    outcomes = decode(encoder, good, value, good)
    assert reason(outcomes[1]) == expected, (kind, outcomes[1])
    assert pixels_of(outcomes[0]).shape == (1, *ROW)  # its neighbours are untouched
    assert pixels_of(outcomes[2]).shape == (1, *ROW)


def test_one_bad_image_dead_letters_its_record_only(encoder: ImageEncoder) -> None:
    value = encode_request("mixed", {"image": [png((1, 2, 3)), b"not an image"]})
    other = encode_request("fine", {"image": [png((1, 2, 3))]})
    outcomes = decode(encoder, value, other)
    assert reason(outcomes[0]) == R.INVALID_IMAGE
    assert pixels_of(outcomes[1]).shape == (1, *ROW)


def test_fuzz_every_corrupted_image_is_answered_or_dead_lettered(encoder: ImageEncoder) -> None:
    images = corruptions(seed=13, n=400)
    values = [encode_request(f"f{i}", {"image": [image]}) for i, image in enumerate(images)]
    outcomes = decode(encoder, *values)
    reasons = {reason(o) for o in outcomes}
    assert reasons <= {None, R.INVALID_IMAGE, R.TOO_LARGE}
    assert R.INVALID_IMAGE in reasons
    assert None in reasons  # a flipped bit in a pixel leaves a decodable image
    for outcome in outcomes:
        if isinstance(outcome, DecodedRequest):
            assert pixels_of(outcome).shape == (1, *ROW)
            assert np.isfinite(pixels_of(outcome)).all()
