"""Record ``streaminfer-gates``' test fixtures from real runs (tests/fixtures/gates/).

Each run drains a backlog of the bench's own digits requests (:func:`harness.bench.data.digits_backlog`) through a
real ``streaminfer-consumer`` at default settings on a real broker, and keeps two scrapes of its ``/metrics``,
``--window`` seconds apart, taken ``--settle`` seconds after the consumer is ready (``producer_tools.gates``'
``--record`` format):

- ``digits.json``: the digits model (``models/digits``): tiny, the Python and Kafka client work per record bound it;
- ``minilm.json``: the real MiniLM export (``models/minilm/build.py``; skipped when ``--minilm-dir`` holds none) on
  the bench's text backlog (:func:`harness.bench.data.corpus`, the standard library's docstrings), at the bench's
  ``max_batch_size`` of 64 rows (``--minilm-batch``): a transformer per row, so ONNX Runtime's time dominates;
- ``heavy.json``: a compute-heavy model that needs no torch, for machines without the MiniLM export: a multilayer
  perceptron on the same ``input`` FLOAT ``[batch, 64]`` (3 hidden layers of
  :data:`HIDDEN` units, ReLU, softmax ``probabilities`` FLOAT ``[batch, 10]``; random weights, seed 0), about
  :data:`HIDDEN`\\ ² x 2 multiply-adds per row, so ONNX Runtime's time dominates every other stage.

Usage (a broker of its own): ``python -m harness.localkafka --state .bench/gates run -- python -m harness.bench.gates
--out tests/fixtures/gates``.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import os
import tempfile
import uuid
from pathlib import Path
from typing import Any

import numpy as np

from harness.bench.data import DEFAULT_MINILM, DIGITS_MODEL, corpus, digits_backlog, text_backlog
from harness.bench.measure import new_topics, start_streaminfer, stop
from producer_tools.gates import Thresholds as GateThresholds
from producer_tools.gates import figures, gates, record, report, scrape
from producer_tools.produce import Outgoing, send_all

#: The heavy model's hidden width, units.
HIDDEN = 2048


def heavy_model(path: Path) -> Path:
    """Write the compute-heavy MLP (module docstring) to ``path``."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    sizes = [64, HIDDEN, HIDDEN, HIDDEN, 10]
    nodes, inits, prev = [], [], "input"
    for i, (n_in, n_out) in enumerate(itertools.pairwise(sizes)):
        w = (rng.standard_normal((n_in, n_out)) / np.sqrt(n_in)).astype(np.float32)
        inits.append(numpy_helper.from_array(w, f"w{i}"))
        nodes.append(helper.make_node("MatMul", [prev, f"w{i}"], [f"h{i}"]))
        prev = f"h{i}"
        if i < len(sizes) - 2:
            nodes.append(helper.make_node("Relu", [prev], [f"r{i}"]))
            prev = f"r{i}"
    nodes.append(helper.make_node("Softmax", [prev], ["probabilities"], axis=1))
    graph = helper.make_graph(
        nodes,
        "heavy_mlp",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["batch", 64])],
        [helper.make_tensor_value_info("probabilities", TensorProto.FLOAT, ["batch", 10])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    onnx.save(model, str(path))
    return path


async def one(
    bootstrap: str,
    model: Path,
    name: str,
    backlog: list[Outgoing],
    settle_s: float,
    window_s: float,
    out: Path,
    **settings: Any,
) -> None:
    """Drain ``backlog`` through streaminfer on ``model`` (with ``settings``); record its scrapes to
    ``out/<name>.json``."""
    tag = uuid.uuid4().hex[:6]
    topics = await new_topics(bootstrap, f"gates-{name}-{tag}")
    await send_all(bootstrap, topics["requests"], backlog, progress=False)
    child = start_streaminfer(bootstrap, topics, model, out / f"{name}.log", **settings)
    try:
        assert child.port is not None
        url = f"http://127.0.0.1:{child.port}"
        await asyncio.sleep(settle_s)
        before = scrape(url)
        await asyncio.sleep(window_s)
        pairs = [(before, scrape(url))]
    finally:
        stop(child)
    record(out / f"{name}.json", pairs)
    f = figures(pairs)
    print("\n".join(report(f, gates(f, GateThresholds()))))


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m harness.bench.gates", description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--bootstrap-servers", default=os.environ.get("KAFKA_BOOTSTRAP_SERVERS", "127.0.0.1:9092"))
    p.add_argument("--records", type=int, default=150_000, help="digits backlog, records")
    p.add_argument("--heavy-records", type=int, default=20_000, help="heavy model backlog, records")
    p.add_argument("--texts", type=int, default=6_000, help="MiniLM backlog, texts")
    p.add_argument("--minilm-dir", type=Path, default=DEFAULT_MINILM, help="minilm.onnx and tokenizer.json")
    p.add_argument("--only", choices=("digits", "heavy", "minilm"), default=None, help="record one fixture only")
    p.add_argument("--settle", type=float, default=2.0, help="seconds after readiness before the first scrape")
    p.add_argument("--window", type=float, default=4.0, help="seconds between the scrapes")
    args = p.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    bootstrap, window = args.bootstrap_servers, (args.settle, args.window, args.out)
    if args.only in (None, "digits"):
        asyncio.run(one(bootstrap, DIGITS_MODEL, "digits", digits_backlog("d", args.records), *window))
    if args.only in (None, "heavy"):
        with tempfile.TemporaryDirectory() as tmp:
            heavy = heavy_model(Path(tmp) / "heavy.onnx")
            asyncio.run(one(bootstrap, heavy, "heavy", digits_backlog("h", args.heavy_records), *window))
    minilm, tokenizer = args.minilm_dir / "minilm.onnx", args.minilm_dir / "tokenizer.json"
    if args.only in (None, "minilm") and minilm.is_file() and tokenizer.is_file():
        texts = text_backlog("m", corpus(args.texts))
        asyncio.run(one(bootstrap, minilm, "minilm", texts, *window, tokenizer_path=tokenizer, max_batch_size=64))
    elif args.only == "minilm":
        raise SystemExit(f"python -m harness.bench.gates: no MiniLM in {args.minilm_dir}; run models/minilm/build.py")


if __name__ == "__main__":
    main()
