"""The benchmark's output: a table, the per-stage costs, plots, strict JSON, the summary line, and the generated
block of the documentation's benchmarks page (``make bench`` rewrites what lies between :data:`DOCS_BEGIN` and
:data:`DOCS_END` in ``docs/benchmarks.md``; the hand-written text around it stays)."""

from __future__ import annotations

import math
import re
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from harness.bench.plan import RATIOS, SPREAD_SUFFIX
from harness.bench.reading import reading

#: The closed-loop modes drawn in throughput.png.
CLOSED_MODES = (
    "naive",
    "passthrough",
    "decode-encode",
    "streaminfer",
    "streaminfer-binary",
    "streaminfer-eos",
    "bare-ort",
)

#: The markers of the generated block in docs/benchmarks.md.
DOCS_BEGIN, DOCS_END = "<!-- bench:begin -->", "<!-- bench:end -->"

#: The plots' width, inches at :data:`PLOT_DPI`: 1,001 pixels, about a page's width, so labels stay legible.
PLOT_WIDTH_IN, PLOT_DPI = 9.1, 110
#: The plots' captions on the benchmarks page.
PLOT_CAPTIONS = {"throughput.png": "throughput and p99 per setting", "latency.png": "latency against offered load"}


def table(runs: Sequence[dict[str, Any]]) -> str:
    """The runs as a fixed-width text table."""
    head = (
        f"{'model':<11} {'mode':<19} {'setting':<17} {'records':>8} {'rec/s':>9} {'p50 ms':>7} {'p95 ms':>7} "
        f"{'p99 ms':>7} {'CPU %':>6} {'CPU us/rec':>10} {'RSS MiB':>8} {'rows/batch':>10}"
    )
    lines = [head, "-" * len(head)]
    for r in runs:
        mean = r["extra"].get("mean_batch_rows", math.nan)
        lines.append(
            f"{r['model']:<11} {r['mode']:<19} {r['setting']:<17} {r['records']:>8} {r['throughput_rps']:>9.0f} "
            f"{r['p50_ms']:>7.1f} {r['p95_ms']:>7.1f} {r['p99_ms']:>7.1f} {r['cpu_pct']:>6.0f} "
            f"{_num(r.get('cpu_us_per_record')):>10.1f} "
            f"{r['peak_rss_mib']:>8.0f} {mean:>10.1f}"
        )
    return "\n".join(lines)


def plots(result: dict[str, Any], out: Path) -> list[Path]:
    """throughput.png (digits: rec/s per mode and setting, with the ceilings) and latency.png (p50/p95/p99
    against offered load). Returns the files written."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = [r for r in result["runs"] if r["model"] == "digits"]
    closed = [r for r in runs if r["mode"] in CLOSED_MODES and not r["extra"].get("round")]  # rounds: in the table
    # One horizontal bar per run, its name on the left in full: the figure is PLOT_WIDTH_IN wide whatever the
    # number of runs (about 1,000 px), and grows in height instead (a quarter inch a run).
    if not closed:
        return []  # no digits run (--skip-digits, --only-shadow): nothing to draw, not an empty log axis
    labels = [f"{r['mode']} {r['setting']}" for r in closed]
    fig, ax = plt.subplots(figsize=(PLOT_WIDTH_IN, 1.6 + 0.27 * len(closed)))
    colors = {"naive": "tab:red", "passthrough": "tab:gray", "decode-encode": "tab:olive", "bare-ort": "tab:green"}
    rows = range(len(closed))
    ax.barh(rows, [r["throughput_rps"] for r in closed], color=[colors.get(r["mode"], "tab:blue") for r in closed])
    ax.set_yticks(list(rows), labels, fontsize=9)
    ax.invert_yaxis()
    ax.set_xscale("log")
    ax.set_xlabel("throughput, records/s (log; bars)", fontsize=10)
    ax.set_title("digits: closed-loop throughput (bars) and open-loop p99 (dots)", fontsize=11)
    timed = [(i, r["p99_ms"]) for i, r in enumerate(closed) if math.isfinite(r["p99_ms"])]
    if timed:
        rate = next((r["extra"].get("latency_at_rps") for r in closed if "latency_at_rps" in r["extra"]), None)
        twin = ax.twiny()
        twin.plot([p for _, p in timed], [i for i, _ in timed], "o", color="black")
        twin.set_xscale("log")
        twin.set_xlabel(f"p99 latency at {rate:.0f} rec/s, ms (log; dots)" if rate else "p99 latency, ms (log; dots)")
    fig.tight_layout()
    paths = [out / "throughput.png"]
    fig.savefig(paths[0], dpi=PLOT_DPI)
    plt.close(fig)

    open_runs = [r for r in runs if r["mode"] == "open-loop"]
    if open_runs:
        fig, ax = plt.subplots(figsize=(PLOT_WIDTH_IN, 4.5))
        rates = [r["throughput_rps"] for r in open_runs]
        for key in ("p50_ms", "p95_ms", "p99_ms"):
            if not any(math.isfinite(r[key]) for r in open_runs):
                continue  # not measured: no empty legend entry
            ax.plot(rates, [r[key] for r in open_runs], marker="o", label=key.replace("_ms", ""))
        ax.set_xlabel("offered load, records/s")
        ax.set_ylabel("latency, ms (result append - request timestamp)")
        ax.set_title("digits: latency against offered load (streaminfer defaults)")
        ax.legend()
        fig.tight_layout()
        paths.append(out / "latency.png")
        fig.savefig(paths[-1], dpi=PLOT_DPI)
        plt.close(fig)
    return paths


def strict_json(value: Any) -> Any:
    """``value`` with every NaN or infinity replaced by None (strict JSON has no NaN)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: strict_json(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [strict_json(v) for v in value]
    return value


def stage_line(run: dict[str, Any]) -> str:
    """Where a streaminfer run's time went per record, from its own ``streaminfer_stage_seconds_total``."""
    stages = run["extra"].get("stage_us", {})
    costs = " ".join(f"{stage}={us:.1f}" for stage, us in stages.items() if us is not None)
    return f"stages ({run['model']} {run['mode']} {run['setting']}), us/record: {costs}"


def summary_line(
    ratios: dict[str, float], spreads: dict[str, float] | None = None, other_cpu: float | None = None
) -> str:
    """The last line of the benchmark: ``bench: key=value ...``, one ``key=value`` per word: each ratio of
    :data:`~harness.bench.plan.RATIOS`, in order, and right after each one measured over rounds its
    ``<key>_spread`` (the largest minus the smallest per-round ratio) when ``spreads`` has it; last, when given,
    ``other_cpu_pct``: the CPU the rest of the machine used during the ratios' runs (% of one core)."""
    words = []
    for key in RATIOS:
        words.append(f"{key}={ratios.get(key, math.nan):.2f}")
        if spreads is not None and key in spreads:
            words.append(f"{key}{SPREAD_SUFFIX}={spreads[key]:.2f}")
    if other_cpu is not None:
        words.append(f"other_cpu_pct={other_cpu:.0f}")
    return "bench: " + " ".join(words)


def rounds_line(label: str, values: Sequence[float], other_cpu: float) -> str:
    """A ratio's rounds: each round's ratio, their spread, and how busy the machine was with other work."""
    busy = f"; other work on the machine: {other_cpu:.0f} % CPU" if math.isfinite(other_cpu) else ""
    return (
        f"rounds {label}: " + " ".join(f"{v:.2f}" for v in values)
        + f" (the ratio is their median; spread {max(values) - min(values):.2f}{busy})"
    )  # fmt: skip


def other_cpu_pct(runs: Sequence[dict[str, Any]]) -> float:
    """The mean CPU the rest of the machine used during the runs of the ratios' rounds, % of one core (NaN when
    not measured)."""
    values = [
        r["extra"]["other_cpu_pct"]
        for r in runs
        if r["extra"].get("round") and r["extra"].get("other_cpu_pct") is not None
        and math.isfinite(r["extra"]["other_cpu_pct"])
    ]  # fmt: skip
    return sum(values) / len(values) if values else math.nan


def _num(value: float | None) -> float:
    """A number that strict JSON may have turned into None, as a float (NaN)."""
    return math.nan if value is None else float(value)


def _cell(value: float | None, digits: int = 0) -> str:
    """A number for the markdown table: blank when not measured (NaN or None)."""
    return f"{value:.{digits}f}" if value is not None and math.isfinite(value) else ""


def markdown_table(runs: Sequence[dict[str, Any]]) -> str:
    """The runs as the benchmarks page's markdown table."""
    rows = [
        "| model | mode | setting | records | rec/s | p50 ms | p99 ms | CPU % | CPU us/record | peak RSS MiB "
        "| rows/batch |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in runs:
        cells = (
            r["model"],
            r["mode"],
            r["setting"],
            str(r["records"]),
            _cell(r["throughput_rps"]),
            _cell(r["p50_ms"]),
            _cell(r["p99_ms"]),
            _cell(r["cpu_pct"]),
            _cell(r.get("cpu_us_per_record"), 1),
            _cell(r["peak_rss_mib"]),
            _cell(r["extra"].get("mean_batch_rows"), 1),
        )
        rows.append("| " + " | ".join(cells) + " |")
    return "\n".join(rows)


#: Throughput ratio -> the CPU ratio of the same runs, for the reading of the docs block.
CPU_OF = {
    "digits_vs_passthrough": "digits_cpu_vs_passthrough",
    "events_vs_passthrough": "events_cpu_vs_passthrough",
    "avro_events_vs_passthrough": "avro_events_cpu_vs_passthrough",
    "digits_eos_vs_alo": "digits_eos_cpu_vs_alo",
    "wide_digits_vs_passthrough": "wide_digits_cpu_vs_passthrough",
    "shadow_digits_vs_off": "shadow_digits_cpu_vs_off",
    "shadow_slow_digits_vs_off": "shadow_slow_digits_cpu_vs_off",
}


def cpu_reading(result: dict[str, Any]) -> list[str]:
    """The generated reading of a run's ratios: each throughput ratio beside the CPU ratio of the same runs (median and
    spread over the rounds), and which of the two reproduces, and why."""
    ratios, spreads = result.get("ratios", {}), result.get("spreads", {})

    def fig(key: str) -> str:
        value, spread = _num(ratios.get(key)), _num(spreads.get(key))
        return f"{value:.2f} (spread {spread:.2f})" if math.isfinite(value) else "not measured"

    rows = ["| runs | records/s ratio | CPU-per-record ratio |", "|---|---|---|"]
    rows += [f"| `{rps}` / `{cpu}` | {fig(rps)} | {fig(cpu)} |" for rps, cpu in CPU_OF.items()]
    pairs = [(_num(spreads.get(r)), _num(spreads.get(c))) for r, c in CPU_OF.items()]
    pairs = [(r, c) for r, c in pairs if math.isfinite(r) and math.isfinite(c)]
    tighter = sum(1 for r, c in pairs if c <= r)
    verdict = (
        f"In this run the CPU ratio's spread over the rounds was at most the throughput ratio's in {tighter} of "
        f"{len(pairs)} pairs."
        if pairs
        else "This run measured no pair of them over rounds."
    )
    wide = result.get("wide_partitions")
    return [
        "The CPU-per-record ratios (`*_cpu_vs_*`) are the ceiling's CPU seconds per record over streaminfer's "
        "(exactly_once: at_least_once's over exactly_once's), each read from the process's own CPU time "
        "(user + system, `/proc/<pid>/stat`) at the first and the last result's append time, over the results "
        "appended between them; 1.0 means streaminfer costs what the ceiling costs."
        + (f" The `wide_*` keys are the same rounds on a {wide}-partition requests topic." if wide else ""),
        "",
        *rows,
        "",
        "**The CPU ratio is the one that reproduces.** Records/s of a consumer sharing the machine's cores with the "
        "broker is set by how fast those cores run the broker as much as the consumer, so the throughput ratio "
        "moves from one machine to the next (issue 33: 0.81 and 0.53 for the same command on two machines of one "
        "kind); the CPU seconds a process spends per record count only its own work, which the broker's speed "
        "does not change (0.42 and 0.44 on those machines). Compare CPU ratios across machines; read the "
        f"throughput ratios within one run. {verdict}",
        "",
    ]


def docs_block(result: dict[str, Any], lines: Sequence[str], plot_names: Sequence[str], day: str) -> str:
    """The generated block of docs/benchmarks.md: the run's date and machine, the table, the printed summary
    ``lines`` (stages, rounds, vision, the bench line), the reading of the run in words
    (:func:`harness.bench.reading.reading`) and the plots (``plot_names``, in docs/bench/)."""
    cpus = result.get("machine", {}).get("cpus")
    machine = f", {cpus} CPU cores" if cpus else ""
    parts = [
        DOCS_BEGIN,
        f"Latest run: `make bench` on {day}{machine}.",
        "",
        markdown_table(result["runs"]),
        "",
        *cpu_reading(result),
        "```text",
        *lines,
        "```",
        "",
        "**Reading this run** (generated from its figures with the table; `harness/bench/reading.py`):",
        "",
        *reading(result),
        "",
        *(f"![{PLOT_CAPTIONS.get(name, name)}](bench/{name})" for name in plot_names),
        DOCS_END,
    ]
    return "\n".join(parts)


def check_docs(page: Path) -> str:
    """``page``'s text; SystemExit unless it holds the generated block's markers once each (checked before a run,
    so that a wrong ``--docs`` does not cost a whole benchmark)."""
    if not page.is_file():
        raise SystemExit(f"streaminfer-bench: {page} does not exist")
    text = page.read_text()
    if text.count(DOCS_BEGIN) != 1 or text.count(DOCS_END) != 1 or text.index(DOCS_BEGIN) > text.index(DOCS_END):
        raise SystemExit(f"streaminfer-bench: {page} must hold {DOCS_BEGIN} then {DOCS_END}, once each")
    return text


def write_docs(page: Path, result: dict[str, Any], lines: Sequence[str], plot_paths: Sequence[Path], day: str) -> None:
    """Rewrite the generated block of ``page`` (docs/benchmarks.md) and copy the plots into ``page``'s bench/
    folder. SystemExit when the page or its markers are missing (nothing is written then)."""
    text = check_docs(page)
    block = docs_block(result, lines, [p.name for p in plot_paths], day)
    new = re.sub(re.escape(DOCS_BEGIN) + ".*?" + re.escape(DOCS_END), lambda _: block, text, flags=re.DOTALL)
    folder = page.parent / "bench"
    folder.mkdir(exist_ok=True)
    for path in plot_paths:
        shutil.copyfile(path, folder / path.name)
    page.write_text(new)
