"""A record's fate: what happens next when something fails, for every failure class, in one table.

The sites that meet a failure raise or return its class (:mod:`consumer.errors`); the functions here map the class to
the action, and the sites do what they are told. docs/record-contract.md shows the same two tables (a test reads them
against :data:`REASONS` and :data:`FAILURES`), so a new reason or failure class cannot land without its action.

========================================  =============================================================================
failure class                             action
========================================  =============================================================================
a record that cannot be decoded or        :attr:`Action.DEAD_LETTER` with its reason (:data:`REASONS`)
validated (a ``RecordError``)
the model run failed for a batch          :attr:`Action.BISECT` until the culprit is alone, then dead-letter it
                                          (``inference_error``)
a transient model failure (out of         :attr:`Action.RETRY` with the shared backoff, ``inference_retries`` times,
memory: ``RecordError.retriable``)        then bisect
a schema ID the registry does not know    :attr:`Action.RETRY` ``unknown_schema_retries`` times, then dead-letter
                                          (``unknown_schema_id``)
a dependency is down (broker, registry    :attr:`Action.WAIT`: never a dead letter; readiness goes 503
that does not answer: 5xx, 408, 429)
a failed write (a Kafka error)            :attr:`Action.RETRY` with the backoff until it is acknowledged (exactly_once:
                                          abort, re-read, answer again)
a write never attempted (``NotSentError``) :attr:`Action.RESEND`: written again, not counted as a retry
the producer's sequence state broke       :attr:`Action.NEW_PRODUCER`, then retry
(``BROKEN_PRODUCER``)
the answer is too large (``TOO_LARGE``)   :attr:`Action.SIZE_LADDER`: sent alone, shrunk, then ``result_too_large``
the partition was revoked (or its         :attr:`Action.DROP`: its next owner reads the record again
producer fenced)
========================================  =============================================================================
"""

from __future__ import annotations

from collections.abc import Container, Hashable
from enum import StrEnum

from aiokafka.errors import IllegalOperation, InvalidProducerEpoch, KafkaError, ProducerClosed, ProducerFenced

from consumer.errors import BROKEN_PRODUCER, TOO_LARGE, DeadLetterReason, NotSentError, RecordError


class Action(StrEnum):
    """What happens to a record (or a batch, or a write) after a failure."""

    DEAD_LETTER = "dead_letter"
    """The record goes to the dead-letter topic with its reason; its offset is committed once that is acknowledged."""
    BISECT = "bisect"
    """The micro-batch is split in halves that run again, until the record failing alone is dead-lettered."""
    RETRY = "retry"
    """The same work again after the shared backoff (``retry_backoff_ms`` doubling to ``retry_backoff_max_ms``)."""
    RESEND = "resend"
    """A write that was never attempted: simply written again, not counted as a retry."""
    WAIT = "wait"
    """A dependency is down: the records that need it are held and the call repeated until it answers."""
    NEW_PRODUCER = "new_producer"
    """The idempotent producer's sequence state is lost: a new producer is started, then the writes retried."""
    SIZE_LADDER = "size_ladder"
    """Too large to write: sent alone, then shrunk (result -> ``result_too_large`` dead letter -> reduced)."""
    DROP = "drop"
    """The partition is no longer ours: the record is dropped unanswered and uncommitted; its next owner reads it."""


#: What happens to a record before it is dead-lettered with each reason: most are dead-lettered at once; an
#: ``inference_error`` only once bisection left it alone, a ``result_too_large`` at the top of the size ladder, an
#: ``unknown_schema_id`` after the registry was asked again. Every reason has a row (a test checks it and the docs).
REASONS: dict[DeadLetterReason, Action] = {
    DeadLetterReason.INVALID_JSON: Action.DEAD_LETTER,
    DeadLetterReason.NOT_AN_OBJECT: Action.DEAD_LETTER,
    DeadLetterReason.INVALID_REQUEST: Action.DEAD_LETTER,
    DeadLetterReason.MISSING_INPUT: Action.DEAD_LETTER,
    DeadLetterReason.UNKNOWN_INPUT: Action.DEAD_LETTER,
    DeadLetterReason.UNKNOWN_OUTPUT: Action.DEAD_LETTER,
    DeadLetterReason.DATATYPE_MISMATCH: Action.DEAD_LETTER,
    DeadLetterReason.OUT_OF_RANGE: Action.DEAD_LETTER,
    DeadLetterReason.SHAPE_MISMATCH: Action.DEAD_LETTER,
    DeadLetterReason.RAGGED: Action.DEAD_LETTER,
    DeadLetterReason.NULL_VALUE: Action.DEAD_LETTER,
    DeadLetterReason.TOO_LARGE: Action.DEAD_LETTER,
    DeadLetterReason.UNDECODABLE_RECORD: Action.DEAD_LETTER,
    DeadLetterReason.INFERENCE_ERROR: Action.BISECT,
    DeadLetterReason.RESULT_TOO_LARGE: Action.SIZE_LADDER,
    DeadLetterReason.NON_FINITE_OUTPUT: Action.DEAD_LETTER,
    DeadLetterReason.INVALID_IMAGE: Action.DEAD_LETTER,
    DeadLetterReason.MISSING_FIELD: Action.DEAD_LETTER,
    DeadLetterReason.WRONG_TYPE: Action.DEAD_LETTER,
    DeadLetterReason.UNKNOWN_CATEGORY: Action.DEAD_LETTER,
    DeadLetterReason.FIELD_CLASH: Action.DEAD_LETTER,
    DeadLetterReason.NOT_IN_WIRE_FORMAT: Action.DEAD_LETTER,
    DeadLetterReason.UNKNOWN_SCHEMA_ID: Action.RETRY,
    DeadLetterReason.INVALID_AVRO: Action.DEAD_LETTER,
    DeadLetterReason.RESULT_SCHEMA_REFUSED: Action.DEAD_LETTER,
}

#: Every failure class that is not a record's own fault, and its action (the docs' "when something fails" table).
FAILURES: dict[str, Action] = {
    "inference_failed": Action.BISECT,
    "inference_transient": Action.RETRY,
    "registry_unknown_schema": Action.RETRY,
    "registry_unavailable": Action.WAIT,
    "broker_unreachable": Action.WAIT,
    "write_failed": Action.RETRY,
    "write_not_sent": Action.RESEND,
    "producer_broken": Action.NEW_PRODUCER,
    "write_too_large": Action.SIZE_LADDER,
    "partition_revoked": Action.DROP,
    "producer_fenced": Action.DROP,
}

#: HTTP statuses of a schema registry that is there but cannot answer now (besides 5xx): waited out.
REGISTRY_UNAVAILABLE = frozenset({408, 429})
#: Errors of a transactional producer that mean another producer with its transactional.id exists (the partition's
#: new owner, or a restarted instance), or that it was closed below the window: the window's records are dropped.
#: IllegalOperation is aiokafka's answer to sends after its producer was fenced (not a KafkaError).
FENCED: tuple[type[BaseException], ...] = (ProducerFenced, InvalidProducerEpoch, IllegalOperation, ProducerClosed)


def of_record(error: RecordError) -> Action:
    """What happens to a record failing with ``error`` before it is dead-lettered (:data:`REASONS`)."""
    return REASONS[error.reason]


def bounded(attempt: int, retries: int, then: Action) -> Action:
    """:attr:`Action.RETRY` while ``attempt`` (0-based) is below ``retries``, else ``then``."""
    return Action.RETRY if attempt < retries else then


def of_inference(error: RecordError, attempt: int, retries: int, alone: bool) -> Action:
    """A micro-batch's model run failed with ``error`` after ``attempt`` retries (``inference_retries``:
    ``retries``): run it again if the failure is transient (``error.retriable``: out of memory) and retries are left,
    else bisect it, or dead-letter the record when it is ``alone``."""
    after = Action.DEAD_LETTER if alone else Action.BISECT
    return bounded(attempt, retries, after) if error.retriable else after


def of_registry(status: int | None) -> Action:
    """A schema registry request failed: ``status`` is the HTTP status, None when no answer came (a connection that
    failed or timed out). 404: asked again a bounded number of times (:attr:`Action.RETRY`, the caller's count);
    5xx, 408, 429 and no answer: :attr:`Action.WAIT`; another refusal: :attr:`Action.DEAD_LETTER`."""
    if status is None or status >= 500 or status in REGISTRY_UNAVAILABLE:
        return Action.WAIT
    if status == 404:
        return Action.RETRY
    return Action.DEAD_LETTER


def of_write(error: BaseException) -> Action:
    """A write of answers (a producer batch) failed with ``error``: in either delivery mode."""
    if isinstance(error, NotSentError):
        return Action.RESEND
    if isinstance(error, TOO_LARGE):
        return Action.SIZE_LADDER
    if isinstance(error, BROKEN_PRODUCER):
        return Action.NEW_PRODUCER
    return Action.RETRY


def of_transaction(error: BaseException) -> Action:
    """exactly_once: a partition's transaction failed with ``error``. Fenced or closed (:data:`FENCED`):
    :attr:`Action.DROP` (the partition has a new owner; if it is still ours it is read again by a fresh producer);
    else :attr:`Action.RETRY`: abort, re-read and answer the window again."""
    return Action.DROP if isinstance(error, FENCED) else Action.RETRY


def needs_new_producer(error: BaseException) -> bool:
    """Whether only a new producer writes again after ``error`` (the sequence state is lost: too large included)."""
    return of_write(error) in (Action.NEW_PRODUCER, Action.SIZE_LADDER)


def of_partition(tp: Hashable, revoked: Container[Hashable]) -> Action | None:
    """A record of partition ``tp`` after a rebalance took ``revoked`` away: :attr:`Action.DROP` when ``tp`` is one of
    them (``partition_revoked``: unanswered and uncommitted, its next owner reads it), else None (it goes on)."""
    return FAILURES["partition_revoked"] if tp in revoked else None


def of_connect(error: BaseException) -> Action:
    """A new producer could not be started: a Kafka error (the broker unreachable) is :attr:`Action.WAIT`ed out
    with the shared backoff (``broker_unreachable``); anything else is a bug and raised (:attr:`Action.DEAD_LETTER`
    is never the answer to a dependency that is down)."""
    if isinstance(error, KafkaError):
        return FAILURES["broker_unreachable"]
    raise error
