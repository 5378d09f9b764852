"""The benchmark's requests: held-out digits rows and MiniLM texts from the standard library's docstrings."""

from __future__ import annotations

import importlib
import inspect
import os
import re
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from consumer.oip.client import encode_request, encode_request_binary
from consumer.oip.wire import BINARY_HEADER
from producer_tools.produce import DEFAULT_HELDOUT, Outgoing

if TYPE_CHECKING:
    from consumer.model.runner import OnnxRunner

ROOT = Path(__file__).resolve().parents[2]
DIGITS_MODEL = ROOT / "models" / "digits" / "artifacts" / "digits.onnx"
DEFAULT_MINILM = Path(os.environ.get("STREAMINFER_CACHE", Path.home() / ".cache" / "streaminfer")) / "minilm"
#: models/efficientnet_lite0/build.py's default output folder.
DEFAULT_VISION = DEFAULT_MINILM.parent / "efficientnet_lite0"
#: Python standard library modules whose docstrings are the MiniLM corpus.
CORPUS_MODULES = (
    "argparse",
    "asyncio",
    "collections",
    "concurrent.futures",
    "csv",
    "dataclasses",
    "decimal",
    "email",
    "enum",
    "fractions",
    "functools",
    "http",
    "inspect",
    "json",
    "logging",
    "os",
    "pathlib",
    "pickle",
    "random",
    "re",
    "shutil",
    "socket",
    "sqlite3",
    "statistics",
    "string",
    "subprocess",
    "tarfile",
    "textwrap",
    "threading",
    "typing",
    "unittest",
    "urllib.request",
    "zipfile",
)


def digits_rows(heldout: Path = DEFAULT_HELDOUT) -> np.ndarray:
    """The held-out digits, FP32 ``[n, 64]``."""
    with np.load(heldout) as data:
        return np.asarray(data["x"], dtype=np.float32)


def digits_backlog(tag: str, n: int, binary: bool = False) -> list[Outgoing]:
    """``n`` one-row digits requests (held-out rows, cycled), JSON or binary extension."""
    x = digits_rows()
    out = []
    for i in range(n):
        cid = f"{tag}-{i}"
        row = x[i % len(x) : i % len(x) + 1]
        if binary:
            value, length = encode_request_binary(cid, {"input": row}, binary_output=False)
            out.append(Outgoing(cid, value, headers=((BINARY_HEADER, str(length).encode()),)))
        else:
            out.append(Outgoing(cid, encode_request(cid, {"input": row})))
    return out


def corpus(n: int) -> list[str]:
    """``n`` texts: paragraphs of the standard library's docstrings (fixed module order), cycled."""
    seen: set[str] = set()
    texts: list[str] = []
    with warnings.catch_warnings():  # touching deprecated members (typing.io) warns
        warnings.simplefilter("ignore", DeprecationWarning)
        for name in CORPUS_MODULES:
            module = importlib.import_module(name)
            members = sorted(inspect.getmembers(module), key=lambda kv: kv[0])
            for obj in [module, *(obj for _, obj in members)]:
                doc = inspect.getdoc(obj) if callable(obj) or inspect.ismodule(obj) else None
                for para in re.split(r"\n\s*\n", doc or ""):
                    text = " ".join(para.split())
                    if 10 <= len(text) <= 1200 and text not in seen:
                        seen.add(text)
                        texts.append(text)
    return [texts[i % len(texts)] for i in range(n)]


def sorted_batches(
    runner: OnnxRunner, tokenizer: Path, texts: Sequence[str], size: int, max_tokens: int | None = None
) -> tuple[list[dict[str, np.ndarray]], float]:
    """Bare ONNX Runtime's best case for a sequence model: ``texts`` tokenized one by one, sorted by length and
    padded per batch of at most ``size`` rows and, with ``max_tokens``, at most that many padded tokens (rows x
    longest; on CPU smaller batches of long texts run faster than full ones, which the consumer's
    ``max_batch_tokens`` exploits too, so a fair ceiling has the same freedom).

    Returns:
        (batches, mean tokens per text): each batch input name -> INT64 ``[rows, longest]``.
    """
    from consumer.model.buffers import BatchBuffers
    from consumer.model.sequence import TextEncoder

    spec = runner.signature.sequence
    assert spec is not None
    encoder = TextEncoder(tokenizer, spec)
    parts = sorted((encoder.encode([t]) for t in texts), key=lambda p: p["input_ids"].shape[1])
    buffers = BatchBuffers({s.name: s.dtype for s in runner.signature.inputs}, spec.pad_values)
    groups: list[list[dict[str, np.ndarray]]] = [[]]
    for part in parts:  # ascending length: the newest part is the longest of its group
        group = groups[-1]
        tokens = (len(group) + 1) * part["input_ids"].shape[1]
        if group and (len(group) == size or (max_tokens is not None and tokens > max_tokens)):
            groups.append(group := [])
        group.append(part)
    batches = []
    for group in groups:
        feeds, _, _ = buffers.pad(group)
        batches.append({k: v.copy() for k, v in feeds.items()})
    return batches, float(np.mean([p["input_ids"].shape[1] for p in parts]))


def text_backlog(tag: str, texts: Sequence[str]) -> list[Outgoing]:
    """One text request (BYTES ``[1]``) per text."""
    return [Outgoing(f"{tag}-{i}", encode_request(f"{tag}-{i}", {"text": [t]})) for i, t in enumerate(texts)]
