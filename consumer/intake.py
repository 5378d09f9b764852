"""A fetched chunk -> one :class:`~consumer.work.Work` per record: tracked, decoded, validated.

Records are decoded chunk by chunk (:func:`consumer.oip.chunk.decode_chunk`: records declaring the same inputs
are parsed into one array and checked together). Text is tokenized in a decode thread (the Rust tokenizer releases
the GIL), so a chunk of large texts never holds up the event loop (heartbeats, produces, ``/healthz``'s loop
check); images likewise, that thread waiting on :class:`~consumer.model.vision.ImageEncoder`'s pool while it decodes
them in parallel; tensor requests are decoded on the loop, where a thread hop would cost more than it saves.

Events (``request_format`` json or avro) are decoded by :class:`consumer.events.decode.EventDecoder` instead, on
the loop: their writer schemas are resolved first (:meth:`~consumer.events.decode.EventDecoder.prepare`, waiting
out an unreachable schema registry while ``idle`` keeps the group membership), then the chunk is decoded at once.

The chunk's decode time goes to ``streaminfer_stage_seconds_total{stage="decode"}`` and, divided by its records,
to ``streaminfer_preprocess_seconds`` once per record.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from aiokafka import TopicPartition

from consumer.answers.headers import CORRELATION_HEADER, correlation_id
from consumer.errors import DeadLetterReason, DecodeError
from consumer.events.decode import TOMBSTONE, EventDecoder
from consumer.events.registry import Idle
from consumer.kafka.unpack import Dropped
from consumer.model.record import RangeCheck
from consumer.model.sequence import TextEncoder
from consumer.model.vision import ImageEncoder
from consumer.offsets import OffsetTracker
from consumer.oip.chunk import decode_chunk
from consumer.ops.metrics import Metrics
from consumer.signature import ModelSignature
from consumer.work import DecodedRequest, Limits, UndecodableRecord, Work

log = logging.getLogger(__name__)


class Intake:
    """Turns fetched records into work items.

    Args:
        signature: the model's inputs and outputs.
        limits: per-record size limits.
        text: tokenizer of a sequence model that serves text, or None.
        metrics: decode time.
        clock: monotonic seconds.
        images: an image model's encoder, or None.
        events: the event decoder (``request_format`` json or avro), or None: OIP requests.
        ranges: the validation record's input ranges (``validation_record``): decoded requests with a value outside
            them are counted, and served as any other; None: not checked.
    """

    def __init__(
        self,
        signature: ModelSignature,
        limits: Limits,
        text: TextEncoder | None,
        metrics: Metrics,
        clock: Callable[[], float],
        images: ImageEncoder | None = None,
        events: EventDecoder | None = None,
        ranges: RangeCheck | None = None,
    ) -> None:
        self._signature = signature
        self.events = events
        self._ranges = ranges
        self._limits = limits
        self._text = text
        self.images = images
        self._metrics = metrics
        self._decode_seconds = metrics.stage_seconds.labels("decode")
        self._clock = clock
        self._decoder = (
            ThreadPoolExecutor(max_workers=1, thread_name_prefix="streaminfer-decode")
            if text is not None or images is not None
            else None
        )

    def close(self) -> None:
        """Stop the decode threads."""
        if self._decoder is not None:
            self._decoder.shutdown(wait=True, cancel_futures=True)
        if self.images is not None:
            self.images.close()

    async def decode(
        self,
        fetched: dict[TopicPartition, list[Any]],
        tracker: OffsetTracker[TopicPartition],
        idle: Idle | None = None,
    ) -> list[Work]:
        """Track and decode a fetched chunk.

        Args:
            fetched: records per partition, each partition's in offset order.
            tracker: every record is tracked in its partition's offsets (in fetch order) before it is returned.
            idle: Avro events: how to wait while the schema registry does not answer (the delivery mode's
                :meth:`consumer.kafka.source.Source.idle`); default: sleep.

        Returns:
            One work item per record, partition by partition in fetch order: a request, or the error that
            dead-letters it (``rows`` 1).
        """
        records = [rec for recs in fetched.values() for rec in recs]
        if not records:
            return []
        # A rebalance (or a rewind) may run while this chunk waits below (the registry, the decode thread): the
        # records of a partition revoked meanwhile, even one assigned back at once, are not this assignment's; the
        # client reads them again from the committed offset, so they are dropped here untracked (the fate table's
        # partition_revoked).
        epochs = {tp: tracker.epoch(tp) for tp in fetched}
        if self.events is not None:
            await self.events.prepare([rec.value for rec in records], idle)
        started = self._clock()
        if self._decoder is None:
            parsed = self._parse(records)
        else:
            parsed = await asyncio.get_running_loop().run_in_executor(self._decoder, self._parse, records)
        if self._ranges is not None:  # drift: counted, never a reason to dead-letter
            self._ranges.count(parsed)
        works: list[Work] = []
        append = works.append
        first = 0
        for tp, recs in fetched.items():
            if tracker.epoch(tp) != epochs[tp]:
                log.info(
                    "partition %s was revoked or rewound while %d of its records were decoded: dropped", tp, len(recs)
                )
                first += len(recs)
                continue
            offsets = tracker.partition(tp)
            track = offsets.track
            topic, partition = tp.topic, tp.partition
            for rec, outcome in zip(recs, parsed[first : first + len(recs)], strict=True):
                offset = rec.offset
                track(offset)
                if type(outcome) is DecodedRequest:
                    headers = rec.headers
                    if headers and headers[0][0] == CORRELATION_HEADER and headers[0][1] is not None:
                        cid = headers[0][1]  # the common case, correlation_id's first rule without the call
                    else:
                        cid = correlation_id(headers, outcome.id, rec.key, (topic, partition, offset))
                    append(Work(rec, tp, offsets, cid, outcome, None, outcome.rows, started))
                elif outcome is TOMBSTONE:
                    cid = correlation_id(rec.headers, None, rec.key, (topic, partition, offset))
                    work = Work(rec, tp, offsets, cid, None, None, 1, started)
                    work.tombstone = True
                    append(work)
                else:
                    cid = correlation_id(rec.headers, None, rec.key, (topic, partition, offset))
                    append(Work(rec, tp, offsets, cid, None, outcome, 1, started))
            first += len(recs)
        elapsed = self._clock() - started
        self._decode_seconds.inc(elapsed)
        self._metrics.preprocess_seconds.observe(elapsed / len(records), len(records))
        return works

    def _parse(self, records: list[Any]) -> list[Any]:
        """Decode and validate every record (thread-safe: reads only the signature, limits and tokenizer): a
        DecodedRequest, a RecordError or (events) TOMBSTONE each."""
        values = [rec.value for rec in records]
        odd = set(map(type, records)), set(map(type, values))  # a stand-in or a dropped value: looked for below
        outcomes: list[Any]
        if self.events is not None:
            outcomes = self.events.decode([None if type(v) is Dropped else v for v in values])
        else:
            headers = [rec.headers for rec in records]
            outcomes = decode_chunk(values, headers, self._signature, self._limits, self._text, self.images)
        if UndecodableRecord in odd[0]:
            for i, rec in enumerate(records):
                if type(rec) is UndecodableRecord:
                    outcomes[i] = DecodeError(DeadLetterReason.UNDECODABLE_RECORD, rec.error)
        if Dropped in odd[1]:
            for i, value in enumerate(values):
                if type(value) is Dropped:  # a batch or value the client was not let unpack or keep
                    reason = DeadLetterReason.TOO_LARGE if value.error is None else DeadLetterReason.UNDECODABLE_RECORD
                    outcomes[i] = DecodeError(reason, value.describe())
        return outcomes
