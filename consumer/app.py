"""The consumer service: builds the stages, picks the delivery mode, starts, serves, stops.

One record's path, stage by stage (each a module)::

    source      Kafka in: fetch under the rows budget, pause/resume, lag, undecodable records, rebalances
    intake      fetched chunk -> tracked work items, decoded and validated chunk-wise (consumer.oip.decode)
    batcher     micro-batches by rows, tokens or deadline, per input shape
    inference   input tensors -> ONNX Runtime in its thread -> results, bisection, batch-wise encoding
    publisher   answers -> producer batches in each partition's offset order; retries, the size ladder
    committer   contiguous acknowledged offsets, commit cadence

composed by the delivery mode (``settings.delivery``): :mod:`consumer.delivery.at_least_once` runs them as
concurrent tasks; :mod:`consumer.delivery.exactly_once` runs transaction windows.

Shutdown (:meth:`StreamInferApp.stop`, on SIGTERM/SIGINT): stop fetching, answer and publish what was fetched
(exactly_once: commit the open transactions), commit, leave the group; all within ``shutdown_grace_s``. What does
not finish in time is not committed and will be redelivered.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

from consumer.config import Settings
from consumer.delivery.at_least_once import AtLeastOnce
from consumer.delivery.exactly_once import ExactlyOnce
from consumer.delivery.stages import SHUTDOWN_STEP_TIMEOUT_S, Stages, build_stages
from consumer.events.mapping import InputMapping
from consumer.events.registry import Schemas, value_subject
from consumer.kafka.clients import Clients, KafkaClients
from consumer.kafka.link import BrokerLink
from consumer.kafka.security import kafka_security_kwargs
from consumer.model.runner import OnnxRunner
from consumer.ops.metrics import Metrics
from consumer.ops.tracing import Tracing

log = logging.getLogger(__name__)

#: The part of shutdown_grace_s kept for the final commit, leaving the group and closing the producers, seconds;
#: the drain gets the rest, so the whole stop fits in shutdown_grace_s.
SHUTDOWN_RESERVE_S = 3 * SHUTDOWN_STEP_TIMEOUT_S


class StreamInferApp:
    """The consumer service.

    Args:
        settings: validated settings.
        runner: a loaded (and warmed) ONNX runner.
        metrics: metrics on an injected registry.
        clock: monotonic clock in seconds (batch deadlines, stage timings, stall detection).
        wall_clock: epoch clock in seconds (record age against Kafka timestamps only).
        sleep: ``asyncio.sleep``, or a fake that a test's clock resolves (backoff, commit cadence, revoke wait).
        clients: makes the Kafka clients; default the real ones (:class:`~consumer.kafka.clients.KafkaClients`).
        suppressed_client_logs: how many Kafka client log records were suppressed so far
            (:attr:`consumer.ops.logs.ClientLogLimiter.suppressed_total`), reported when the cluster answers again.
        tracing: OpenTelemetry spans (:func:`consumer.ops.tracing.from_environment`), or None: traces off.
        mapping: events: the input mapping checked when the model was loaded (``consumer.__main__``); None: loaded
            when the stages are built.
        candidate: ``shadow_model_path``'s model, loaded and checked (``consumer.__main__``); None: loaded when
            the stages are built, if the setting is set.
    """

    def __init__(
        self,
        settings: Settings,
        runner: OnnxRunner,
        metrics: Metrics,
        *,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        clients: Clients | None = None,
        suppressed_client_logs: Callable[[], int] | None = None,
        tracing: Tracing | None = None,
        mapping: InputMapping | None = None,
        candidate: OnnxRunner | None = None,
    ) -> None:
        self._tracing = tracing
        self._mapping = mapping
        self._candidate = candidate
        self.settings = settings
        self.runner = runner
        self.metrics = metrics
        self._clock = clock
        self._wall_clock = wall_clock
        self._sleep = sleep
        self._clients = clients
        self._suppressed_client_logs = suppressed_client_logs
        self.stages: Stages | None = None
        self.link: BrokerLink | None = None
        self._link_task: asyncio.Task[None] | None = None
        self.mode: AtLeastOnce | ExactlyOnce | None = None
        self._crashed = asyncio.Event()
        self._stopping = False
        self.failed: BaseException | None = None
        self._started_at = clock()
        metrics.seconds_since_progress.set_function(self._idle_s)

    async def start(self, stop: asyncio.Event | None = None) -> bool:
        """Connect, join the group and start the delivery mode's tasks (Avro events with enriched results: once the
        result schema of the requests subject's latest writer schema is registered, waiting out a schema registry
        that does not answer).

        Args:
            stop: set meanwhile, start-up is given up (returns False).

        Returns:
            Whether the consumer started.

        Raises:
            aiokafka.errors.KafkaError: the broker cannot be reached.
            ConfigError: the result schema is missing and may not be registered, or registering it was refused.
            ModelError: the requests subject's latest writer schema cannot feed the model as mapped; the shadow
                candidate cannot be loaded.
            ConfigError: the shadow candidate is refused (:mod:`consumer.shadow.candidate`).
        """
        clients = self._clients or KafkaClients(self.settings, kafka_security_kwargs(self.settings))
        stages = build_stages(
            self.settings,
            self.runner,
            self.metrics,
            clients,
            clock=self._clock,
            wall_clock=self._wall_clock,
            sleep=self._sleep,
            fail=self._fail,
            tracing=self._tracing,
            mapping=self._mapping,
            candidate=self._candidate,
        )
        self.stages = stages
        if stages.schemas is not None:
            try:
                ready = await self._schemas_ready(stages.schemas, stop)
            except BaseException:
                await stages.source.stop()  # never started: closes what the client opened in its constructor
                raise
            if not ready:
                await stages.source.stop()
                return False
        mode = AtLeastOnce(stages) if self.settings.delivery == "at_least_once" else ExactlyOnce(stages)
        await mode.start()
        self.stages, self.mode = stages, mode
        for task in mode.tasks:
            task.add_done_callback(self._on_task_done)
        self.link = BrokerLink(
            stages.source.consumer.topics,
            self.settings.bootstrap_servers,
            clock=self._clock,
            sleep=self._sleep,
            gauge=self.metrics.kafka_reachable,
            suppressed=self._suppressed_client_logs,
        )
        self._link_task = asyncio.create_task(self.link.watch(), name="streaminfer-kafka-link")
        loop = asyncio.get_running_loop()
        self.metrics.asyncio_tasks.set_function(lambda: len(asyncio.all_tasks(loop)))  # read at scrape time
        return True

    async def _schemas_ready(self, schemas: Schemas, stop: asyncio.Event | None) -> bool:
        """The start-up check of the result schema (:meth:`consumer.events.registry.Schemas.start`), given up when
        ``stop`` is set first (False; its client closed, as when the check raises)."""
        check = asyncio.ensure_future(schemas.start(value_subject(self.settings.requests_topic)))
        try:
            if stop is not None:
                stopped = asyncio.ensure_future(stop.wait())
                try:
                    await asyncio.wait([check, stopped], return_when=asyncio.FIRST_COMPLETED)
                finally:
                    stopped.cancel()
                if not check.done():
                    check.cancel()
                    await asyncio.gather(check, return_exceptions=True)
                    await schemas.close()
                    return False
            await check  # ConfigError: the result schema refused or missing
        except BaseException:
            await schemas.close()
            raise
        return True

    async def run(self, stop: asyncio.Event) -> int:
        """Start, serve until ``stop`` is set or a task fails, then stop. Returns the process exit code."""
        if not await self.start(stop):
            log.info("stopped before start-up finished")
            return 0
        assert self.mode is not None
        stop_task = asyncio.create_task(stop.wait())
        crash_task = asyncio.create_task(self._crashed.wait())
        try:
            await asyncio.wait([stop_task, crash_task, *self.mode.tasks], return_when=asyncio.FIRST_COMPLETED)
        finally:
            stop_task.cancel()
            crash_task.cancel()
            await self.stop()
        return 1 if self.failed is not None else 0

    async def stop(self) -> None:
        """Stop fetching, drain within ``shutdown_grace_s``, commit, leave the group."""
        if self._stopping:
            return
        self._stopping = True
        if self._link_task is not None:
            self._link_task.cancel()
        if self.mode is not None:
            await self.mode.stop(max(0.5, self.settings.shutdown_grace_s - SHUTDOWN_RESERVE_S))
        if self.stages is not None and self.stages.schemas is not None:
            await self.stages.schemas.close()
        if self._tracing is not None:
            await asyncio.to_thread(self._tracing.close)  # exports what is buffered (a blocking HTTP call)
        log.info("stopped")

    def _on_task_done(self, task: asyncio.Task[None]) -> None:
        """A main task must never end: that is a bug, and the process exits 1 (uncommitted records are
        redelivered after the restart)."""
        if task.cancelled() or self._stopping:
            return
        self._fail(task.exception() or RuntimeError(f"task {task.get_name()} ended"), task.get_name())

    def _fail(self, exc: BaseException, name: str) -> None:
        if self._stopping or self.failed is not None:
            return
        self.failed = exc
        self._crashed.set()
        log.error("background task %s failed: %r", name, exc, exc_info=exc)

    def _idle_s(self) -> float:
        return self.stages.progress.idle_s() if self.stages is not None else self._clock() - self._started_at

    @property
    def joined(self) -> bool:
        """Whether the group assigned partitions (False while it rebalances)."""
        return self.mode is not None and self.mode.joined

    @property
    def ready(self) -> bool:
        """Warm (the runner is warmed before start), joined, the cluster reachable and not stopping."""
        return self.readiness()[0]

    def readiness(self) -> tuple[bool, str]:
        """(ready, reason) for ``/readyz``: joined, the last metadata check answered, not stopping, no task failed.
        Reads plain attributes only: safe from the HTTP thread."""
        if self._stopping or self.failed is not None:
            return False, "stopping"
        registry_down = self._registry_down_since()
        if registry_down is not None:
            return False, f"schema registry unanswered for {self._clock() - registry_down:.0f} s"
        if not self.joined:
            return False, "joining the consumer group"
        down_since = self.link.down_since if self.link is not None else None
        if down_since is not None:
            return False, f"kafka cluster unreachable for {self._clock() - down_since:.0f} s"
        return True, "ready"

    def liveness(self) -> tuple[bool, str]:
        """(alive, reason) for ``/healthz``: False when a background task died, or when the consumer has neither
        fetched records nor committed for ``stall_timeout_s`` while it has work: lag > 0 by the last count, or the
        cluster has not answered a metadata check for ``stall_timeout_s`` (cut off, the consumer cannot learn its
        lag; records produced meanwhile wait). Reads plain attributes only: safe from the HTTP thread."""
        if self.failed is not None:
            return False, f"background task failed: {self.failed!r}"
        if self._registry_down_since() is not None:  # records wait for the registry: a restart would not help
            return True, "holding records for the schema registry"
        idle_s = self._idle_s()
        stall_s = self.settings.stall_timeout_s
        if idle_s <= stall_s:
            return True, "ok"
        if self.lag > 0:
            return False, f"stalled: lag {self.lag} records, no fetch or commit for {idle_s:.0f} s"
        silent_s = self._clock() - self.link.last_ok if self.link is not None and not self.link.reachable else 0.0
        if silent_s > stall_s:
            return False, (f"stalled: kafka cluster silent for {silent_s:.0f} s (lag unknown), no fetch or commit "
                           f"for {idle_s:.0f} s")  # fmt: skip
        return True, "ok"

    def _registry_down_since(self) -> float | None:
        schemas = self.stages.schemas if self.stages is not None else None
        return schemas.down_since if schemas is not None else None

    @property
    def lag(self) -> int:
        """Sum of the per-partition lag last computed, records."""
        return self.stages.source.lag if self.stages is not None else 0

    @property
    def in_flight_rows(self) -> int:
        """Rows fetched and not yet answered (exactly_once: held by the open window)."""
        return self.mode.in_flight_rows if self.mode is not None else 0
