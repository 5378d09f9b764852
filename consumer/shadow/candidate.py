"""Loading the shadow candidate (``shadow_model_path``) and checking it against the serving model at start-up.

A candidate is refused, each time with exit 2 and the setting named (:class:`~consumer.errors.ConfigError`):

- ``shadow_validation_record`` is set and the file's SHA-256 is not the record's (both hashes named);
- it cannot take the serving model's inputs (:func:`check_inputs`): the feeds of a micro-batch are assembled from
  the requests the serving model validated, so every candidate input must be one of the serving model's, of the
  same dtype and of a shape those feeds fit.

A file ONNX Runtime cannot open or run is a :class:`~consumer.errors.ModelError` (exit 3), as for the serving model.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Callable, Mapping

import numpy as np

from consumer.config import Settings
from consumer.errors import ConfigError
from consumer.model.record import check_model, load_record, summary
from consumer.model.runner import OnnxRunner, warmup_plan
from consumer.model.session import SessionOptions
from consumer.oip.encode import check_output
from consumer.signature import ModelSignature

log = logging.getLogger(__name__)

#: ONNX Runtime intra-op threads of the candidate's session (:func:`load_candidate`).
INTRA_OP_THREADS = 1
#: The settings that name the candidate and its record, in error messages.
SETTINGS = ("shadow_model_path", "shadow_validation_record")


def check_inputs(serving: ModelSignature, candidate: ModelSignature) -> None:
    """The candidate can be fed what the serving model is fed.

    Raises:
        ConfigError: a candidate input the serving model has not, or of another dtype, rank or fixed dimension
            (``shadow_model_path`` and the input named).
    """
    ours = {spec.name: spec for spec in serving.inputs}
    for spec in candidate.inputs:
        where = f"shadow_model_path: input {spec.name!r}"
        fed = ours.get(spec.name)
        if fed is None:
            raise ConfigError(f"{where} is not an input of the serving model (it has {sorted(ours)})")
        if fed.dtype != spec.dtype:
            raise ConfigError(f"{where} is {spec.datatype}, the serving model's is {fed.datatype}")
        if len(fed.shape) != len(spec.shape) or any(
            a is not None and b is not None and a != b for a, b in zip(fed.shape[1:], spec.shape[1:], strict=True)
        ):
            raise ConfigError(f"{where} has shape {list(spec.shape)}, the serving model's is {list(fed.shape)}")


def check_record(settings: Settings) -> None:
    """``shadow_model_path`` is the file ``shadow_validation_record`` describes (nothing to check when either is
    unset); its summary is logged. Cheap: ``consumer.__main__`` runs it before any model is loaded.

    Raises:
        ConfigError: the record cannot be read, or the file's SHA-256 is not the record's (both hashes named).
    """
    path, record_path = settings.shadow_model_path, settings.shadow_validation_record
    if path is None or record_path is None:
        return
    record = load_record(record_path, SETTINGS[1])
    check_model(record, path, SETTINGS)
    log.info("shadow validation record %s", json.dumps(summary(record)))


def load_candidate(
    settings: Settings,
    serving: OnnxRunner,
    warmup_sample: Callable[[ModelSignature], Mapping[str, np.ndarray]] | None = None,
    *,
    checked: bool = False,
) -> OnnxRunner | None:
    """The candidate of ``shadow_model_path``, checked and warmed up; None when the setting is unset.

    Opened with the serving model's execution provider and session options, but its own name and version (the
    graph metadata's: ``model_name`` and ``model_version`` name the serving model) and :data:`INTRA_OP_THREADS`
    intra-op thread: a candidate that computes all the time (slower than the stream, shedding) then takes at most
    one core from the serving model, whose own session keeps ``intra_op_threads``.

    Args:
        warmup_sample: as :meth:`consumer.model.runner.OnnxRunner.load` (the decoded ``warmup_request``).
        checked: :func:`check_record` already ran (the hash is not computed twice).

    Raises:
        ConfigError: as the module docstring says.
        ModelError: the file cannot be opened, probed or encoded (:meth:`~consumer.model.runner.OnnxRunner.load`).
    """
    path = settings.shadow_model_path
    if path is None:
        return None
    if not checked:  # before loading: a wrong file is refused at once
        check_record(settings)
    options = dataclasses.replace(
        SessionOptions.from_settings(settings), model_name=None, model_version=None, intra_op_threads=INTRA_OP_THREADS
    )
    runner = OnnxRunner.load(path, options, warmup_sample=warmup_sample, answer_encoders=(check_output,))
    check_inputs(serving.signature, runner.signature)
    sizes, lengths = warmup_plan(runner, settings.max_batch_size)
    runner.warmup(sizes, settings.warmup_runs, lengths)
    log.info(
        "shadow candidate %s v%s from %s on %s", runner.signature.name, runner.signature.version, path, runner.provider
    )
    return runner
