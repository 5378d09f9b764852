"""``streaminfer-dlq``: read the dead-letter topic, and put dead letters back once their cause is fixed.

Built on the headers every dead letter carries (docs/record-contract.md, "Dead letter"): the request's own key, value
and headers, then ``correlation_id``, ``streaminfer.error.reason``, Kafka Connect's ``__connect.errors.*`` (message,
class, source topic, partition, offset), ``streaminfer.source.timestamp_ms`` and ``streaminfer.consumer.group``.

- ``summary``: dead letters by reason, source partition and time range (a table, or ``--json``).
- ``show``: the selected dead letters, every header decoded, key and value previewed safely (``--json`` lines).
- ``replay``: the selected dead letters back to the requests topic (``--to``): the original key, value and headers
  without the dead letter's own, the correlation ID kept (header ``correlation_id``, so the answer matches what the
  sender expects), plus the replay counter ``streaminfer.replay.count``. A dead letter replayed ``--max-replays``
  times already is refused, as is one whose value was not kept (a reduced dead letter, an undecodable record).
  Replay reads with its own consumer group, one per topic, target and selection (``--group`` to choose), and
  commits what it read once every replayed record is acknowledged: a finished replay is not repeated, a failed one
  is resumed. ``--dry-run`` selects and counts without sending or committing.

Selection (every command): ``--reason`` (repeatable; one of :class:`consumer.errors.DeadLetterReason`),
``--since`` / ``--until`` (the dead letter's own timestamp: ISO 8601, or ms since the epoch), ``--source-partition``,
``--offsets A-B`` (source offsets, inclusive), ``--correlation-id`` (repeatable). Every command reads the topic up
to its end offsets when it started.

Exit codes: 0 done; 1 a record was refused or not acknowledged, or the broker cannot be reached; 2 a bad flag or a
topic that does not exist.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import os
import sys
from collections import Counter, defaultdict
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import orjson
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.errors import KafkaError
from rich.console import Console
from rich.table import Table
from tqdm import tqdm

from consumer.answers.headers import CORRELATION_HEADER
from consumer.answers.records import (
    FIRST_OFFSET_HEADER,
    OFFSET_HEADER,
    PARTITION_HEADER,
    REASON_HEADER,
    TOPIC_HEADER,
    VALUE_DROPPED_HEADER,
)
from consumer.errors import DeadLetterReason
from producer_tools.cli import BadArgument, ToolParser, add_bootstrap, quiet_client_logs, refuse, unreachable
from producer_tools.security import Security, add_security, security_of
from producer_tools.topics import TopicMissingError, partitions_of

#: The name a line the tool says on stderr starts with.
TOOL = "streaminfer-dlq"
#: Header counting how often a request was replayed from the dead-letter topic (decimal text).
REPLAY_HEADER = "streaminfer.replay.count"
#: Header naming the dead letter a replayed request came from, ``topic:partition:offset``.
REPLAYED_FROM_HEADER = "streaminfer.replay.from"
#: Bytes of a key or value shown by ``show`` before it is cut.
PREVIEW_BYTES = 200

Headers = list[tuple[str, bytes | None]]


# ------------------------------------------------------------------------------------------------ dead letters
@dataclass(slots=True)
class DeadLetter:
    """One record of the dead-letter topic, split into the request it carries and what went wrong.

    Attributes:
        partition, offset: where it sits on the dead-letter topic.
        timestamp_ms: its own record timestamp (when it was dead-lettered, with LogAppendTime), ms since the epoch.
        key, value: the request's (value None: not kept).
        request_headers: the request's own headers, in order.
        error: the headers the consumer added (name -> text), ``correlation_id`` and the reason among them.
        kept: whether the request's value is still there (not a reduced dead letter, nor an undecodable record).
        added: the consumer's headers as written.
    """

    partition: int
    offset: int
    timestamp_ms: int
    key: bytes | None
    value: bytes | None
    request_headers: Headers
    error: dict[str, str] = field(default_factory=dict)
    kept: bool = True
    added: Headers = field(default_factory=list)

    @property
    def reason(self) -> str:
        """The dead-letter reason ("" when the header is missing: not written by streaminfer)."""
        return self.error.get(REASON_HEADER, "")

    @property
    def correlation_id(self) -> bytes | None:
        """The correlation ID the request was answered under (exact bytes)."""
        for name, value in [*self.request_headers, *self.added][::-1]:
            if name == CORRELATION_HEADER:
                return value
        return None

    @property
    def replays(self) -> int:
        """How often the request was replayed before (header ``streaminfer.replay.count``; 0 without it)."""
        for name, value in self.request_headers:
            if name == REPLAY_HEADER and value is not None and value.isdigit():
                return int(value)
        return 0

    @property
    def source(self) -> tuple[str, int, int] | None:
        """The request's topic, partition and offset (None when the headers are missing or malformed)."""
        try:
            return self.error[TOPIC_HEADER], int(self.error[PARTITION_HEADER]), int(self.error[OFFSET_HEADER])
        except (KeyError, ValueError):
            return None


def split(partition: int, offset: int, timestamp_ms: int, key: bytes | None, value: bytes | None,
          headers: Sequence[tuple[str, bytes | None]]) -> DeadLetter:  # fmt: skip
    """Split a dead-letter record at the consumer's own headers: they start at the ``correlation_id`` just before
    the last ``streaminfer.error.reason`` (sink.py appends them in that order after the request's headers, and the
    header block of a value that was never fetched, or a reduced dead letter's size header, just before)."""
    headers = list(headers)
    reasons = [i for i, (name, _) in enumerate(headers) if name == REASON_HEADER]
    if not reasons:
        return DeadLetter(partition, offset, timestamp_ms, key, value, headers, kept=value is not None)
    start = reasons[-1] - 1 if reasons[-1] > 0 and headers[reasons[-1] - 1][0] == CORRELATION_HEADER else reasons[-1]
    own, added = headers[:start], headers[start:]
    dropped = {VALUE_DROPPED_HEADER, FIRST_OFFSET_HEADER}
    while own and own[-1][0].startswith(("streaminfer.error.", "streaminfer.source.")):
        added.insert(0, own.pop())  # the dropped-value block sits between the request's headers and ours
    error = {name: (v or b"").decode("utf-8", "backslashreplace") for name, v in added if name != CORRELATION_HEADER}
    lost = bool(dropped & {name for name, _ in added}) or error.get(REASON_HEADER) == "undecodable_record"
    return DeadLetter(partition, offset, timestamp_ms, key, value, own, error, not lost and value is not None, added)


# ------------------------------------------------------------------------------------------------ selection
@dataclass(slots=True)
class Selection:
    """Which dead letters a command acts on (all by default)."""

    reasons: frozenset[str] = frozenset()
    since_ms: int | None = None
    until_ms: int | None = None
    source_partition: int | None = None
    offsets: tuple[int, int] | None = None
    correlation_ids: frozenset[bytes] = frozenset()

    def picks(self, letter: DeadLetter) -> bool:
        """Whether ``letter`` is selected."""
        if self.reasons and letter.reason not in self.reasons:
            return False
        if self.since_ms is not None and letter.timestamp_ms < self.since_ms:
            return False
        if self.until_ms is not None and letter.timestamp_ms > self.until_ms:
            return False
        source = letter.source
        if self.source_partition is not None and (source is None or source[1] != self.source_partition):
            return False
        if self.offsets is not None and (source is None or not self.offsets[0] <= source[2] <= self.offsets[1]):
            return False
        return not self.correlation_ids or letter.correlation_id in self.correlation_ids

    def tag(self) -> str:
        """A short, stable digest of the selection (names replay's default consumer group)."""
        parts = [sorted(self.reasons), self.since_ms, self.until_ms, self.source_partition, self.offsets,
                 sorted(c.hex() for c in self.correlation_ids)]  # fmt: skip
        return hashlib.sha256(orjson.dumps(parts)).hexdigest()[:10]


def parse_time_ms(text: str, flag: str) -> int:
    """``text`` as ms since the epoch: an integer, or an ISO 8601 time (UTC unless it names its offset).

    Raises:
        BadArgument: neither.
    """
    if text.isdigit():
        return int(text)
    try:
        when = datetime.fromisoformat(text)
    except ValueError:
        raise BadArgument(f"{flag} must be ms since the epoch or an ISO 8601 time, got {text!r}") from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return int(when.timestamp() * 1000)


def selection(args: argparse.Namespace) -> Selection:
    """The selection the flags name.

    Raises:
        BadArgument: an unknown reason, a time or an offset range that cannot be read, ``--since`` after
            ``--until``, a negative partition or limit.
    """
    known = {r.value for r in DeadLetterReason}
    unknown = sorted(set(args.reason) - known)
    if unknown:
        raise BadArgument(f"--reason {unknown[0]!r} is not a dead-letter reason; one of: {', '.join(sorted(known))}")
    if args.source_partition is not None and args.source_partition < 0:
        raise BadArgument(f"--source-partition must be >= 0, got {args.source_partition}")
    if getattr(args, "limit", 0) < 0:
        raise BadArgument(f"--limit must be >= 0 (0: all), got {args.limit}")
    offsets = None
    if args.offsets:
        first, _, last = args.offsets.partition("-")
        if not (first.isdigit() and last.isdigit() and int(first) <= int(last)):
            raise BadArgument(f"--offsets must be FIRST-LAST (inclusive, FIRST <= LAST), got {args.offsets!r}")
        offsets = (int(first), int(last))
    since_ms = parse_time_ms(args.since, "--since") if args.since else None
    until_ms = parse_time_ms(args.until, "--until") if args.until else None
    if since_ms is not None and until_ms is not None and since_ms > until_ms:
        raise BadArgument(f"--since {args.since!r} is after --until {args.until!r}")
    return Selection(
        reasons=frozenset(args.reason),
        since_ms=since_ms,
        until_ms=until_ms,
        source_partition=args.source_partition,
        offsets=offsets,
        correlation_ids=frozenset(c.encode() for c in args.correlation_id),
    )


# ------------------------------------------------------------------------------------------------ reading
async def read(
    consumer: AIOKafkaConsumer,
    bootstrap_servers: str,
    topic: str,
    progress: bool,
    ends: dict[TopicPartition, int] | None = None,
    security: Security = None,
) -> AsyncIterator[DeadLetter]:
    """Every dead letter of ``topic`` from the consumer's positions (its group's committed offsets, else the
    earliest) up to the end offsets when the read began (written into ``ends``: what a reader in a group commits
    once done; records fetched beyond them are not read).

    Raises:
        KafkaError: the topic does not exist or the broker cannot be reached.
    """
    parts = await partitions_of(bootstrap_servers, topic, security)
    tps = [TopicPartition(topic, p) for p in sorted(parts)]
    consumer.assign(tps)
    ends = {} if ends is None else ends
    ends.update(await consumer.end_offsets(tps))
    left: dict[TopicPartition, int] = {}
    total = 0
    for tp, end in ends.items():
        position = await consumer.position(tp)
        if position < end:
            left[tp] = end
            total += end - position
    with tqdm(total=total, desc="dead letters", unit="rec", disable=None if progress else True) as bar:
        while left:
            batches = await consumer.getmany(*left, timeout_ms=500)
            for tp, records in batches.items():
                for rec in records:
                    if rec.offset >= ends[tp]:
                        break
                    bar.update(1)
                    yield split(tp.partition, rec.offset, rec.timestamp, rec.key, rec.value, rec.headers)
                if await consumer.position(tp) >= ends[tp]:
                    left.pop(tp, None)


def consumer_for(bootstrap_servers: str, group: str | None = None, security: Security = None) -> AIOKafkaConsumer:
    """A reader of the dead-letter topic: no auto commit; in ``group`` (replay) or in none (summary, show).
    ``read_committed``: dead letters of an aborted exactly_once transaction were never delivered. ``security``:
    aiokafka's TLS/SASL keyword arguments (:meth:`producer_tools.security.ClientSecurity.kwargs`)."""
    return AIOKafkaConsumer(
        **(security or {}),
        bootstrap_servers=bootstrap_servers,
        group_id=group,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        client_id="streaminfer-dlq",
        isolation_level="read_committed",
    )


async def selected(args: argparse.Namespace, chosen: Selection, security: Security = None) -> list[DeadLetter]:
    """The selected dead letters of ``args.dead_letter_topic`` (no group: the whole topic)."""
    consumer = consumer_for(args.bootstrap_servers, None, security)
    await start(consumer)
    try:
        return [
            letter
            async for letter in read(
                consumer, args.bootstrap_servers, args.dead_letter_topic, args.progress, None, security
            )
            if chosen.picks(letter)
        ]
    finally:
        await consumer.stop()


async def start(client: AIOKafkaConsumer | AIOKafkaProducer) -> None:
    """Start ``client``; a failed start closes what it opened."""
    try:
        await client.start()
    except BaseException:
        await client.stop()
        raise


# ------------------------------------------------------------------------------------------------ summary
@dataclass(slots=True)
class ReasonRow:
    """Dead letters of one reason: how many, from which source partitions, first and last timestamp (ms)."""

    count: int = 0
    partitions: Counter[str] = field(default_factory=Counter)
    first_ms: int | None = None
    last_ms: int | None = None


def summarise(letters: Sequence[DeadLetter]) -> dict[str, ReasonRow]:
    """Rows by reason (most frequent first)."""
    rows: dict[str, ReasonRow] = defaultdict(ReasonRow)
    for letter in letters:
        row = rows[letter.reason or "(none)"]
        row.count += 1
        source = letter.source
        row.partitions[f"{source[0]}:{source[1]}" if source else "?"] += 1
        row.first_ms = letter.timestamp_ms if row.first_ms is None else min(row.first_ms, letter.timestamp_ms)
        row.last_ms = letter.timestamp_ms if row.last_ms is None else max(row.last_ms, letter.timestamp_ms)
    return dict(sorted(rows.items(), key=lambda kv: (-kv[1].count, kv[0])))


def iso(ms: int | None, timespec: str = "milliseconds", zone: str = "Z") -> str:
    """``ms`` since the epoch as UTC ISO 8601 (to the ms, or ``timespec``), ending in ``zone``."""
    if ms is None:
        return ""
    return datetime.fromtimestamp(ms / 1000, UTC).replace(tzinfo=None).isoformat(timespec=timespec) + zone


def print_summary(topic: str, rows: dict[str, ReasonRow], as_json: bool) -> None:
    """The summary as a table (rich) or one JSON object."""
    if as_json:
        doc = {
            "topic": topic,
            "dead_letters": sum(r.count for r in rows.values()),
            "reasons": {
                reason: {
                    "count": r.count,
                    "source_partitions": dict(r.partitions),
                    "first_ms": r.first_ms,
                    "last_ms": r.last_ms,
                }
                for reason, r in rows.items()
            },
        }
        sys.stdout.write(orjson.dumps(doc).decode() + "\n")
        return
    sources = sorted({p.rsplit(":", 1)[0] for r in rows.values() for p in r.partitions})
    title = f"{sum(r.count for r in rows.values())} dead letters on {topic}, from {', '.join(sources) or '-'}"
    table = Table(title=title)
    for column in ("reason", "count", "partition:count", "first (UTC)", "last (UTC)"):
        table.add_column(column, justify="right" if column == "count" else "left", no_wrap=column != "partition:count")
    for reason, r in rows.items():
        spread = " ".join(f"{p.rsplit(':', 1)[1]}:{n}" for p, n in sorted(r.partitions.items()))
        table.add_row(reason, str(r.count), spread, iso(r.first_ms, "seconds", ""), iso(r.last_ms, "seconds", ""))
    Console(width=None if sys.stdout.isatty() else 120).print(table)  # piped: rich would assume 80 columns


# ------------------------------------------------------------------------------------------------ show
def preview(data: bytes | None) -> str:
    """Bytes shown safely: text with escapes for what is not printable UTF-8, cut at :data:`PREVIEW_BYTES`."""
    if data is None:
        return "(null)"
    text = data[:PREVIEW_BYTES].decode("utf-8", "backslashreplace")
    text = "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)
    return text + (f"... ({len(data)} bytes)" if len(data) > PREVIEW_BYTES else "")


def described(letter: DeadLetter, topic: str) -> dict[str, Any]:
    """One dead letter as a JSON-ready dict: where it is, the error, the request's headers, key and value."""
    cid = letter.correlation_id
    return {
        "dead_letter": f"{topic}:{letter.partition}:{letter.offset}",
        "timestamp": iso(letter.timestamp_ms),
        "reason": letter.reason,
        "correlation_id": preview(cid),
        "error": letter.error,
        "replays": letter.replays,
        "value_kept": letter.kept,
        "headers": [[name, preview(value)] for name, value in letter.request_headers],
        "key": preview(letter.key),
        "value": preview(letter.value),
    }


def print_letters(letters: Sequence[DeadLetter], topic: str, as_json: bool) -> None:
    """``show``'s output: JSON lines, or a readable block per dead letter."""
    console = Console(highlight=False)
    for letter in letters:
        doc = described(letter, topic)
        if as_json:
            sys.stdout.write(orjson.dumps(doc).decode() + "\n")
            continue
        console.rule(f"{doc['dead_letter']}  {doc['timestamp']}  [bold]{doc['reason']}[/bold]")
        for name in ("correlation_id", "replays", "value_kept", "key", "value"):
            console.print(f"{name}: {doc[name]}", markup=False)
        for name, text in doc["error"].items():
            console.print(f"  {name}: {text}", markup=False)
        for name, text in doc["headers"]:
            console.print(f"  header {name}: {text}", markup=False)


# ------------------------------------------------------------------------------------------------ replay
def replayed_headers(letter: DeadLetter, topic: str) -> Headers:
    """The request's headers for its replay: its own, less any ``correlation_id`` and replay headers, then the
    correlation ID it was answered under, the new replay count and where it was replayed from."""
    keep = [
        (n, v) for n, v in letter.request_headers if n not in (CORRELATION_HEADER, REPLAY_HEADER, REPLAYED_FROM_HEADER)
    ]
    cid = letter.correlation_id
    if cid is not None:
        keep.append((CORRELATION_HEADER, cid))
    keep.append((REPLAY_HEADER, str(letter.replays + 1).encode()))
    keep.append((REPLAYED_FROM_HEADER, f"{topic}:{letter.partition}:{letter.offset}".encode()))
    return keep


@dataclass(slots=True)
class ReplayReport:
    """What a replay did, in records."""

    read: int = 0
    selected: int = 0
    sent: int = 0
    refused: Counter[str] = field(default_factory=Counter)  # why -> records
    failed: int = 0
    group: str = ""

    def line(self, dry_run: bool) -> str:
        """The one-line summary printed last."""
        refused = sum(self.refused.values())
        why = ", ".join(f"{n} {w}" for w, n in sorted(self.refused.items()))
        verb = "would send" if dry_run else "sent"
        return (f"dlq replay: read={self.read} selected={self.selected} {verb}={self.sent} refused={refused}"
                f"{f' ({why})' if why else ''} failed={self.failed} group={self.group}")  # fmt: skip


def refusal(letter: DeadLetter, max_replays: int) -> str | None:
    """Why ``letter`` cannot be replayed, or None."""
    if not letter.kept:
        return "value not kept"
    if letter.replays >= max_replays:
        return f"replayed {max_replays} times already"
    return None


async def replay(args: argparse.Namespace, chosen: Selection, security: Security = None) -> ReplayReport:
    """Send the selected dead letters to ``args.to``; commit the group's offsets when all were acknowledged.

    Raises:
        TopicMissingError: the dead-letter topic or ``--to`` does not exist.
        KafkaError: the broker cannot be reached.
    """
    group = args.group or f"streaminfer-dlq-replay-{args.dead_letter_topic}-{args.to}-{chosen.tag()}"
    report = ReplayReport(group=group)
    consumer = consumer_for(args.bootstrap_servers, group, security)
    producer: AIOKafkaProducer | None = None
    try:
        await start(consumer)
        if not args.dry_run:
            producer = AIOKafkaProducer(**(security or {}), bootstrap_servers=args.bootstrap_servers, acks="all",
                                        enable_idempotence=True, client_id="streaminfer-dlq-replay")  # fmt: skip
            await start(producer)
            if args.to not in await consumer.topics():
                raise TopicMissingError(f"--to: topic {args.to!r} does not exist on the cluster; fix the name")
        pending: list[asyncio.Future[Any]] = []
        ends: dict[TopicPartition, int] = {}
        async for letter in read(
            consumer, args.bootstrap_servers, args.dead_letter_topic, args.progress, ends, security
        ):
            report.read += 1
            if not chosen.picks(letter):
                continue
            report.selected += 1
            why = refusal(letter, args.max_replays)
            if why is not None:
                report.refused[why] += 1
                continue
            report.sent += 1
            if producer is not None:
                headers = replayed_headers(letter, args.dead_letter_topic)
                pending.append(await producer.send(args.to, letter.value, key=letter.key, headers=headers))
        if args.dry_run:
            return report
        outcomes = await asyncio.gather(*pending, return_exceptions=True)
        report.failed = sum(isinstance(o, BaseException) for o in outcomes)
        report.sent -= report.failed
        if report.failed == 0:
            # A rerun starts after what was read (a failed run is redone whole; the replayed records carry their
            # count, so --max-replays bounds how often any of them goes round).
            await consumer.commit(ends)
    finally:
        await consumer.stop()
        if producer is not None:
            await producer.stop()
    return report


# ------------------------------------------------------------------------------------------------ command line
def parser() -> argparse.ArgumentParser:
    """The command line (one sub-command per verb; the selection flags on each)."""
    p = ToolParser(prog="streaminfer-dlq", description=__doc__.split("\n\n")[0])
    add_bootstrap(p)
    add_security(p)
    p.add_argument("--dead-letter-topic", default="requests.dlq")
    p.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bar")
    verbs = p.add_subparsers(dest="verb", required=True)
    summary = verbs.add_parser("summary", help="dead letters by reason, source partition and time range")
    show = verbs.add_parser("show", help="the selected dead letters, headers decoded, values previewed")
    again = verbs.add_parser("replay", help="send the selected dead letters back to the requests topic")
    for verb in (summary, show, again):
        # also after the verb; SUPPRESS: absent there, the value before the verb (or its default) stands
        verb.add_argument("--dead-letter-topic", default=argparse.SUPPRESS, help="as before the verb")
        verb.add_argument(
            "--no-progress", dest="progress", action="store_false", default=argparse.SUPPRESS, help="as before the verb"
        )
        verb.add_argument("--reason", action="append", default=[], help="this reason only (repeatable)")
        verb.add_argument("--since", help="dead-lettered at or after (ISO 8601, or ms since the epoch)")
        verb.add_argument("--until", help="dead-lettered at or before (ISO 8601, or ms since the epoch)")
        verb.add_argument("--source-partition", type=int, help="from this requests partition only")
        verb.add_argument("--offsets", help="source offsets FIRST-LAST, inclusive")
        verb.add_argument("--correlation-id", action="append", default=[], help="this correlation ID (repeatable)")
    for verb in (summary, show):
        verb.add_argument("--json", action="store_true", help="JSON instead of a table")
    show.add_argument("--limit", type=int, default=20, help="show at most this many (the first ones), 0: all")
    again.add_argument("--to", required=True, help="topic to replay into (the requests topic, or another)")
    again.add_argument("--max-replays", type=int, default=3, help="refuse a record replayed this often already")
    again.add_argument("--group", help="consumer group of the replay (default: one per topic, target, selection)")
    again.add_argument("--dry-run", action="store_true", help="select and count; send and commit nothing")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``streaminfer-dlq`` (exit codes in the module docstring)."""
    args = parser().parse_args(argv)
    quiet_client_logs()
    try:
        chosen = selection(args)
        security = security_of(args, os.environ).kwargs()
        if args.verb == "replay" and args.max_replays < 1:
            raise BadArgument(f"--max-replays must be at least 1, got {args.max_replays}")
    except BadArgument as exc:
        return refuse(TOOL, exc)
    try:
        if args.verb == "replay":
            report = asyncio.run(replay(args, chosen, security))
            print(report.line(args.dry_run))
            return 1 if report.failed or report.refused else 0
        letters = asyncio.run(selected(args, chosen, security))
    except TopicMissingError as exc:
        return refuse(TOOL, exc)
    except KafkaError as exc:
        return refuse(TOOL, exc, unreachable(exc, args.bootstrap_servers))
    if args.verb == "summary":
        print_summary(args.dead_letter_topic, summarise(letters), args.json)
    else:
        print_letters(letters[: args.limit or None], args.dead_letter_topic, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
