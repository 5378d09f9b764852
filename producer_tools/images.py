"""Images to send: the files of a folder, or scikit-image's bundled sample photographs (encoded as JPEG here).

Used by ``streaminfer-produce --source DIR|samples`` and the vision benchmark. The sample photographs ship inside
the scikit-image wheel (``skimage.data``; the ``bench`` extra installs it), so nothing is downloaded.
"""

from __future__ import annotations

import io
from pathlib import Path

#: File suffixes read from a folder (what Pillow decodes), lower case.
IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".webp", ".gif", ".bmp", ".tif", ".tiff")
#: scikit-image's colour photographs (skimage.data): chelsea is a tabby cat (ImageNet 281-285), coffee an espresso.
SAMPLES = ("chelsea", "coffee", "astronaut", "rocket", "hubble_deep_field", "immunohistochemistry")
#: JPEG quality the samples are encoded at (a typical camera or web setting).
JPEG_QUALITY = 90


def folder_images(folder: Path) -> list[tuple[str, bytes]]:
    """Every image file directly in ``folder`` (by suffix, :data:`IMAGE_SUFFIXES`), sorted by name: (name, bytes).

    Raises:
        ValueError: the folder holds no image file.
        OSError: it cannot be read.
    """
    files = sorted(p for p in folder.iterdir() if p.is_file() and p.suffix.lower() in IMAGE_SUFFIXES)
    if not files:
        raise ValueError(f"{folder} holds no image file ({', '.join(IMAGE_SUFFIXES)})")
    return [(p.name, p.read_bytes()) for p in files]


def sample_images() -> list[tuple[str, bytes]]:
    """scikit-image's sample photographs (:data:`SAMPLES`), RGB, JPEG-encoded at :data:`JPEG_QUALITY`.

    Raises:
        ModuleNotFoundError: scikit-image is not installed (``pip install -e '.[bench]'``).
    """
    import skimage.data
    from PIL import Image

    out = []
    for name in SAMPLES:
        pixels = getattr(skimage.data, name)()
        buffer = io.BytesIO()
        Image.fromarray(pixels[..., :3]).convert("RGB").save(buffer, "JPEG", quality=JPEG_QUALITY)
        out.append((f"{name}.jpg", buffer.getvalue()))
    return out
