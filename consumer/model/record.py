"""The validation record: what a model file was validated as, and the consumer's checks against it.

A validation record is a JSON file (written by ``streaminfer-model record``, docs/models.md "Rolling out a model:
record, set, gate") describing one model file as it was run over a comparison set: the file's SHA-256, its
name and version, IR version and opsets, the producer, the ONNX Runtime version and the execution provider that
actually ran, the input and output signature, the observed range of every input (min, max, percentiles; sequence
lengths; image sizes), output summaries, accuracy against labels and latency per batch size.

The consumer (``validation_record`` setting) uses three parts of it:

- ``sha256``: :func:`check_model` refuses a model file whose hash differs (start-up exits 2, naming both hashes);
- :func:`summary`: one log line at start-up;
- ``inputs.<name>.range`` ``{"min": ..., "max": ...}``: :class:`RangeCheck` counts, per input, the records holding
  a value outside the recorded range (``streaminfer_input_out_of_range_total{input}``) and lets them be served:
  drift is visible on the dashboard, and a valid record is never dead-lettered for it.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from consumer.errors import ConfigError
from consumer.work import DecodedRequest

#: The record format written and read (``format`` in the JSON).
RECORD_FORMAT = 1
#: Bytes read per step when hashing a model file.
_HASH_CHUNK_BYTES = 1 << 20
#: numpy dtype kinds whose values are compared (bool, signed, unsigned, float); strings are not.
_NUMERIC = "biuf"


def file_sha256(path: Path) -> str:
    """The SHA-256 of a file's bytes, as 64 hex digits.

    Raises:
        OSError: the file cannot be read.
    """
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        while chunk := fh.read(_HASH_CHUNK_BYTES):
            digest.update(chunk)
    return digest.hexdigest()


@dataclass(frozen=True)
class ValidationRecord:
    """A loaded validation record.

    Attributes:
        path: where it was read from.
        sha256: the model file's SHA-256 it describes (64 hex digits).
        ranges: input name -> (min, max) observed over the comparison set, inclusive, in the input's own units.
        data: the whole JSON document.
    """

    path: Path
    sha256: str
    ranges: Mapping[str, tuple[float, float]]
    data: Mapping[str, Any]


def load_record(path: Path, setting: str = "validation_record") -> ValidationRecord:
    """Read a validation record (``setting``: the setting named in errors, e.g. ``shadow_validation_record``).

    Raises:
        ConfigError: the file cannot be read, is not JSON, is of another ``format``, or lacks ``sha256`` or a
            well-formed ``inputs.<name>.range`` (the setting and the problem named).
    """
    where = f"{setting} {str(path)!r}"
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{where}: {exc}") from None
    if not isinstance(data, dict) or data.get("format") != RECORD_FORMAT:
        raise ConfigError(f"{where}: not a validation record of format {RECORD_FORMAT} (streaminfer-model record)")
    sha = data.get("sha256")
    if not isinstance(sha, str) or len(sha) != 64:
        raise ConfigError(f"{where}: 'sha256' is not 64 hex digits")
    ranges: dict[str, tuple[float, float]] = {}
    inputs = data.get("inputs")
    if not isinstance(inputs, dict):
        raise ConfigError(f"{where}: 'inputs' is not an object")
    for name, entry in inputs.items():
        observed = entry.get("range") if isinstance(entry, dict) else None
        if observed is None:  # an input the set did not observe (e.g. image bytes): nothing to compare against
            continue
        try:
            low, high = float(observed["min"]), float(observed["max"])
        except (TypeError, KeyError, ValueError):
            raise ConfigError(f"{where}: inputs.{name}.range is not {{'min': number, 'max': number}}") from None
        ranges[str(name)] = (low, high)
    return ValidationRecord(path, sha, ranges, data)


def check_model(
    record: ValidationRecord, model_path: Path, settings: tuple[str, str] = ("model_path", "validation_record")
) -> None:
    """The model file is the one the record describes (``settings``: the model's and the record's setting names,
    e.g. ``("shadow_model_path", "shadow_validation_record")``).

    Raises:
        ConfigError: its SHA-256 differs (both hashes named) or it cannot be read.
    """
    model_setting, record_setting = settings
    try:
        actual = file_sha256(model_path)
    except OSError as exc:
        raise ConfigError(f"{model_setting} {str(model_path)!r}: {exc}") from None
    if actual != record.sha256:
        raise ConfigError(
            f"{model_setting} {str(model_path)!r} is not the model {record_setting} {str(record.path)!r} describes: "
            f"its sha256 is {actual}, the record's is {record.sha256}"
        )


def summary(record: ValidationRecord) -> dict[str, Any]:
    """What start-up logs of the record: the model's identity and runtime, the set's size and accuracy, the ranges."""
    d = record.data
    model = d.get("model", {})
    runtime = d.get("runtime", {})
    comparison = d.get("set", {})
    return {
        "record": str(record.path),
        "sha256": record.sha256,
        "model": f"{model.get('name')} v{model.get('version')}",
        "onnxruntime": runtime.get("onnxruntime"),
        "provider": runtime.get("provider"),
        "set_records": comparison.get("records"),
        "accuracy": d.get("accuracy", {}).get("top1"),
        "ranges": {name: list(r) for name, r in record.ranges.items()},
    }


class RangeCheck:
    """Counts, per input, the decoded records holding a value outside the record's range; changes nothing.

    Work is per chunk, not per record: requests decoded into one block (OIP chunks, events) are checked with one
    comparison over the block's rows per input, then a cumulative sum gives each request's count of offending rows.

    Args:
        ranges: input name -> inclusive (min, max); inputs not named are not checked.
        counter: a Prometheus counter with one label, the input name (``streaminfer_input_out_of_range_total``).
    """

    def __init__(self, ranges: Mapping[str, tuple[float, float]], counter: Any) -> None:
        self._ranges = dict(ranges)
        self._children = {name: counter.labels(name) for name in self._ranges}

    def count(self, outcomes: Sequence[Any]) -> dict[str, int]:
        """Count the out-of-range records among ``outcomes`` (decoded requests; errors and others are skipped;
        image requests still pending their decode are not checked).

        Returns:
            input name -> records counted in this call (only inputs with at least one).
        """
        blocks: dict[int, tuple[Mapping[str, np.ndarray], list[DecodedRequest]]] = {}
        loose: list[DecodedRequest] = []
        for outcome in outcomes:
            if type(outcome) is not DecodedRequest or outcome.pending is not None:
                continue
            if outcome.block is not None:
                blocks.setdefault(id(outcome.block), (outcome.block, []))[1].append(outcome)
            else:
                loose.append(outcome)
        counted: dict[str, int] = {}
        for name, (low, high) in self._ranges.items():
            n = 0
            for block, requests in blocks.values():
                arr = block.get(name)
                if arr is None or arr.shape[0] == 0 or arr.dtype.kind not in _NUMERIC:
                    continue
                bad_rows = _outside(arr, low, high)
                cumulative = np.concatenate(([0], np.cumsum(bad_rows)))
                starts = np.fromiter((r.start for r in requests), dtype=np.int64, count=len(requests))
                ends = starts + np.fromiter((r.rows for r in requests), dtype=np.int64, count=len(requests))
                n += int(np.count_nonzero(cumulative[ends] > cumulative[starts]))
            for request in loose:
                arr = request.inputs.get(name)
                if arr is not None and arr.size and arr.dtype.kind in _NUMERIC and bool(_outside(arr, low, high).any()):
                    n += 1
            if n:
                self._children[name].inc(n)
                counted[name] = n
        return counted


def _outside(arr: np.ndarray, low: float, high: float) -> np.ndarray:
    """Per row of ``arr`` ``[rows, ...]``: whether any value lies outside [low, high] (NaN counts as outside)."""
    flat = arr.reshape(arr.shape[0], -1)
    return np.asarray(~((flat >= low) & (flat <= high)).all(axis=1))
