"""What the tools share (producer_tools/cli.py): the exit-code mapping, written once for produce, results and dlq."""

from __future__ import annotations

import pytest
from aiokafka.errors import KafkaConnectionError

from consumer.errors import TopicMissingError
from producer_tools.cli import BadArgument, RegistryUnavailable, exit_code, refuse


@pytest.mark.parametrize(
    ("exc", "code"),
    [
        (BadArgument("--rate must be > 0"), 2),
        (TopicMissingError("requests_topic: no topic"), 2),
        (FileNotFoundError("events.jsonl"), 2),
        (ValueError("line 3 is not JSON"), 2),
        (KafkaConnectionError("no broker"), 1),
        (RegistryUnavailable("http://registry: refused"), 1),
    ],
)
def test_the_users_fault_is_2_the_clusters_1(exc: BaseException, code: int) -> None:
    assert exit_code(exc) == code


def test_refuse_prints_one_line_naming_the_tool(capsys: pytest.CaptureFixture[str]) -> None:
    assert refuse("streaminfer-dlq", "no such topic", TopicMissingError("x")) == 2
    assert capsys.readouterr().err == "streaminfer-dlq: no such topic\n"
