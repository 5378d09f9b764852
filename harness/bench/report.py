"""The benchmark's output: a table, the per-stage costs, plots, strict JSON and the summary line."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from harness.bench.plan import RATIOS

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


def table(runs: Sequence[dict[str, Any]]) -> str:
    """The runs as a fixed-width text table."""
    head = (
        f"{'model':<7} {'mode':<19} {'setting':<17} {'records':>8} {'rec/s':>9} {'p50 ms':>7} {'p95 ms':>7} "
        f"{'p99 ms':>7} {'CPU %':>6} {'RSS MiB':>8} {'rows/batch':>10}"
    )
    lines = [head, "-" * len(head)]
    for r in runs:
        mean = r["extra"].get("mean_batch_rows", math.nan)
        lines.append(
            f"{r['model']:<7} {r['mode']:<19} {r['setting']:<17} {r['records']:>8} {r['throughput_rps']:>9.0f} "
            f"{r['p50_ms']:>7.1f} {r['p95_ms']:>7.1f} {r['p99_ms']:>7.1f} {r['cpu_pct']:>6.0f} "
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
    closed = [r for r in runs if r["mode"] in CLOSED_MODES]
    labels = [f"{r['mode']}\n{r['setting']}" for r in closed]
    fig, ax = plt.subplots(figsize=(max(8, 0.9 * len(closed)), 4.5))
    colors = {"naive": "tab:red", "passthrough": "tab:gray", "decode-encode": "tab:olive", "bare-ort": "tab:green"}
    ax.bar(labels, [r["throughput_rps"] for r in closed], color=[colors.get(r["mode"], "tab:blue") for r in closed])
    ax.set_yscale("log")
    ax.set_ylabel("throughput, records/s (log; bars)")
    ax.set_title("digits: closed-loop throughput (bars) and open-loop p99 (dots) per mode and setting", fontsize=10)
    ax.tick_params(axis="x", labelsize=7)
    timed = [(i, r["p99_ms"]) for i, r in enumerate(closed) if math.isfinite(r["p99_ms"])]
    if timed:
        rate = next((r["extra"].get("latency_at_rps") for r in closed if "latency_at_rps" in r["extra"]), None)
        twin = ax.twinx()
        twin.plot([i for i, _ in timed], [p for _, p in timed], "o", color="black")
        twin.set_yscale("log")
        twin.set_ylabel(f"p99 latency at {rate:.0f} rec/s, ms (log; dots)" if rate else "p99, ms")
    fig.tight_layout()
    paths = [out / "throughput.png"]
    fig.savefig(paths[0], dpi=110)
    plt.close(fig)

    open_runs = [r for r in runs if r["mode"] == "open-loop"]
    if open_runs:
        fig, ax = plt.subplots(figsize=(6, 4))
        rates = [r["throughput_rps"] for r in open_runs]
        for key in ("p50_ms", "p95_ms", "p99_ms"):
            ax.plot(rates, [r[key] for r in open_runs], marker="o", label=key.replace("_ms", ""))
        ax.set_xlabel("offered load, records/s")
        ax.set_ylabel("latency, ms (result append - request timestamp)")
        ax.set_title("digits: latency against offered load (streaminfer defaults)")
        ax.legend()
        fig.tight_layout()
        paths.append(out / "latency.png")
        fig.savefig(paths[-1], dpi=110)
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


def summary_line(ratios: dict[str, float]) -> str:
    """The last line of the benchmark, in the issue's exact form."""
    return "bench: " + " ".join(f"{key}={ratios.get(key, math.nan):.2f}" for key in RATIOS)
