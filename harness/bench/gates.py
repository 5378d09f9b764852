"""Record ``streaminfer-gates``' test fixtures from real runs (tests/fixtures/gates/).

Each run drains a backlog of the bench's own digits requests (:func:`harness.bench.data.digits_backlog`) through a
real ``streaminfer-consumer`` at default settings on a real broker, and keeps two scrapes of its ``/metrics``,
``--window`` seconds apart, taken ``--settle`` seconds after the consumer is ready (``producer_tools.gates``'
``--record`` format):

- ``digits.json``: the digits model (``models/digits``): tiny, the Python and Kafka client work per record bound it;
- ``heavy.json``: a compute-heavy stand-in for MiniLM, whose export needs torch (not installable where these were
  recorded): a multilayer perceptron on the same ``input`` FLOAT ``[batch, 64]`` (3 hidden layers of
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

import numpy as np

from harness.bench.data import DIGITS_MODEL, digits_backlog
from harness.bench.measure import new_topics, start_streaminfer, stop
from producer_tools.gates import Thresholds as GateThresholds
from producer_tools.gates import figures, gates, record, report, scrape
from producer_tools.produce import send_all

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


async def one(bootstrap: str, model: Path, name: str, n: int, settle_s: float, window_s: float, out: Path) -> None:
    """Drain ``n`` digits requests through streaminfer on ``model``; record its scrapes to ``out/<name>.json``."""
    tag = uuid.uuid4().hex[:6]
    topics = await new_topics(bootstrap, f"gates-{name}-{tag}")
    await send_all(bootstrap, topics["requests"], digits_backlog(name[0], n), progress=False)
    child = start_streaminfer(bootstrap, topics, model, out / f"{name}.log")
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
    p.add_argument("--settle", type=float, default=2.0, help="seconds after readiness before the first scrape")
    p.add_argument("--window", type=float, default=4.0, help="seconds between the scrapes")
    args = p.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    bootstrap = args.bootstrap_servers
    asyncio.run(one(bootstrap, DIGITS_MODEL, "digits", args.records, args.settle, args.window, args.out))
    with tempfile.TemporaryDirectory() as tmp:
        heavy = heavy_model(Path(tmp) / "heavy.onnx")
        asyncio.run(one(bootstrap, heavy, "heavy", args.heavy_records, args.settle, args.window, args.out))


if __name__ == "__main__":
    main()
