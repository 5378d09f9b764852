"""A micro-batch's outputs -> each record's answer: OIP responses (JSON, binary, protobuf) or enriched events.

Inference hands the room a micro-batch's outputs (:meth:`Answers.shape`); here they are cut back per request (per-token
outputs of sequence models also to the request's own length), a record whose outputs hold NaN or Inf becomes a
``non_finite_output`` dead letter (one vectorised check per output for the batch: :func:`non_finite`), and responses
are encoded for the whole batch at once (:class:`~consumer.oip.encode.BatchEncoder`; also when every request asked
for the same outputs), record by record only where requests asked for different outputs or the binary extension.
Events with enriched results are encoded by :class:`consumer.answers.enrich.EnrichedAnswers`. The response formats
themselves are OIP's own (:mod:`consumer.oip.encode`, :mod:`consumer.oip.proto`).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Any

import numpy as np

from consumer.answers.enrich import EnrichedAnswers
from consumer.errors import DeadLetterReason, InferenceError, RecordError
from consumer.model.runner import split
from consumer.oip.encode import BatchEncoder, encode_response, encode_response_binary
from consumer.oip.proto import response as proto_response
from consumer.signature import ModelSignature, floating
from consumer.work import DecodedRequest, Work


class Answers:
    """Sets each record's result (or dead-letter error) from its micro-batch's outputs.

    Args:
        signature: the model (output names, outputs without a batch axis, per-token outputs).
        enriched: events with enriched results: their encoder; None: OIP responses.
    """

    def __init__(self, signature: ModelSignature, enriched: EnrichedAnswers | None = None) -> None:
        self._signature = signature
        self._enriched = enriched
        self._sequence = signature.sequence
        self._names = signature.output_names
        self._per_token = {o.name for o in signature.outputs if len(o.shape) >= 2 and o.shape[1] is None}
        self._encoder = BatchEncoder(signature)

    def shape(
        self, batch: Sequence[Work], requests: Sequence[DecodedRequest], outputs: dict[str, np.ndarray], length: int
    ) -> None:
        """Set each item's result (or error) from the batch's outputs.

        Args:
            batch: the micro-batch's items, each holding one of ``requests``, in order.
            outputs: output name -> ``[sum of the requests' rows, ...]`` (the model's own shape for an output
                without a batch axis).
            length: sequence models: the padded length, tokens (0 otherwise).
        """
        if self._enriched is not None:  # events: one row each, every output, enriched
            self._batch(batch, requests, outputs)
            return
        if self._sequence is None and requests:
            asked = requests[0].outputs  # every request asking for the same outputs (or all): one batch encoding
            if all(r.outputs == asked and not r.binary_output for r in requests):
                try:
                    self._batch(batch, requests, outputs, asked)
                    return
                except (KeyError, TypeError, ValueError):  # an output OIP JSON cannot carry: say so record by record
                    pass
        names = self._names
        signature = self._signature
        parts = split(outputs, [r.rows for r in requests], signature.whole_outputs)
        for work, request, part in zip(batch, requests, parts, strict=True):
            chosen = [(n, self._unpad(n, part[n], length, request.length)) for n in (request.outputs or names)]
            bad = non_finite(chosen, [request.rows], signature.whole_outputs)
            if bad is not None:
                work.error = non_finite_error(bad[0])
                continue
            response_id = work.correlation_id.decode("utf-8", "backslashreplace")
            try:
                if request.protobuf:
                    work.result = proto_response(*encode_response_binary(response_id, signature, chosen))
                elif request.binary_output:
                    work.result, work.result_json_length = encode_response_binary(response_id, signature, chosen)
                else:
                    work.result = encode_response(response_id, signature, chosen)
            except (KeyError, TypeError, ValueError) as exc:  # an output dtype OIP JSON cannot carry
                work.error = InferenceError(
                    DeadLetterReason.INFERENCE_ERROR, f"response cannot be encoded: {type(exc).__name__}: {exc}"
                )

    def _batch(
        self,
        batch: Sequence[Work],
        requests: Sequence[DecodedRequest],
        outputs: dict[str, np.ndarray],
        asked: tuple[str, ...] | None = None,
    ) -> None:
        """The outputs every request asked for (``asked``; None: every output), encoded for the whole batch;
        non-finite rows found with one check."""
        rows = [r.rows for r in requests]
        chosen = [(name, outputs[name]) for name in (asked or self._names)]
        results: Sequence[bytes | RecordError]
        if self._enriched is not None:
            results = self._enriched.encode(batch, outputs)
        else:
            results = self._encoder.encode_ids([w.correlation_id for w in batch], rows, chosen)
        bad = non_finite(chosen, rows, self._signature.whole_outputs)
        if bad is None and self._enriched is None:  # the common case: every record has its response
            for work, result in zip(batch, results, strict=True):
                work.result = result  # type: ignore[assignment]  # the OIP encoder's are all bytes
            return
        for i, (work, result) in enumerate(zip(batch, results, strict=True)):
            if bad is not None and bad[i]:
                work.error = non_finite_error(bad[i])
            elif isinstance(result, RecordError):  # the enriched encoder's
                work.error = result
            else:
                work.result = result

    def _unpad(self, name: str, arr: Any, padded: int, length: int) -> Any:
        """A per-token output (axis 1 dynamic in the graph and equal to the padded length, e.g. token embeddings
        ``[rows, sequence, dim]``) cut back to the request's own length."""
        if not padded or length >= padded or arr.ndim < 2 or arr.shape[1] != padded:
            return arr
        return arr[:, :length] if name in self._per_token else arr


def non_finite(
    outputs: Sequence[tuple[str, np.ndarray]], rows: Sequence[int], whole: Collection[str]
) -> list[list[str]] | None:
    """Which float outputs (bfloat16 included) hold NaN or Inf, per request: JSON cannot carry them.

    Args:
        outputs: (name, array) of a batch: ``[sum(rows), ...]``, or the model's own shape for a name in ``whole``
            (no batch axis: NaN in it spoils every request).
        rows: each request's rows, in order.

    Returns:
        None when every value is finite (one vectorised check per output); else per request the names of its
        outputs that are not (an empty list for a request whose outputs are finite).
    """
    total = sum(rows)
    bad_rows: np.ndarray | None = None
    for name, arr in outputs:
        if floating(arr.dtype):
            if name in whole:
                finite = np.full(total, bool(np.isfinite(arr).all()))
            else:
                finite = np.isfinite(arr.reshape(arr.shape[0], -1)).all(axis=1)
            if not bool(finite.all()):
                bad_rows = ~finite if bad_rows is None else bad_rows | ~finite
    if bad_rows is None:
        return None
    named: list[list[str]] = []
    start = 0
    for n in rows:
        named.append(
            [
                name
                for name, arr in outputs
                if floating(arr.dtype)
                and bool(bad_rows[start : start + n].any())
                and not bool(np.isfinite(arr if name in whole else arr[start : start + n]).all())
            ]
        )
        start += n
    return named


def non_finite_error(names: Sequence[str]) -> InferenceError:
    """The ``non_finite_output`` dead-letter error of a record whose outputs ``names`` hold NaN or Inf."""
    return InferenceError(DeadLetterReason.NON_FINITE_OUTPUT, f"outputs {list(names)} hold NaN or Inf for this record")
