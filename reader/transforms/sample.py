"""``SampleTransform``: run a PIL or torchvision (v1 / v2) per-sample pipeline unchanged in
the Loader's workers.

    Loader(ds, sample_transform=SampleTransform(my_pil_pipeline, input="pil"), ...)

The Loader hands ``sample_transform`` an (H, W, 3) uint8 ndarray and wants one back; this
wrapper converts on the way in (``input``: "numpy" as is, "pil" an RGB ``PIL.Image``,
"tensor" a (3, H, W) uint8 ``torch.Tensor`` as torchvision's ``pil_to_tensor`` /
``decode_jpeg`` give) and accepts any of those kinds on the way out (a grey result gains
its 3 channels). The result must still be uint8 pixels: conversions to float (``ToTensor``,
``ToDtype(float)``, ``Normalize``) belong in the Loader's ``transforms=[..., Normalize()]``,
which fuse them after the pipeline.
"""
from __future__ import annotations

import sys
from dataclasses import dataclass

import numpy as np

INPUTS = ("numpy", "pil", "tensor")


def _to_input(pixels: np.ndarray, kind: str):
    if kind == "pil":
        from PIL import Image

        return Image.fromarray(pixels, "RGB")
    if kind == "tensor":
        import torch

        return torch.from_numpy(np.ascontiguousarray(pixels)).permute(2, 0, 1).contiguous()
    return pixels


def _describe(out) -> str:
    return (f"{type(out).__module__}.{type(out).__name__} {getattr(out, 'dtype', '')} "
            f"{tuple(getattr(out, 'shape', ()))}".strip())


def to_pixels(out, name: str = "sample_transform") -> np.ndarray:
    """An (H, W, 3) uint8 C-contiguous ndarray from a PIL image, a (C, H, W) uint8 tensor
    or an (H, W[, C]) uint8 ndarray (C of 1 or 3); TypeError naming what came back."""
    try:
        from PIL import Image
    except ImportError:  # pragma: no cover - PIL is a dependency
        Image = None
    if Image is not None and isinstance(out, Image.Image):
        return np.asarray(out.convert("RGB"))
    torch = sys.modules.get("torch")  # a tensor result means torch is imported already
    if torch is not None and isinstance(out, torch.Tensor) and out.dtype == torch.uint8 \
            and out.ndim == 3:
        out = out.detach().cpu().permute(1, 2, 0).numpy()
    if isinstance(out, np.ndarray) and out.dtype == np.uint8 and out.ndim in (2, 3):
        out = out[:, :, None] if out.ndim == 2 else out
        if out.shape[2] == 1:
            out = np.repeat(out, 3, axis=2)
        if out.shape[2] == 3 and 0 not in out.shape:
            return np.ascontiguousarray(out)
    raise TypeError(f"{name} returned {_describe(out)}; expected uint8 pixels: a PIL image, a "
                    f"(3, H, W) uint8 tensor or an (H, W, 3) uint8 ndarray. Float conversions "
                    f"(ToTensor, ToDtype, Normalize) go in the Loader's transforms=[..., "
                    f"Normalize(mean, std)] and dtype=, which run after sample_transform")


@dataclass(frozen=True)
class SampleTransform:
    """``fn`` run on each sample as ``input`` ("numpy", "pil" or "tensor"); see the module
    doc. Picklable when ``fn`` is (process workers pickle it)."""

    fn: object
    input: str = "numpy"

    def __post_init__(self):
        if not callable(self.fn):
            raise TypeError(f"SampleTransform: {self.fn!r} is not callable")
        if self.input not in INPUTS:
            raise ValueError(f"SampleTransform: input={self.input!r}; expected one of {INPUTS}")

    def __call__(self, pixels: np.ndarray) -> np.ndarray:
        """(H, W, 3) uint8 in, (H', W', 3) uint8 out, ``fn`` run on the chosen kind."""
        return to_pixels(self.fn(_to_input(pixels, self.input)),
                         f"sample_transform {getattr(self.fn, '__name__', self.fn)!r}")
