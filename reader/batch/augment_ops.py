"""The image ops of torchvision's AutoAugment, RandAugment and TrivialAugmentWide, on PIL
images, as torchvision's PIL path computes them (``torchvision.transforms.autoaugment.
_apply_op`` -> ``functional`` -> PIL): shears about the corner (0, 0), translations by whole
pixels, rotation about the centre, fill outside the image; ImageEnhance for brightness,
colour, contrast and sharpness (factor ``1 + magnitude``); ImageOps for the rest.
"""
from __future__ import annotations

import math

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
