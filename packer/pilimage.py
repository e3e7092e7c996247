"""The PIL steps of encoding one input: open it behind the decompression-bomb guard,
decode it, turn it upright, convert it to RGB, resize it.

Kept apart from encode.py, which decides *which* of these steps a record needs (the
"same upright RGB pixels" rule); here is only *how* each step is done with PIL. PIL is
imported inside the functions: the packer's parent process and ``dlpack --help`` must not
pay for it, and a missing PIL is reported by ``require_pil`` with the one-line fix.
"""
from __future__ import annotations

import io
import os
import threading
import warnings

from dlpack_io.packer.records import RejectedInput

PIL_MISSING = ("no PIL provider is installed (dlpack needs one to read images): "
               "pip install 'dlpack-io[pillow]', or pillow-simd for faster resizing")


def require_pil() -> None:
    """Raise RuntimeError with the one-line fix when no PIL provider can be imported.

    Called before any work starts (``convert`` checks before scanning the folder)."""
    try:
        import PIL  # noqa: F401
    except ImportError:
        raise RuntimeError(PIL_MISSING) from None


# PIL's bomb limit and the warning filters are process globals: threads opening images
# at once (the field blocks made ahead, fieldahead.py) must not interleave their save and
# restore, which left PIL's guard off (None) for the rest of the process
_GLOBALS = threading.Lock()


def _new_lock() -> None:
    """A forked worker starts with a free lock (a thread of the parent may hold it)."""
    global _GLOBALS
    _GLOBALS = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_new_lock)


def open_image(data: bytes, max_pixels: int):
    """PIL image of ``data`` (header only), rejected beyond ``max_pixels``."""
    from PIL import Image, UnidentifiedImageError

    if not data:
        raise RejectedInput("empty file (0 bytes)")
    try:
        with _GLOBALS, warnings.catch_warnings():  # our limit below replaces Pillow's
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            limit, Image.MAX_IMAGE_PIXELS = Image.MAX_IMAGE_PIXELS, None
            try:
                img = Image.open(io.BytesIO(data))
            finally:
                Image.MAX_IMAGE_PIXELS = limit
    except UnidentifiedImageError:
        raise RejectedInput("not an image PIL can identify") from None
    except Exception as exc:  # PIL raises many types on a damaged header
        raise RejectedInput(f"cannot read the image header: {exc}") from None
    w, h = img.size
    if w * h > max_pixels:
        raise RejectedInput(f"{w} x {h} = {w * h} pixels is more than --max-pixels "
                            f"{max_pixels} (decompression bomb guard); raise --max-pixels "
                            f"to pack it")
    return img


def full_decode(img) -> None:
    """Decode every pixel; raises RejectedInput on truncated or corrupt data."""
    try:
        img.load()
    except Exception as exc:  # PIL raises OSError, SyntaxError, ValueError...
        raise RejectedInput(f"cannot decode {img.format or 'image'}: {exc}") from None


def exif_orientation(img) -> int:
    """The EXIF orientation (1..8) the reader must apply; 1 when absent or malformed."""
    try:
        value = int(img.getexif().get(0x0112, 1) or 1)
    except Exception:  # malformed EXIF blocks are common; Pillow then leaves it as it is
        return 1
    return value if 1 <= value <= 8 else 1  # exif_transpose ignores other values too


def upright_rgb(img):
    """Fully decoded, EXIF-transposed RGB image: the pixels every record must decode to."""
    from PIL import ImageOps

    full_decode(img)
    img = ImageOps.exif_transpose(img)
    if img.mode != "RGB":
        img = img.convert("RGB")
    return img


def target_size(w: int, h: int, size: int | None, max_side: int | None) -> tuple[int, int]:
    """Size to resize to before any center crop: shorter side = size, or longer <= max_side."""
    if size is not None:
        scale = size / min(w, h)
    elif max_side is not None and max(w, h) > max_side:
        scale = max_side / max(w, h)
    else:
        return w, h
    return max(1, round(w * scale)), max(1, round(h * scale))


def resize(img, size: int | None, max_side: int | None):
    """Resize as asked (bilinear), then center-crop to ``size`` x ``size`` when ``size``."""
    from PIL import Image

    w, h = img.size
    tw, th = target_size(w, h, size, max_side)
    if (tw, th) != (w, h):
        img = img.resize((tw, th), Image.BILINEAR)
    if size is not None:
        left, top = (tw - size) // 2, (th - size) // 2
        img = img.crop((left, top, left + size, top + size))
    return img


def draft_for(img, size, max_side) -> None:
    """Let libjpeg decode at 1/2, 1/4 or 1/8 scale when the target is that much smaller."""
    if img.format == "JPEG" and (size or max_side):
        tw, th = target_size(*img.size, size, max_side)
        img.draft("RGB", (tw, th))
