"""The fate table (consumer/fate.py): each failure class maps to one action, read by every site that decides."""

from __future__ import annotations

import pytest
from aiokafka.errors import (
    IllegalOperation,
    KafkaConnectionError,
    KafkaTimeoutError,
    MessageSizeTooLargeError,
    OutOfOrderSequenceNumber,
    ProducerFenced,
    RecordTooLargeError,
)

from consumer import fate
from consumer.errors import DeadLetterReason, InferenceError, NotSentError, RecordError, ValidationError
from consumer.fate import Action


def oom() -> InferenceError:
    err = InferenceError(DeadLetterReason.INFERENCE_ERROR, "out of memory")
    err.transient = "out_of_memory"
    return err


def test_only_a_transient_inference_error_is_retriable() -> None:
    assert oom().retriable
    assert not InferenceError(DeadLetterReason.INFERENCE_ERROR, "shape").retriable
    assert not ValidationError(DeadLetterReason.SHAPE_MISMATCH, "rank").retriable


@pytest.mark.parametrize(
    ("transient", "attempt", "alone", "action"),
    [
        (True, 0, False, Action.RETRY),
        (True, 2, True, Action.RETRY),
        (True, 3, False, Action.BISECT),
        (True, 3, True, Action.DEAD_LETTER),
        (False, 0, False, Action.BISECT),
        (False, 0, True, Action.DEAD_LETTER),
    ],
)
def test_inference_retries_transient_failures_then_bisects(
    transient: bool, attempt: int, alone: bool, action: Action
) -> None:
    err = oom() if transient else InferenceError(DeadLetterReason.INFERENCE_ERROR, "kernel")
    assert fate.of_inference(err, attempt, 3, alone=alone) is action


@pytest.mark.parametrize(
    ("status", "action"),
    [
        (None, Action.WAIT),
        (500, Action.WAIT),
        (503, Action.WAIT),
        (408, Action.WAIT),
        (429, Action.WAIT),
        (404, Action.RETRY),
        (409, Action.DEAD_LETTER),
        (401, Action.DEAD_LETTER),
    ],
)
def test_a_registry_that_does_not_answer_is_waited_out(status: int | None, action: Action) -> None:
    assert fate.of_registry(status) is action


@pytest.mark.parametrize(
    ("error", "action", "new_producer"),
    [
        (NotSentError("earlier failed"), Action.RESEND, False),
        (MessageSizeTooLargeError(), Action.SIZE_LADDER, True),
        (RecordTooLargeError(), Action.SIZE_LADDER, True),
        (OutOfOrderSequenceNumber(), Action.NEW_PRODUCER, True),
        (KafkaTimeoutError(), Action.RETRY, False),
    ],
)
def test_a_failed_write(error: BaseException, action: Action, new_producer: bool) -> None:
    assert fate.of_write(error) is action
    assert fate.needs_new_producer(error) is new_producer


def test_a_fenced_transaction_is_dropped_any_other_retried() -> None:
    assert fate.of_transaction(ProducerFenced()) is Action.DROP
    assert fate.of_transaction(IllegalOperation()) is Action.DROP
    assert fate.of_transaction(KafkaTimeoutError()) is Action.RETRY


def test_every_reason_has_an_action() -> None:
    assert set(fate.REASONS) == set(DeadLetterReason)
    assert fate.of_record(RecordError(DeadLetterReason.RESULT_TOO_LARGE, "x")) is Action.SIZE_LADDER
    assert fate.of_record(RecordError(DeadLetterReason.NULL_VALUE, "x")) is Action.DEAD_LETTER


def test_a_record_of_a_revoked_partition_is_dropped_any_other_goes_on() -> None:
    assert fate.of_partition("a-0", {"a-0", "a-1"}) is Action.DROP
    assert fate.of_partition("a-2", {"a-0", "a-1"}) is None


def test_a_broker_that_does_not_answer_a_new_producer_is_waited_out() -> None:
    assert fate.of_connect(KafkaConnectionError()) is Action.WAIT
    with pytest.raises(ValueError, match="a bug"):
        fate.of_connect(ValueError("a bug"))
