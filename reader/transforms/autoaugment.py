"""torchvision's AutoAugment (ImageNet policy), RandAugment and TrivialAugmentWide.

Same names, parameters, op tables and magnitudes as ``torchvision.transforms``; the random
choices (op, magnitude bin, sign, sub-policy, whether each step applies) are a pure
function of (seed, epoch, sample index) like every other draw of the Loader. They run per
sample on the host, on the cropped and flipped uint8 image (torchvision's recipe order:
crop, flip, augment, then ToTensor / Normalize / RandomErasing), with PIL as torchvision's
PIL path does (the ops at the end of this module). With ``device="cuda"`` a spec holding
one of them is finished on the host and copied (the GPU kernels do not have these ops).
Recipe ops: imported only by a Loader whose transforms hold one.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from dlpack_io.reader.transforms.geometry import check_interpolation

_IMAGENET = (
    (("Posterize", 0.4, 8), ("Rotate", 0.6, 9)), (("Solarize", 0.6, 5), ("AutoContrast", 0.6, None)),
    (("Equalize", 0.8, None), ("Equalize", 0.6, None)), (("Posterize", 0.6, 7), ("Posterize", 0.6, 6)),
    (("Equalize", 0.4, None), ("Solarize", 0.2, 4)), (("Equalize", 0.4, None), ("Rotate", 0.8, 8)),
    (("Solarize", 0.6, 3), ("Equalize", 0.6, None)), (("Posterize", 0.8, 5), ("Equalize", 1.0, None)),
    (("Rotate", 0.2, 3), ("Solarize", 0.6, 8)), (("Equalize", 0.6, None), ("Posterize", 0.4, 6)),
    (("Rotate", 0.8, 8), ("Color", 0.4, 0)), (("Rotate", 0.4, 9), ("Equalize", 0.6, None)),
    (("Equalize", 0.0, None), ("Equalize", 0.8, None)), (("Invert", 0.6, None), ("Equalize", 1.0, None)),
    (("Color", 0.6, 4), ("Contrast", 1.0, 8)), (("Rotate", 0.8, 8), ("Color", 1.0, 2)),
    (("Color", 0.8, 8), ("Solarize", 0.8, 7)), (("Sharpness", 0.4, 7), ("Invert", 0.6, None)),
    (("ShearX", 0.6, 5), ("Equalize", 1.0, None)), (("Color", 0.4, 0), ("Equalize", 0.6, None)),
    (("Equalize", 0.4, None), ("Solarize", 0.2, 4)), (("Solarize", 0.6, 5), ("AutoContrast", 0.6, None)),
    (("Invert", 0.6, None), ("Equalize", 1.0, None)), (("Color", 0.6, 4), ("Contrast", 1.0, 8)),
    (("Equalize", 0.8, None), ("Equalize", 0.6, None)))


def space(num_bins: int, width: int, height: int, wide: bool = False) -> dict:
    """op -> (magnitudes (list, or None for ops without one), signed): torchvision's
    ``_augmentation_space`` (float32 linspaces, as torch computes them)."""
    import torch

    def lin(a, b):
        return torch.linspace(a, b, num_bins).tolist()
    top = 0.99 if wide else 0.9
    bits = 6 if wide else 4
    return {
        "Identity": (None, False),
        "ShearX": (lin(0.0, 0.99 if wide else 0.3), True),
        "ShearY": (lin(0.0, 0.99 if wide else 0.3), True),
        "TranslateX": (lin(0.0, 32.0 if wide else 150.0 / 331.0 * width), True),
        "TranslateY": (lin(0.0, 32.0 if wide else 150.0 / 331.0 * height), True),
        "Rotate": (lin(0.0, 135.0 if wide else 30.0), True),
        "Brightness": (lin(0.0, top), True), "Color": (lin(0.0, top), True),
        "Contrast": (lin(0.0, top), True), "Sharpness": (lin(0.0, top), True),
        "Posterize": ((8 - (torch.arange(num_bins) / ((num_bins - 1) / bits)).round().int())
                      .tolist(), False),
        "Solarize": (lin(255.0, 0.0), False),
        "AutoContrast": (None, False), "Equalize": (None, False),
        "Invert": (None, False),
    }


def _fill(name: str, fill):
    if fill is None:
        return (0, 0, 0)
    values = tuple(fill) if isinstance(fill, (tuple, list)) else (fill,) * 3
    if len(values) != 3:
        raise ValueError(f"{name}: fill {fill!r}: one number or one per RGB channel")
    return tuple(int(v) for v in values)


class _Augment:
    """What the three share: interpolation and fill checks, :meth:`apply` and
    :meth:`apply_rows`."""

    role, stage, stream = "sample", 2, 8

    def _check(self, name: str) -> None:
        mode, _ = check_interpolation(name, self.interpolation, True)
        object.__setattr__(self, "interpolation", mode)
        object.__setattr__(self, "fill", _fill(name, self.fill))

    def apply(self, hwc: np.ndarray, ops) -> np.ndarray:
        """(H, W, 3) uint8 after the drawn ``ops`` [(name, magnitude), ...]."""
        from PIL import Image

        from dlpack_io.reader.resample import pil_filter

        img = Image.fromarray(hwc, "RGB")
        for name, magnitude in ops:
            img = apply_op(img, name, magnitude, pil_filter(self.interpolation), self.fill)
        return np.array(img)  # writable: it is copied into the batch row

    def apply_rows(self, draws, indices, rows) -> None:
        """Apply the op in place to ``rows`` ((n, 3, H, W) uint8 torch tensor on the CPU),
        one row per index of ``indices``."""
        if not len(indices):
            return
        plans = self.draw(draws, indices, tuple(rows.shape[2:]))
        planes = rows.numpy()  # numpy's strided copies: torch's permuted copy_ is ~10x slower
        for row, ops in zip(planes, plans):
            if ops:
                row[...] = self.apply(np.ascontiguousarray(row.transpose(1, 2, 0)),
                                      ops).transpose(2, 0, 1)


def _signed(magnitude, signed: bool, negate: bool) -> float:
    return -float(magnitude) if signed and negate else float(magnitude)


@dataclass(frozen=True)
class TrivialAugmentWide(_Augment):
    """One op of the wide space, uniformly, at a uniform magnitude bin and sign."""

    num_magnitude_bins: int = 31
    interpolation: object = "nearest"
    fill: object = None

    def __post_init__(self):
        if int(self.num_magnitude_bins) < 2:
            raise ValueError(f"TrivialAugmentWide: num_magnitude_bins="
                             f"{self.num_magnitude_bins} must be >= 2")
        self._check("TrivialAugmentWide")

    def draw(self, draws, indices, size) -> list:
        """Per sample, the [(op, magnitude)] to apply to an image of ``size`` (h, w)."""
        table = space(self.num_magnitude_bins, size[1], size[0], wide=True)
        names = [n for n in table if n != "Invert"]
        u = draws(self.stream, indices, 3)
        out = []
        for u0, u1, u2 in u:
            name = names[int(u0 * len(names))]
            mags, signed = table[name]
            mag = 0.0 if mags is None else mags[int(u1 * len(mags))]
            out.append([(name, _signed(mag, signed, u2 >= 0.5))])
        return out


@dataclass(frozen=True)
class RandAugment(_Augment):
    """``num_ops`` ops, each uniformly chosen (with a random sign), at ``magnitude``."""

    num_ops: int = 2
    magnitude: int = 9
    num_magnitude_bins: int = 31
    interpolation: object = "nearest"
    fill: object = None

    def __post_init__(self):
        if int(self.num_ops) < 0 or not 0 <= int(self.magnitude) < int(self.num_magnitude_bins):
            raise ValueError(f"RandAugment: num_ops={self.num_ops} must be >= 0 and magnitude="
                             f"{self.magnitude} in [0, num_magnitude_bins="
                             f"{self.num_magnitude_bins})")
        self._check("RandAugment")

    def draw(self, draws, indices, size) -> list:
        """Per sample, the [(op, magnitude)] to apply to an image of ``size`` (h, w)."""
        table = space(self.num_magnitude_bins, size[1], size[0])
        names = [n for n in table if n != "Invert"]
        u = draws(self.stream, indices, 2 * max(self.num_ops, 1))
        out = []
        for row in u:
            ops = []
            for k in range(self.num_ops):
                name = names[int(row[2 * k] * len(names))]
                mags, signed = table[name]
                mag = 0.0 if mags is None else mags[self.magnitude]
                ops.append((name, _signed(mag, signed, row[2 * k + 1] >= 0.5)))
            out.append(ops)
        return out


@dataclass(frozen=True)
class AutoAugment(_Augment):
    """One of the 25 ImageNet sub-policies, uniformly; each of its two steps applies with
    its probability, at its magnitude bin (of 10), with a random sign."""

    policy: object = "imagenet"
    interpolation: object = "nearest"
    fill: object = None

    def __post_init__(self):
        name = str(getattr(self.policy, "value", self.policy)).lower()
        if name != "imagenet":
            raise ValueError(f"AutoAugment: policy {self.policy!r}: only the ImageNet policy "
                             f"is available ('imagenet' or AutoAugmentPolicy.IMAGENET)")
        object.__setattr__(self, "policy", name)
        self._check("AutoAugment")

    def draw(self, draws, indices, size) -> list:
        """Per sample, the [(op, magnitude)] to apply to an image of ``size`` (h, w)."""
        table = space(10, size[1], size[0])
        u = draws(self.stream, indices, 5)
        out = []
        for row in u:
            ops = []
            for i, (name, p, bin_) in enumerate(_IMAGENET[int(row[0] * len(_IMAGENET))]):
                if row[1 + i] <= p:
                    mags, signed = table[name]
                    mag = 0.0 if bin_ is None else mags[bin_]
                    ops.append((name, _signed(mag, signed, row[3 + i] < 0.5)))
            out.append(ops)
        return out


# ---- the image ops ---------------------------------------------------------------------
# torchvision's AutoAugment, RandAugment and TrivialAugmentWide ops on PIL images, as
# torchvision's PIL path computes them (torchvision.transforms.autoaugment._apply_op ->
# functional -> PIL): shears about the corner (0, 0), translations by whole pixels,
# rotation about the centre, fill outside the image; ImageEnhance for brightness, colour,
# contrast and sharpness (factor 1 + magnitude); ImageOps for the rest.

OPS = ("Identity", "ShearX", "ShearY", "TranslateX", "TranslateY", "Rotate", "Brightness",
       "Color", "Contrast", "Sharpness", "Posterize", "Solarize", "AutoContrast", "Equalize",
       "Invert")


def inverse_affine(center, angle: float, translate, shear) -> list[float]:
    """torchvision's ``_get_inverse_affine_matrix`` (scale 1): the output->input map that
    PIL's ``Image.transform(AFFINE)`` takes."""
    rot = math.radians(angle)
    sx, sy = math.radians(shear[0]), math.radians(shear[1])
    cx, cy = center
    tx, ty = translate
    a = math.cos(rot - sy) / math.cos(sy)
    b = -math.cos(rot - sy) * math.tan(sx) / math.cos(sy) - math.sin(rot)
    c = math.sin(rot - sy) / math.cos(sy)
    d = -math.sin(rot - sy) * math.tan(sx) / math.cos(sy) + math.cos(rot)
    m = [d, -b, 0.0, -c, a, 0.0]
    m[2] += m[0] * (-cx - tx) + m[1] * (-cy - ty)
    m[5] += m[3] * (-cx - tx) + m[4] * (-cy - ty)
    m[2] += cx
    m[5] += cy
    return m


def _affine(img, resample, fill, center=None, translate=(0, 0), shear=(0.0, 0.0)):
    from PIL import Image

    if center is None:  # torchvision's PIL path: the centre without the 0.5 offset
        center = (img.size[0] * 0.5, img.size[1] * 0.5)
    matrix = inverse_affine(center, 0.0, translate, shear)
    return img.transform(img.size, Image.AFFINE, matrix, resample, fillcolor=fill)


def apply_op(img, name: str, magnitude: float, resample, fill):
    """``img`` (an RGB PIL image) after op ``name`` of the given magnitude."""
    from PIL import ImageEnhance, ImageOps

    if name == "ShearX":
        return _affine(img, resample, fill, (0, 0), shear=(math.degrees(math.atan(magnitude)), 0.0))
    if name == "ShearY":
        return _affine(img, resample, fill, (0, 0), shear=(0.0, math.degrees(math.atan(magnitude))))
    if name == "TranslateX":
        return _affine(img, resample, fill, translate=(int(magnitude), 0))
    if name == "TranslateY":
        return _affine(img, resample, fill, translate=(0, int(magnitude)))
    if name == "Rotate":
        return img.rotate(magnitude, resample, False, None, fillcolor=fill)
    enhance = {"Brightness": ImageEnhance.Brightness, "Color": ImageEnhance.Color,
               "Contrast": ImageEnhance.Contrast, "Sharpness": ImageEnhance.Sharpness}
    if name in enhance:
        return enhance[name](img).enhance(1.0 + magnitude)
    if name == "Posterize":
        return ImageOps.posterize(img, int(magnitude))
    if name == "Solarize":
        return ImageOps.solarize(img, magnitude)
    if name == "AutoContrast":
        return ImageOps.autocontrast(img)
    if name == "Equalize":
        return ImageOps.equalize(img)
    if name == "Invert":
        return ImageOps.invert(img)
    if name == "Identity":
        return img
    raise ValueError(f"augmentation op {name!r} is not one of {OPS}")
