"""``make image-e2e`` (``python -m harness.docker serve``): the CPU image end to end, as the Deployment starts it.

1. The overlay ``k8s/overlays/cpu`` is rendered and translated (:mod:`harness.docker.pod`); the image's configuration
   and a probe run inside it as the pod runs are checked against what the manifests assume (user, entrypoint, port,
   the model's path, nothing writable but the tmpfs, the CPU build of ONNX Runtime only).
2. A local broker in security mode (SASL_SSL with SCRAM-SHA-512, a throwaway CA) listening where the container reaches
   it (the bridge's address on this machine, or loopback with host networking), with the KafkaTopics' partitions and
   configuration (one replica, so ``min.insync.replicas`` 1: the one liberty taken).
3. The Secrets' files where Kubernetes would mount them (the KafkaUser's password and the cluster CA at the paths the
   ConfigMap names, the Secret volume's mode, group fsGroup); the container is started with the ConfigMap's settings,
   only the bootstrap address overridden (the broker's SASL_SSL listener), and ``/readyz`` is waited for.
4. The demo's records (:mod:`harness.demo`: a warm-up, then the held-out digits with every poison kind interleaved):
   each one must be answered, the poison ones dead-lettered with their reason.
5. A second wave sent at a steady rate while ``docker stop`` (SIGTERM, the Deployment's grace period) stops the
   container: it must exit 0; a second container of the same group answers the rest; no record may be missing and
   none answered twice (what the first committed on its way out is not redone), and the group's committed offsets
   must reach the end of every partition once the second has stopped too.

Prints one summary line (stdout); exits 1 naming the first failure. Containers, broker and Secret files are removed
afterwards whatever happens; the consumers' logs stay in ``<state>/consumer-*.log``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient

from harness.demo import WARMUP_RECORDS, demo_records, serve_records
from harness.docker import pod
from harness.docker.client import Docker, DockerError
from harness.docker.engine import Engine
from harness.localkafka import LocalBroker
from producer_tools.produce import DEFAULT_HELDOUT, Outgoing, digits_requests, send_all
from producer_tools.results import Report, collect
from producer_tools.topics import ensure_topics, partitions_of

#: Seconds the container may take to answer /readyz (model load and warm-up; Kafka's group join).
READY_TIMEOUT_S = 120.0
#: Seconds to wait for every answer of a phase.
ANSWER_TIMEOUT_S = 120.0
#: The second wave: records per second, and after how many seconds of it ``docker stop`` is sent.
WAVE_RATE = 120.0
STOP_AFTER_S = 1.0


class ServeError(RuntimeError):
    """The end-to-end run failed; the message says where."""


@dataclass
class Summary:
    """The run's figures."""

    image: str
    size_mb: float
    ready_s: float = 0.0
    report: Report | None = None
    stop_s: float = 0.0
    stop_exit: int | None = None
    wave: int = 0
    committed_by_first: int = 0  # records of the wave the first container answered and committed before exiting
    wave_report: Report | None = None
    second_exit: int | None = None
    committed: int = 0
    end: int = 0

    def line(self) -> str:
        """``image-e2e: ...`` (one line)."""
        r, w = self.report, self.wave_report
        demo = r.summary("demo").removeprefix("demo: ") if r else "-"
        wave = f"answered={w.results + w.dead_letters} duplicates={w.duplicates} missing={len(w.missing)}" if w else "-"
        return (
            f"image-e2e: image={self.image} size_mb={self.size_mb:.0f} ready_s={self.ready_s:.1f} {demo} | "
            f"stop: exit={self.stop_exit} stop_s={self.stop_s:.1f} wave={self.wave} "
            f"committed_by_first={self.committed_by_first} {wave} second_exit={self.second_exit} | "
            f"committed={self.committed}/{self.end}"
        )


def serve(
    engine: Engine,
    state: Path,
    *,
    image: str | None = None,
    heldout: Path = DEFAULT_HELDOUT,
    say: Callable[[str], None] = print,
) -> Summary:
    """Run the scenario of the module docstring on ``engine`` with ``image`` (default: the overlay's image name).

    Raises:
        ServeError: a check failed (named).
        pod.ManifestError: the manifests ask for what the translation cannot honour.
        DockerError: a docker command failed.
        harness.localkafka.BrokerSetupError: the broker did not start.
    """
    docker = engine.docker()
    plan = pod.plan(pod.render("cpu"))
    image = image or plan.image
    inspected = docker.image(image)
    if inspected is None:
        raise ServeError(f"no image {image} here: `make image-cpu` builds it")
    summary = Summary(image, int(inspected.get("Size", 0)) / 1e6)
    problems = pod.image_problems(plan, inspected)
    found = pod.parse_probe(docker.run(*pod.probe_argv(plan, image), timeout_s=120).stdout)
    problems += pod.probe_problems(plan, found, "cpu")
    if problems:
        raise ServeError("the image does not do what the manifests assume:\n- " + "\n- ".join(problems))
    say(f"image {image} fits the manifests: user {found['uid']}:{found['gid']}, runtime {found['runtimes']}, "
        f"providers {found['providers']}, writable {found['writable']}")  # fmt: skip
    if not heldout.exists():
        raise ServeError(f"{heldout} is missing: `make model` builds it")

    shutil.rmtree(state, ignore_errors=True)
    state.mkdir(parents=True)
    host = engine.gateway if engine.network == "bridge" else "127.0.0.1"
    names = [f"streaminfer-e2e-{tag}-{uuid.uuid4().hex[:6]}" for tag in ("a", "b")]
    with LocalBroker(state / "kafka", security=True, hosts=[host]) as broker, _removed(docker, names, state):
        security = broker.security_env()
        if plan.env.get("STREAMINFER_SASL_USERNAME") != security["KAFKA_LOCAL_SASL_USERNAME"]:
            raise ServeError(f"the ConfigMap's STREAMINFER_SASL_USERNAME {plan.env.get('STREAMINFER_SASL_USERNAME')} "
                             f"is not the broker's user {security['KAFKA_LOCAL_SASL_USERNAME']}")  # fmt: skip
        topics = {
            "requests": plan.env["STREAMINFER_REQUESTS_TOPIC"],
            "results": plan.env["STREAMINFER_RESULTS_TOPIC"],
            "dlq": plan.env["STREAMINFER_DEAD_LETTER_TOPIC"],
        }
        declared = {t.name: t for t in plan.topics}
        missing = sorted(set(topics.values()) - set(declared))
        if missing:
            raise ServeError(f"the ConfigMap's topics {missing} have no KafkaTopic in the manifests")
        asyncio.run(
            ensure_topics(
                broker.bootstrap,
                {name: declared[name].partitions for name in topics.values()},
                configs={name: {**declared[name].config, "min.insync.replicas": "1"} for name in topics.values()},
            )
        )
        secret_dirs = _write_secrets(plan, state / "secrets", security)
        overrides = {"STREAMINFER_BOOTSTRAP_SERVERS": security["KAFKA_LOCAL_SASL_SSL_BOOTSTRAP"]}

        def start(name: str) -> float:
            argv = pod.run_argv(
                plan, name=name, image=image, overrides=overrides, secret_dirs=secret_dirs, network=engine.network
            )
            say(f"docker {' '.join(a if 'PASSWORD' not in a else '...' for a in argv[:-1])} {image}")
            started = time.monotonic()
            docker.run(*argv)
            _wait_ready(docker, name, plan, engine, READY_TIMEOUT_S)
            return time.monotonic() - started

        summary.ready_s = start(names[0])
        say(f"{names[0]} ready after {summary.ready_s:.1f} s")
        run_id = f"e2e-{uuid.uuid4().hex[:8]}"
        warm = list(digits_requests(f"{run_id}-warm", heldout, limit=WARMUP_RECORDS))
        _require_all(
            asyncio.run(serve_records(broker.bootstrap, topics, warm, ANSWER_TIMEOUT_S, progress=False)), "warm-up"
        )
        summary.report = _require_all(
            asyncio.run(serve_records(broker.bootstrap, topics, demo_records(run_id, heldout), ANSWER_TIMEOUT_S)),
            "demo records",
        )
        say(summary.report.summary("demo"))
        # the records before the wave (the group commits them a moment after answering, so the end offsets count)
        _, before_wave = asyncio.run(
            committed_and_end(broker.bootstrap, plan.env["STREAMINFER_GROUP_ID"], topics["requests"])
        )

        wave = list(digits_requests(f"{run_id}-wave", heldout))
        summary.wave = len(wave)
        summary.stop_s = asyncio.run(
            _send_while_stopping(docker, names[0], plan.grace_s, broker.bootstrap, topics, wave)
        )
        summary.stop_exit = _exit_code(docker, names[0])
        _save_logs(docker, names[0], state)
        if summary.stop_exit != 0:
            raise ServeError(f"{names[0]} exited with {summary.stop_exit} on docker stop; log: {state}/consumer-a.log")
        committed, _ = asyncio.run(
            committed_and_end(broker.bootstrap, plan.env["STREAMINFER_GROUP_ID"], topics["requests"])
        )
        summary.committed_by_first = committed - before_wave
        if summary.committed_by_first < 0:
            missed = -summary.committed_by_first
            raise ServeError(f"{names[0]} exited 0 without committing {missed} records answered before the wave")
        say(f"{names[0]} stopped in {summary.stop_s:.1f} s with exit 0, {summary.committed_by_first} of the wave's "
            f"{len(wave)} records committed on its way out")  # fmt: skip

        ready_b = start(names[1])
        say(f"{names[1]} ready after {ready_b:.1f} s")
        expected = {r.correlation_id: r.manifest() for r in wave}
        summary.wave_report = asyncio.run(
            collect(
                broker.bootstrap,
                topics["results"],
                topics["dlq"],
                expected,
                ANSWER_TIMEOUT_S,
                progress=False,
                settle_s=3.0,
            )
        )
        _require_all(summary.wave_report, "the wave across docker stop")
        if summary.wave_report.duplicates:
            raise ServeError(f"{summary.wave_report.duplicates} records of the wave were answered twice: the first "
                             "container's commit on docker stop was lost")  # fmt: skip
        docker.run("stop", "--time", str(plan.grace_s), names[1], timeout_s=plan.grace_s + 30)
        summary.second_exit = _exit_code(docker, names[1])
        _save_logs(docker, names[1], state)
        if summary.second_exit != 0:
            raise ServeError(f"{names[1]} exited with {summary.second_exit} on docker stop")
        summary.committed, summary.end = asyncio.run(
            committed_and_end(broker.bootstrap, plan.env["STREAMINFER_GROUP_ID"], topics["requests"])
        )
        if summary.committed != summary.end:
            raise ServeError(f"the group committed {summary.committed} of {summary.end} records: something was lost")
    return summary


def _require_all(report: Report, what: str) -> Report:
    if report.missing or report.reason_mismatches:
        raise ServeError(
            f"{what}: {len(report.missing)} of {report.sent} records unanswered (first: {report.missing[:3]}), "
            f"{len(report.reason_mismatches)} dead-lettered with the wrong reason ({report.reason_mismatches[:3]})"
        )
    return report


async def _send_while_stopping(
    docker: Docker, name: str, grace_s: int, bootstrap: str, topics: dict[str, str], wave: list[Outgoing]
) -> float:
    """Send ``wave`` at :data:`WAVE_RATE` records/s and ``docker stop`` the container :data:`STOP_AFTER_S` seconds in.
    Returns how long the stop took, s."""
    sending = asyncio.create_task(send_all(bootstrap, topics["requests"], wave, rate=WAVE_RATE, progress=False))
    await asyncio.sleep(STOP_AFTER_S)
    started = time.monotonic()
    await asyncio.to_thread(docker.run, "stop", "--time", str(grace_s), name, timeout_s=grace_s + 30)
    took = time.monotonic() - started
    await sending
    return took


async def committed_and_end(bootstrap: str, group: str, topic: str) -> tuple[int, int]:
    """(the group's committed offsets summed over ``topic``'s partitions, the partitions' end offsets summed)."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, client_id="streaminfer-e2e")
    await admin.start()
    try:
        offsets = await admin.list_consumer_group_offsets(group)
    finally:
        await admin.close()
    parts = [TopicPartition(topic, p) for p in sorted(await partitions_of(bootstrap, topic))]
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, client_id="streaminfer-e2e", enable_auto_commit=False)
    await consumer.start()
    try:
        ends = await consumer.end_offsets(parts)
    finally:
        await consumer.stop()
    committed = sum(meta.offset for tp, meta in offsets.items() if tp.topic == topic and meta.offset >= 0)
    return committed, sum(ends.values())


def _write_secrets(plan: pod.Plan, folder: Path, security: dict[str, str]) -> dict[str, Path]:
    """Each Secret volume's files as Kubernetes writes them: the password and the CA at the ConfigMap's paths, the
    volume's mode, owned by root with group fsGroup (mode o+r added where this process cannot set the group)."""
    contents = {
        "STREAMINFER_SASL_PASSWORD_FILE": security["KAFKA_LOCAL_SASL_PASSWORD"].encode(),
        "STREAMINFER_SSL_CAFILE": Path(security["KAFKA_LOCAL_CA_FILE"]).read_bytes(),
    }
    dirs = {}
    for mount in plan.secrets:
        target = folder / mount.volume
        target.mkdir(parents=True, mode=0o755)
        dirs[mount.volume] = target
    for volume, files in pod.secret_files(plan, contents).items():
        mount = next(m for m in plan.secrets if m.volume == volume)
        for name, data in files.items():
            path = dirs[volume] / name
            path.write_bytes(data)
            mode = mount.mode
            try:
                os.chown(path, 0, plan.fs_group if plan.fs_group is not None else 0)
            except PermissionError:
                mode |= 0o004
            path.chmod(mode)
    return dirs


def _wait_ready(docker: Docker, name: str, plan: pod.Plan, engine: Engine, timeout_s: float) -> None:
    """Poll the readiness probe's path on the container's http port until it answers 200.

    Raises:
        ServeError: the container exited, or was not ready within ``timeout_s`` seconds (its log's end named).
    """
    deadline = time.monotonic() + timeout_s
    url = ""
    while time.monotonic() < deadline:
        state = docker.json("inspect", "--format", "{{json .State}}", name)
        if not state.get("Running"):
            logs = docker.run("logs", "--tail", "30", name, check=False)
            raise ServeError(
                f"{name} exited with {state.get('ExitCode')} before it was ready:\n{logs.stdout}{logs.stderr}"
            )
        if not url:
            if engine.network == "host":
                url = f"http://127.0.0.1:{plan.port}{plan.readiness_path}"
            else:
                published = docker.run("port", name, f"{plan.port}/tcp", check=False).stdout.split()
                url = f"http://{published[0]}{plan.readiness_path}" if published else ""
        if url:
            with contextlib.suppress(OSError), urllib.request.urlopen(url, timeout=1) as response:  # noqa: S310
                if response.status == 200:
                    return
        time.sleep(0.2)
    logs = docker.run("logs", "--tail", "30", name, check=False)
    raise ServeError(f"{name} not ready after {timeout_s:.0f} s:\n{logs.stdout}{logs.stderr}")


def _exit_code(docker: Docker, name: str) -> int:
    return int(docker.run("inspect", "--format", "{{.State.ExitCode}}", name).stdout.strip())


def _save_logs(docker: Docker, name: str, state: Path) -> None:
    logs = docker.run("logs", name, check=False)
    (state / f"consumer-{name.split('-')[2]}.log").write_text(logs.stdout + logs.stderr)


@contextlib.contextmanager
def _removed(docker: Docker, names: list[str], state: Path) -> Iterator[None]:
    """Remove the containers ``names`` and the Secret files afterwards, whatever happens (logs saved first)."""
    try:
        yield
    finally:
        for name in names:
            with contextlib.suppress(DockerError):
                if docker.run("inspect", name, check=False).returncode == 0:
                    if not (state / f"consumer-{name.split('-')[2]}.log").exists():
                        _save_logs(docker, name, state)
                    docker.remove_container(name)
        shutil.rmtree(state / "secrets", ignore_errors=True)
