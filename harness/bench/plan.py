"""The benchmark's plan: every mode, on one broker, in one run (see :mod:`harness.bench`)."""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import platform
import re
import time
import uuid
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any, Literal

import numpy as np
from tqdm import tqdm

from consumer.oip.client import encode_request, encode_request_binary
from consumer.oip.wire import BINARY_HEADER
from harness.bench.data import (
    DIGITS_MODEL,
    corpus,
    digits_backlog,
    digits_rows,
    sorted_batches,
    text_backlog,
)
from harness.bench.events import EVENTS_MODEL, EVENTS_SCHEMA, model_name, schema_registry
from harness.bench.events import backlogs as event_backlogs
from harness.bench.events import check_files as check_event_files
from harness.bench.events import events as event_runs
from harness.bench.measure import (
    OtherWork,
    Run,
    Sampler,
    first_result_s,
    last_result_s,
    latency_pcts,
    listening_pids,
    mean_batch,
    new_topics,
    read_results,
    results_topic,
    scrape,
    start_streaminfer,
    start_worker,
    stop,
    throughput,
)
from harness.bench.slow import slow_candidate
from harness.bench.vision import backlog as vision_backlog
from harness.bench.vision import ceilings, model_paths, vision, vision_ratio
from producer_tools.produce import send_all
from producer_tools.topics import ensure_topics

#: (max_batch_size, max_batch_delay_ms) swept for digits; the consumer's defaults are (64, 5).
SWEEP = ((1, 5.0), (8, 5.0), (32, 5.0), (64, 5.0), (256, 5.0), (64, 1.0), (64, 20.0))
DEFAULT_SETTING = (64, 5.0)
LOADS = (0.25, 0.50, 0.75)
#: Each sweep setting's latency is measured at this share of the passthrough throughput (the same rate for all).
SWEEP_LOAD = 0.2
#: Bare ONNX Runtime repeats its batches for at least this long, s (a digits pass takes milliseconds).
BARE_MIN_S = 1.0
#: Padded tokens per batch (rows x longest) of one of the MiniLM ceiling's batchings.
CEILING_TOKENS = 1024
#: The last line's keys, in order (each median over rounds followed by its ``_spread``: :data:`SPREAD_SUFFIX`).
RATIOS = (
    "digits_vs_passthrough",
    "digits_vs_naive",
    "minilm_vs_bare_ort",
    "digits_eos_vs_alo",
    "vision_vs_ceiling",
    "events_vs_passthrough",
    "avro_events_vs_passthrough",
    "digits_cpu_vs_passthrough",
    "events_cpu_vs_passthrough",
    "avro_events_cpu_vs_passthrough",
    "digits_eos_cpu_vs_alo",
    "wide_digits_vs_passthrough",
    "wide_digits_cpu_vs_passthrough",
    "wide_digits_eos_cpu_vs_alo",
    "first_answer_alo_s",
    "first_answer_eos_s",
    "wide_first_answer_alo_s",
    "wide_first_answer_eos_s",
    "shadow_digits_vs_off",
    "shadow_digits_cpu_vs_off",
    "shadow_digits_shed_share",
    "shadow_slow_digits_vs_off",
    "shadow_slow_digits_cpu_vs_off",
    "shadow_slow_digits_shed_share",
)
#: The digits rounds' run with a shadow of the same model on every micro-batch (``shadow_model_path``:
#: :mod:`consumer.shadow`), beside the same run without (``streaminfer``); ``--skip-shadow`` leaves it out.
SHADOW_MODE = "streaminfer-shadow"
#: The same with a slow candidate (:func:`harness.bench.slow.slow_candidate`: digits' answers, a quarter of the
#: stream's rows/s on one core): what shedding leaves of its cost.
SHADOW_SLOW_MODE = "streaminfer-shadow-slow"
SHADOW_MODES = (SHADOW_MODE, SHADOW_SLOW_MODE)
#: The digits rounds on many partitions (``--wide-partitions``, default 128): the model column of their rows.
WIDE = "digits-wide"
WIDE_PARTITIONS = 128
#: A ratio that is a median over rounds is followed on the last line by ``<key>_spread=``: the largest minus the
#: smallest of its per-round ratios.
SPREAD_SUFFIX = "_spread"
#: The ratios measured over rounds of back-to-back runs: key -> (model, top mode, bottom mode) (the vision ratio's
#: bottom is the slower of its two ceilings: :func:`harness.bench.vision.ceilings`).
PAIRED = {
    "digits_vs_passthrough": ("digits", "streaminfer", "passthrough"),
    "digits_eos_vs_alo": ("digits", "streaminfer-eos", "streaminfer"),
    "minilm_vs_bare_ort": ("minilm", "streaminfer", "bare-ort"),
    "events_vs_passthrough": (model_name("json"), "streaminfer", "passthrough"),
    "avro_events_vs_passthrough": (model_name("avro"), "streaminfer", "passthrough"),
    "wide_digits_vs_passthrough": (WIDE, "streaminfer", "passthrough"),
    "shadow_digits_vs_off": ("digits", SHADOW_MODE, "streaminfer"),
    "shadow_slow_digits_vs_off": ("digits", SHADOW_SLOW_MODE, "streaminfer"),
}
#: The CPU ratios measured over the same rounds: key -> (model, top mode, bottom mode); each round's ratio is the
#: bottom's CPU time per record over the top's (:attr:`harness.bench.measure.Run.cpu_us_per_record`: each process's
#: own CPU seconds over the window of its results), so 1 means streaminfer costs what the ceiling costs and 0.5
#: twice as much.
PAIRED_CPU = {
    "digits_cpu_vs_passthrough": ("digits", "streaminfer", "passthrough"),
    "events_cpu_vs_passthrough": (model_name("json"), "streaminfer", "passthrough"),
    "avro_events_cpu_vs_passthrough": (model_name("avro"), "streaminfer", "passthrough"),
    "digits_eos_cpu_vs_alo": ("digits", "streaminfer-eos", "streaminfer"),
    "wide_digits_cpu_vs_passthrough": (WIDE, "streaminfer", "passthrough"),
    "wide_digits_eos_cpu_vs_alo": (WIDE, "streaminfer-eos", "streaminfer"),
    "shadow_digits_cpu_vs_off": ("digits", SHADOW_MODE, "streaminfer"),
    "shadow_slow_digits_cpu_vs_off": ("digits", SHADOW_SLOW_MODE, "streaminfer"),
}
#: The share of rows the shadow shed (``streaminfer_shadow_shed_rows_total`` over shed and scored rows, from the
#: run's ``/metrics``: ``extra["shadow_shed_share"]``), median over the rounds: key -> (model, mode).
SHED_SHARE = {
    "shadow_digits_shed_share": ("digits", SHADOW_MODE),
    "shadow_slow_digits_shed_share": ("digits", SHADOW_SLOW_MODE),
}
#: The time from the assignment to the first answer (``extra["first_answer_s"]``), median over the rounds: key ->
#: (model, mode).
FIRST_ANSWER = {
    "first_answer_alo_s": ("digits", "streaminfer"),
    "first_answer_eos_s": ("digits", "streaminfer-eos"),
    "wide_first_answer_alo_s": (WIDE, "streaminfer"),
    "wide_first_answer_eos_s": (WIDE, "streaminfer-eos"),
}
#: Each ratio measured over rounds -> its name on the ``rounds`` lines and in ``bench.json``'s ``rounds``.
ROUND_LABELS = {
    "digits_vs_passthrough": "streaminfer/passthrough",
    "digits_eos_vs_alo": "streaminfer-eos/streaminfer",
    "minilm_vs_bare_ort": "minilm streaminfer/bare-ort",
    "vision_vs_ceiling": "vision streaminfer/ceiling",
    "events_vs_passthrough": "events-json streaminfer/passthrough",
    "avro_events_vs_passthrough": "events-avro streaminfer/passthrough",
    "wide_digits_vs_passthrough": "wide streaminfer/passthrough",
    "digits_cpu_vs_passthrough": "CPU/record passthrough/streaminfer",
    "digits_eos_cpu_vs_alo": "CPU/record streaminfer/streaminfer-eos",
    "events_cpu_vs_passthrough": "CPU/record events-json passthrough/streaminfer",
    "avro_events_cpu_vs_passthrough": "CPU/record events-avro passthrough/streaminfer",
    "wide_digits_cpu_vs_passthrough": "CPU/record wide passthrough/streaminfer",
    "wide_digits_eos_cpu_vs_alo": "CPU/record wide streaminfer/streaminfer-eos",
    "first_answer_alo_s": "first answer after assignment, s, streaminfer",
    "first_answer_eos_s": "first answer after assignment, s, streaminfer-eos",
    "wide_first_answer_alo_s": "first answer after assignment, s, wide streaminfer",
    "wide_first_answer_eos_s": "first answer after assignment, s, wide streaminfer-eos",
    "shadow_digits_vs_off": "streaminfer-shadow/streaminfer",
    "shadow_digits_cpu_vs_off": "CPU/record streaminfer/streaminfer-shadow",
    "shadow_digits_shed_share": "shadow shed share of rows, streaminfer-shadow",
    "shadow_slow_digits_vs_off": "streaminfer-shadow-slow/streaminfer",
    "shadow_slow_digits_cpu_vs_off": "CPU/record streaminfer/streaminfer-shadow-slow",
    "shadow_slow_digits_shed_share": "shadow shed share of rows, streaminfer-shadow-slow",
}
#: Untimed passes of the client-only passthrough over a backlog before anything is measured (``--warmup``): a fresh
#: broker's JVM compiles its fetch and produce paths during the first passes (its JIT compiler threads took
#: 0.7-0.9 CPU s in the first 50,000-record pass here, 0.2-0.4 s from the fourth on), which on two cores slowed the
#: first measured passthrough by a third.
WARMUP_PASSES = 3
#: The setting column of the baseline workers.
WORKER_SETTINGS = {
    "passthrough": "client only",
    "passthrough-events": "client only",
    "decode-encode": "codec, no model",
    "naive": "batch 1",
    "naive-vision": "PIL, batch 1",
}


class Bench:
    """Runs every mode and keeps the :class:`Run` rows."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.bootstrap: str = args.bootstrap_servers
        self.out: Path = args.out
        self.runs: list[Run] = []
        self.tag = uuid.uuid4().hex[:6]
        self.bar: tqdm[Any] | None = None
        self._dlq: str | None = None
        self.warmup: list[float] = []
        self._broker_pids: list[int] | None = None

    def step(self, what: str) -> None:
        if self.bar is not None:
            self.bar.set_description(what)
            self.bar.update(1)

    def log(self, name: str) -> Path:
        return self.out / "logs" / (re.sub(r"[^A-Za-z0-9._-]", "-", name) + ".log")

    async def dead_letter_topic(self) -> str:
        """The closed-loop runs' dead-letter topic, created on first use (the broker creates no topic itself)."""
        if self._dlq is None:
            self._dlq = f"bench-{self.tag}.dlq"
            await ensure_topics(self.bootstrap, {self._dlq: 1})
        return self._dlq

    # -- closed loop
    async def closed_streaminfer(
        self,
        model_name: str,
        model: Path,
        topics_backlog: str,
        n: int,
        setting: str,
        mode: str = "streaminfer",
        **settings: Any,
    ) -> Run:
        eos = settings.get("delivery") == "exactly_once"
        topics = {
            "requests": topics_backlog,
            "results": await results_topic(self.bootstrap, f"{self.tag}-{model_name}-{setting}-{uuid.uuid4().hex[:4]}"),
            "dlq": await self.dead_letter_topic(),
        }
        log = self.log(f"{model_name}-{mode}-{setting}")
        child = start_streaminfer(self.bootstrap, topics, model, log, **settings)
        sampler = Sampler(child.proc.pid).start()
        others = self.other_work(child.proc.pid)
        try:
            stamps = await read_results(
                self.bootstrap,
                topics["results"],
                n,
                timeout_s=self.args.timeout_s,
                isolation_level="read_committed" if eos else "read_uncommitted",
            )
            other_cpu = others.stop()
            assert child.port is not None
            scraped = scrape(child.port)
        finally:
            sampler.stop()
            stop(child)
        run = Run(
            model_name,
            mode,
            setting,
            len(stamps),
            throughput(stamps),
            cpu_pct=sampler.cpu_pct(last_result_s(stamps)),
            peak_rss_mib=sampler.peak_rss_mib,
            cpu_us_per_record=child.cpu.cpu_us_per_record(stamps) if child.cpu is not None else math.nan,
            batch_rows=scraped.batch_rows,
        )
        first = first_result_s(stamps)
        # The assignment arrived assign_s before the group counted as joined (the end of the assignment handler),
        # which /readyz reports; the bench sees that within its 10 ms poll (ready_s), so this may read 10 ms low.
        assigned_s = child.ready_s - scraped.assign_s
        run.extra["first_answer_s"] = max(0.0, first - assigned_s) if first is not None else math.nan
        run.extra["mean_batch_rows"] = mean_batch(scraped.batch_rows)
        run.extra["mean_padding_ratio"] = scraped.padding_ratio
        run.extra["stage_us"] = scraped.stage_us_per_record()
        run.extra["other_cpu_pct"] = other_cpu
        if settings.get("shadow_model_path") is not None:
            offered = scraped.shadow_rows + scraped.shadow_shed_rows
            run.extra["shadow_rows"] = scraped.shadow_rows
            run.extra["shadow_shed_share"] = scraped.shadow_shed_rows / offered if offered else math.nan
        return run

    async def closed_worker(
        self,
        mode: str,
        model: Path,
        backlog: str,
        n: int,
        seconds: float,
        model_name: str = "digits",
        extra: tuple[str, ...] = (),
    ) -> Run:
        topics = {
            "requests": backlog,
            "results": await results_topic(self.bootstrap, f"{self.tag}-{mode}-{uuid.uuid4().hex[:4]}"),
        }
        child = start_worker(mode, self.bootstrap, topics, model, self.log(f"{model_name}-{mode}"), seconds, extra)
        sampler = Sampler(child.proc.pid).start()
        others = self.other_work(child.proc.pid)
        try:
            stamps = await read_results(
                self.bootstrap, topics["results"], n, seconds + 30, done=lambda: child.proc.poll() is not None
            )
            other_cpu = others.stop()
        finally:
            sampler.stop()
            stop(child)
        run = Run(
            model_name,
            mode,
            WORKER_SETTINGS[mode],
            len(stamps),
            throughput(stamps),
            cpu_pct=sampler.cpu_pct(last_result_s(stamps)),
            peak_rss_mib=sampler.peak_rss_mib,
            cpu_us_per_record=child.cpu.cpu_us_per_record(stamps) if child.cpu is not None else math.nan,
        )
        run.extra["other_cpu_pct"] = other_cpu
        return run

    def other_work(self, pid: int) -> OtherWork:
        """The CPU of the rest of the machine from now on, but for ``pid`` (a mode's process), the broker (when it
        runs here) and this bench."""
        if self._broker_pids is None:
            self._broker_pids = listening_pids(self.bootstrap)
        return OtherWork([pid, os.getpid(), *self._broker_pids]).start()

    # -- open loop
    async def open_loop(
        self,
        model: Path,
        rate: float,
        seconds: float,
        setting: str,
        lone: bool = False,
        client_only: bool = False,
        **settings: Any,
    ) -> Run:
        """``seconds`` of requests at ``rate`` records/s (``lone``: each sent alone, unbatched) through streaminfer,
        or through the client-only passthrough worker (``client_only``: the Kafka round trip's own latency)."""
        topics = await new_topics(self.bootstrap, f"{self.tag}-open-{uuid.uuid4().hex[:4]}")
        log = self.log(f"open-{setting}")
        if client_only:
            child = start_worker("passthrough", self.bootstrap, topics, model, log, seconds + self.args.timeout_s)
        else:
            child = start_streaminfer(self.bootstrap, topics, model, log, **settings)
        n = int(rate * seconds)
        records = digits_backlog(f"open-{uuid.uuid4().hex[:4]}", n)
        sampler = Sampler(child.proc.pid).start()
        try:
            if lone:
                for rec in records:  # one at a time, the producer without linger: each waits for nothing else
                    await send_all(self.bootstrap, topics["requests"], [rec], progress=False, linger_ms=0)
                    await asyncio.sleep(1.0 / rate)
            else:
                await send_all(self.bootstrap, topics["requests"], records, rate=rate, progress=False)
            stamps = await read_results(self.bootstrap, topics["results"], n, timeout_s=self.args.timeout_s)
        finally:
            sampler.stop()
            stop(child)
        p50, p95, p99 = latency_pcts(stamps)
        return Run(
            "digits",
            "lone" if lone else "open-loop",
            setting,
            len(stamps),
            rate,
            p50,
            p95,
            p99,
            sampler.cpu_pct(last_result_s(stamps)),
            sampler.peak_rss_mib,
        )

    # -- bare ONNX Runtime
    def bare_ort(
        self,
        model_name: str,
        model: Path,
        batches: Sequence[dict[str, np.ndarray]],
        setting: str,
        level: Literal["disable", "basic", "extended", "all"] = "all",
        threads: int = 0,
    ) -> Run:
        import psutil

        from consumer.model.runner import OnnxRunner
        from consumer.model.session import SessionOptions

        runner = OnnxRunner.load(
            model, SessionOptions(execution_provider="cpu", graph_optimization_level=level, intra_op_threads=threads)
        )
        session = runner.session  # bare: session.run alone, none of the runner's checks
        for feeds in batches[:3]:
            session.run(None, feeds)
        proc = psutil.Process()
        cpu0 = sum(proc.cpu_times()[:2])
        started = time.perf_counter()
        rows = runs = 0
        while runs < len(batches) or time.perf_counter() - started < BARE_MIN_S:  # whole passes, >= 1 s
            for feeds in batches:
                session.run(None, feeds)
                rows += next(iter(feeds.values())).shape[0]
            runs += len(batches)
        wall = time.perf_counter() - started
        cpu = 100.0 * (sum(proc.cpu_times()[:2]) - cpu0) / wall
        return Run(
            model_name,
            "bare-ort",
            setting,
            rows,
            rows / wall,
            cpu_pct=cpu,
            peak_rss_mib=proc.memory_info().rss / 2**20,
            extra={"batch_ms": 1000 * wall / runs},
        )

    # -- decode cost, JSON against the binary data extension
    def decode_costs(self) -> None:
        """Records/s of the consumer's decoder alone (``decode_chunk`` over chunks of 200 records) for digits
        requests of 1 and 64 rows, JSON and binary."""
        from consumer.model.runner import OnnxRunner
        from consumer.model.session import SessionOptions
        from consumer.oip.chunk import decode_chunk
        from consumer.work import Limits

        signature = OnnxRunner.load(DIGITS_MODEL, SessionOptions(execution_provider="cpu")).signature
        x = digits_rows()
        for rows in (1, 64):
            for binary in (False, True):
                outgoing = []
                for i in range(200):
                    start = (i * rows) % (len(x) - rows)
                    if binary:
                        value, n = encode_request_binary(None, {"input": x[start : start + rows]}, binary_output=False)
                        outgoing.append((value, [(BINARY_HEADER, str(n).encode())]))
                    else:
                        outgoing.append((encode_request(None, {"input": x[start : start + rows]}), []))
                values = [value for value, _ in outgoing]
                headers = [h for _, h in outgoing]
                count = 0
                started = time.perf_counter()
                while time.perf_counter() - started < 0.5:
                    decode_chunk(values, headers, signature, Limits())
                    count += len(outgoing)
                rps = count / (time.perf_counter() - started)
                run = Run("digits", "decode", f"{rows} rows {'binary' if binary else 'JSON'}", count, rps)
                run.extra["bytes"] = len(outgoing[0][0])
                self.runs.append(run)

    # -- the plan
    async def wide_backlog(self) -> str | None:
        """The topic of the wide rounds' backlog: ``--round-records`` digits requests on ``--wide-partitions``
        partitions (None when 0: no wide rounds)."""
        a = self.args
        if not a.wide_partitions:
            return None
        topic = (await new_topics(self.bootstrap, f"{self.tag}-digits-wide", a.wide_partitions))["requests"]
        await send_all(self.bootstrap, topic, digits_backlog("w", a.round_records), progress=False)
        return topic

    async def digits_backlogs(self) -> tuple[str, str, str]:
        """Topics holding the digits backlogs: JSON and binary extension (``--records`` each), and the rounds' JSON
        (``--round-records``; the first one when the sizes agree)."""
        a = self.args
        backlog = (await new_topics(self.bootstrap, f"{self.tag}-digits"))["requests"]
        await send_all(self.bootstrap, backlog, digits_backlog("d", a.records), progress=False)
        binary_backlog = (await new_topics(self.bootstrap, f"{self.tag}-digits-bin"))["requests"]
        await send_all(self.bootstrap, binary_backlog, digits_backlog("b", a.records, binary=True), progress=False)
        rounds_backlog = backlog
        if a.round_records != a.records:
            rounds_backlog = (await new_topics(self.bootstrap, f"{self.tag}-digits-rounds"))["requests"]
            await send_all(self.bootstrap, rounds_backlog, digits_backlog("r", a.round_records), progress=False)
        self.step("digits: backlog")
        return backlog, binary_backlog, rounds_backlog

    async def warm_up(self, backlog: str, n: int, events: bool = False) -> None:
        """:data:`WARMUP_PASSES` (``--warmup``) untimed passes of the client-only passthrough over ``backlog``
        (``events``: the JSON events' worker), before anything is measured: the broker's JIT compiles its fetch,
        produce and commit paths, the backlog is read into the page cache once, the group coordinator answers.
        Their throughput is kept (``warmup``) and printed, not used."""
        for _ in range(self.args.warmup):
            if events:
                extra = ("--format", "json", "--schema", str(EVENTS_SCHEMA))
                run = await self.closed_worker(
                    "passthrough-events", EVENTS_MODEL, backlog, n, self.args.passthrough_s, "warm-up", extra
                )
            else:
                run = await self.closed_worker("passthrough", DIGITS_MODEL, backlog, n, self.args.passthrough_s)
            self.warmup.append(run.throughput_rps)
        self.step("warm-up")

    async def digits(self, backlog: str, binary_backlog: str, rounds_backlog: str, wide: str | None = None) -> None:
        a = self.args
        n = a.records

        x = digits_rows()
        rows = np.resize(x, (n, 64))
        size = DEFAULT_SETTING[0]
        self.runs.append(
            self.bare_ort("digits", DIGITS_MODEL, [{"input": rows[i : i + size]} for i in range(0, n, size)], "b64")
        )
        lone_compute_ms = self.bare_ort("digits", DIGITS_MODEL, [{"input": rows[i : i + 1]} for i in range(500)], "b1")
        self.runs.append(lone_compute_ms)
        self.decode_costs()
        self.step("digits: bare ORT")
        self.runs.append(await self.closed_worker("passthrough", DIGITS_MODEL, backlog, n, a.passthrough_s))
        self.step("digits: passthrough")
        self.runs.append(await self.closed_worker("decode-encode", DIGITS_MODEL, backlog, n, a.passthrough_s))
        self.step("digits: decode-encode")
        self.runs.append(await self.closed_worker("naive", DIGITS_MODEL, backlog, n, a.naive_s))
        self.step("digits: naive")
        passthrough = self.find("digits", "passthrough")
        assert passthrough is not None
        fixed_rate = SWEEP_LOAD * passthrough.throughput_rps
        for b, d in self.sweep:
            setting = f"b{b}/d{d:g}ms"
            run = await self.closed_streaminfer(
                "digits", DIGITS_MODEL, backlog, n, setting, max_batch_size=b, max_batch_delay_ms=d
            )
            run.extra["default"] = (b, d) == DEFAULT_SETTING
            # Latency of this setting at one offered load for all settings (a share of the I/O ceiling).
            timed = await self.open_loop(
                DIGITS_MODEL, fixed_rate, a.open_s, setting, max_batch_size=b, max_batch_delay_ms=d
            )
            run.p50_ms, run.p95_ms, run.p99_ms = timed.p50_ms, timed.p95_ms, timed.p99_ms
            run.extra["latency_at_rps"] = fixed_rate
            self.runs.append(run)
            self.step(f"digits: streaminfer {setting}")
        binary = await self.closed_streaminfer("digits", DIGITS_MODEL, binary_backlog, n, "b64/d5ms")
        binary.mode = "streaminfer-binary"
        self.runs.append(binary)
        self.step("digits: streaminfer binary")
        eos = await self.closed_streaminfer(
            "digits",
            DIGITS_MODEL,
            backlog,
            n,
            "b64/d5ms",
            mode="streaminfer-eos",
            delivery="exactly_once",
            transactional_id_prefix=f"bench-{self.tag}",
        )
        self.runs.append(eos)
        self.step("digits: streaminfer exactly_once")
        await self.repeats(rounds_backlog, a.round_records)
        if wide is not None:
            await self.repeats(wide, a.round_records, WIDE, a.wide_rounds)
        best = self.streaminfer_default("digits").throughput_rps
        for load in LOADS:
            run = await self.open_loop(DIGITS_MODEL, best * load, a.open_s, f"{int(load * 100)}% of max")
            self.runs.append(run)
            self.step(f"digits: open loop {int(load * 100)}%")
        lone = await self.open_loop(DIGITS_MODEL, 10.0, a.lone_s, "1 at a time", lone=True)
        lone.extra["target_ms"] = DEFAULT_SETTING[1] + lone_compute_ms.extra["batch_ms"] + 5.0
        self.runs.append(lone)
        # The floor under it: the same lone records through the Kafka client alone (no batch delay, no model).
        self.runs.append(await self.open_loop(DIGITS_MODEL, 10.0, a.lone_s, "client only", lone=True, client_only=True))
        self.step("digits: lone record")

    async def repeats(
        self,
        backlog: str,
        n: int,
        model_name: str = "digits",
        rounds: int | None = None,
        modes: Sequence[str] | None = None,
    ) -> None:
        """The rounds of the ratios' three runs (passthrough, streaminfer and streaminfer-eos at default settings),
        each back to back and in a rotated order, after the sweep (so the broker is warm for every round alike),
        so a ratio compares runs made under the same machine conditions (a shared VM's speed drifts over minutes);
        the ratios are the medians over the rounds, their spread the largest minus the smallest. ``model_name``
        labels the rows (:data:`WIDE`: the many-partition backlog), ``rounds`` defaults to ``--rounds``; ``modes``
        to those three, and on digits :data:`SHADOW_MODES` too (a shadow of the same model, and a slow one) unless
        ``--skip-shadow``."""
        b, d = DEFAULT_SETTING
        if modes is None:
            modes = ["passthrough", "streaminfer", "streaminfer-eos"]
            if model_name == "digits" and not self.args.skip_shadow:
                modes.extend(SHADOW_MODES)
        for i in range(self.args.rounds if rounds is None else rounds):
            order = list(modes)
            order = order[i % len(order) :] + order[: i % len(order)]
            for mode in order:
                if mode == "passthrough":
                    run = await self.closed_worker(
                        mode, DIGITS_MODEL, backlog, n, self.args.passthrough_s, model_name=model_name
                    )
                else:
                    prefix = f"bench-{self.tag}-{model_name}-{i}"
                    extra: dict[str, Any] = {}
                    if mode == "streaminfer-eos":
                        extra = {"delivery": "exactly_once", "transactional_id_prefix": prefix}
                    elif mode == SHADOW_MODE:
                        extra = {"shadow_model_path": DIGITS_MODEL}  # the candidate is the same model
                    elif mode == SHADOW_SLOW_MODE:
                        extra = {"shadow_model_path": self.slow_model()}
                    run = await self.closed_streaminfer(
                        model_name, DIGITS_MODEL, backlog, n, f"b{b}/d{d:g}ms", mode, **extra
                    )
                run.setting = f"{run.setting}, round {i + 1}"
                run.extra["round"] = i + 1
                self.runs.append(run)
            self.step(f"{model_name}: round {i + 1}")

    def rounds(self, model: str, mode: str) -> dict[int, Run]:
        """Round number -> the default-setting run of ``mode`` on ``model`` in that round. Runs made in dedicated
        rounds carry their number (digits and events: every round); MiniLM's round 1 is its first run (bare-ort:
        the fastest of its batchings, the ceiling)."""
        tagged = {
            int(r.extra["round"]): r for r in self.runs if r.model == model and r.mode == mode and r.extra.get("round")
        }
        if 1 in tagged:
            return tagged
        if mode == "streaminfer":
            first = self.default_run(model)
        elif mode == "bare-ort":
            first = self.ceiling(model)
        else:
            first = self.find(model, mode)
        return tagged | ({1: first} if first is not None else {})

    def round_ratios(self, top: str, bottom: str, model: str = "digits") -> list[float]:
        """``top``'s throughput / ``bottom``'s on ``model``, round by round (complete rounds only)."""
        tops, bottoms = self.rounds(model, top), self.rounds(model, bottom)
        pairs = [(tops[i], bottoms[i]) for i in sorted(tops) if i in bottoms]
        return [a.throughput_rps / b.throughput_rps for a, b in pairs if b.throughput_rps > 0]

    def round_cpu_ratios(self, top: str, bottom: str, model: str = "digits") -> list[float]:
        """``bottom``'s CPU time per record / ``top``'s on ``model``, round by round (complete rounds only)."""
        tops, bottoms = self.rounds(model, top), self.rounds(model, bottom)
        pairs = [(tops[i].cpu_us_per_record, bottoms[i].cpu_us_per_record) for i in sorted(tops) if i in bottoms]
        return [b / a for a, b in pairs if a > 0 and math.isfinite(a) and math.isfinite(b)]

    def round_first_answers(self, model: str, mode: str) -> list[float]:
        """``mode``'s time from the assignment to its first answer on ``model``, s, round by round."""
        runs = self.rounds(model, mode)
        values = [runs[i].extra.get("first_answer_s", math.nan) for i in sorted(runs) if runs[i].extra.get("round")]
        return [v for v in values if math.isfinite(v)]

    def round_extra(self, model: str, mode: str, name: str) -> list[float]:
        """``mode``'s ``extra[name]`` on ``model``, round by round (finite values only)."""
        runs = self.rounds(model, mode)
        values = [runs[i].extra.get(name, math.nan) for i in sorted(runs) if runs[i].extra.get("round")]
        return [v for v in values if math.isfinite(v)]

    def paired(self, top: str, bottom: str, model: str = "digits") -> float:
        """Median of :meth:`round_ratios` (nan without a complete round)."""
        ratios = self.round_ratios(top, bottom, model)
        return float(np.median(ratios)) if ratios else math.nan

    def per_round(self) -> dict[str, list[float]]:
        """Each ratio measured over rounds (:data:`PAIRED` and ``vision_vs_ceiling``) -> its per-round ratios."""
        out = {key: self.round_ratios(top, bottom, model) for key, (model, top, bottom) in PAIRED.items()}
        out |= {key: self.round_cpu_ratios(top, bottom, model) for key, (model, top, bottom) in PAIRED_CPU.items()}
        out |= {key: self.round_first_answers(model, mode) for key, (model, mode) in FIRST_ANSWER.items()}
        out |= {key: self.round_extra(model, mode, "shadow_shed_share") for key, (model, mode) in SHED_SHARE.items()}
        out["vision_vs_ceiling"] = [
            s.throughput_rps / min(d.throughput_rps, b.throughput_rps) for d, b, s in ceilings(self.runs)
        ]
        return out

    def other_cpu(self) -> dict[str, float]:
        """Each ratio measured over rounds (:data:`PAIRED`) -> the mean CPU the rest of the machine used during its
        runs, % of one core (NaN without one): how busy the machine was with other work."""
        out = {}
        for key, (model, top, bottom) in (PAIRED | PAIRED_CPU).items():
            runs = [*self.rounds(model, top).values(), *self.rounds(model, bottom).values()]
            values = [r.extra["other_cpu_pct"] for r in runs if math.isfinite(r.extra.get("other_cpu_pct", math.nan))]
            out[key] = float(np.mean(values)) if values else math.nan
        return out

    def spreads(self) -> dict[str, float]:
        """Each ratio measured over rounds -> the largest minus the smallest of its per-round ratios (nan without
        a round)."""
        return {key: max(values) - min(values) if values else math.nan for key, values in self.per_round().items()}

    def ceiling(self, model: str) -> Run | None:
        """The fastest round-1 bare ORT batching of ``model``, if any ran."""
        bare = [r for r in self.runs if r.model == model and r.mode == "bare-ort" and not r.extra.get("round")]
        return max(bare, key=lambda r: r.throughput_rps) if bare else None

    async def minilm_backlog(self) -> dict[str, str]:
        """Topics holding the MiniLM backlog. Written before the digits runs: a consumer started within seconds of
        a large produce runs slower (about 20 % on MiniLM here, while the broker's fresh log is written back), so
        the backlog must have settled before it is read."""
        model = self.args.minilm_dir / "minilm.onnx"
        if not model.is_file() or not (self.args.minilm_dir / "tokenizer.json").is_file():
            raise SystemExit(
                f"streaminfer-bench: no MiniLM in {self.args.minilm_dir}; run python models/minilm/build.py"
            )
        topics = await new_topics(self.bootstrap, f"{self.tag}-minilm")
        await send_all(self.bootstrap, topics["requests"], text_backlog("m", corpus(self.args.texts)), progress=False)
        return topics

    async def minilm(self, topics: dict[str, str]) -> None:
        from consumer.model.runner import OnnxRunner
        from consumer.model.session import SessionOptions

        a = self.args
        model = a.minilm_dir / "minilm.onnx"
        tokenizer = a.minilm_dir / "tokenizer.json"
        texts = corpus(a.texts)
        size = a.minilm_batch
        runner = OnnxRunner.load(model, SessionOptions(execution_provider="cpu"))
        batches, mean_tokens = sorted_batches(runner, tokenizer, texts, size)
        # On CPU smaller batches of padded text can be faster than full ones: the ceiling is the best of a few.
        candidates = [(f"b{size} sorted", batches)]
        for rows, tokens in ((max(1, size // 2), None), (size, CEILING_TOKENS)):
            other, _ = sorted_batches(runner, tokenizer, texts, rows, tokens)
            candidates.append((f"b{rows} sorted" + (f" <={tokens} tok" if tokens else ""), other))
        for label, candidate in candidates:
            bare = self.bare_ort("minilm", model, candidate, label)
            if candidate is batches:
                bare.extra["mean_tokens"] = mean_tokens
            self.runs.append(bare)
        # The session options streaminfer exposes, on a share of the same batches (does a non-default win?).
        share = batches[: max(2, len(batches) // 4)]
        options: tuple[tuple[Literal["basic", "extended", "all"], int], ...] = (
            ("all", 0),
            ("basic", 0),
            ("extended", 0),
            ("all", 1),
        )
        for level, threads in options:
            run = self.bare_ort("minilm", model, share, f"{level}/threads {threads or 'auto'}", level, threads)
            run.mode = "bare-ort-options"
            self.runs.append(run)
        self.step("minilm: bare ORT")
        settings = {"tokenizer_path": tokenizer, "max_batch_size": size}
        run = await self.closed_streaminfer(
            "minilm", model, topics["requests"], len(texts), f"b{size}/d5ms text", **settings
        )
        run.extra["default"] = True
        self.runs.append(run)
        self.step("minilm: streaminfer")
        # Rounds 2..: the round-1 ceiling's batching and streaminfer again, back to back in a rotated order.
        best = self.ceiling("minilm")
        assert best is not None
        chosen = dict(candidates)[best.setting]
        for i in range(1, a.rounds):
            for mode in ("bare-ort", "streaminfer")[:: 1 if i % 2 else -1]:
                if mode == "bare-ort":
                    again = self.bare_ort("minilm", model, chosen, best.setting)
                else:
                    again = await self.closed_streaminfer(
                        "minilm", model, topics["requests"], len(texts), f"b{size}/d5ms text", **settings
                    )
                again.setting = f"{again.setting}, round {i + 1}"
                again.extra["round"] = i + 1
                self.runs.append(again)
            self.step(f"minilm: round {i + 1}")

    @property
    def sweep(self) -> tuple[tuple[int, float], ...]:
        return SWEEP if not self.args.quick else ((8, 5.0), DEFAULT_SETTING)

    def default_run(self, model: str) -> Run | None:
        """``model``'s streaminfer run at default settings (round 1), if it ran."""
        return next(
            (r for r in self.runs if r.model == model and r.mode == "streaminfer" and r.extra.get("default")), None
        )

    def streaminfer_default(self, model: str) -> Run:
        run = self.default_run(model)
        assert run is not None, f"no default streaminfer run of {model}"
        return run

    def find(self, model: str, mode: str) -> Run | None:
        return next((r for r in self.runs if r.model == model and r.mode == mode and not r.extra.get("round")), None)

    def ratios(self) -> dict[str, float]:
        out = dict.fromkeys(RATIOS, math.nan)
        naive = self.find("digits", "naive")
        if naive is not None:
            out["digits_vs_naive"] = self.streaminfer_default("digits").throughput_rps / naive.throughput_rps
        for key, values in self.per_round().items():
            if key != "vision_vs_ceiling":
                out[key] = float(np.median(values)) if values else math.nan
        out["vision_vs_ceiling"] = vision_ratio(self.runs)
        return out

    async def shadow_only(self) -> None:
        """``--only-shadow``: the digits rounds of streaminfer without and with a shadow (of the same model, and
        the slow one), on a
        backlog of ``--round-records``, after the warm-up; nothing else."""
        a = self.args
        backlog = (await new_topics(self.bootstrap, f"{self.tag}-digits-rounds"))["requests"]
        await send_all(self.bootstrap, backlog, digits_backlog("r", a.round_records), progress=False)
        await self.warm_up(backlog, a.round_records)
        await self.repeats(backlog, a.round_records, modes=["streaminfer", *SHADOW_MODES])

    def slow_model(self) -> Path:
        """The slow candidate (:func:`harness.bench.slow.slow_candidate`), built once per bench run under
        ``--out``."""
        path = self.out / "models" / "digits-slow.onnx"
        if not path.is_file():
            slow_candidate(DIGITS_MODEL, path)
        return path

    async def run(self) -> dict[str, Any]:
        a = self.args
        self.out.mkdir(parents=True, exist_ok=True)
        (self.out / "logs").mkdir(exist_ok=True)
        if a.only_shadow:
            await self.shadow_only()
            return self.result()
        steps = (
            1
            + (0 if a.skip_digits else 9 + len(self.sweep) + len(LOADS) + a.rounds - 1)
            + (0 if a.skip_digits or not a.wide_partitions else a.wide_rounds)
            + (0 if a.skip_events else a.rounds)
            + (0 if a.skip_minilm else 1 + a.rounds)
            + (0 if a.skip_vision else 2 + a.rounds)
        )
        with tqdm(
            total=steps, desc="bench", unit="step", disable=True if a.no_progress else None
        ) as bar:  # None: only on a TTY
            self.bar = bar
            if not a.skip_vision:
                model_paths(a.vision_dir)  # missing models stop the run before anything is measured
            if not a.skip_events:
                check_event_files()
            async with schema_registry(a.schema_registry_url, self.out / "logs", wanted=not a.skip_events) as url:
                # Every backlog first, so each has settled before it is read; then the warm-up, then the runs.
                minilm = None if a.skip_minilm else await self.minilm_backlog()
                images = None if a.skip_vision else await vision_backlog(self)
                digits = None if a.skip_digits else await self.digits_backlogs()
                wide = None if a.skip_digits else await self.wide_backlog()
                events = None if a.skip_events else await event_backlogs(self, url)
                if digits is not None:
                    await self.warm_up(digits[0], a.records)
                elif events:
                    await self.warm_up(events["json"], a.events, events=True)
                if digits is not None:
                    await self.digits(*digits, wide)
                if events is not None:
                    await event_runs(self, events, url)
            if minilm is not None:
                await self.minilm(minilm)
            if images is not None:
                await vision(self, images)
        return self.result()

    def result(self) -> dict[str, Any]:
        """Everything measured, as ``bench.json`` holds it."""
        a = self.args
        per_round = self.per_round()
        return {
            "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version()},
            "records": a.records,
            "round_records": a.round_records,
            "events": a.events,
            "wide_partitions": a.wide_partitions,
            "runs": [asdict(r) for r in self.runs],
            "ratios": self.ratios(),
            "spreads": self.spreads(),
            "other_cpu_pct": self.other_cpu(),
            "warmup": self.warmup,
            "rounds": {label: per_round[key] for key, label in ROUND_LABELS.items()},
        }
