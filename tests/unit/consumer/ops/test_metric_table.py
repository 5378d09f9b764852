"""The metrics table (consumer/ops/metrics.py): the same families as before it was a table, and a table other
modules extend on the same registry.

``metric_families.txt`` is the exposition of ``Metrics`` on a fresh registry as main 3cc2ca2 wrote it (before the
table), every line without its value, sorted, ``process_*`` left out (the host's): HELP and TYPE of every family,
every sample that exists from the start (pre-created label values, histogram buckets). Names, help text, labels and
buckets are contracts (docs/operations.md): a change here is a change for every dashboard and alert.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest

from consumer.ops.metrics import BulkHistogram, Declared, Metrics, MetricTable, bulk_histogram, counter, gauge

FAMILIES = Path(__file__).with_name("metric_families.txt")


def exposition(registry: CollectorRegistry) -> list[str]:
    """The exposition's lines without values, sorted, ``process_*`` left out."""
    lines = []
    for line in generate_latest(registry).decode().splitlines():
        if line.startswith("process_") or " process_" in line:
            continue
        lines.append(line if line.startswith("#") else line.rsplit(" ", 1)[0])
    return sorted(lines)


def test_the_table_exposes_the_families_main_exposed_before_it() -> None:
    got = exposition(Metrics(CollectorRegistry()).registry)
    want = FAMILIES.read_text().splitlines()
    assert [line for line in got if line not in want] == []
    assert [line for line in want if line not in got] == []
    assert got == want


def test_every_row_is_an_attribute_of_its_kind_and_names_are_unique() -> None:
    metrics = Metrics(CollectorRegistry())
    rows = Metrics.rows()
    assert len({r.name for r in rows}) == len(rows)
    families = {f.name for f in metrics.registry.collect() if not f.name.startswith("process_")}
    assert families - {r.name for r in rows} == {"streaminfer_gpu_utilization_ratio"}  # read at scrape time
    kinds = {"counter": Counter, "gauge": Gauge, "bulk_histogram": BulkHistogram}
    for row in rows:
        metric = getattr(metrics, row.attr)
        assert metric is metrics.__dict__[row.attr]  # the instance's own: no descriptor call on the hot path
        if row.kind in kinds:
            assert isinstance(metric, kinds[row.kind]), row
    assert Metrics.records is Metrics.__dict__["records"]  # on the class: the row itself
    assert Metrics.records.values == ("result", "dead_letter", "tombstone")


class ExtraMetrics(MetricTable):
    """A table of another module, as shadow scoring declares its own."""

    answered = counter("streaminfer_example_answered", "Records the example answered.", ["outcome"], ["a", "b"])
    pending = gauge("streaminfer_example_pending", "Batches the example holds.")
    seconds = bulk_histogram("streaminfer_example_seconds", "Example time per record, seconds.", (0.1, 1.0))


def test_another_module_extends_the_registry_with_a_table_of_its_own() -> None:
    registry = CollectorRegistry()
    Metrics(registry)
    extra = ExtraMetrics(registry)
    extra.answered.labels("a").inc(3)
    extra.pending.set(2)
    extra.seconds.observe_many([0.05, 0.5, 5.0])
    assert registry.get_sample_value("streaminfer_example_answered_total", {"outcome": "a"}) == 3
    assert registry.get_sample_value("streaminfer_example_answered_total", {"outcome": "b"}) == 0
    assert registry.get_sample_value("streaminfer_example_pending") == 2
    assert registry.get_sample_value("streaminfer_example_seconds_bucket", {"le": "1.0"}) == 2
    assert registry.get_sample_value("streaminfer_records_total", {"outcome": "result"}) == 0
    assert [r.attr for r in ExtraMetrics.rows()] == ["answered", "pending", "seconds"]


def test_a_name_registered_twice_is_refused() -> None:
    registry = CollectorRegistry()
    Metrics(registry)

    class Clash(MetricTable):
        again = counter("streaminfer_records", "Registered twice.")

    with pytest.raises(ValueError, match="streaminfer_records"):
        Clash(registry)


def test_a_subclass_table_keeps_its_bases_rows_first() -> None:
    class More(ExtraMetrics):
        later = gauge("streaminfer_example_later", "Declared in a subclass.")

    assert [r.attr for r in More.rows()] == ["answered", "pending", "seconds", "later"]
    more = More(CollectorRegistry())
    more.later.set(1)
    assert more.registry.get_sample_value("streaminfer_example_later") == 1


@pytest.mark.parametrize(
    ("row", "message"),
    [
        (lambda: Declared("counter", "x", "h", ("a", "b"), values=("v",)), "exactly one label"),
        (lambda: Declared("gauge", "x", "h", buckets=(1.0,)), "buckets are for histograms"),
        (lambda: Declared("histogram", "x", "h"), "buckets are for histograms"),
        (lambda: Declared("bulk_histogram", "x", "h", ("a",), (1.0,)), "no labels"),
    ],
)
def test_a_malformed_row_is_refused_when_declared(row: object, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        row()  # type: ignore[operator]


def test_a_row_read_off_an_unregistered_instance_says_so() -> None:
    table = ExtraMetrics.__new__(ExtraMetrics)
    with pytest.raises(AttributeError, match=r"'pending'.*not registered"):
        _ = table.pending
