"""The checks a request tensor must pass before it reaches ONNX Runtime.

Two levels, both raising :class:`~consumer.errors.ValidationError` with a reason of
:class:`~consumer.errors.DeadLetterReason`:

- the *declaration* (:func:`check_declaration`): datatype known and castable to the model's, rank, static
  dimensions, rows (``shape[0]``) within ``[1, max_record_rows]``; it depends only on ``(datatype, shape)``, so a
  chunk of records declaring the same thing is checked once;
- the *values* (:func:`check_values`, :func:`check_ranges`): what JSON parsed into fits the declared datatype and
  casts losslessly (or in range) to the model's. Every check is a reduction (min, max, floor), so it holds for one
  record's array and for many records' arrays stacked along a new first axis alike.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from consumer.errors import DeadLetterReason as R
from consumer.errors import ValidationError
from consumer.signature import NUMPY_TO_OIP, OIP_TO_NUMPY, ModelSignature, TensorSpec


def check_rows(name: str, rows: int, max_record_rows: int) -> int:
    """``shape[0]`` of an input: at least 1 (shape_mismatch) and at most ``max_record_rows`` (too_large)."""
    if rows < 1:
        raise ValidationError(R.SHAPE_MISMATCH, f"input {name!r}: shape[0] (rows) must be >= 1")
    if rows > max_record_rows:
        raise ValidationError(R.TOO_LARGE, f"input {name!r}: {rows} rows; max_record_rows is {max_record_rows}")
    return rows


def castable(declared: np.dtype[Any], target: np.dtype[Any]) -> bool:
    """Whether a declared OIP datatype may be fed to a model input of ``target`` dtype (values checked later)."""
    if declared == target:
        return True  # BYTES only to BYTES (a tensor(string) input)
    dk, tk = declared.kind, target.kind
    if dk in "iu" and tk in "iuf":
        return True  # integer -> integer (range checked) or -> float (exactness checked)
    return dk == "f" and tk == "f"  # float width change (range checked)


def check_declaration(spec: TensorSpec, datatype: str, shape: Sequence[int], max_record_rows: int) -> np.dtype[Any]:
    """Check an input's declared ``datatype`` and ``shape`` against the model's input ``spec``.

    Returns:
        The declared numpy dtype.

    Raises:
        ValidationError: datatype_mismatch, shape_mismatch, too_large.
    """
    name = spec.name
    declared = OIP_TO_NUMPY.get(datatype)
    if declared is None:
        raise ValidationError(R.DATATYPE_MISMATCH, f"input {name!r}: unknown datatype {datatype!r}")
    if not castable(declared, spec.dtype):
        raise ValidationError(
            R.DATATYPE_MISMATCH, f"input {name!r}: {datatype} cannot be cast to the model's {spec.datatype}"
        )
    if len(shape) != len(spec.shape):
        raise ValidationError(
            R.SHAPE_MISMATCH, f"input {name!r}: rank {len(shape)}, model expects rank {len(spec.shape)}"
        )
    for axis, (got, want) in enumerate(zip(shape, spec.shape, strict=True)):  # axis 0 is rows, even when static
        if axis and want is not None and got != want:
            raise ValidationError(R.SHAPE_MISMATCH, f"input {name!r}: dimension {axis} is {got}, model expects {want}")
    check_rows(name, shape[0], max_record_rows)
    return declared


def check_strings(name: str, arr: np.ndarray) -> None:
    """A BYTES input's JSON data (numpy object array, as parsed): every element a string.

    Raises:
        ValidationError: null_value (a null), ragged (a nested list where a string belongs), datatype_mismatch.
    """
    for value in arr.flat:
        if type(value) is str:
            continue
        if value is None:
            raise ValidationError(R.NULL_VALUE, f"input {name!r}: data contains null")
        if isinstance(value, list):
            raise ValidationError(R.RAGGED, f"input {name!r}: nested data is ragged")
        raise ValidationError(
            R.DATATYPE_MISMATCH, f"input {name!r}: BYTES data must be strings, found {type(value).__name__}"
        )


def holds_boolean(data: list[Any]) -> bool:
    """Whether nested JSON ``data`` holds a ``true`` or ``false`` anywhere."""
    stack: list[Any] = [data]
    while stack:
        for v in stack.pop():
            if v is True or v is False:
                return True
            if isinstance(v, list):
                stack.append(v)
    return False


def check_values(name: str, arr: np.ndarray, declared: np.dtype[Any], target: np.dtype[Any]) -> None:
    """Check the parsed values fit the declared datatype and cast losslessly (or in range) to ``target``.

    Args:
        arr: what numpy made of the JSON data (or the binary data, already of the declared dtype).

    Raises:
        ValidationError: null_value, out_of_range, datatype_mismatch.
    """
    kind = arr.dtype.kind
    if kind == "O":
        if any(v is None for v in arr.flat):
            raise ValidationError(R.NULL_VALUE, f"input {name!r}: data contains null")
        if all(isinstance(v, int) for v in arr.flat):  # Python ints beyond uint64
            raise ValidationError(R.OUT_OF_RANGE, f"input {name!r}: an integer exceeds 64 bits")
        raise ValidationError(R.DATATYPE_MISMATCH, f"input {name!r}: data mixes types {datatype_of(arr)}")
    if kind in "USV":
        raise ValidationError(R.DATATYPE_MISMATCH, f"input {name!r}: data holds strings, declared {oip_name(declared)}")
    if (kind == "b") != (declared.kind == "b"):
        raise ValidationError(
            R.DATATYPE_MISMATCH, f"input {name!r}: data is {datatype_of(arr)}, declared {oip_name(declared)}"
        )
    if arr.size == 0 or kind == "b":
        return
    if kind == "f" and declared.kind in "iu" and not bool(np.all(np.floor(arr) == arr)):
        raise ValidationError(
            R.DATATYPE_MISMATCH, f"input {name!r}: fractional values for integer datatype {oip_name(declared)}"
        )
    lo, hi = arr.min(), arr.max()
    for dtype in (declared, target):
        if dtype.kind in "iu":
            info = np.iinfo(dtype)
            ok = int(lo) >= info.min and int(hi) <= info.max if kind in "iu" else lo >= info.min and hi <= info.max
        else:
            fmax = float(np.finfo(dtype).max)
            ok = -fmax <= float(lo) and float(hi) <= fmax
        if not ok:
            raise ValidationError(R.OUT_OF_RANGE, f"input {name!r}: values [{lo}, {hi}] do not fit {oip_name(dtype)}")
    if declared.kind in "iu" and target.kind == "f":
        exact = 2 ** (np.finfo(target).nmant + 1)
        if max(abs(int(lo)), abs(int(hi))) > exact:
            raise ValidationError(
                R.OUT_OF_RANGE, f"input {name!r}: integers beyond +-{exact} are not exact in {oip_name(target)}"
            )


def check_ranges(arrays: Mapping[str, np.ndarray], signature: ModelSignature) -> None:
    """The model's declared inclusive value ranges (ONNX metadata ``input_ranges``), e.g. token ids below the
    vocabulary size.

    Raises:
        ValidationError: out_of_range.
    """
    for name, (low, high) in signature.ranges.items():
        arr = arrays.get(name)
        if arr is None or arr.size == 0:
            continue
        lo, hi = int(arr.min()), int(arr.max())
        if lo < low or hi > high:
            raise ValidationError(R.OUT_OF_RANGE, f"input {name!r}: values [{lo}, {hi}] outside [{low}, {high}]")


def row_elements(
    item: Mapping[str, Any], span: memoryview | None, what: str, check: Callable[[str, int], int]
) -> tuple[int, list[Any]]:
    """A BYTES input of one element per row (text, encoded images): shape ``[rows]`` or ``[rows, 1]``.

    Args:
        item: the OIP input object (name, shape and data or binary size already checked).
        span: its binary data, or None for JSON ``data``.
        what: what an element is, for the messages (``text``, ``encoded images``).
        check: checks ``shape[0]`` and returns it (e.g. :func:`check_rows` with its limit).

    Returns:
        (rows, elements): the binary elements as ``bytes`` (:func:`split_bytes`), or the JSON elements as given
        (a ``[rows, 1]`` nesting flattened), not yet checked.

    Raises:
        ValidationError: shape_mismatch (another shape, or a binary length prefix cut off), whatever ``check``
            raises.
    """
    name: str = item["name"]
    shape: list[int] = item["shape"]
    if len(shape) not in (1, 2) or (len(shape) == 2 and shape[1] != 1):
        raise ValidationError(
            R.SHAPE_MISMATCH, f"input {name!r}: {what} shape must be [rows] or [rows, 1], got {shape}"
        )
    rows = check(name, shape[0])
    if span is not None:
        return rows, split_bytes(name, span)
    data = item["data"]
    if len(shape) == 2 and all(isinstance(v, list) and len(v) == 1 for v in data):
        data = [v[0] for v in data]
    return rows, data


def split_bytes(name: str, span: memoryview) -> list[bytes]:
    """A binary BYTES tensor's elements (binary data extension): each a 4-byte little-endian length, then that
    many bytes.

    Raises:
        ValidationError: shape_mismatch: a length is cut off or runs past the data.
    """
    raw = span.tobytes()
    out: list[bytes] = []
    pos = 0
    while pos < len(raw):
        if pos + 4 > len(raw):
            raise ValidationError(R.SHAPE_MISMATCH, f"input {name!r}: binary BYTES element length is cut off")
        n = int.from_bytes(raw[pos : pos + 4], "little")
        pos += 4
        if pos + n > len(raw):
            raise ValidationError(R.SHAPE_MISMATCH, f"input {name!r}: binary BYTES element runs past its data")
        out.append(raw[pos : pos + n])
        pos += n
    return out


def oip_name(dtype: np.dtype[Any]) -> str:
    """The OIP datatype name of a numpy dtype, for messages (the dtype's own name when OIP has none)."""
    return NUMPY_TO_OIP.get(dtype, str(dtype))


def datatype_of(arr: np.ndarray) -> str:
    """Readable datatype of parsed JSON data, for messages (``INT64``, ``FP64``, ``object``)."""
    return NUMPY_TO_OIP.get(arr.dtype, str(arr.dtype))
