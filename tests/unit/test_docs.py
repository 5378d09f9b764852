"""The documentation follows the code: every setting with its default, every dead-letter reason with the functions
that assign it, every metric and every make target are on their pages (docs/), and the README stays a short front
page that opens with the two commands."""

from __future__ import annotations

import importlib
import math
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from consumer import fate
from consumer.config import Settings
from consumer.errors import DeadLetterReason
from consumer.ops.metrics import Metrics
from consumer.shadow.compare import Plan
from consumer.shadow.metrics import ShadowMetrics
from harness.bench import report
from scripts import settings_table
from scripts.settings_table import shown

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
README = (ROOT / "README.md").read_text()
SETTINGS_PAGE = (DOCS / "settings.md").read_text()
CONTRACT_PAGE = (DOCS / "record-contract.md").read_text()
OPERATIONS_PAGE = (DOCS / "operations.md").read_text()
COMMANDS_PAGE = (DOCS / "commands.md").read_text()


def table_rows(page: str, heading: str) -> list[list[str]]:
    """The cells of each body row of the first table after ``heading`` (a markdown heading line)."""
    rest = page[page.index(f"\n{heading}\n") :]
    rows: list[list[str]] = []
    for line in rest.splitlines()[1:]:
        if line.startswith("|"):
            rows.append([cell.strip() for cell in line.strip().strip("|").split("|")])
        elif rows:
            break
    return rows[2:] if rows and set(rows[1][0]) <= set("-:") else rows[1:]


# ------------------------------------------------------------------------------------------------ settings
@pytest.mark.parametrize("name", list(Settings.model_fields))
def test_every_setting_on_the_settings_page_with_default(name: str) -> None:
    field = Settings.model_fields[name]
    row = f"| `{name}` | `--{name.replace('_', '-')}` | `{shown(field.default)}` |"
    assert row in SETTINGS_PAGE, f"docs/settings.md lacks or misstates: {row}"


def test_settings_page_is_what_make_docs_writes() -> None:
    assert settings_table.rewrite(SETTINGS_PAGE) == SETTINGS_PAGE, "run make docs"


# ------------------------------------------------------------------------------------------------ reasons
REASON_ROWS = {row[0].strip("`"): row for row in table_rows(CONTRACT_PAGE, "## Dead-letter reasons")}


@pytest.mark.parametrize("reason", list(DeadLetterReason))
def test_every_dead_letter_reason_in_the_reasons_table(reason: DeadLetterReason) -> None:
    assert reason.value in REASON_ROWS, f"docs/record-contract.md: no row for {reason.value}"
    assert len(REASON_ROWS[reason.value]) == 4, "reason | when | assigned by | action"


@pytest.mark.parametrize("reason", list(DeadLetterReason))
def test_every_reason_has_its_action_in_the_fate_table_and_the_docs(reason: DeadLetterReason) -> None:
    """reason -> action: a new reason cannot land without its row in consumer.fate.REASONS and on the page."""
    assert reason in fate.REASONS, f"consumer/fate.py: REASONS has no action for {reason.value}"
    assert REASON_ROWS[reason.value][3] == f"`{fate.REASONS[reason].value}`", "docs/record-contract.md: action"


def test_reasons_table_holds_only_reasons() -> None:
    assert set(REASON_ROWS) == {r.value for r in DeadLetterReason}


def assigners() -> list[tuple[str, str]]:
    """(reason, dotted name) for every function named in the reasons table's "assigned by" column."""
    return [(reason, name) for reason, row in REASON_ROWS.items() for name in re.findall(r"`([a-z_][\w.]*)`", row[2])]


def resolve(dotted: str) -> Any:
    """The object ``dotted`` names: the longest importable module prefix, then attributes (class, method)."""
    parts = dotted.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        try:
            obj: Any = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError:
            continue
        for attr in parts[cut:]:
            if not hasattr(obj, attr):
                raise AttributeError(f"{dotted}: {'.'.join(parts[:cut])} has no {'.'.join(parts[cut:])}")
            obj = getattr(obj, attr)
        return obj
    raise ModuleNotFoundError(dotted)


def test_every_reason_names_who_assigns_it() -> None:
    named = {reason for reason, _ in assigners()}
    assert named == set(REASON_ROWS), f"reasons without an 'assigned by': {set(REASON_ROWS) - named}"


@pytest.mark.parametrize(("reason", "dotted"), assigners())
def test_every_assigner_in_the_reasons_table_exists(reason: str, dotted: str) -> None:
    """Names are in the layout of the "house" move (issue 25): this fails on the layout before it."""
    assert callable(resolve(dotted)), f"{reason}: {dotted} is not a function"


FAILURE_ROWS = {row[0].strip("`"): row for row in table_rows(CONTRACT_PAGE, "## When something fails")}


def test_every_failure_class_on_the_page_with_its_action() -> None:
    assert set(FAILURE_ROWS) == set(fate.FAILURES)
    for name, action in fate.FAILURES.items():
        assert FAILURE_ROWS[name][2].startswith(f"`{action.value}`"), f"docs/record-contract.md: {name}"


# ------------------------------------------------------------------------------------------------ metrics
def exposed_metric_names() -> list[str]:
    """Every metric family the consumer registers, by the name /metrics exposes (counters end in _total, an
    info in _info)."""
    registry = CollectorRegistry()
    Metrics(registry)
    ShadowMetrics(registry, Plan())  # with shadow_model_path set (consumer.shadow)
    suffix = {"counter": "_total", "info": "_info"}
    return [family.name + suffix.get(family.type, "") for family in registry.collect()]


def test_every_metric_in_the_metrics_table() -> None:
    names = exposed_metric_names()
    assert names, "no metrics registered"
    rows = {row[0].strip("`") for row in table_rows(OPERATIONS_PAGE, "## Metrics")}
    assert set(names) <= rows, f"docs/operations.md lacks: {sorted(set(names) - rows)}"
    assert rows <= set(names), f"docs/operations.md names metrics the consumer does not export: {rows - set(names)}"


# ------------------------------------------------------------------------------------------------ make
def documented_targets() -> list[str]:
    return re.findall(r"^([a-zA-Z0-9_-]+):.*## ", (ROOT / "Makefile").read_text(), flags=re.M)


def test_make_help_lists_every_documented_target_with_variables_expanded() -> None:
    if shutil.which("make") is None:
        pytest.skip("make is not installed")
    documented = documented_targets()
    listed = subprocess.run(["make", "-s", "help"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    assert "k8s" in documented
    for target in documented:
        assert f"make {target} " in listed, target
    assert "$(" not in listed


@pytest.mark.parametrize("target", [t for t in documented_targets() if t != "help"])
def test_every_make_target_on_the_commands_page(target: str) -> None:
    assert f"`make {target}`" in COMMANDS_PAGE, f"docs/commands.md: make {target}"


# ------------------------------------------------------------------------------------------------ README
def test_readme_opens_with_the_two_commands() -> None:
    head = "\n".join(README.splitlines()[:20])
    assert "make demo" in head
    assert "make test" in head


def test_readme_is_a_short_front_page() -> None:
    assert len(README.splitlines()) <= 120, "the README links to docs/; the rest belongs there"


def test_readme_links_to_pages_that_exist() -> None:
    links = re.findall(r"\]\((docs/[^)#]+)(?:#[^)]*)?\)", README)
    assert len(links) >= 10
    for link in links:
        assert (ROOT / link).is_file(), link


def test_every_page_is_in_the_navigation() -> None:
    nav = (ROOT / "mkdocs.yml").read_text()
    for page in DOCS.glob("*.md"):
        assert f": {page.name}" in nav, f"mkdocs.yml nav lacks {page.name}"


# ------------------------------------------------------------------------------------------------ benchmarks
RUN = {
    "model": "digits",
    "mode": "streaminfer",
    "setting": "b64/d5ms",
    "records": 50000,
    "throughput_rps": 16672.4,
    "p50_ms": 13.2,
    "p99_ms": math.nan,
    "cpu_pct": 95.0,
    "peak_rss_mib": 114.0,
    "extra": {"mean_batch_rows": 48.0},
}


def test_benchmarks_page_has_the_generated_block() -> None:
    text = report.check_docs(DOCS / "benchmarks.md")
    block = text[text.index(report.DOCS_BEGIN) : text.index(report.DOCS_END)]
    assert "\n| model | mode | setting | records | rec/s |" in block
    assert "\nbench: digits_vs_passthrough=" in block
    assert "\n**Reading this run**" in block  # generated with the table,
    assert "\n- **JSON events**" in block  # the events rows included
    after = text[text.index(report.DOCS_END) :]
    assert not re.search(r"\d{2},\d{3}|\b0\.\d\d\b", after), "docs/benchmarks.md: a run's figure outside the block"
    for plot in re.findall(r"\]\((bench/[^)]+)\)", block):
        assert (DOCS / plot).is_file(), plot


def test_make_bench_rewrites_only_the_generated_block(tmp_path: Path) -> None:
    page = tmp_path / "docs" / "benchmarks.md"
    page.parent.mkdir()
    page.write_text(f"# Benchmarks\n\nmethod\n\n{report.DOCS_BEGIN}\nold figures\n{report.DOCS_END}\n\nreading\n")
    plot = tmp_path / "throughput.png"
    plot.write_bytes(b"png")
    result = {"machine": {"cpus": 2}, "runs": [RUN]}
    report.write_docs(page, result, ["bench: digits_vs_passthrough=0.57"], [plot], "2026-12-02")
    text = page.read_text()
    assert text.startswith("# Benchmarks\n\nmethod\n\n<!-- bench:begin -->\nLatest run: `make bench` on 2026-12-02, 2 ")
    assert text.endswith("<!-- bench:end -->\n\nreading\n")
    assert "old figures" not in text
    assert "| digits | streaminfer | b64/d5ms | 50000 | 16672 | 13 |  | 95 |  | 114 | 48.0 |" in text
    assert "```text\nbench: digits_vs_passthrough=0.57\n```" in text
    assert "![throughput and p99 per setting](bench/throughput.png)" in text
    assert (page.parent / "bench" / "throughput.png").read_bytes() == b"png"


def test_make_bench_refuses_a_page_without_markers_before_it_runs(tmp_path: Path) -> None:
    page = tmp_path / "benchmarks.md"
    page.write_text("# Benchmarks\n")
    with pytest.raises(SystemExit, match="bench:begin"):
        report.check_docs(page)
    with pytest.raises(SystemExit, match="does not exist"):
        report.check_docs(tmp_path / "missing.md")


def test_the_architecture_page_names_every_consumer_module() -> None:
    page = (DOCS / "architecture.md").read_text()
    modules = sorted(
        p.relative_to(ROOT).as_posix() for p in (ROOT / "consumer").rglob("*.py") if p.name != "__init__.py"
    )
    assert len(modules) > 40
    assert [m for m in modules if f"`{m}`" not in page] == []


# ------------------------------------------------------------------------------------------------ events
def test_the_events_page_shows_the_mapping_file_it_runs() -> None:
    page = (DOCS / "events.md").read_text()
    mapping = (ROOT / "models" / "breast_cancer" / "mapping.yaml").read_text()
    assert f"```yaml\n{mapping}```" in page, "docs/events.md: the mapping example is models/breast_cancer/mapping.yaml"
    assert "--input-mapping models/breast_cancer/mapping.yaml" in page


@pytest.mark.parametrize("name", ["events.md", "rollout.md"])
def test_each_walkthrough_block_starts_what_it_uses(name: str) -> None:
    """Each sh block of the events and rollout walkthroughs runs alone in a fresh shell: it sets every variable it
    reads."""
    page = (DOCS / name).read_text()
    blocks = re.findall(r"```sh\n(.*?)```", page, flags=re.S)
    assert len(blocks) >= 3
    for block in blocks:
        used = set(re.findall(r"\$\{?([A-Z_]+)", block))
        assigned = set(re.findall(r"^([A-Z_]+)=", block, flags=re.M))
        assert used <= assigned, f"docs/{name}: a block reads {used - assigned} without setting it:\n{block}"


# ------------------------------------------------------------------------------------------------ words
GLOSSARY_TERMS = (
    "consumer-group", "offset", "dead-letter", "micro-batch", "execution-provider", "schema-id", "subject",
    "topicnamestrategy", "writer-schema-reader-schema", "ccompat", "oip",
)  # fmt: skip


@pytest.mark.parametrize("anchor", GLOSSARY_TERMS)
def test_every_glossary_term_is_on_the_glossary_and_linked_from_a_page(anchor: str) -> None:
    glossary = (DOCS / "glossary.md").read_text()
    headings = {re.sub(r"[^a-z0-9]+", "-", h.lower()).strip("-") for h in re.findall(r"^### (.+)$", glossary, re.M)}
    assert anchor in headings, f"docs/glossary.md: no heading for #{anchor}"
    pages = [p for p in DOCS.glob("*.md") if p.name != "glossary.md"]
    assert any(f"(glossary.md#{anchor})" in p.read_text() for p in pages), f"no page links glossary.md#{anchor}"


def test_the_events_page_is_in_both_reading_lists() -> None:
    index = (DOCS / "index.md").read_text()
    quickstart = (DOCS / "quickstart.md").read_text()
    assert "[Scoring an existing topic](events.md)" in index.split("## Where to read")[1]
    assert "[Scoring an existing topic](events.md)" in quickstart.split("## Where next")[1]
