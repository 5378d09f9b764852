"""``make faults`` / ``python -m harness.faults``: fault injection against a real broker, with the figures.

Starts its own local broker (:class:`harness.localkafka.LocalBroker` in a private state folder; it creates no
topic on first use, so a missing dead-letter topic stays missing, and it can be paused for an outage) and, for the
cluster scenarios, a local 3-node cluster (replication factor 3, ``min.insync.replicas=2``); builds nothing (the
digits model must exist: ``make model``), runs each scenario on fresh topics and consumer groups, and prints a table::

    scenario            records  lost  duplicates  dead_lettered  outcome
    kill9                 20000     0          41              0  ok
    ...
    faults: scenarios=S lost=L duplicates_exactly_once=E poison_missed=P

Scenarios (consumers run as separate processes, ``python -m consumer``, unless noted):

- ``kill9``: records produced at a steady rate while the consumer is SIGKILLed at random moments and restarted
  (static group membership, so the restart takes its partitions back at once). Lost must be 0 (at least once).
- ``exactly_once``: the same with ``--delivery exactly_once``; a ``read_committed`` reader must see every
  correlation ID exactly once.
- ``rebalance``: a group scaled 1 -> 3 -> 1 mid-stream (dynamic membership, SIGTERM on scale-in). Lost 0.
- ``idle_takeover``: a member without partitions for ``--idle-s`` (120 s in the full run) takes over when the
  owner is SIGKILLed. Lost 0.
- ``outage``: the broker is stopped for ``--outage-s`` seconds mid-stream and restarted with its data. The consumer
  must recover by itself (or exit non-zero, and is then restarted as an orchestrator would). Lost 0; /readyz 503
  within ``READY_BOUND_S`` of the cut and 200 again after it; at most ``OUTAGE_LOG_LINES`` log lines meanwhile,
  one of them "cluster unreachable" and one "reachable again".
- ``dlq_missing``: the dead-letter topic does not exist (the consumer is told to start anyway,
  ``--allow-auto-create-topics``, on a broker that creates no topics: as if it had been deleted); the offset must
  not be committed past the poison record; once the topic is created the dead letter lands there exactly once.
- ``poison``: every poison kind of :mod:`producer_tools.poison` plus oversized values, repeated and non-UTF-8
  header values, interleaved with valid records; every bad one must be dead-lettered with its reason and every
  good one answered, without the consumer ever exiting.
- ``graceful``: SIGTERM under load must exit 0 within the grace; after a restart nothing is lost.
- ``slow_model`` (in process): batches that run longer than the session timeout; the member must stay in the
  group (one assignment only) and answer everything.
- ``backlog``: ``--backlog`` records (1,000,000 in the full run) waiting before the consumer starts; prints the
  consumer's peak resident memory (bounded by ``max_in_flight_rows`` and the fetch buffers) and its throughput.
- ``compression_bomb``: a zstd batch of 2,000 MiB of zeros and 300 zstd records of 20 MiB of zeros each (a few KB on
  the wire; 30 in the quick run), then valid requests, read by a consumer under a 1.5 GiB data limit: every bomb is
  dead-lettered ``too_large``, every valid request answered, and the consumer never exits.
- ``leader_kill``, ``rolling_restart``, ``txn_broker_kill`` (on the 3-node cluster, an at_least_once and an
  exactly_once group side by side): a partition leader SIGKILLed, every node restarted in turn, the transaction
  coordinator SIGKILLed, all under load; lost 0, no exactly-once duplicate, answers resume within
  :data:`harness.faults.cluster.RESUME_BOUND_S` (:mod:`harness.faults.cluster`).

- ``net_partition``, ``net_one_way``, ``net_slow``, ``net_lossy`` (consumers in their own network namespace behind
  a veth link; needs root, skipped otherwise): the link cut both ways, cut broker -> consumer only, throttled, and
  made slow and lossy (50 +- 10 ms, 1 % loss each way, :mod:`harness.impair`), under load; during a cut
  ``/readyz`` and ``/healthz`` must fail and after it recover without a restart (:mod:`harness.faults.network`).
- ``steps_alo_dynamic``, ``steps_eos_dynamic``, ``steps_alo_static``, ``steps_eos_static``,
  ``steps_eos_statefulset``: an open-loop load on 8 partitions while the group scales out, loses a member to
  ``kill -9``, rolls and scales in; per step the longest gap overall and per partition, p99 and the rebalances the
  stayers saw; targets judged in the full run only (:mod:`harness.faults.steps`).
- ``rollout_model_alo``, ``rollout_model_eos``: the same load while a group of 2 members serving digits (model
  version 1) is rolled over to a retrained digits (version 2) as the manifests' Deployment rolls (a new pod ready,
  then an old one SIGTERMed); the steps' figures plus the answers per model_version (:mod:`harness.faults.rollout`).
- ``tcp_reset``, ``slow_link`` (consumers connected through toxiproxy; skipped where it cannot be built): bursts of
  TCP resets on every consumer connection, and 50 +- 10 ms added each way, under load
  (:mod:`harness.faults.toxic`).

The modules: :mod:`~harness.faults.harness` (plan, rows, the harness), :mod:`~harness.faults.scenarios`
(single broker), :mod:`~harness.faults.steps` (scale steps), :mod:`~harness.faults.rollout` (model rollout),
:mod:`~harness.faults.cluster`, :mod:`~harness.faults.cli` (registry, run, table).
"""

from __future__ import annotations

from harness.faults.cli import SCENARIOS, main, run, table
from harness.faults.harness import MODEL, QUICK, Outcome, Plan

__all__ = ["MODEL", "QUICK", "SCENARIOS", "Outcome", "Plan", "main", "run", "table"]
