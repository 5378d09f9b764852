"""An image model's request input -> its images, checked but not yet decoded (:mod:`consumer.model.vision` decodes).

The three forms (docs/models.md, "Images"): ``BYTES`` ``[rows]`` in the binary data extension (raw files) or in
JSON (base64 strings), and ``UINT8`` ``[rows, H, W, 3]`` decoded RGB pixels (their shape checked here, their values by
:mod:`consumer.oip.decode` as any UINT8 tensor's).
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Mapping
from typing import Any

from consumer.errors import DeadLetterReason as R
from consumer.errors import ValidationError
from consumer.oip.validate import row_elements


def image_elements(item: Mapping[str, Any], span: memoryview | None, limit: int) -> list[bytes]:
    """One request's BYTES image input -> its encoded images (one per row), not yet decoded.

    Args:
        item: the OIP input object (fields already checked: name, shape, datatype, data or binary size).
        span: its binary data (binary data extension), or None for JSON ``data`` (base64 strings).
        limit: most images in one record: ``max_record_rows``, at most ``max_in_flight_images``.

    Raises:
        ValidationError: datatype_mismatch (not BYTES, a JSON element that is not a string, bad base64),
            shape_mismatch, null_value, too_large (more images than ``limit``).
    """
    name, shape, datatype = item["name"], item["shape"], item["datatype"]
    if datatype != "BYTES":
        raise ValidationError(
            R.DATATYPE_MISMATCH,
            f"input {name!r}: images are BYTES (encoded) or UINT8 [rows, H, W, 3], got {datatype!r}",
        )
    rows, data = row_elements(item, span, "encoded images", lambda n, r: _rows(n, r, limit))
    images = data if span is not None else [_base64(name, v) for v in data]
    if len(images) != rows:
        raise ValidationError(R.SHAPE_MISMATCH, f"input {name!r}: {len(images)} images, shape {shape} needs {rows}")
    return images


def check_pixels(name: str, shape: list[int], limit: int, max_pixels: int) -> None:
    """The declared shape of decoded UINT8 pixels: ``[rows, H, W, 3]``, rows within ``limit``, H x W within
    ``max_pixels`` (``image_max_pixels``), checked before the data is read.

    Raises:
        ValidationError: shape_mismatch, too_large.
    """
    if len(shape) != 4 or shape[3] != 3:
        raise ValidationError(R.SHAPE_MISMATCH, f"input {name!r}: UINT8 pixels are [rows, H, W, 3], got {shape}")
    _rows(name, shape[0], limit)
    if shape[1] < 1 or shape[2] < 1:
        raise ValidationError(R.SHAPE_MISMATCH, f"input {name!r}: an image of {shape[2]} x {shape[1]} pixels")
    if shape[1] * shape[2] > max_pixels:
        raise ValidationError(
            R.TOO_LARGE, f"input {name!r}: {shape[2]} x {shape[1]} pixels; image_max_pixels is {max_pixels}"
        )


def _rows(name: str, rows: int, limit: int) -> int:
    if rows < 1:
        raise ValidationError(R.SHAPE_MISMATCH, f"input {name!r}: a request needs at least 1 image")
    if rows > limit:
        raise ValidationError(
            R.TOO_LARGE,
            f"input {name!r}: {rows} images; at most {limit} per record (max_record_rows, max_in_flight_images)",
        )
    return rows


def _base64(name: str, value: object) -> bytes:
    if value is None:
        raise ValidationError(R.NULL_VALUE, f"input {name!r}: data contains null")
    if not isinstance(value, str):
        raise ValidationError(R.DATATYPE_MISMATCH, f"input {name!r}: an image in JSON is a base64 string")
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        raise ValidationError(R.DATATYPE_MISMATCH, f"input {name!r}: an image string is not valid base64") from None
