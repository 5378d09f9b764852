"""The reading of a benchmark run, in words, from the run's own figures: one markdown bullet per comparison
(:func:`reading`). ``make bench`` writes it into the generated block of docs/benchmarks.md with the table, so no
figure on the page is kept by hand. Every number comes from ``bench.json``'s ``runs`` (throughput in records/s,
latency in ms, CPU in % of one core), ``ratios``, ``rounds`` and ``other_cpu_pct``; a comparison whose runs are
missing (skipped, or a run that failed) is left out. The wording says what each comparison measures (fixed, from
the method); whether a figure meets its target is computed, never written in advance."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from harness.bench.plan import PAIRED, ROUND_LABELS

#: The targets the issues set, by ratio key (a ratio at or above its target meets it).
TARGETS = {"minilm_vs_bare_ort": 0.9, "vision_vs_ceiling": 0.8, "shadow_digits_vs_off": 0.9}
#: The naive PIL consumer should be this many times slower than streaminfer on images.
VISION_VS_NAIVE_TARGET = 5.0
#: What each paired ratio compares: (what streaminfer serves, what the ceiling is, the unit of its throughput).
PAIRED_WORDS = {
    "digits_vs_passthrough": (
        "**digits** (a tiny model: Kafka and Python bound)",
        "the Kafka client alone (`passthrough`: the same client fetches, parses, answers and commits, no streaminfer "
        "code)",
        "records/s",
    ),
    "digits_eos_vs_alo": (
        "**exactly_once** on digits (`streaminfer-eos`)",
        "at_least_once at the same settings",
        "records/s",
    ),
    "minilm_vs_bare_ort": (
        "**MiniLM** on CPU (compute bound; tokenizing, bucketing, padding and encoding included)",
        "bare ONNX Runtime at its best batching, chosen in round 1",
        "texts/s",
    ),
    "shadow_digits_vs_off": (
        "**shadow scoring** on digits (`streaminfer-shadow`: a shadow of the same model scores every micro-batch in "
        "its own thread, `shadow_model_path`)",
        "the same consumer without a shadow",
        "records/s",
    ),
    "shadow_slow_digits_vs_off": (
        "**a slow shadow** on digits (`streaminfer-shadow-slow`: a candidate with digits' answers and a dense side "
        "branch, a quarter of the stream's rows/s on its one core; shedding bounds its cost)",
        "the same consumer without a shadow",
        "records/s",
    ),
    "events_vs_passthrough": (
        "**JSON events** (breast-cancer, 30 inputs fed by name, enriched results)",
        "the events passthrough (`orjson.loads` each event, a fixed answer the size of an enriched result, no "
        "streaminfer code)",
        "records/s",
    ),
    "avro_events_vs_passthrough": (
        "**Avro events** (the same events, Confluent-framed, the writer schema from the registry)",
        "the events passthrough decoding each datum with fastavro after the 5-byte frame",
        "records/s",
    ),
}


def _n(value: float, digits: int = 0) -> str:
    return f"{value:,.{digits}f}"


def _span(values: Sequence[float], unit: str) -> str:
    """``low to high unit`` over the finite ``values`` (one figure when they round alike; ``not measured``)."""
    finite = [v for v in values if _finite(v)]
    if not finite:
        return "not measured"
    low, high = min(finite), max(finite)
    return f"{_n(low)} {unit}" if round(low) == round(high) else f"{_n(low)} to {_n(high)} {unit}"


def _finite(value: Any) -> bool:
    return isinstance(value, int | float) and math.isfinite(value)


def _rounds(runs: Sequence[dict[str, Any]], model: str, mode: str) -> list[dict[str, Any]]:
    return [r for r in runs if r["model"] == model and r["mode"] == mode and r["extra"].get("round")]


def _first(runs: Sequence[dict[str, Any]], model: str, mode: str, setting: str | None = None) -> dict[str, Any] | None:
    return next(
        (
            r
            for r in runs
            if r["model"] == model
            and r["mode"] == mode
            and not r["extra"].get("round")
            and (setting is None or r["setting"] == setting)
        ),
        None,
    )


def cpu_us_per_record(run: dict[str, Any]) -> float:
    """CPU time the run's process spent per record, us (``cpu_pct`` % of one core at ``throughput_rps``)."""
    rate, cpu = run["throughput_rps"], run["cpu_pct"]
    return cpu / 100.0 / rate * 1e6 if _finite(rate) and _finite(cpu) and rate > 0 else math.nan


def _median(values: Sequence[float]) -> float:
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


def _target(key: str, ratio: float) -> str:
    target = TARGETS.get(key)
    if target is None:
        return ""
    return f"; target {target:.2f}: {'met' if ratio >= target else 'not met'}"


def paired(result: dict[str, Any], key: str) -> str | None:
    """The bullet of one ratio measured over rounds (:data:`~harness.bench.plan.PAIRED`), or None without it."""
    ratio = result.get("ratios", {}).get(key)
    values = result.get("rounds", {}).get(ROUND_LABELS[key]) or []
    model, top, bottom = PAIRED[key]
    ours, ceiling = _rounds(result["runs"], model, top), _rounds(result["runs"], model, bottom)
    if not _finite(ratio) or not values or not ours or not ceiling:
        return None
    what, against, unit = PAIRED_WORDS[key]
    busy = result.get("other_cpu_pct", {}).get(key)
    busy_words = f"; other work on the machine {busy:.0f} % of a core" if _finite(busy) else ""
    text = (
        f"- {what}: {_span([r['throughput_rps'] for r in ours], unit)} over the rounds, against "
        f"{_span([r['throughput_rps'] for r in ceiling], unit)} for {against}: **{ratio:.2f}** of it (the median of "
        f"the rounds {' '.join(f'{v:.2f}' for v in values)}; spread {max(values) - min(values):.2f}{busy_words}"
        f"{_target(key, ratio)})."
    )
    ours_cpu = [c for c in map(cpu_us_per_record, ours) if _finite(c)]
    ceiling_cpu = [c for c in map(cpu_us_per_record, ceiling) if _finite(c)]
    if ours_cpu and ceiling_cpu and unit == "records/s":
        text += (
            f" CPU per record, the process's own (medians over the rounds): {_median(ours_cpu):.1f} us against "
            f"{_median(ceiling_cpu):.1f} us."
        )
    return text


def shadow(result: dict[str, Any], key: str = "shadow_digits_vs_off") -> str | None:
    """A shadow bullet: :func:`paired` for ``key`` (``shadow_digits_vs_off`` or ``shadow_slow_digits_vs_off``),
    with the CPU ratio and the shed share of the same runs."""
    text = paired(result, key)
    if text is None:
        return None
    ratios = result.get("ratios", {})
    stem = key.removesuffix("_vs_off")
    cpu, shed = ratios.get(f"{stem}_cpu_vs_off"), ratios.get(f"{stem}_shed_share")
    if _finite(cpu):
        text += f" CPU per record without the shadow over with it: **{cpu:.2f}** (median over the rounds)."
    if _finite(shed):
        text += f" The shadow shed {100 * shed:.1f} % of the rows (median over the rounds)."
    return text


def naive(result: dict[str, Any]) -> str | None:
    ratio = result.get("ratios", {}).get("digits_vs_naive")
    slow = _first(result["runs"], "digits", "naive")
    ours = next((r for r in result["runs"] if r["model"] == "digits" and r["extra"].get("default")), None)
    if not _finite(ratio) or slow is None or ours is None:
        return None
    return (
        f"- **against a naive consumer** (one record, `session.run` at batch 1, produce, wait, commit): streaminfer at "
        f"defaults {_n(ours['throughput_rps'])} records/s, the naive one {_n(slow['throughput_rps'])}: "
        f"**{ratio:,.0f}x** (`digits_vs_naive`)."
    )


def sweep(result: dict[str, Any]) -> str | None:
    runs = [
        r
        for r in result["runs"]
        if r["model"] == "digits" and r["mode"] == "streaminfer" and not r["extra"].get("round")
    ]
    timed = [r for r in runs if _finite(r["p99_ms"])]
    if len(timed) < 2:
        return None
    cells = ", ".join(f"{r['setting']} {_n(r['throughput_rps'])} rec/s, p99 {_n(r['p99_ms'])} ms" for r in timed)
    return (
        f"- **batch size and delay** (digits; throughput closed loop, p99 open loop at one offered load for all): "
        f"{cells}."
    )


def lone(result: dict[str, Any]) -> str | None:
    ours = _first(result["runs"], "digits", "lone", "1 at a time")
    client = _first(result["runs"], "digits", "lone", "client only")
    if ours is None or client is None or not _finite(ours["p50_ms"]) or not _finite(client["p50_ms"]):
        return None
    return (
        f"- **a lone record** (10 records/s, each alone): p50 **{_n(ours['p50_ms'])} ms**, "
        f"p99 {_n(ours['p99_ms'])} ms; "
        f"the Kafka client alone at the same rate, the round trip's own floor: p50 {_n(client['p50_ms'])} ms, p99 "
        f"{_n(client['p99_ms'])} ms."
    )


def open_loop(result: dict[str, Any]) -> str | None:
    runs = [r for r in result["runs"] if r["model"] == "digits" and r["mode"] == "open-loop"]
    if not runs:
        return None
    cells = ", ".join(
        f"{r['setting']} ({_n(r['throughput_rps'])} rec/s) p50 {_n(r['p50_ms'])} / p99 {_n(r['p99_ms'])} ms"
        for r in runs
    )
    return f"- **latency under load** (digits at defaults, open loop): {cells}."


def binary(result: dict[str, Any]) -> str | None:
    rates = {
        r["setting"]: r["throughput_rps"] for r in result["runs"] if r["model"] == "digits" and r["mode"] == "decode"
    }
    parts = []
    for rows in (1, 64):
        json_rate = rates.get(f"{rows} rows JSON", math.nan)
        binary_rate = rates.get(f"{rows} rows binary", math.nan)
        if _finite(json_rate) and _finite(binary_rate) and json_rate:
            parts.append(
                f"{rows}-row records {_n(binary_rate)} decodes/s in the binary extension against {_n(json_rate)} in "
                f"JSON ({binary_rate / json_rate:.1f}x)"
            )
    return f"- **binary payloads** (the consumer's chunk decoder alone): {'; '.join(parts)}." if parts else None


def vision(result: dict[str, Any]) -> str | None:
    ratio = result.get("ratios", {}).get("vision_vs_ceiling")
    values = result.get("rounds", {}).get(ROUND_LABELS["vision_vs_ceiling"]) or []
    runs = result["runs"]
    ours = [r for r in runs if r["model"] == "vision" and r["mode"] == "streaminfer"]
    decode = [r for r in runs if r["model"] == "vision" and r["mode"] == "decode-alone"]
    bare = [r for r in runs if r["model"] == "vision" and r["mode"] == "bare-ort"]
    if not _finite(ratio) or not ours or not decode or not bare:
        return None
    text = (
        f"- **EfficientNet-Lite0** (images): streaminfer {_span([r['throughput_rps'] for r in ours], 'images/s')}; "
        f"the ceiling is the slower of the consumer's own preprocessing alone "
        f"({_span([r['throughput_rps'] for r in decode], 'images/s')}) and bare ONNX Runtime at batch 64 on "
        f"preprocessed tensors ({_span([r['throughput_rps'] for r in bare], 'images/s')}): **{ratio:.2f}** of it"
    )
    if values:
        text += f" (rounds {' '.join(f'{v:.2f}' for v in values)})"
    text += f"{_target('vision_vs_ceiling', ratio)}."
    first_decode, first_bare = decode[0]["throughput_rps"], bare[0]["throughput_rps"]
    if _finite(first_decode) and _finite(first_bare) and first_decode and first_bare:
        shared = 1.0 / (1.0 / first_decode + 1.0 / first_bare)
        text += (
            f" Where both parts share the same cores (no GPU), they cannot both run at their solo speed: "
            f"`shared_cpu_bound` = 1 / (1/decode + 1/ORT) = {_n(shared)} images/s in round 1."
        )
    slow = _first(runs, "vision", "naive-vision")
    if slow is not None and slow["throughput_rps"]:
        times = ours[0]["throughput_rps"] / slow["throughput_rps"]
        met = "met" if times >= VISION_VS_NAIVE_TARGET else "not met"
        text += (
            f" Against the naive PIL consumer ({_n(slow['throughput_rps'])} images/s): {times:.1f}x (target "
            f"{VISION_VS_NAIVE_TARGET:.0f}x: {met})."
        )
    return text


def reading(result: dict[str, Any]) -> list[str]:
    """The markdown bullets reading ``result`` (``bench.json``'s content), in the order of the page."""
    bullets = [
        paired(result, "digits_vs_passthrough"),
        naive(result),
        paired(result, "digits_eos_vs_alo"),
        shadow(result),
        shadow(result, "shadow_slow_digits_vs_off"),
        sweep(result),
        open_loop(result),
        lone(result),
        binary(result),
        paired(result, "events_vs_passthrough"),
        paired(result, "avro_events_vs_passthrough"),
        paired(result, "minilm_vs_bare_ort"),
        vision(result),
    ]
    return [b for b in bullets if b is not None]
