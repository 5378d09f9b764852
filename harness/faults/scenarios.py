"""The single-broker scenarios of ``make faults`` (the package docstring describes each)."""

from __future__ import annotations

import asyncio
import os
import random
import sys
import threading
import time
import uuid

import numpy as np
from aiokafka import TopicPartition
from prometheus_client import CollectorRegistry

from consumer.answers.headers import CORRELATION_HEADER
from consumer.errors import DeadLetterReason
from consumer.oip.client import encode_request
from harness.bombs import bomb_producer, send_whole_batch_bomb
from harness.faults.harness import (
    HEARTBEAT_MS,
    MODEL,
    OUTAGE_LOG_LINES,
    READY_BOUND_S,
    SESSION_TIMEOUT_MS,
    Harness,
    Outcome,
    Plan,
    count_records,
    first_unready_s,
    log_lines,
)
from producer_tools.poison import catalogue
from producer_tools.produce import Headers, Outgoing
from producer_tools.topics import ensure_topics


# ------------------------------------------------------------------------------------------------ scenarios
async def scenario_kill9(h: Harness, plan: Plan, exactly_once: bool = False) -> Outcome:
    name = "exactly_once" if exactly_once else "kill9"
    topics = await h.new_topics(name)
    group = f"{name}-{uuid.uuid4().hex[:6]}"
    extra = ["--group-instance-id", "member-0"]
    if exactly_once:
        extra += ["--delivery", "exactly_once"]
    proc = h.consumer(topics, group, "m0", *extra)
    proc.start()
    records = h.digits(group, plan.records)
    sending = asyncio.create_task(h.produce(topics["requests"], records, plan.rate))
    duration = plan.records / plan.rate
    rng = random.Random(7)  # noqa: S311 (fault timing, not security)
    moments = sorted(rng.uniform(0.05, 0.95) * duration for _ in range(plan.kills))
    started = time.monotonic()
    for at in moments:
        await asyncio.sleep(max(0.0, started + at - time.monotonic()))
        proc.kill()
        await asyncio.to_thread(proc.start)
    await sending
    report = await h.answers(topics, records, timeout_s=120, read_committed=exactly_once)
    code, _ = proc.terminate()
    lost, dups = len(report.missing), report.duplicates
    ok = lost == 0 and (dups == 0 or not exactly_once) and code == 0
    note = f"{plan.kills} kills, exit {code}"
    return Outcome(name, len(records), lost, dups, report.dead_letters, ok, note, exactly_once=exactly_once)


async def scenario_rebalance(h: Harness, plan: Plan) -> Outcome:
    topics = await h.new_topics("rebalance", partitions=6)
    group = f"rebalance-{uuid.uuid4().hex[:6]}"
    members = [h.consumer(topics, group, f"m{i}") for i in range(3)]
    members[0].start()
    records = h.digits(group, plan.records)
    sending = asyncio.create_task(h.produce(topics["requests"], records, plan.rate))
    duration = plan.records / plan.rate
    await asyncio.sleep(duration * 0.25)
    await asyncio.gather(*(asyncio.to_thread(m.start) for m in members[1:]))  # 1 -> 3
    await asyncio.sleep(duration * 0.35)
    codes = await asyncio.gather(*(asyncio.to_thread(m.terminate) for m in members[1:]))  # 3 -> 1
    await sending
    report = await h.answers(topics, records, timeout_s=120)
    code, _ = members[0].terminate()
    lost = len(report.missing)
    exits = [c for c, _ in codes] + [code]
    return Outcome(
        "rebalance", len(records), lost, report.duplicates, report.dead_letters,
        lost == 0 and all(c == 0 for c in exits), f"1->3->1 members, exits {exits}",
    )  # fmt: skip


async def scenario_idle_takeover(h: Harness, plan: Plan) -> Outcome:
    """One partition, two members: the spare sits without partitions for ``idle_s``, then its peer is killed."""
    topics = await h.new_topics("idle", partitions=1)
    group = f"idle-{uuid.uuid4().hex[:6]}"
    owner, spare = h.consumer(topics, group, "owner"), h.consumer(topics, group, "spare")
    owner.start()
    spare.start()
    records = h.digits(group, min(plan.records, 2000))
    half = len(records) // 2
    await h.produce(topics["requests"], records[:half])
    await asyncio.sleep(plan.idle_s)
    owner.kill()  # no LeaveGroup: the spare takes over once the session times out
    await h.produce(topics["requests"], records[half:])
    report = await h.answers(topics, records, timeout_s=60)
    alive = spare.returncode is None
    code, _ = spare.terminate()
    lost = len(report.missing)
    note = f"spare idle {plan.idle_s:.0f} s, took over after SIGKILL of the owner"
    return Outcome(
        "idle_takeover", len(records), lost, report.duplicates, report.dead_letters,
        lost == 0 and alive and code == 0, note,
    )  # fmt: skip


async def scenario_outage(h: Harness, plan: Plan) -> Outcome:
    if h.broker is None:
        return Outcome("outage", 0, 0, 0, 0, True, "skipped: the broker is not ours to stop")
    topics = await h.new_topics("outage")
    group = f"outage-{uuid.uuid4().hex[:6]}"
    proc = h.consumer(topics, group, "m0", "--group-instance-id", "member-0")
    proc.start()
    records = h.digits(group, plan.records)
    half = len(records) // 2
    await h.produce(topics["requests"], records[:half], plan.rate * 2)
    before = log_lines(proc.log)
    await asyncio.to_thread(h.broker.pause)
    unready_after_s = await first_unready_s(proc, plan.outage_s)  # must be 503 within READY_BOUND_S of the cut
    await asyncio.to_thread(h.broker.resume)
    restarts = 0
    if proc.returncode is not None:  # it chose to exit: an orchestrator restarts it
        restarts += 1
        await asyncio.to_thread(proc.start)
    await h.produce(topics["requests"], records[half:], plan.rate * 2)
    deadline = time.monotonic() + 120
    report = await h.answers(topics, records, timeout_s=30)
    while report.missing and time.monotonic() < deadline:
        if proc.returncode is not None:
            restarts += 1
            await asyncio.to_thread(proc.start)
        report = await h.answers(topics, records, timeout_s=30)
    for _ in range(30):  # the link says "reachable again" within its check interval (5 s) of the first answer
        logged = proc.log.read_text(errors="replace").splitlines()[before:]  # the outage and the recovery
        if any("reachable again" in line for line in logged):
            break
        await asyncio.sleep(0.5)
    said = [sum(phrase in line for line in logged) for phrase in ("kafka: cluster unreachable", "reachable again")]
    ready_again = True
    if restarts == 0:
        try:
            await asyncio.to_thread(proc.wait_ready, 30.0)
        except RuntimeError:  # exited, or not ready within 30 s
            ready_again = False
    code, _ = proc.terminate()
    lost = len(report.missing)
    quiet = len(logged) <= OUTAGE_LOG_LINES and said[0] >= 1 and said[1] >= 1
    told = unready_after_s <= READY_BOUND_S and ready_again  # NaN (never unready) compares False
    note = (
        f"broker down {plan.outage_s:.0f} s, consumer restarts {restarts}, exit {code}; {len(logged)} log lines "
        f"meanwhile (at most {OUTAGE_LOG_LINES}), 'unreachable' {said[0]}x, 'reachable again' {said[1]}x; /readyz 503 "
        f"after {unready_after_s:.1f} s (at most {READY_BOUND_S:.0f}), 200 again: {ready_again}"
    )
    ok = lost == 0 and quiet and told
    return Outcome("outage", len(records), lost, report.duplicates, report.dead_letters, ok, note)


async def scenario_dlq_missing(h: Harness, plan: Plan) -> Outcome:
    topics = await h.new_topics("dlqmissing", partitions=1, dlq=False)
    group = f"dlqmissing-{uuid.uuid4().hex[:6]}"
    # Start-up refuses a missing topic unless told otherwise; told, it starts and meets the topic missing at run time.
    proc = h.consumer(topics, group, "m0", "--producer-request-timeout-ms", "2000", "--allow-auto-create-topics")
    proc.start()
    good = h.digits(group, 10)
    poison = Outgoing(f"{group}-poison", b"{not json", expected_reason=DeadLetterReason.INVALID_JSON.value)
    records = [*good[:5], poison, *good[5:]]
    await h.produce(topics["requests"], records)
    await asyncio.sleep(6)  # the dead letter cannot be written meanwhile
    tp = TopicPartition(topics["requests"], 0)
    before = (await h.committed(group, [tp]))[tp]
    held = before is None or before <= 5  # never past the poison record at offset 5
    await ensure_topics(h.bootstrap, {topics["dlq"]: 1})
    report = await h.answers(topics, records, timeout_s=60)
    await asyncio.sleep(2)
    after = (await h.committed(group, [tp]))[tp]
    code, _ = proc.terminate()
    dl_count = await count_records(h.bootstrap, topics["dlq"])
    lost = len(report.missing)
    ok = held and lost == 0 and dl_count == 1 and after == len(records) and code == 0
    note = f"committed before topic: {before}, after: {after}; dead letters written: {dl_count}"
    return Outcome("dlq_missing", len(records), lost, dl_count - 1, report.dead_letters, ok, note)


def fuzz_records(run: str, good: list[Outgoing]) -> tuple[list[Outgoing], dict[str, Headers]]:
    """Poison of every kind plus header and size fuzz, interleaved with ``good``; returns (records, headers)."""
    bad = [Outgoing(f"{run}-poison-{p.kind}", p.value, expected_reason=p.reason.value) for p in catalogue()]
    big = encode_request(None, {"input": np.zeros((1, 64), np.float32)}) + b" " * 200_000  # > --max-record-bytes
    bad.append(Outgoing(f"{run}-poison-huge", big, expected_reason=DeadLetterReason.TOO_LARGE.value))
    bad.append(Outgoing(f"{run}-poison-random-bytes", os.urandom(512), expected_reason="invalid_json"))
    headers: dict[str, Headers] = {}
    # Valid requests with odd headers must be answered, not dead-lettered.
    repeated, non_utf8, null = good[1], good[2], good[3]
    headers[repeated.correlation_id] = [
        (CORRELATION_HEADER, repeated.correlation_id.encode()),
        (CORRELATION_HEADER, b"second-id-ignored"),
        ("trace", b"a"),
        ("trace", b"b"),
    ]
    headers[non_utf8.correlation_id] = [(CORRELATION_HEADER, non_utf8.correlation_id.encode()), ("bin", b"\xff\xfe")]
    headers[null.correlation_id] = [(CORRELATION_HEADER, null.correlation_id.encode()), ("empty", None)]
    step = max(1, len(good) // (len(bad) + 1))
    records: list[Outgoing] = []
    it = iter(bad)
    for i, g in enumerate(good):
        if i % step == 0:
            nxt = next(it, None)
            if nxt is not None:
                records.append(nxt)
        records.append(g)
    records.extend(it)
    return records, headers


async def scenario_poison(h: Harness, plan: Plan) -> Outcome:
    topics = await h.new_topics("poison")
    group = f"poison-{uuid.uuid4().hex[:6]}"
    proc = h.consumer(topics, group, "m0", "--max-record-bytes", "65536")
    proc.start()
    good = h.digits(group, max(60, plan.records // 10))
    records, headers = fuzz_records(group, good)

    def hdrs(rec: Outgoing) -> Headers:
        return headers.get(rec.correlation_id, [(CORRELATION_HEADER, rec.correlation_id.encode())])

    await h.produce(topics["requests"], records, headers=hdrs)
    report = await h.answers(topics, records, timeout_s=60)
    alive = proc.returncode is None
    code, _ = proc.terminate()
    expected_bad = [r for r in records if r.expected_reason]
    missed = sum(
        1
        for r in expected_bad
        if r.correlation_id not in report.answers or report.answers[r.correlation_id].reason != r.expected_reason
    )
    missed += sum(
        1
        for r in records
        if not r.expected_reason
        and (r.correlation_id not in report.answers or report.answers[r.correlation_id].kind != "result")
    )
    kinds = len({r.correlation_id.split("-poison-")[1] for r in expected_bad})
    ok = missed == 0 and alive and code == 0
    note = f"{kinds} poison kinds, consumer alive throughout: {alive}"
    return Outcome(
        "poison", len(records), len(report.missing), report.duplicates, report.dead_letters, ok, note,
        poison_missed=missed,
    )  # fmt: skip


async def scenario_graceful(h: Harness, plan: Plan) -> Outcome:
    topics = await h.new_topics("graceful")
    group = f"graceful-{uuid.uuid4().hex[:6]}"
    proc = h.consumer(topics, group, "m0", "--shutdown-grace-s", "25")
    proc.start()
    records = h.digits(group, plan.records)
    await h.produce(topics["requests"], records)  # a backlog: SIGTERM lands under load
    await asyncio.sleep(0.5)
    code, took = await asyncio.to_thread(proc.terminate, 40)
    proc.start()
    report = await h.answers(topics, records, timeout_s=120)
    code2, _ = proc.terminate()
    lost = len(report.missing)
    ok = lost == 0 and code == 0 and took < 25 and code2 == 0
    note = f"SIGTERM under load: exit {code} in {took:.1f} s (grace 25 s)"
    return Outcome("graceful", len(records), lost, report.duplicates, report.dead_letters, ok, note)


async def scenario_slow_model(h: Harness, plan: Plan) -> Outcome:
    """In process: every inference run sleeps longer than the session timeout and max_poll_interval_ms."""
    from consumer.app import StreamInferApp
    from consumer.config import Settings
    from consumer.model.runner import OnnxRunner
    from consumer.model.session import SessionOptions
    from consumer.ops.metrics import Metrics

    topics = await h.new_topics("slowmodel")
    settings = Settings(
        bootstrap_servers=h.bootstrap,
        group_id=f"slow-{uuid.uuid4().hex[:6]}",
        requests_topic=topics["requests"],
        results_topic=topics["results"],
        dead_letter_topic=topics["dlq"],
        model_path=MODEL,
        execution_provider="cpu",
        http_port=0,
        session_timeout_ms=SESSION_TIMEOUT_MS,
        heartbeat_interval_ms=HEARTBEAT_MS,
        max_poll_interval_ms=3000,
        max_batch_size=16,
    )
    real = OnnxRunner.load(MODEL, SessionOptions(execution_provider="cpu"))
    slow_s = SESSION_TIMEOUT_MS / 1000 + 2

    class SlowSession:
        def run(self, names: list[str] | None, feed: dict[str, np.ndarray]) -> list[np.ndarray]:
            time.sleep(slow_s)
            return real.session.run(names, feed)

    metrics = Metrics(CollectorRegistry())
    app = StreamInferApp(settings, OnnxRunner(SlowSession(), real.signature, real.provider), metrics)
    await app.start()
    records = h.digits(settings.group_id, 32)
    try:
        await h.produce(topics["requests"], records)
        report = await h.answers(topics, records, timeout_s=120)
    finally:
        await app.stop()
    assignments = metrics.registry.get_sample_value("streaminfer_rebalances_total") or 0
    lost = len(report.missing)
    ok = lost == 0 and assignments == 1
    note = (
        f"each batch {slow_s:.0f} s > session timeout {SESSION_TIMEOUT_MS / 1000:.0f} s; assignments {assignments:.0f}"
    )
    return Outcome("slow_model", len(records), lost, report.duplicates, report.dead_letters, ok, note)


async def scenario_backlog(h: Harness, plan: Plan) -> Outcome:
    topics = await h.new_topics("backlog")
    group = f"backlog-{uuid.uuid4().hex[:6]}"
    n = plan.backlog
    chunk = 50_000
    for start in range(0, n, chunk):  # encode in chunks: the harness itself stays small
        await h.produce(topics["requests"], h.digits(f"{group}-{start}", min(chunk, n - start)))
    proc = h.consumer(topics, group, "m0", "--max-in-flight-rows", "4096")
    peak = [0]
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            peak[0] = max(peak[0], proc.rss_bytes())
            time.sleep(0.2)

    sampler = threading.Thread(target=sample, daemon=True)
    started = time.monotonic()
    proc.start()
    sampler.start()
    tps = [TopicPartition(topics["requests"], p) for p in range(4)]
    deadline = time.monotonic() + max(300, n / 500)
    done = False
    while time.monotonic() < deadline and not done:
        await asyncio.sleep(2)
        answered = await count_records(h.bootstrap, topics["results"]) + await count_records(h.bootstrap, topics["dlq"])
        done = answered >= n
    took = time.monotonic() - started
    await asyncio.sleep(1)
    committed = await h.committed(group, tps)
    stop.set()
    code, _ = proc.terminate()
    answered = await count_records(h.bootstrap, topics["results"])
    lost = max(0, n - answered)
    uncommitted = n - sum(v or 0 for v in committed.values())
    ok = lost == 0 and uncommitted == 0 and code == 0
    note = f"peak RSS {peak[0] / 2**20:.0f} MiB while draining {n} at {n / took:.0f} rec/s"
    print(f"backlog: records={n} peak_rss_mib={peak[0] / 2**20:.0f} drain_rps={n / took:.0f}", file=sys.stderr)
    return Outcome("backlog", n, lost, max(0, answered - n), 0, ok, note)


async def scenario_compression_bomb(h: Harness, plan: Plan) -> Outcome:
    tag = f"bomb-{uuid.uuid4().hex[:6]}"
    topics = {"requests": f"{tag}.requests", "results": f"{tag}.results", "dlq": f"{tag}.requests.dlq"}
    big = {"max.message.bytes": str(16 << 20)}  # the broker checks compressed bytes only
    await ensure_topics(h.bootstrap, dict.fromkeys(topics.values(), 1), configs={topics["requests"]: big})
    producer = bomb_producer(h.bootstrap, "zstd")
    await producer.start()
    bombs: list[Outgoing] = []
    try:
        first = await send_whole_batch_bomb(producer, topics["requests"], 0, "zstd", 100, 20 << 20)
        bombs.append(Outgoing(f"{topics['requests']}:0:{first + 99}", None, expected_reason="too_large"))
        value = b"\0" * (20 << 20)
        for _ in range(300 if plan.records >= 10_000 else 30):
            sent = await producer.send_and_wait(topics["requests"], value, partition=0)
            bombs.append(Outgoing(f"{topics['requests']}:0:{sent.offset}", None, expected_reason="too_large"))
    finally:
        await producer.stop()
    good = h.digits(tag, max(50, plan.records // 100))
    await h.produce(topics["requests"], good)
    proc = h.consumer(topics, tag, "m0")
    proc.data_limit_bytes = 1536 << 20
    proc.start()
    report = await h.answers(topics, bombs + good, timeout_s=180)
    peak = proc.rss_bytes()
    alive = proc.returncode is None
    code, _ = proc.terminate()
    missed = sum(
        1
        for b in bombs
        if b.correlation_id not in report.answers or report.answers[b.correlation_id].reason != "too_large"
    )
    lost = sum(
        1 for g in good if g.correlation_id not in report.answers or report.answers[g.correlation_id].kind != "result"
    )
    ok = missed == 0 and lost == 0 and alive and code == 0
    note = f"{len(bombs)} bombs, 1.5 GiB data limit, RSS {peak / 2**20:.0f} MiB after, consumer alive: {alive}"
    return Outcome(
        "compression_bomb",
        len(bombs) + len(good),
        lost,
        report.duplicates,
        report.dead_letters,
        ok,
        note,
        poison_missed=missed,
    )
