"""What the command-line tools share: their argument parser (a mistyped flag answered with the closest real one, as
the consumer does), one-line Kafka errors, the exit codes, and the client library kept quiet.

Exit codes (every tool): 0 done; :data:`CLUSTER` (1) the cluster failed (the broker or the schema registry cannot be
reached, a send failed); :data:`USER` (2) the user can fix it (a bad flag, an unreadable or malformed file, a topic
that does not exist). :func:`exit_code` maps a failure to its code, :func:`refuse` says it in one line.

A tool reports its own failure in one line (what failed, the broker asked, what was done so far), so the Kafka
client's records would only repeat it: while a broker is unreachable the client logs each failed connection and
metadata refresh, thousands of lines a minute. :func:`quiet_client_logs` keeps records of the ``aiokafka`` loggers
below CRITICAL from the terminal.
"""

from __future__ import annotations

import argparse
import difflib
import logging
import os
import re
import sys
from typing import Any, NoReturn

from aiokafka.errors import KafkaError

from consumer.config import did_you_mean

#: The broker the tools use without ``--bootstrap-servers``: ``KAFKA_BOOTSTRAP_SERVERS`` (what ``kafka-local run``
#: sets for the command it runs), else the Kafka default.
DEFAULT_BOOTSTRAP = "127.0.0.1:9092"


class ToolParser(argparse.ArgumentParser):
    """argparse whose one-line error (exit 2) adds the closest real flag to a mistyped one, sub-commands' flags
    included (``unrecognized arguments: --limt 5 (did you mean --limit?)``), or the closest sub-command to a
    mistyped one. Its sub-commands' parsers are of this class too (argparse makes them so)."""

    def error(self, message: str) -> NoReturn:
        hint = did_you_mean(message, self.flags())
        choice = re.search(r"invalid choice: '([^']*)' \(choose from (.*)\)", message)
        if choice and not hint:
            close = difflib.get_close_matches(choice[1], re.findall(r"'([^']*)'", choice[2]), n=1, cutoff=0.6)
            hint = f" (did you mean {close[0]}?)" if close else ""
        self.exit(2, f"{self.prog}: {message}{hint}; --help lists every flag\n")

    def flags(self) -> list[str]:
        """Every ``--flag`` of this parser and of its sub-commands."""
        found = [option for option in self._option_string_actions if option.startswith("--")]
        for action in self._actions:
            subs = action.choices.values() if isinstance(action.choices, dict) else ()
            for sub in subs:
                if isinstance(sub, ToolParser):
                    found += [option for option in sub.flags() if option not in found]
        return found


def default_bootstrap() -> str:
    """``KAFKA_BOOTSTRAP_SERVERS``, else :data:`DEFAULT_BOOTSTRAP`."""
    return os.environ.get("KAFKA_BOOTSTRAP_SERVERS") or DEFAULT_BOOTSTRAP


def add_bootstrap(parser: Any) -> None:
    """The tools' ``--bootstrap-servers`` flag, its default from :func:`default_bootstrap`."""
    parser.add_argument(
        "--bootstrap-servers",
        default=default_bootstrap(),
        help="Kafka bootstrap servers (default %(default)s: $KAFKA_BOOTSTRAP_SERVERS when set, else 127.0.0.1:9092)",
    )


#: Exit code of a failure of the cluster's (a dependency that is down, a send that failed).
CLUSTER = 1
#: Exit code of a failure of the user's (argparse's own code for a bad flag).
USER = 2


class UserFault(Exception):
    """A failure the user can fix (exit :data:`USER`): the base of the tools' own such errors."""


class ClusterFault(Exception):
    """A failure of the cluster's (exit :data:`CLUSTER`): the base of the tools' own such errors (besides Kafka's)."""


class BadArgument(UserFault, ValueError):
    """A flag's value the tool cannot use; the message is the whole line the user sees (exit 2)."""


def quiet_client_logs() -> None:
    """Drop the Kafka client's log records below CRITICAL (the tool says what failed itself)."""
    logging.getLogger("aiokafka").setLevel(logging.CRITICAL)


def kafka_error_text(exc: BaseException) -> str:
    """``Type: message`` once: aiokafka's errors already start their text with the class name."""
    name, text = type(exc).__name__, str(exc)
    return text if text.startswith(name) else f"{name}: {text}" if text else name


def exit_code(exc: BaseException) -> int:
    """The exit code of a tool that failed with ``exc``: :data:`CLUSTER` for a Kafka error or a
    :class:`ClusterFault`; :data:`USER` for a :class:`UserFault` or a file that cannot be read (``OSError``) or
    parsed (``ValueError``).

    Raises:
        TypeError: ``exc`` is of neither kind (a bug: it should not have been caught).
    """
    if isinstance(exc, KafkaError | ClusterFault):
        return CLUSTER
    if isinstance(exc, UserFault | OSError | ValueError):
        return USER
    raise TypeError(f"no exit code for {exc!r}") from exc


def refuse(tool: str, exc: BaseException, message: str | None = None) -> int:
    """Say ``tool: message`` (``exc``'s text by default) on stderr, one line; return ``exc``'s :func:`exit_code`."""
    print(f"{tool}: {exc if message is None else message}", file=sys.stderr)
    return exit_code(exc)


def unreachable(exc: BaseException, bootstrap_servers: str) -> str:
    """A Kafka failure's line: ``Type: message (bootstrap_servers=...)``."""
    return f"{kafka_error_text(exc)} (bootstrap_servers={bootstrap_servers})"
