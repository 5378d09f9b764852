"""Prometheus metrics, registered on a registry passed in (never the global one).

Units are in the names (``_seconds``, ``_rows``, ``_bytes``); labels come from fixed sets only
(outcome, dead-letter reason, commit failure class), never from record content. Buckets are named constants.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Iterator, Sequence

import numpy as np
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Info, ProcessCollector
from prometheus_client.core import GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.utils import floatToGoString

from consumer.errors import DeadLetterReason

#: Batch sizes in rows: powers of two up to 1024.
BATCH_ROWS_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
#: Sub-millisecond to seconds, for preprocessing, queue wait and inference, seconds.
STAGE_SECONDS_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
#: Time of one rebalance phase (revoke, join, assign), seconds: tens of milliseconds when quick, a session timeout
#: when a member left without a word.
REBALANCE_SECONDS_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 120.0)
#: The phases of a rebalance (``streaminfer_rebalance_seconds{phase}``, :mod:`consumer.kafka.rebalance`): revoke
#: (the revoke handler), join (JoinGroup and SyncGroup), assign (the assignment handler; exactly_once: producers).
REBALANCE_PHASES = ("revoke", "join", "assign")
#: What happened to a transactional producer at a rebalance (``streaminfer_transactional_producers_total{event}``):
#: opened (a partition new to this member), kept (a partition the member got back), closed (one it lost).
PRODUCER_EVENTS = ("opened", "kept", "closed")
#: End-to-end record age at publish, seconds.
AGE_SECONDS_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)

OUTCOMES = ("result", "dead_letter", "tombstone")
#: Where a record's time goes on the consumer (``streaminfer_stage_seconds_total{stage}``): fetch (the Kafka
#: client's fetch call, record parsing included), decode (decode and validate), assemble (input tensors of a
#: batch), infer (ONNX Runtime, in its thread), encode (responses), produce (answers into producer batches and
#: handed to the client), commit (offset commits or transaction commits).
STAGES = ("fetch", "decode", "assemble", "infer", "encode", "produce", "commit")


#: Padded / real tokens of a sequence batch: 1 = no padding; bucketing by length keeps it below 2.
PADDING_RATIO_BUCKETS = (1.0, 1.1, 1.25, 1.5, 2.0, 3.0, 5.0, 10.0)


class Metrics:
    """All of streaminfer's metrics on one registry.

    Args:
        registry: where to register; tests pass a fresh ``CollectorRegistry``.
    """

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self.batch_rows = Histogram(
            "streaminfer_batch_rows",
            "Rows per micro-batch sent to ONNX Runtime.",
            buckets=BATCH_ROWS_BUCKETS,
            registry=registry,
        )
        self.batch_padding_ratio = Histogram(
            "streaminfer_batch_padding_ratio",
            "Sequence models: padded tokens / real tokens per micro-batch (1 = no padding).",
            buckets=PADDING_RATIO_BUCKETS,
            registry=registry,
        )
        self.batch_queue_wait_seconds = Histogram(
            "streaminfer_batch_queue_wait_seconds",
            "Time the oldest record of a batch waited in the batcher, seconds.",
            buckets=STAGE_SECONDS_BUCKETS,
            registry=registry,
        )
        self.preprocess_seconds = BulkHistogram(
            "streaminfer_preprocess_seconds",
            "Decode and validation time of one record (a fetched chunk's time over its records), seconds.",
            buckets=STAGE_SECONDS_BUCKETS,
            registry=registry,
        )
        self.image_seconds = BulkHistogram(
            "streaminfer_image_preprocess_seconds",
            "Image models: decode, resize and normalisation time of one image, on a decode thread, seconds.",
            buckets=STAGE_SECONDS_BUCKETS,
            registry=registry,
        )
        self.inference_seconds = Histogram(
            "streaminfer_inference_seconds",
            "ONNX Runtime compute time of one batch, seconds.",
            buckets=STAGE_SECONDS_BUCKETS,
            registry=registry,
        )
        self.record_age_seconds = BulkHistogram(
            "streaminfer_record_age_seconds",
            "Age of a record when its answer is acknowledged: now minus the record timestamp, seconds.",
            buckets=AGE_SECONDS_BUCKETS,
            registry=registry,
        )
        self.stage_seconds = Counter(
            "streaminfer_stage_seconds",
            "Time spent per pipeline stage (fetch, decode, assemble, infer, encode, produce, commit), seconds.",
            ["stage"],
            registry=registry,
        )
        self.records = Counter(
            "streaminfer_records",
            "Records answered, by outcome (tombstone: an event with a null value, forwarded unscored).",
            ["outcome"],
            registry=registry,
        )
        self.dead_letters = Counter(
            "streaminfer_dead_letters", "Dead letters written, by reason.", ["reason"], registry=registry
        )
        self.input_out_of_range = Counter(
            "streaminfer_input_out_of_range",
            "Records served with a value of this model input outside the validation record's observed range "
            "(validation_record set); counted, never dead-lettered.",
            ["input"],
            registry=registry,
        )
        self.in_flight_rows = Gauge(
            "streaminfer_in_flight_rows", "Rows fetched and not yet answered.", registry=registry
        )
        self.in_flight_bytes = Gauge(
            "streaminfer_in_flight_bytes",
            "Record key, value and header bytes fetched and not yet answered (limit: max_in_flight_bytes).",
            registry=registry,
        )
        self.commits = Counter("streaminfer_commits", "Successful offset commits.", registry=registry)
        self.commit_failures = Counter(
            "streaminfer_commit_failures", "Failed offset commits, by error class.", ["error"], registry=registry
        )
        self.produce_retries = Counter(
            "streaminfer_produce_retries", "Result or dead-letter writes retried after a failure.", registry=registry
        )
        self.retries = Counter(
            "streaminfer_retries",
            "Transient failures retried with backoff, by stage (inference: a micro-batch run again; produce: records "
            "written again) and reason (out_of_memory, or the Kafka error's class).",
            ["stage", "reason"],
            registry=registry,
        )
        self.batch_failures = Counter(
            "streaminfer_batch_failures",
            "Inference runs that failed and were bisected to isolate the culprit records.",
            registry=registry,
        )
        self.paused = Gauge(
            "streaminfer_partitions_paused",
            "1 while fetching is paused because in-flight rows are full.",
            registry=registry,
        )
        self.revoked_dropped = Counter(
            "streaminfer_revoked_records_dropped",
            "Queued records of revoked partitions dropped uncommitted (their new owner answers them).",
            registry=registry,
        )
        self.rebalances = Counter("streaminfer_rebalances", "Partition assignments received.", registry=registry)
        self.rebalance_seconds = Histogram(
            "streaminfer_rebalance_seconds",
            "Time of each phase of a rebalance: revoke (finishing the revoked partitions' work), join (JoinGroup and "
            "SyncGroup, waiting for the other members), assign (taking the new partitions; exactly_once: opening "
            "their transactional producers), seconds.",
            ["phase"],
            buckets=REBALANCE_SECONDS_BUCKETS,
            registry=registry,
        )
        self.transactional_producers = Counter(
            "streaminfer_transactional_producers",
            "exactly_once: transactional producers at rebalances, by event: opened (InitProducerId, fencing the "
            "partition's previous owner), kept (a partition this member got back), closed (a partition it lost).",
            ["event"],
            registry=registry,
        )
        self.consumer_lag = Gauge(
            "streaminfer_consumer_lag_records",
            "Log end offset minus the group's committed offset, per assigned partition, records.",
            ["topic", "partition"],
            registry=registry,
        )
        self.seconds_since_progress = Gauge(
            "streaminfer_seconds_since_progress",
            "Time since records were last fetched or offsets last committed, seconds.",
            registry=registry,
        )
        self.ready = Gauge("streaminfer_ready", "1 when /readyz answers 200.", registry=registry)
        self.asyncio_tasks = Gauge(
            "streaminfer_asyncio_tasks",
            "asyncio tasks alive in the consumer's event loop (flat in steady state; growth is a leak).",
            registry=registry,
        )
        self.kafka_reachable = Gauge(
            "streaminfer_kafka_reachable",
            "1 while the cluster answers metadata requests (checked every 5 s), 0 during an outage.",
            registry=registry,
        )
        self.schema_registry_reachable = Gauge(
            "streaminfer_schema_registry_reachable",
            "Avro events: 1 while the schema registry answers, 0 while records wait for it to answer again.",
            registry=registry,
        )
        self.model = Info("streaminfer_model", "Served model and active execution provider.", registry=registry)
        self.gpu_memory_used_bytes = Gauge(
            "streaminfer_gpu_memory_used_bytes",
            "GPU memory in use on the device ONNX Runtime runs on (NVML), bytes. Absent on CPU.",
            ["device"],
            registry=registry,
        )
        # process_cpu_seconds_total, process_resident_memory_bytes, ... (Linux /proc): the CPU per record the
        # gates (streaminfer-gates) read beside the records counted
        self.process = ProcessCollector(registry=registry)
        self.gpu_utilization = GpuUtilization(registry)
        for outcome in OUTCOMES:
            self.records.labels(outcome)
        for stage in STAGES:
            self.stage_seconds.labels(stage)
        for reason in DeadLetterReason:
            self.dead_letters.labels(reason.value)
        for phase in REBALANCE_PHASES:
            self.rebalance_seconds.labels(phase)
        for event in PRODUCER_EVENTS:
            self.transactional_producers.labels(event)

    def track_gpu_memory(
        self,
        device_index: int,
        read_used_bytes: Callable[[], float] | None = None,
        read_utilization: Callable[[], float] | None = None,
    ) -> bool:
        """Report ``streaminfer_gpu_memory_used_bytes{device}`` and ``streaminfer_gpu_utilization_ratio{device}``
        at scrape time through NVML (nvidia-ml-py).

        Args:
            device_index: the CUDA device ONNX Runtime uses.
            read_used_bytes: the memory reader (tests pass a fake); default NVML's ``nvmlDeviceGetMemoryInfo().used``.
            read_utilization: the utilisation reader, a ratio 0..1 (tests pass a fake); default NVML's
                ``nvmlDeviceGetUtilizationRates().gpu`` / 100 when the memory reader is NVML's, else none.

        Returns:
            False when NVML is not available (no NVIDIA driver), True otherwise.
        """
        if read_used_bytes is None:
            read_used_bytes = nvml_used_bytes_reader(device_index)
            if read_used_bytes is None:
                return False
            if read_utilization is None:
                read_utilization = nvml_utilization_reader(device_index)
        self.gpu_memory_used_bytes.labels(str(device_index)).set_function(read_used_bytes)
        self.gpu_utilization.track(device_index, read_utilization)
        return True


def nvml_used_bytes_reader(device_index: int) -> Callable[[], float] | None:
    """A function returning the device's used memory in bytes via NVML, or None when NVML cannot start."""
    try:
        import pynvml

        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(device_index)
    except Exception:  # noqa: BLE001 (NVMLError, ImportError: no driver, no GPU)
        return None
    return lambda: float(pynvml.nvmlDeviceGetMemoryInfo(handle).used)


def nvml_utilization_reader(device_index: int) -> Callable[[], float] | None:
    """A function returning the device's utilisation (NVML ``nvmlDeviceGetUtilizationRates().gpu``: the share of
    the driver's last sample period, 1/6 s to 1 s, in which a kernel ran, 0..100 %) as a ratio 0..1, or None when
    NVML cannot start."""
    try:
        import pynvml

        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(device_index)
    except Exception:  # noqa: BLE001 (NVMLError, ImportError: no driver, no GPU)
        return None
    return lambda: float(pynvml.nvmlDeviceGetUtilizationRates(handle).gpu) / 100.0


class GpuUtilization:
    """``streaminfer_gpu_utilization_ratio{device}``: GPU busy share (0..1, NVML), read at scrape time. A device
    whose read fails (no driver, a lost GPU, NVML's errors) gives no sample, never a failed scrape.

    Args:
        registry: where to register.
    """

    NAME = "streaminfer_gpu_utilization_ratio"
    DOC = (
        "Share of NVML's last sample period (1/6 s to 1 s) in which a kernel ran on the GPU ONNX Runtime uses, 0..1. "
        "Absent on CPU."
    )

    def __init__(self, registry: CollectorRegistry) -> None:
        self._readers: dict[str, Callable[[], float]] = {}
        registry.register(self)

    def track(self, device_index: int, read_ratio: Callable[[], float] | None) -> bool:
        """Read ``read_ratio`` (a ratio 0..1; tests pass a fake) for ``device_index`` at every scrape; False (and
        nothing tracked) when it is None."""
        if read_ratio is None:
            return False
        self._readers[str(device_index)] = read_ratio
        return True

    def describe(self) -> list[Metric]:
        """The metric's name and type, for the registry."""
        return [GaugeMetricFamily(self.NAME, self.DOC, labels=["device"])]

    def collect(self) -> Iterator[Metric]:
        """One sample per device whose read answers."""
        family = GaugeMetricFamily(self.NAME, self.DOC, labels=["device"])
        for device, read in self._readers.items():
            try:
                value = read()
            except Exception:  # noqa: BLE001, S112 (NVMLError and the like: this scrape has no sample)
                continue
            family.add_metric([device], value)
        yield family


class BulkHistogram:
    """A Prometheus histogram observed many values at a time (one numpy pass per batch instead of one locked
    update per record). Exposed exactly like ``prometheus_client.Histogram``: ``<name>_bucket{le}``,
    ``<name>_count``, ``<name>_sum``.

    Args:
        name: metric name (units in it).
        documentation: help text.
        buckets: upper bounds, increasing; ``+Inf`` is added.
        registry: where to register.
    """

    def __init__(self, name: str, documentation: str, buckets: Sequence[float], registry: CollectorRegistry) -> None:
        self._name = name
        self._documentation = documentation
        self._upper = np.array([*buckets, math.inf], dtype=np.float64)
        self._counts = np.zeros(len(self._upper), dtype=np.int64)
        self._sum = 0.0
        self._lock = threading.Lock()
        registry.register(self)

    def observe_many(self, values: Sequence[float] | np.ndarray) -> None:
        """Count every value of ``values``."""
        arr = np.asarray(values, dtype=np.float64)
        if arr.size == 0:
            return
        counts = np.bincount(np.searchsorted(self._upper, arr, side="left"), minlength=len(self._upper))
        total = float(arr.sum())
        with self._lock:
            self._counts += counts
            self._sum += total

    def observe(self, value: float, count: int = 1) -> None:
        """Count ``value`` ``count`` times (e.g. a chunk's mean time per record, once per record)."""
        if count <= 0:
            return
        index = int(np.searchsorted(self._upper, value, side="left"))
        with self._lock:
            self._counts[index] += count
            self._sum += value * count

    def describe(self) -> list[Metric]:
        """The metric's name and type, for the registry."""
        return [HistogramMetricFamily(self._name, self._documentation)]

    def collect(self) -> Iterator[Metric]:
        """The current buckets (cumulative), count and sum."""
        with self._lock:
            cumulative = np.cumsum(self._counts).tolist()
            total = self._sum
        bounds = [floatToGoString(le) for le in self._upper.tolist()]  # type: ignore[no-untyped-call]
        buckets = list(zip(bounds, cumulative, strict=True))
        yield HistogramMetricFamily(self._name, self._documentation, buckets=buckets, sum_value=total)
