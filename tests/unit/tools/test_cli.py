"""Every user tool answers a mistyped flag or sub-command with the closest real one, in one line, exit 2 (as the
consumer does, with the same helper: consumer.config.did_you_mean)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import pytest
from aiokafka.errors import KafkaConnectionError

from producer_tools import cli, dlq, fuse, produce, results
from producer_tools.events import RegistryUnavailable
from producer_tools.topics import TopicMissingError

Main = Callable[[Sequence[str] | None], int]


@pytest.mark.parametrize(
    ("main", "argv", "expected"),
    [
        (produce.main, ["--limt", "5"], "streaminfer-produce: unrecognized arguments: --limt 5 (did you mean --limit?"),
        (produce.main, ["--comand-config", "f"], "(did you mean --command-config?)"),
        (results.main, ["--manifest", "m", "--label-feild", "y"], "(did you mean --label-field?)"),
        (dlq.main, ["summary", "--reasn", "x"], "streaminfer-dlq: unrecognized arguments: --reasn x (did you mean "
                                                "--reason?)"),
        (dlq.main, ["replai"], "invalid choice: 'replai' (choose from 'summary', 'show', 'replay') (did you mean "
                               "replay?)"),
        (dlq.main, ["summary", "--sasl-usrname", "u"], "(did you mean --sasl-username?)"),
        (fuse.main, ["m.onnx", "out.onnx", "--help-me"], "(did you mean --help?)"),
    ],
)  # fmt: skip
def test_a_mistyped_flag_is_answered_with_the_closest_one(
    main: Main, argv: list[str], expected: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        main(argv)
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert expected in err
    assert err.endswith("; --help lists every flag\n")
    assert err.count("\n") == 1


def test_a_flag_far_from_every_real_one_gets_no_guess(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        produce.main(["--zzzz"])
    assert capsys.readouterr().err == "streaminfer-produce: unrecognized arguments: --zzzz; --help lists every flag\n"


def test_a_bad_value_of_a_real_flag_names_it_without_a_guess(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        produce.main(["--rate", "0"])
    assert capsys.readouterr().err == "streaminfer-produce: --rate must be > 0; --help lists every flag\n"


@pytest.mark.parametrize(
    ("exc", "code"),
    [
        (cli.BadArgument("--limit must be >= 1"), cli.USER),
        (TopicMissingError("topic requests does not exist"), cli.USER),
        (FileNotFoundError("no such file"), cli.USER),
        (ValueError("not JSON"), cli.USER),
        (KafkaConnectionError("no broker"), cli.CLUSTER),
        (RegistryUnavailable("http://registry: 503"), cli.CLUSTER),
    ],
)
def test_a_failure_is_the_users_2_or_the_clusters_1(
    exc: BaseException, code: int, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.refuse("streaminfer-x", exc) == code
    assert capsys.readouterr().err == f"streaminfer-x: {exc}\n"


def test_a_failure_of_neither_kind_has_no_exit_code() -> None:
    with pytest.raises(TypeError, match="no exit code"):
        cli.exit_code(RuntimeError("a bug"))


def test_an_unreachable_broker_is_named_once() -> None:
    line = cli.unreachable(KafkaConnectionError("Unable to bootstrap"), "127.0.0.1:1")
    assert line == "KafkaConnectionError: Unable to bootstrap (bootstrap_servers=127.0.0.1:1)"
