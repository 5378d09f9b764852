"""What a model does that its graph does not say, found by running it before it serves (:meth:`OnnxRunner.probe`,
called by :meth:`OnnxRunner.load`).

Inputs are placeholder rows (:func:`~consumer.model.compat.blank`: zeros, empty strings) or, with ``warmup_request``,
the rows of a request the user gave. Four questions, each answered by a few runs:

1. **Which outputs have a batch axis?** Runs at 1 and 2 rows (a static-batch model: at its N): an output whose
   axis 0 follows the rows at both is batched; any other (a scalar, a table) is carried whole in every response.
   ZipMap outputs get their class labels.
2. **May requests share a run?** Only if every output without a batch axis is a constant of the graph (a
   ``Constant`` node or an initializer, read with the ``onnx`` package when it is installed): any other (a sum over
   the batch, a ``NonZero`` index list, a ``Shape``) would answer each request with its neighbours' data, so every
   request then runs alone (``ModelSignature.solo``). And only if two different rows run together give each row
   what it gets alone (within :data:`RTOL`): a time-first LSTM (``[sequence, batch, features]``), batch statistics
   (``x - x.mean(0)``) or dynamic quantisation (one scale per run) do not, and run alone too.
3. **Does padding change a sequence model's answer?** A row of 4 tokens alone against the same row padded to 8
   (``attention_mask`` 0 on the padding): a model without a mask, or one that pools the last position, answers
   differently, and is then batched only with rows of the same length (``SequenceSpec.padding_safe``).
4. **Can every output be encoded?** Each output of the 1-row run goes through the answer encoders the loader
   hands over (the service: the OIP encoder, JSON and binary).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import replace
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from consumer.errors import ModelError
from consumer.model.compat import FIX_OUTPUT_TYPE, OutputReader, blank
from consumer.signature import ModelSignature, TensorSpec, floating

#: Encodes one output of a 1-row run as an answer would carry it: (signature, output name, array); raises KeyError,
#: TypeError or ValueError when it cannot.
OutputEncoder = Callable[[ModelSignature, str, np.ndarray], object]

log = logging.getLogger(__name__)

#: Two runs of the same row agree to this relative tolerance (and 1e-5 absolute) on CPU: different batch sizes may
#: sum in another order (float32 GEMM blocking, about 1e-7 relative), a model whose rows interact differs far more
#: (a time-first LSTM by 0.1, dynamic quantisation by 1e-3).
RTOL = 1e-4
#: On a GPU (cuDNN algorithm choice per shape, TF32, fp16): 1e-2 relative, 1e-3 absolute; it still catches the
#: structural cases (recurrence across rows, batch statistics).
RTOL_GPU = 1e-2
#: The row length of the padding check, tokens, and what it is padded to.
PAD_CHECK_LENGTH, PAD_CHECK_PADDED = 4, 8

Feeds = dict[str, np.ndarray]


class Probed(Protocol):
    """What the probe needs of a runner (:class:`consumer.model.runner.OnnxRunner`)."""

    signature: ModelSignature
    reader: OutputReader
    provider: str

    def execute(self, feeds: Mapping[str, np.ndarray], rows: int) -> dict[str, np.ndarray]: ...

    def quiet_runs(self) -> AbstractContextManager[None]: ...

    def quiet_shape_warnings(self) -> None: ...


#: Rows for a run: (rows, sequence length) -> input name -> array.
RowSource = Callable[[int, int], Feeds]


def fix_for_zeros() -> str:
    """The fix for a model that fails on placeholder rows."""
    return (
        "if zeros and empty strings are not valid input for this model (a OneHotEncoder with handle_unknown='error', "
        "say), give a valid request to probe and warm up with: --warmup-request request.json (an OIP request)"
    )


def rows_from(sample: Mapping[str, np.ndarray] | None, inputs: tuple[TensorSpec, ...]) -> RowSource:
    """Rows for probe and warmup runs: the sample's rows repeated to the size asked (its own length), or
    :func:`~consumer.model.compat.blank` rows of the asked length."""
    if sample is None:
        return lambda rows, length: {spec.name: blank(spec, rows, length) for spec in inputs}

    def repeated(rows: int, length: int) -> Feeds:
        return {name: np.take(arr, np.arange(rows) % arr.shape[0], axis=0) for name, arr in sample.items()}

    return repeated


def probe(
    runner: Probed,
    rows: RowSource,
    constants: Callable[[], frozenset[str]],
    sampled: bool = False,
    encoders: Sequence[OutputEncoder] = (),
) -> ModelSignature:
    """The runner's signature with what the runs found (batched outputs, ZipMap labels, ``solo``, padding).

    Args:
        runner: the loaded runner (``execute`` runs it).
        rows: placeholder or sample rows (:func:`rows_from`).
        constants: names of the graph outputs that are constants (called only if an output has no batch axis).
        sampled: ``rows`` are the ``warmup_request``'s (the error then says so instead of suggesting one).
        encoders: the answer encoders each output of the 1-row run must pass (the service passes the OIP
            response encoder, :func:`consumer.oip.encode.check_output`); none: not checked.

    Raises:
        ModelError: the model fails on the probe rows at one row, or an output cannot be encoded (the fix named).
    """
    sig = runner.signature
    sizes = [sig.static_batch] if sig.static_batch is not None else [1, 2]
    seen: dict[int, dict[str, np.ndarray]] = {}
    for n in sizes:
        try:
            seen[n] = runner.execute(rows(n, 1), n)
        except Exception as exc:
            if not seen:
                what = "the warmup_request rows" if sampled else "its probe input"
                fix = "check the request against the model's inputs" if sampled else fix_for_zeros()
                raise ModelError(
                    f"the model fails on {what} at {n} row(s): {type(exc).__name__}: {exc}; {fix}"
                ) from exc
            break  # fails above one row: warmup says so, bisection answers record by record
    outputs = []
    misdeclared = []  # batched outputs whose graph declares a fixed axis 0
    for spec in sig.outputs:
        batched = all(out[spec.name].ndim > 0 and out[spec.name].shape[0] == n for n, out in seen.items())
        labels = runner.reader.labels.get(spec.name, ())
        shape = (None, len(labels)) if spec.name in runner.reader.zipmaps else spec.shape
        if batched and shape:
            if shape[0] is not None and sig.static_batch is None and len(seen) > 1:
                misdeclared.append(spec.name)
            shape = (None, *shape[1:])
        outputs.append(replace(spec, shape=shape, batched=batched, labels=labels))
    found = replace(sig, outputs=tuple(outputs))
    whole = found.whole_outputs - constants() if found.whole_outputs else frozenset()
    if whole:
        log.warning(
            "outputs %s have no batch axis and are not constants of the graph: every request runs alone (batching "
            "off), so no answer holds another request's data; export them with a batch axis to batch",
            sorted(whole),
        )
        found = replace(found, solo=True)
    elif sig.sequence is None and sig.static_batch is None and len(seen) > 1 and _rows_interact(runner, found):
        log.warning(
            "two rows run together do not get the answers they get alone (a time-first RNN, batch statistics, "
            "dynamic quantisation?): every request runs alone (batching off)"
        )
        found = replace(found, solo=True)
    if found.sequence is not None and not _padding_is_safe(runner, found):
        log.warning(
            "padding changes this sequence model's answers (no attention_mask, or last-token pooling?): requests are "
            "batched only with requests of the same length"
        )
        found = replace(found, sequence=replace(found.sequence, padding_safe=False))
    if misdeclared:
        log.warning(
            "outputs %s declare a fixed axis 0 but follow the batch's rows (an exporter's shape annotation, e.g. "
            "onnxmltools' LightGBM label); served as batched, ONNX Runtime's per-run shape warnings silenced",
            misdeclared,
        )
        runner.quiet_shape_warnings()
    _check_encoding(found, seen[sizes[0]], encoders)
    return found


def graph_constants(path: Path) -> frozenset[str]:
    """Names of the graph outputs that are constants: an initializer, a ``Constant`` node, or an ``Identity`` or
    ``Cast`` of one (read with the ``onnx`` package, weights not loaded); empty without the package."""
    try:
        import onnx
    except ImportError:
        return frozenset()
    model = onnx.load(str(path), load_external_data=False)
    constant = {init.name for init in model.graph.initializer}
    for node in model.graph.node:  # topologically sorted, as ONNX requires
        if node.op_type == "Constant" or (
            node.op_type in ("Identity", "Cast") and node.input and all(i in constant for i in node.input)
        ):
            constant.update(node.output)
    return frozenset(o.name for o in model.graph.output if o.name in constant)


def _pattern(spec: TensorSpec, row: int, ranges: Mapping[str, tuple[int, int]]) -> np.ndarray:
    """One distinct placeholder row ``[1, ...]`` per ``row`` (0 or 1): floats 0.25 to 1.0 in steps, integers and
    bools 0 or 1 (the low end of a declared range and one above), strings empty."""
    arr = blank(spec, 1)
    if arr.dtype.kind == "O":
        return arr
    if arr.dtype.kind == "b":
        return np.full_like(arr, bool(row))
    if arr.dtype.kind in "iu":
        low = ranges.get(spec.name, (0, 1))[0]
        return np.full_like(arr, low + row)
    flat = (np.arange(arr.size) % 4 + 1) * 0.25 * (1 + row)
    return flat.reshape(arr.shape).astype(arr.dtype)


def _rows_interact(runner: Probed, sig: ModelSignature) -> bool:
    """Whether rows A and B run together answer other than A alone and B alone (False when a run fails: the
    pattern may be invalid input for the model, and nothing is learnt)."""
    a = {s.name: _pattern(s, 0, sig.ranges) for s in sig.inputs}
    b = {s.name: _pattern(s, 1, sig.ranges) for s in sig.inputs}
    try:
        with runner.quiet_runs():
            together = runner.execute({n: np.concatenate([a[n], b[n]]) for n in a}, 2)
            alone = [runner.execute(a, 1), runner.execute(b, 1)]
    except Exception:  # noqa: BLE001 (ONNX Runtime raises its own classes)
        return False
    for spec in sig.outputs:
        if spec.batched:
            for row, out in enumerate(alone):
                if not _close(together[spec.name][row : row + 1], out[spec.name], runner.provider):
                    return True
    return False


def _padding_is_safe(runner: Probed, sig: ModelSignature) -> bool:
    """Whether a row of :data:`PAD_CHECK_LENGTH` tokens padded to :data:`PAD_CHECK_PADDED` gets its unpadded
    answer (True when a run fails: nothing is learnt)."""
    spec = sig.sequence
    assert spec is not None
    low = sig.ranges.get("input_ids", (0, 0))[0]
    length, padded = PAD_CHECK_LENGTH, PAD_CHECK_PADDED
    short: Feeds = {}
    long: Feeds = {}
    for s in sig.inputs:
        row: np.ndarray
        if s.name == "input_ids":
            row = np.arange(low + 1, low + 1 + length)
        elif s.name == "attention_mask":
            row = np.ones(length)
        else:
            row = np.zeros(length)
        short[s.name] = row.reshape(1, length).astype(s.dtype)
        pad = np.full((1, padded - length), spec.pad_values.get(s.name, 0), dtype=s.dtype)
        long[s.name] = np.concatenate([short[s.name], pad], axis=1)
    try:
        with runner.quiet_runs():
            alone, padded_out = runner.execute(short, 1), runner.execute(long, 1)
    except Exception:  # noqa: BLE001 (ONNX Runtime raises its own classes)
        return True
    for name, arr in alone.items():
        other = padded_out[name]
        if other.ndim >= 2 and other.shape[1] == padded and arr.ndim >= 2 and arr.shape[1] == length:
            other = other[:, :length]  # a per-token output: its real positions
        if not _close(other, arr, runner.provider):
            return False
    return True


def _close(got: np.ndarray, want: np.ndarray, provider: str) -> bool:
    if got.shape != want.shape:
        return False
    if floating(got.dtype):
        rtol, atol = (RTOL, 1e-5) if provider == "CPUExecutionProvider" else (RTOL_GPU, 1e-3)
        return bool(np.allclose(got.astype(np.float64), want.astype(np.float64), rtol=rtol, atol=atol))
    return bool(np.array_equal(got, want))


def _check_encoding(sig: ModelSignature, first: Mapping[str, np.ndarray], encoders: Sequence[OutputEncoder]) -> None:
    """Encode each output of a 1-row run with every answer encoder.

    Raises:
        ModelError: an output an encoder cannot carry, with the fix.
    """
    for spec in sig.outputs:
        arr: Any = first[spec.name][:1] if spec.batched else first[spec.name]
        for encoder in encoders:
            try:
                encoder(sig, spec.name, arr)
            except (KeyError, TypeError, ValueError) as exc:
                raise ModelError(
                    f"output {spec.name!r} ({arr.dtype}, shape {list(arr.shape)}) cannot be encoded in an answer: "
                    f"{type(exc).__name__}: {exc}; {FIX_OUTPUT_TYPE.format(name=spec.name)}"
                ) from exc
