"""The bench's source folder: every input ``dlpack convert`` accepts, in the one form every
contender reads alike (an upright RGB JPEG), and the bad ones left out and counted.

The contenders (files + PIL, LMDB, WebDataset, FFCV, our Loader...) were written for an
ImageNet-like folder of RGB JPEGs. A PNG, a grey or CMYK JPEG, or one whose EXIF says
"rotate", each reads differently (or not at all) in some of them, so the bench would crash
or compare different pixels. Such inputs are re-encoded once, upright and RGB, into
out/src-prepared (the others are hard-linked there); an input that does not decode is left
out and counted, as convert's rejects are. A folder of plain RGB JPEGs is used as it is.
"""
from __future__ import annotations

import io
import logging
import os
import shutil
from collections import Counter
from concurrent.futures import ProcessPoolExecutor

log = logging.getLogger(__name__)
PREPARED = "src-prepared"
QUALITY = 95  # convert's default --quality for images that must be re-encoded


def classify(path: str) -> str:
    """'plain' (an upright RGB JPEG), 'reencode: <why>' (an image that must be re-encoded)
    or 'bad: <why>' (no image we can read), for the file at ``path``; never raises."""
    from PIL import Image

    try:
        with Image.open(path) as img:
            why = _why_reencode(img)
            img.draft("RGB", (max(1, img.width // 8), max(1, img.height // 8)))
            img.load()  # a truncated or corrupt file fails here, not in a contender
        return "plain" if why is None else f"reencode: {why}"
    except Exception as exc:  # noqa: BLE001 - any decoder failure makes a bad input
        return f"bad: {type(exc).__name__}: {exc}"[:200]


def _why_reencode(img) -> str | None:
    if img.format != "JPEG":
        return f"{img.format or 'unknown'} image"
    if img.mode != "RGB":
        return f"{img.mode} JPEG"
    if img.getexif().get(0x0112, 1) not in (0, 1):  # EXIF Orientation
        return "EXIF-rotated JPEG"
    return None


def upright_jpeg(path: str) -> bytes:
    """The image at ``path`` upright (EXIF applied), RGB, as a JPEG at QUALITY."""
    from PIL import Image, ImageOps

    with Image.open(path) as img:
        rgb = ImageOps.exif_transpose(img).convert("RGB")
    out = io.BytesIO()
    rgb.save(out, format="JPEG", quality=QUALITY)
    return out.getvalue()


def bench_source(src: str, out: str, workers: int | None = None) -> tuple[str, dict]:
    """(the folder the bench reads, what was done: counts by reason). Raises ValueError
    naming ``src`` when no input can be read."""
    from dlpack_io.packer.scan import scan_image_folder

    inputs = scan_image_folder(src)
    paths = [os.path.join(inputs.root, p) for p in inputs.paths]
    with ProcessPoolExecutor(max(1, min(workers or os.cpu_count() or 1, 8))) as pool:
        kinds = list(pool.map(classify, paths, chunksize=64))
    report = dict(Counter(k for k in kinds if k != "plain"))
    if all(k.startswith("bad") for k in kinds):
        raise ValueError(f"{src}: none of its {len(kinds)} image files can be read ("
                         + "; ".join(f"{why} ({n}x)" for why, n in sorted(report.items())[:3])
                         + "); the bench needs at least one image that convert accepts")
    if not report:
        return src, report
    dst = os.path.join(out, PREPARED)
    shutil.rmtree(dst, ignore_errors=True)  # an earlier run's folder may hold other inputs
    for rel, path, kind in zip(inputs.paths, paths, kinds):
        if kind.startswith("bad"):
            continue
        target = os.path.join(dst, rel if kind == "plain" else rel + ".jpg")  # x.png.jpg
        os.makedirs(os.path.dirname(target), exist_ok=True)
        if kind == "plain":
            _link_or_copy(path, target)
        else:
            with open(target, "wb") as f:
                f.write(upright_jpeg(path))
    for why, n in sorted(report.items()):
        log.info("bench source: %d input(s) %s", n, "left out (" + why + ")"
                 if why.startswith("bad") else "re-encoded as upright RGB JPEGs (" + why + ")")
    return dst, report


def _link_or_copy(path: str, target: str) -> None:
    try:
        os.link(path, target)
    except OSError:  # another file system, or links not allowed: a copy reads the same
        shutil.copyfile(path, target)
