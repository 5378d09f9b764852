"""``make demo``: the whole path on a running broker, from request to answer, with one summary line.

Creates the topics (requests with several partitions; results and dead letters with broker append time),
starts ``streaminfer-consumer`` as a child process on the digits model (with its validation record, ``make model``
``digits.record.json``, when it exists), waits for ``/readyz``, warms the path up
(a few records answered first; their time is printed as the cold start), then pauses the consumer (SIGSTOP), sends
the held-out digits with every poison kind interleaved, resumes it (SIGCONT), waits until each record has a result
or a dead letter, prints::

    demo: sent=N results=R dead_letters=D accuracy=A p50_ms=X p99_ms=Y throughput_rps=T

and stops the consumer with SIGTERM. The figures describe the consumer, not the demo's producer: the whole burst is
on the topic when the consumer resumes, so ``throughput_rps`` is the records answered per second from the resume to
the broker's append time of the last answer, and ``p50_ms`` / ``p99_ms`` are each answer's append time minus the
resume (its wait behind the burst plus its own processing). Both clocks are this machine's: with a remote broker
(``KAFKA_BOOTSTRAP_SERVERS``) its clock offset enters the figures. Exit 1 if any record is unanswered, a poison
record got the wrong reason, or the consumer did not stop cleanly.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import os
import signal
import sys
import time
import uuid
from collections.abc import Sequence
from pathlib import Path

from harness.process import ConsumerProcess
from producer_tools.produce import DEFAULT_HELDOUT, Outgoing, digits_requests, interleave, poison_requests, send_all
from producer_tools.results import Report, collect, print_report
from producer_tools.topics import ensure_topics

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_MODEL = ROOT / "models" / "digits" / "artifacts" / "digits.onnx"
DEFAULT_RECORD = ROOT / "models" / "digits" / "artifacts" / "digits.record.json"
APPEND_TIME = {"message.timestamp.type": "LogAppendTime"}
#: Records answered before the timed run, so its figures show a warm consumer.
WARMUP_RECORDS = 32


async def warm_up(bootstrap: str, topics: dict[str, str], heldout: Path, timeout_s: float) -> None:
    """Send WARMUP_RECORDS held-out digits and wait for their answers, and print how long that took: the cold
    start of a new consumer on new topics (the producers' first metadata waits, the first fetches and commits), which
    the timed run after it does not pay.

    Raises:
        RuntimeError: a warm-up record was not answered within ``timeout_s``.
    """
    started = time.monotonic()
    records = list(digits_requests(f"warmup-{uuid.uuid4().hex[:8]}", heldout, limit=WARMUP_RECORDS))
    await send_all(bootstrap, topics["requests"], records, progress=False)
    expected = {r.correlation_id: r.manifest() for r in records}
    report = await collect(bootstrap, topics["results"], topics["dlq"], expected, timeout_s, progress=False)
    if report.missing:
        raise RuntimeError(f"{len(report.missing)} warm-up records were not answered")
    took_ms = 1000 * (time.monotonic() - started)
    print(f"demo: warm-up: {len(records)} records answered in {took_ms:.0f} ms (cold start, not in the figures)")


def since_resume(report: Report, resumed_ms: float) -> Report:
    """``report`` with the consumer's figures: each answer's latency is its broker append time minus
    ``resumed_ms`` (epoch ms, when the consumer was resumed with the whole burst on the topic), and the throughput
    is the answers per second from the resume to the last answer."""
    appended = [a.timestamp_ms for a in report.answers.values()]
    if not appended:
        return report
    span_s = (max(appended) - resumed_ms) / 1000.0
    return dataclasses.replace(
        report,
        latencies_ms=[max(0.0, ts - resumed_ms) for ts in appended],
        throughput_rps=len(appended) / span_s if span_s > 0 else float("nan"),
    )


def demo_records(run_id: str, heldout: Path) -> list[Outgoing]:
    """The demo's timed records: every held-out digit, with every poison kind interleaved (correlation IDs
    ``<run_id>-...``)."""
    return interleave(list(digits_requests(run_id, heldout)), poison_requests(run_id))


async def serve_records(
    bootstrap: str, topics: dict[str, str], records: Sequence[Outgoing], timeout_s: float, progress: bool = True
) -> Report:
    """Send ``records`` to the requests topic and wait up to ``timeout_s`` seconds until each one has a result or a
    dead letter (:func:`producer_tools.results.collect`).

    Raises:
        aiokafka.errors.KafkaError: a send failed.
    """
    await send_all(bootstrap, topics["requests"], records, progress=progress)
    expected = {r.correlation_id: r.manifest() for r in records}
    return await collect(bootstrap, topics["results"], topics["dlq"], expected, timeout_s, progress=progress)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the demo; returns the exit code."""
    p = argparse.ArgumentParser(prog="streaminfer-demo", description=__doc__.split("\n\n")[0])
    p.add_argument("--bootstrap-servers", default=os.environ.get("KAFKA_BOOTSTRAP_SERVERS", "127.0.0.1:9092"))
    p.add_argument("--model-path", type=Path, default=DEFAULT_MODEL)
    p.add_argument("--heldout", type=Path, default=DEFAULT_HELDOUT)
    p.add_argument(
        "--validation-record",
        type=Path,
        default=DEFAULT_RECORD,
        help="the model's validation record (make model writes it); served with it when the file exists",
    )
    p.add_argument("--partitions", type=int, default=4, help="partitions of the requests topic")
    p.add_argument("--timeout-s", type=float, default=120.0, help="wait for answers at most this long, s")
    p.add_argument("--log", type=Path, default=ROOT / ".demo" / "consumer.log", help="consumer log file")
    args = p.parse_args(argv)

    run_id = "demo-" + uuid.uuid4().hex[:8]
    topics = {"requests": "demo.requests", "results": "demo.results", "dlq": "demo.requests.dlq"}
    asyncio.run(
        ensure_topics(
            args.bootstrap_servers,
            {topics["requests"]: args.partitions, topics["results"]: args.partitions, topics["dlq"]: 1},
            configs={topics["results"]: APPEND_TIME, topics["dlq"]: APPEND_TIME},
        )
    )
    args.log.parent.mkdir(parents=True, exist_ok=True)
    args.log.write_bytes(b"")  # this run's log only
    consumer = ConsumerProcess(
        {
            "bootstrap_servers": args.bootstrap_servers,
            "model_path": args.model_path,
            "group_id": "streaminfer-demo",
            "requests_topic": topics["requests"],
            "results_topic": topics["results"],
            "dead_letter_topic": topics["dlq"],
        }
        | ({"validation_record": args.validation_record} if args.validation_record.is_file() else {}),
        args.log,
    )
    code = 1
    print(f"demo: consumer log: {args.log}", file=sys.stderr)
    try:
        consumer.start(timeout_s=90)
        asyncio.run(warm_up(args.bootstrap_servers, topics, args.heldout, args.timeout_s))
        records = demo_records(run_id, args.heldout)
        assert consumer.proc is not None
        consumer.proc.send_signal(signal.SIGSTOP)  # the burst goes on the topic while the consumer is paused
        try:
            asyncio.run(send_all(args.bootstrap_servers, topics["requests"], records))
        finally:
            resumed_ms = time.time() * 1000.0
            consumer.proc.send_signal(signal.SIGCONT)
        expected = {r.correlation_id: r.manifest() for r in records}
        report = asyncio.run(
            collect(args.bootstrap_servers, topics["results"], topics["dlq"], expected, args.timeout_s)
        )
        print_report(since_resume(report, resumed_ms), prefix="demo")
        code = 0 if not report.missing and not report.reason_mismatches else 1
    except RuntimeError as exc:
        print(f"demo: {exc}; consumer log: {args.log}", file=sys.stderr)
    finally:
        exit_code = consumer.terminate()[0] if consumer.proc is not None else None
        if exit_code != 0:
            print(f"demo: consumer exited with code {exit_code}; log: {args.log}", file=sys.stderr)
            code = 1
    return code


if __name__ == "__main__":
    sys.exit(main())
