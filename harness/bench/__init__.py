"""``streaminfer-bench`` / ``make bench``: streaminfer against its ceilings and its naive baseline, one broker, one run.

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
  rows, half of them, and ``--minilm-batch`` rows capped at 1,024 padded tokens; on CPU the smaller ones win).

Closed loop: a mode drains a backlog; throughput = results / (last result's append time - first result's), from
the broker's LogAppendTime on the results topic, records/s. Open loop: requests are offered at a fixed rate for a
few seconds; latency = result append time - request timestamp (producer CreateTime), p50/p95/p99 in ms. Each
sweep setting is timed at 20 % of the passthrough throughput (one rate for all settings); the default settings
at 25/50/75 % of their own closed-loop throughput; a lone record (one request at a time) too.
CPU % (of one core; 200 % = both of 2 cores) and peak RSS are read from the mode's process with psutil
(sampled every 0.1 s), between readiness and the last result. streaminfer's batch-size histogram and its time per
record in each stage (``streaminfer_stage_seconds_total``: fetch, decode, assemble, infer, encode, produce,
commit) come from its ``/metrics``.

R1 and R4 compare runs made one after another: a shared machine's speed drifts by tens of percent over minutes,
so passthrough, streaminfer and streaminfer-eos (default settings) run ``--rounds`` times (default 3) back to back
in a rotated order, and each ratio is the median of its per-round ratios (all of them are printed and kept in
``bench.json`` under ``rounds``). R2 and R3 use round 1 (their gaps are far larger than the drift).

Output: a table on stdout, ``bench.json`` and PNG plots in ``--out`` (default ``bench-results/``), and last::

    bench: digits_vs_passthrough=R1 digits_vs_naive=R2 minilm_vs_bare_ort=R3 digits_eos_vs_alo=R4

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
