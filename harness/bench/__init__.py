"""``make bench`` (``python -m harness.bench``): streaminfer against its ceilings and its naive baseline, one run.

Modes, each run as its own process against the same real broker, on the same backlog of requests:

- **passthrough**, the Kafka client's ceiling: the same aiokafka client, no streaminfer code: fetch, ``orjson.loads``
  each value, a fixed small answer with the same headers into producer batches (the client's batch API and its own
  partitioner), commit each chunk once acknowledged (:mod:`harness.bench.workers`);
- **decode-encode**: streaminfer's codec without the model (decode and validate, encode a zero response, ``send``
  per record), so the codec's own cost stays visible;
- **naive**: one record -> decode -> ``session.run`` at batch 1 -> produce -> wait for the ack -> commit: the
  straightforward port of notebook code (time-boxed: it is slow);
- **streaminfer**: ``streaminfer-consumer`` at default settings and over a sweep of max_batch_size /
  max_batch_delay_ms, with binary-extension requests instead of JSON, and with ``--delivery exactly_once``
  (results read with ``read_committed``);
- **bare ORT**: ONNX Runtime alone over the same tensors at the same batch size, in this process: the compute
  ceiling (MiniLM: texts sorted by length and padded per batch, the fastest of three batchings: ``--minilm-batch``
  rows, half of them, and ``--minilm-batch`` rows capped at 1,024 padded tokens; on CPU the smaller ones win);
- **events** (:mod:`harness.bench.events`): the breast-cancer events as JSON and as registry-framed Avro, served by
  the tabular model with enriched results, against the same client-only ceiling decoding the same events.

Closed loop: a mode drains a backlog; throughput = results / (last result's append time - first result's), from
the broker's LogAppendTime on the results topic, records/s. Open loop: requests are offered at a fixed rate for a
few seconds; latency = result append time - request timestamp (producer CreateTime), p50/p95/p99 in ms. Each
sweep setting is timed at 20 % of the passthrough throughput (one rate for all settings); the default settings
at 25/50/75 % of their own closed-loop throughput; a lone record (one request at a time) too.
CPU % (of one core; 200 % = both of 2 cores) and peak RSS are read from the mode's process with psutil
(sampled every 0.1 s), between readiness and the last result. streaminfer's batch-size histogram and its time per
record in each stage (``streaminfer_stage_seconds_total``: fetch, decode, assemble, infer, encode, produce,
commit) come from its ``/metrics``.

R1, R4 and the events ratios compare runs made one after another: a shared machine's speed drifts by tens of
percent over minutes, so passthrough, streaminfer and streaminfer-eos (default settings), and each events format's
ceiling and streaminfer, run ``--rounds`` times (default 5) back to back in a rotated order, after every backlog was
written and the broker warmed by ``--warmup`` untimed passthrough passes (:data:`harness.bench.plan.WARMUP_PASSES`),
and each ratio is the median of its per-round ratios, printed with its spread (largest minus smallest; all of them
kept in ``bench.json`` under ``rounds`` and ``spreads``); the digits rounds drain a larger backlog
(``--round-records``, 150,000) than the sweep, so that a burst of a shared machine's other work weighs less. The
CPU the rest of the machine used during each run is measured (:class:`harness.bench.measure.OtherWork`) and printed
beside each ratio's rounds and last (``other_cpu_pct``): two runs made under different loads need not agree. R2
uses the sweep's default run; R3 is a median over rounds too (round 1: the first runs).

Output: a table on stdout, ``bench.json`` and PNG plots in ``--out`` (default ``bench-results/``), and last (one
line, every word ``key=value``, each ratio over rounds followed by its ``_spread``)::

    bench: digits_vs_passthrough=R1 digits_vs_passthrough_spread=S digits_vs_naive=R2 minilm_vs_bare_ort=R3 ...
    digits_eos_vs_alo=R4 ... vision_vs_ceiling=R5 ... events_vs_passthrough=R6 ... avro_events_vs_passthrough=R7 ...
    digits_cpu_vs_passthrough=C1 ... events_cpu_vs_passthrough=C2 ... avro_events_cpu_vs_passthrough=C3 ...
    digits_eos_cpu_vs_alo=C4 ... wide_digits_vs_passthrough=... wide_digits_cpu_vs_passthrough=...
    wide_digits_eos_cpu_vs_alo=... first_answer_alo_s=T ... first_answer_eos_s=T ... wide_first_answer_alo_s=...
    wide_first_answer_eos_s=... other_cpu_pct=P

The ``*_cpu_*`` ratios are the ceiling's CPU time per record over streaminfer's in the same round (exactly_once:
at_least_once's over exactly_once's), each process's own CPU time (``/proc/<pid>/stat`` utime + stime, read from its
start every 0.1 s and interpolated) at its first and last result's append time over the results appended between:
the same window as its throughput. The ``wide_*`` keys are the digits rounds again (``--wide-rounds``) on a requests
topic of ``--wide-partitions`` (128) partitions; ``first_answer_*_s`` the time from the assignment to the first
answer (:meth:`harness.bench.plan.Bench.closed_streaminfer`), medians over the rounds.

Models: digits (``models/digits/build.py``) and MiniLM (``models/minilm/build.py`` output folder, ``--minilm-dir``;
texts are docstrings of Python's standard library, real English of every length). ``--skip-minilm`` leaves MiniLM
out (R3 is then ``nan``). ``--quick`` runs small sizes (used by the test suite).
"""

from harness.bench.cli import main
from harness.bench.data import DIGITS_MODEL, corpus, sorted_batches
from harness.bench.measure import latency_pcts, mean_batch, throughput
from harness.bench.report import summary_line

__all__ = [
    "DIGITS_MODEL",
    "corpus",
    "latency_pcts",
    "main",
    "mean_batch",
    "sorted_batches",
    "summary_line",
    "throughput",
]
