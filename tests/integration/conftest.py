"""Integration fixtures: unique topics per test, an in-process consumer against the real broker, and a real schema
registry.

The registry (``schema_registry_url``) is ``SCHEMA_REGISTRY_URL`` if set, else a :class:`harness.registry.LocalRegistry`
(Apicurio Registry on a JDK >= 21) started for the session (``local_registry``); a test that stops or freezes a
registry starts its own (``own_registry``), so the shared one is never restarted under the others. With ``CI=true``
a registry that cannot start fails the tests that need one, with the reason; elsewhere they skip.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import subprocess
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from consumer.__main__ import load_runner
from consumer.app import StreamInferApp
from consumer.config import Settings
from consumer.model.runner import warmup_plan
from consumer.ops.metrics import Metrics
from harness.registry import LocalRegistry, RegistrySetupError
from producer_tools.produce import Outgoing
from producer_tools.results import Report, collect
from producer_tools.topics import ensure_topics

pytestmark = pytest.mark.integration

#: Settings check only that model_path is a file; tests that need no model point here.
MODEL_PLACEHOLDER = Path(__file__)
ROOT = Path(__file__).resolve().parents[2]
#: A docs page's ``sh`` block (its body, without the fences).
SH_BLOCK = re.compile(r"^```sh\n(.*?)^```", re.S | re.M)
KAFKA_STOP = ("scripts/kafka-local", "stop")
REGISTRY_STOP = ("scripts/registry-local", "stop")


def _no_registry(reason: str) -> None:
    if os.environ.get("CI", "").lower() in {"1", "true", "yes"}:
        pytest.fail(f"no schema registry for integration tests: {reason}", pytrace=False)
    pytest.skip(f"no schema registry: {reason}")


@pytest.fixture(scope="session")
def local_registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalRegistry]:
    """A local Apicurio Registry for this test session (stopped, its schemas deleted, at the end); tests may pause,
    resume, freeze and thaw it, and leave it running."""
    registry = LocalRegistry(tmp_path_factory.mktemp("registry"))
    try:
        registry.start(discard_stale=True)
    except RegistrySetupError as exc:
        _no_registry(f"the local registry did not start: {exc}")
    try:
        yield registry
    finally:
        registry.stop()


@pytest.fixture
def own_registry(tmp_path: Path) -> Iterator[LocalRegistry]:
    """A local registry of this test's own, for a test that stops or freezes it: the session's registry is never
    restarted under the tests that share it."""
    registry = LocalRegistry(tmp_path / "registry")
    try:
        registry.start(discard_stale=True)
    except RegistrySetupError as exc:
        _no_registry(f"the local registry did not start: {exc}")
    try:
        yield registry
    finally:
        registry.stop()


@pytest.fixture(scope="session")
def schema_registry_url(request: pytest.FixtureRequest) -> str:
    """The Confluent-compatible URL of a real schema registry: ``SCHEMA_REGISTRY_URL``, else the session's
    :func:`local_registry`."""
    return os.environ.get("SCHEMA_REGISTRY_URL") or request.getfixturevalue("local_registry").url


@pytest.fixture
async def topics(kafka_bootstrap: str) -> dict[str, str]:
    """Fresh requests (4 partitions), results (4) and dead-letter (1) topics for one test."""
    tag = uuid.uuid4().hex[:8]
    names = {"requests": f"it-{tag}.requests", "results": f"it-{tag}.results", "dlq": f"it-{tag}.requests.dlq"}
    append = {"message.timestamp.type": "LogAppendTime"}
    await ensure_topics(
        kafka_bootstrap,
        {names["requests"]: 4, names["results"]: 4, names["dlq"]: 1},
        configs={names["results"]: append, names["dlq"]: append},
    )
    return names


AppFactory = Callable[..., Awaitable[StreamInferApp]]


def settings_for(bootstrap: str, topics: dict[str, str], model_path: Path, **overrides: Any) -> Settings:
    """Settings for a consumer under test: ``topics``, a fresh group, CPU, no HTTP port, a short session timeout."""
    values: dict[str, Any] = {
        "bootstrap_servers": bootstrap,
        "group_id": f"it-{uuid.uuid4().hex[:8]}",
        "requests_topic": topics["requests"],
        "results_topic": topics["results"],
        "dead_letter_topic": topics["dlq"],
        "model_path": model_path,
        "execution_provider": "cpu",
        "http_port": 0,
        "session_timeout_ms": 10_000,
        "heartbeat_interval_ms": 1_000,
    }
    return Settings(**{**values, **overrides})


async def answers(
    bootstrap: str, topics: dict[str, str], records: Sequence[Outgoing], timeout_s: float = 60, **options: Any
) -> Report:
    """Read back the answers to ``records`` (``producer_tools.results.collect``; ``options`` go to it)."""
    expected = {r.correlation_id: r.manifest() for r in records}
    return await collect(bootstrap, topics["results"], topics["dlq"], expected, timeout_s, progress=False, **options)


async def read_all(
    bootstrap: str,
    topic: str,
    *,
    want: int | None = None,
    timeout_s: float = 120.0,
    isolation_level: str = "read_uncommitted",
) -> list[Any]:
    """Records of ``topic`` from its beginning (aiokafka ``ConsumerRecord``s, partition by partition), the one reader
    of the integration tests.

    Args:
        want: None: every record up to the topic's end offsets now; else read until ``want`` records arrived or
            ``timeout_s`` (seconds) passed, whichever comes first.
        isolation_level: ``read_committed`` to see only committed transactions (exactly_once's results).
    """
    from aiokafka import AIOKafkaConsumer, TopicPartition

    from producer_tools.topics import partitions_of

    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        isolation_level=isolation_level,
    )
    await consumer.start()
    try:
        tps = [TopicPartition(topic, p) for p in sorted(await partitions_of(bootstrap, topic))]
        consumer.assign(tps)
        out: list[Any] = []
        if want is None:
            ends = await consumer.end_offsets(tps)
            while any([await consumer.position(tp) < end for tp, end in ends.items()]):
                for records in (await consumer.getmany(timeout_ms=500)).values():
                    out += records
            return out
        deadline = asyncio.get_running_loop().time() + timeout_s
        while len(out) < want and asyncio.get_running_loop().time() < deadline:
            for records in (await consumer.getmany(timeout_ms=200, max_records=5000)).values():
                out += records
        return out
    finally:
        await consumer.stop()


async def group_offsets(bootstrap: str, group_id: str, topic: str) -> tuple[dict[Any, int | None], dict[Any, int]]:
    """(committed offsets of ``group_id``, log end offsets) of every partition of ``topic``, keyed by aiokafka
    ``TopicPartition``: equal once the group has answered and committed everything written to ``topic``."""
    from aiokafka import AIOKafkaConsumer, TopicPartition

    from producer_tools.topics import partitions_of

    probe = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=group_id, enable_auto_commit=False)
    await probe.start()
    try:
        tps = [TopicPartition(topic, p) for p in sorted(await partitions_of(bootstrap, topic))]
        ends = await probe.end_offsets(tps)
        committed = {tp: await probe.committed(tp) for tp in tps}
    finally:
        await probe.stop()
    return committed, dict(ends)


@pytest.fixture
async def start_app(kafka_bootstrap: str, topics: dict[str, str], digits_model: Path) -> AsyncIterator[AppFactory]:
    """Start a consumer in-process; ``await start_app(**setting_overrides)`` (default model: digits). Stopped at
    teardown."""
    started: list[StreamInferApp] = []
    group = f"it-{uuid.uuid4().hex[:8]}"

    async def factory(**overrides: Any) -> StreamInferApp:
        options = {"group_id": group, "shutdown_grace_s": 20, "model_path": digits_model / "digits.onnx", **overrides}
        settings = settings_for(kafka_bootstrap, topics, **options)
        runner = load_runner(settings)  # as consumer.__main__ does
        sizes, lengths = warmup_plan(runner, settings.max_batch_size)
        runner.warmup(sizes, settings.warmup_runs, lengths)
        app = StreamInferApp(settings, runner, Metrics(CollectorRegistry()))
        await app.start()
        started.append(app)
        for _ in range(300):  # the group join takes a few seconds on a fresh broker
            if app.joined:
                break
            await asyncio.sleep(0.1)
        assert app.joined, "consumer did not join the group"
        return app

    yield factory
    for app in started:
        await app.stop()


def shell_blocks(page: Path) -> list[str]:
    """The ``sh`` blocks of a docs page, in page order (each block's text without its fences)."""
    return SH_BLOCK.findall(page.read_text())


def run_shell_block(
    block: str,
    tmp_path: Path,
    *,
    unset: Sequence[str],
    stops: Sequence[Sequence[str]] = (KAFKA_STOP,),
    timeout_s: float = 600,
    cwd: Path = ROOT,
    extra_env: Mapping[str, str] | None = None,
) -> str:
    """Run one docs block as written, alone, in a fresh ``bash`` (``set -euo pipefail``) from ``cwd`` (the
    repository root): without the variables named in ``unset`` (those another block sets, and the suite's own broker
    and registry), with ``KAFKA_LOCAL_STATE`` under ``tmp_path`` (the block's broker and registry, apart from the
    suite's) and ``extra_env``. Afterwards the block's process group is killed (what it left in the background:
    consumers) and each ``stops`` command runs (with the block's environment, from the repository root). Returns the
    block's output (stdout and stderr together); asserts exit 0, showing the output's last 4000 characters
    otherwise. Raises subprocess.TimeoutExpired past ``timeout_s`` seconds."""
    script = "set -euo pipefail\n" + block
    env = {k: v for k, v in os.environ.items() if k not in set(unset)}
    env["KAFKA_LOCAL_STATE"] = str(tmp_path / "state")
    env.update(extra_env or {})
    proc = subprocess.Popen(
        ["bash", "-c", script],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        out, _ = proc.communicate(timeout=timeout_s)
    finally:
        with contextlib.suppress(ProcessLookupError):  # the script and what it left in the background (consumers)
            os.killpg(proc.pid, signal.SIGKILL)
        for stop in stops:
            subprocess.run(list(stop), cwd=ROOT, env=env, capture_output=True, timeout=120, check=False)
    assert proc.returncode == 0, out[-4000:]
    return out


def results_lines(out: str) -> list[dict[str, str]]:
    """Each ``results: key=value ...`` line of ``out`` (``producer_tools``' summary) as a dict, in order."""
    lines = [line for line in out.splitlines() if line.startswith("results:")]
    return [dict(part.split("=", 1) for part in line.split()[1:]) for line in lines]
