"""A slow shadow candidate with digits' signature, built at bench time (never committed): the bench's
``streaminfer-shadow-slow`` run, where the candidate costs far more per row than the serving model and shedding
(``shadow_max_pending``) must bound what it takes from the serving path.

The graph is the digits model itself with a dense side branch: ``input`` float32 ``[batch, 64]`` -> ``layers``
MatMul + Tanh layers of ``hidden`` units -> a MatMul to ``[batch, 10]``, multiplied by 0 and added to the digits
model's ``probabilities``. Tanh keeps every value finite, so the candidate's answers are the digits model's (its
``label`` and ``probabilities``, bit for bit: ``x + 0`` is ``x``) while each row costs about
``64 * hidden + layers * hidden**2`` multiply-adds more (``hidden=1024, layers=8``: 8.5 M, over ten thousand
times digits' own; about 8,000 rows/s on one core of the bench machine, a quarter of the stream). ONNX Runtime
cannot fold the branch away: its input is the graph's input, not a constant.
"""

from __future__ import annotations

from itertools import pairwise
from pathlib import Path

import numpy as np
import onnx
from onnx import helper, numpy_helper

#: Hidden units of each dense layer of the side branch.
HIDDEN = 1024
#: Dense ``[hidden, hidden]`` layers after the first one.
LAYERS = 8
#: The digits model's output the branch is added to (``[batch, 10]`` float32).
PROBABILITIES = "probabilities"


def slow_candidate(digits: Path, out: Path, *, hidden: int = HIDDEN, layers: int = LAYERS, seed: int = 0) -> Path:
    """Write the slow candidate built from the digits model at ``digits`` to ``out`` (see the module docstring).

    Args:
        digits: the digits model (``input`` float32 ``[batch, 64]``; ``label`` int64 ``[batch]``,
            ``probabilities`` float32 ``[batch, 10]``).
        out: the ONNX file to write (its folder is created).
        hidden: units per dense layer.
        layers: ``[hidden, hidden]`` layers after the ``[64, hidden]`` one (0: that one only).
        seed: the weights' random seed (the answers do not depend on it).

    Returns:
        ``out``.

    Raises:
        ValueError: ``digits`` has no ``probabilities`` output, or ``hidden`` < 1 or ``layers`` < 0.
    """
    if hidden < 1 or layers < 0:
        raise ValueError(f"hidden must be >= 1 and layers >= 0, not {hidden} and {layers}")
    model = onnx.load(str(digits))
    graph = model.graph
    producers = [node for node in graph.node if PROBABILITIES in node.output]
    if not producers:
        raise ValueError(f"{digits} has no {PROBABILITIES!r} output")
    served = "digits_probabilities"
    node = producers[0]
    node.output[list(node.output).index(PROBABILITIES)] = served
    feature = graph.input[0].name
    width = graph.input[0].type.tensor_type.shape.dim[1].dim_value
    classes = graph.output[[o.name for o in graph.output].index(PROBABILITIES)].type.tensor_type.shape.dim[1].dim_value
    rng = np.random.default_rng(seed)
    sizes = [width, *([hidden] * (layers + 1)), classes]
    x = feature
    for i, (n_in, n_out) in enumerate(pairwise(sizes)):
        weight = (rng.standard_normal((n_in, n_out)) / np.sqrt(n_in)).astype(np.float32)
        graph.initializer.append(numpy_helper.from_array(weight, f"slow_w{i}"))
        graph.node.append(helper.make_node("MatMul", [x, f"slow_w{i}"], [f"slow_mm{i}"]))
        x = f"slow_mm{i}"
        if i < len(sizes) - 2:
            graph.node.append(helper.make_node("Tanh", [x], [f"slow_h{i}"]))
            x = f"slow_h{i}"
    graph.initializer.append(numpy_helper.from_array(np.zeros((), np.float32), "slow_zero"))
    graph.node.append(helper.make_node("Mul", [x, "slow_zero"], ["slow_nothing"]))
    graph.node.append(helper.make_node("Add", [served, "slow_nothing"], [PROBABILITIES]))
    graph.name = f"{graph.name}_slow"
    model.doc_string = f"digits with a {layers + 1}-layer, {hidden}-unit dense side branch that adds 0 (bench only)"
    onnx.checker.check_model(model)
    out.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(out))
    return out
