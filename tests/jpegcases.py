"""JPEG files as real photo collections hold them, for the tests that prove records load
back exactly as Pillow shows the file: every EXIF orientation, 4:2:0/4:2:2/4:4:4,
grayscale, progressive, CMYK and YCCK, restart markers, odd and tiny sizes."""
import io

import numpy as np
from PIL import Image, ImageOps

from dlpack_io.tools.synth import photo_like


def save(img, **kw) -> bytes:
    out = io.BytesIO()
    img.save(out, format=kw.pop("format", "JPEG"), **kw)
    return out.getvalue()


def exif_with(orientation):
    exif = Image.Exif()
    exif[0x0112] = orientation
    return exif


def ycck(cmyk_jpeg: bytes) -> bytes:
    """A YCCK JPEG: Pillow writes CMYK with an Adobe APP14 marker whose transform byte
    (offset 11 of its data) is 0; 2 makes every decoder read the components as YCCK."""
    data = bytearray(cmyk_jpeg)
    at = data.find(b"Adobe")
    assert at > 0 and data[at + 11] == 0
    data[at + 11] = 2
    return bytes(data)


def collection() -> dict:
    """name -> JPEG bytes: the cases real photo collections hold (odd sizes on purpose)."""
    rng = np.random.default_rng(11)
    rgb = Image.fromarray(photo_like(rng, 45, 70))
    cases = {}
    for o in range(1, 9):
        for name, sub in (("420", 2), ("422", 1), ("444", 0)):
            cases[f"rgb{name}_o{o}"] = save(rgb, quality=90, subsampling=sub, exif=exif_with(o))
        cases[f"gray_o{o}"] = save(rgb.convert("L"), exif=exif_with(o))
        cases[f"progressive_o{o}"] = save(rgb, progressive=True, exif=exif_with(o))
    cmyk = save(rgb.convert("CMYK"), quality=92)
    cases.update(cmyk=cmyk, ycck=ycck(cmyk), cmyk_o6=save(rgb.convert("CMYK"), exif=exif_with(6)),
                 ycck_o3=ycck(save(rgb.convert("CMYK"), exif=exif_with(3))),
                 restart_rows_o8=save(rgb, restart_marker_rows=1, exif=exif_with(8)),
                 restart_blocks=save(rgb, restart_marker_blocks=5),
                 gray_progressive=save(rgb.convert("L"), progressive=True),
                 tiny_o7=save(rgb.resize((3, 2)), exif=exif_with(7)),
                 bad_orientation_9=save(rgb, exif=exif_with(9)))
    return cases


def reference(data: bytes) -> np.ndarray:
    return np.asarray(ImageOps.exif_transpose(Image.open(io.BytesIO(data))).convert("RGB"))


def orientation_of(data: bytes) -> int:
    """The EXIF orientation the packer records for a JPEG (1 when absent or out of 1..8)."""
    o = Image.open(io.BytesIO(data)).getexif().get(0x0112, 1)
    return o if 1 <= o <= 8 else 1


def random_boxes(rng, height: int, width: int, count: int):
    """``count`` random (top, left, h, w) boxes inside a height x width image."""
    for _ in range(count):
        top, left = int(rng.integers(0, height)), int(rng.integers(0, width))
        yield (top, left, int(rng.integers(1, height - top + 1)),
               int(rng.integers(1, width - left + 1)))


def assert_upright_boxes(payload, ref: np.ndarray, orientation: int, rng, count: int,
                         name: str, opaque: bool = False) -> None:
    """``count`` random boxes of the upright image decoded from ``payload`` (a JPEG or a
    planes record) at full scale as RGB and RGBX are exactly ``ref``'s pixels; ``opaque``:
    the X byte of RGBX is 255 too."""
    from dlpack_io.reader import jpegdecode

    H, W = ref.shape[:2]
    scratch = np.empty(jpegdecode.scratch_bytes(H, W), np.uint8)
    for top, left, h, w in random_boxes(rng, H, W, count):
        for ps in (3, 4):
            r = jpegdecode.decode_region(payload, (top, left, h, w), 8, scratch, ps,
                                         orientation=orientation)
            got = r.pixels[top - r.y0:top - r.y0 + h, left - r.x0:left - r.x0 + w]
            np.testing.assert_array_equal(got[..., :3], ref[top:top + h, left:left + w],
                                          err_msg=f"{name} box {(top, left, h, w)}")
            if opaque and ps == 4:
                assert (got[..., 3] == 255).all(), f"{name} box {(top, left, h, w)}"
