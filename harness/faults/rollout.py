"""The model rollout step of ``make faults`` (issue 36): a candidate that passed the gate replaces the serving model
the way the manifests' Deployment rolls a new pod template out.

``k8s/base/deployment.yaml`` rolls with ``maxSurge: 1, maxUnavailable: 0`` and gives each pod
``terminationGracePeriodSeconds: 30`` (above ``STREAMINFER_SHUTDOWN_GRACE_S`` 25 s); each pod is a static member whose
``group.instance.id`` is its own name, leaving the group on SIGTERM. A rollout therefore goes, one pod at a time::

    start a new pod serving model B (a new name: a new static member, which joins: one rebalance)
    wait until it is ready (warm, joined: the readiness probe)
    SIGTERM one old pod serving model A (it drains, commits, leaves: one more rebalance)

Static membership moves nothing here: it spares a rebalance only to a member that comes back with the *same*
``group.instance.id`` within ``session.timeout.ms`` (a container restarted in place), and every surge pod has a new
one. So a rollout costs what the ``rolling`` step of :mod:`harness.faults.steps` costs, two rebalances per pod.

One row per delivery mode, ``rollout_model_<alo|eos>``: :data:`MEMBERS` members serve model A (``make model``'s
digits, ``model_version`` 1) under the open-loop load of the scale steps (``Plan.step_rate`` records/s on
:data:`~harness.faults.steps.PARTITIONS` partitions), then each is replaced by a member serving model B (digits
retrained with ``C`` = :data:`CANDIDATE_C`, ``model_version`` :data:`CANDIDATE_VERSION`: the candidate
docs/rollout.md gates; it passes the gate: agreement 0.997, accuracy 0.9694 against 0.9667). Figures as the steps
print them (gap, partition gap, p99; ``steady`` before, ``rollout`` for the whole switch until every partition
answered again and ``Plan.step_settle_s`` more), plus which model answered: the answers per ``model_version``, the
switch window (from the first B answer received to the last A answer received, s) and the partitions whose answers
went back from B to A at some point (a rebalance handed a partition from a new member back to an old one).

The row passes with lost 0, no exactly-once duplicate, every exit 0, answers from both versions and the last answer
of every partition from B; the full run also judges the partition gap against the ``rolling`` target of
:func:`harness.faults.steps.target_s`.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import orjson

from consumer.oip.client import encode_request
from harness.faults.harness import ROOT, Harness, Outcome, Plan, log_excerpt
from harness.faults.steps import (
    HEADER,
    HEARTBEAT_MS,
    PARTITIONS,
    SETTLE_LIMIT_S,
    STEADY_S,
    Figures,
    Group,
    Load,
    Mark,
    Reader,
    _settle,
    rows_of,
    tally,
    target_s,
    wind_down,
)

#: Members serving the group before, during (one more: the surge) and after the rollout.
MEMBERS = 2
#: The candidate: digits retrained with this ``C`` (scikit-learn's inverse regularisation; model A has 1.0).
CANDIDATE_C = 0.5
#: The candidate's ``model_version`` (model A's is 1).
CANDIDATE_VERSION = "2"


def build_candidate(work: Path) -> Path:
    """Model B, ``<work>/candidate/digits.onnx``, built by ``models/digits/build.py`` (once per work folder).

    Raises:
        subprocess.CalledProcessError: the build failed.
    """
    out = work / "candidate"
    model = out / "digits.onnx"
    if not model.exists():
        build = [sys.executable, str(ROOT / "models" / "digits" / "build.py"), "--out", str(out)]
        build += ["--c", str(CANDIDATE_C), "--model-version", CANDIDATE_VERSION]
        subprocess.run(build, check=True, capture_output=True, timeout=300)  # noqa: S603 (our own script)
    return model


@dataclass
class Versions:
    """Which ``model_version`` answered each request: counts, first and last receipt per version, and per request
    partition the versions in request order (filled by :meth:`note`, the reader's ``on_result``)."""

    counts: Counter[str] = field(default_factory=Counter)
    first: dict[str, float] = field(default_factory=dict)
    last: dict[str, float] = field(default_factory=dict)
    by_partition: list[dict[int, str]] = field(default_factory=lambda: [{} for _ in range(PARTITIONS)])
    unreadable: int = 0

    def note(self, partition: int, number: int, received: float, value: bytes) -> None:
        try:
            version = str(orjson.loads(value)["model_version"])
        except (orjson.JSONDecodeError, KeyError, TypeError):
            self.unreadable += 1
            return
        self.counts[version] += 1
        self.first.setdefault(version, received)
        self.last[version] = received
        self.by_partition[partition][number] = version

    def switch_s(self, old: str, new: str) -> float:
        """From the first ``new`` answer received to the last ``old`` one, s (0 when they do not overlap)."""
        if old not in self.last or new not in self.first:
            return 0.0
        return max(0.0, self.last[old] - self.first[new])

    def went_back(self, old: str, new: str) -> list[int]:
        """The partitions where an ``old`` answer follows a ``new`` one in request order."""
        back = []
        for p, answers in enumerate(self.by_partition):
            seen_new = False
            for number in sorted(answers):
                seen_new = seen_new or answers[number] == new
                if seen_new and answers[number] == old:
                    back.append(p)
                    break
        return back

    def last_is(self, version: str) -> bool:
        """Whether every partition's last request was answered by ``version``."""
        return all(answers and answers[max(answers)] == version for answers in self.by_partition)


async def scenario_rollout(h: Harness, plan: Plan, delivery: str) -> Outcome:
    """One row: ``delivery`` ("at_least_once" or "exactly_once"), the manifests' static membership."""
    mode = "alo" if delivery == "at_least_once" else "eos"
    name = f"rollout_model_{mode}"
    session_ms = plan.static_session_ms
    candidate = await asyncio.to_thread(build_candidate, h.work)
    topics = await h.new_topics(name, partitions=PARTITIONS)
    tag = f"{name}-{uuid.uuid4().hex[:6]}"
    group = Group(h, topics, tag, delivery, "static", session_ms)
    x = h.x.astype(np.float32)
    values = [encode_request(None, {"input": x[i : i + 1]}) for i in range(len(x))]
    load = Load(h.bootstrap, topics["requests"], plan.step_rate, tag, values)
    versions = Versions()
    reader = Reader(h.bootstrap, topics, tag, on_result=versions.note)
    for slot in range(MEMBERS):
        member = group.new(slot)
        await group.start(member)
        group.members.append(member)
    reading = asyncio.create_task(reader.run())
    sending = asyncio.create_task(load.run())
    marks: list[Mark] = []  # (step, start, rebalances: not watched in a rollout, action s)
    failure = ""
    longest = 0.0  # the longest pod replacement: start of the new one to the old one's exit, s
    try:
        await asyncio.sleep(STEADY_S)
        marks.append(("steady", time.time() - STEADY_S + 1.0, 0, 0.0))
        started, t = time.time(), time.monotonic()
        for slot, old in enumerate(list(group.members)):  # maxSurge 1, maxUnavailable 0
            t_pod = time.monotonic()
            new = group.new(slot)
            new.settings["model_path"] = candidate  # the new pod template: the candidate's image or ConfigMap
            await group.start(new)  # returns once /readyz answers 200: the readiness probe passed
            await group.stop(old)  # SIGTERM; the Deployment waits for the exit (terminationGracePeriodSeconds)
            group.retired.append(old)
            group.members[slot] = new
            longest = max(longest, time.monotonic() - t_pod)
        action_s = time.monotonic() - t
        await _settle(reader, time.time(), plan.step_settle_s, SETTLE_LIMIT_S)
        marks.append(("rollout", started, None, action_s))
    except RuntimeError as exc:  # a member that did not start
        failure = f"error: {exc}"
    finally:
        ended = await wind_down(load, sending, reader, reading)
    alive, codes, lost = tally(group, load, reader)
    r = reader.receipts

    def judge(f: Figures) -> None:  # the rollout: a Deployment's rolling update of static members
        f.target_s = target_s(delivery, "static", "rolling", session_ms / 1000, f.action_s)
        f.met = f.target_s is None or f.partition_gap_s <= f.target_s

    rows = rows_of(r, marks, ended, judge)
    old_v, new_v = "1", CANDIDATE_VERSION
    back = versions.went_back(old_v, new_v)
    switched = versions.counts[old_v] > 0 and versions.counts[new_v] > 0 and versions.last_is(new_v)
    missed = [f.step for f in rows if not f.met]
    judged = plan.judge_steps and not failure
    ok = (lost == 0 and (r.duplicates == 0 or delivery == "at_least_once") and all(alive) and switched
          and all(c == 0 for c in codes) and not failure and not (judged and missed))  # fmt: skip
    counts = ", ".join(f"v{v} {n}" for v, n in sorted(versions.counts.items()))
    switch = (
        f"answers {counts}; switch {versions.switch_s(old_v, new_v):.1f} s (first v{new_v} to last v{old_v} "
        f"received); partitions back to v{old_v} after v{new_v}: {len(back)}"
    )
    summary = "; ".join(f"{f.step} {f.gap_s:.1f}/{f.partition_gap_s:.1f} s p99 {f.p99_ms:.0f} ms" for f in rows)
    members = f"static (session {session_ms / 1000:.0f} s, heartbeat {HEARTBEAT_MS / 1000:g} s)"
    note = (
        f"{delivery}, {members}, {MEMBERS} members v{old_v} -> v{new_v} (maxSurge 1, maxUnavailable 0), "
        f"{plan.step_rate:.0f} rec/s on {PARTITIONS} partitions; gap/partition gap: {summary}; {switch}; "
        f"exits {codes}"
    )
    if not switched:
        note += f"; NOT switched: the last answer of every partition is not v{new_v}"
    if missed:
        note += f"; targets missed: {', '.join(missed)}" + ("" if judged else " (not judged)")
    if failure:
        note = f"{failure}; {note}"
    details = "\n".join(
        [f"{name}: {members}, {delivery}, longest pod replacement {longest:.1f} s", "  " + HEADER,
         *("  " + f.line() for f in rows), f"  {switch}"]
    )  # fmt: skip
    if not ok:
        for proc in group.members + group.retired:
            print(f"{name}: {proc.log}:\n{log_excerpt(proc.log)}", file=sys.stderr)
    return Outcome(name, sum(load.sent), lost, r.duplicates, r.dead_letters, ok, note,
                   exactly_once=delivery == "exactly_once", details=details)  # fmt: skip


ROLLOUT_SCENARIOS: dict[str, Callable[[Harness, Plan], Awaitable[Outcome]]] = {
    "rollout_model_alo": lambda h, p: scenario_rollout(h, p, "at_least_once"),
    "rollout_model_eos": lambda h, p: scenario_rollout(h, p, "exactly_once"),
}
