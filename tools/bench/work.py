"""The per-sample work every contender does, so that only the loading machinery differs.

W_jpeg: PIL decode -> RandomResizedCrop(224) with torchvision's sampling (scale 0.08-1,
ratio 3/4-4/3, 10 tries then a centre crop) and PIL bilinear resize -> horizontal flip with
p=0.5 -> CHW uint8. W_raw: a stored 256x256x3 array -> random 224x224 crop -> flip -> CHW.
Batches are (uint8 NCHW tensor, int64 labels). torchvision is not used (no CPU build here);
its sampling is reproduced here line for line.
"""
from __future__ import annotations

import io
import math
import random

import numpy as np

CROP = 224
RAW_SIZE = 256
SCALE = (0.08, 1.0)
RATIO = (3.0 / 4.0, 4.0 / 3.0)


def rrc_box(width: int, height: int, rng=random) -> tuple[int, int, int, int]:
    """torchvision RandomResizedCrop.get_params: (left, top, crop width, crop height)."""
    area = width * height
    log_ratio = (math.log(RATIO[0]), math.log(RATIO[1]))
    for _ in range(10):
        target_area = area * rng.uniform(*SCALE)
        aspect = math.exp(rng.uniform(*log_ratio))
        w = int(round(math.sqrt(target_area * aspect)))
        h = int(round(math.sqrt(target_area / aspect)))
        if 0 < w <= width and 0 < h <= height:
            return rng.randint(0, width - w), rng.randint(0, height - h), w, h
    in_ratio = width / height
    if in_ratio < RATIO[0]:
        w, h = width, int(round(width / RATIO[0]))
    elif in_ratio > RATIO[1]:
        h, w = height, int(round(height * RATIO[1]))
    else:
        w, h = width, height
    return (width - w) // 2, (height - h) // 2, w, h


def _to_chw(hwc: np.ndarray, flip: bool) -> np.ndarray:
    if flip:
        hwc = hwc[:, ::-1]
    return np.ascontiguousarray(hwc.transpose(2, 0, 1))


def jpeg_work(data: bytes, rng=random) -> np.ndarray:
    """W_jpeg on one encoded image: (3, 224, 224) uint8."""
    from PIL import Image

    with Image.open(io.BytesIO(data)) as img:
        img = img.convert("RGB")
        left, top, w, h = rrc_box(img.width, img.height, rng)
        out = img.resize((CROP, CROP), Image.BILINEAR, box=(left, top, left + w, top + h))
    return _to_chw(np.asarray(out), rng.random() < 0.5)


def raw_work(hwc: np.ndarray, rng=random) -> np.ndarray:
    """W_raw on one stored HWC uint8 image: random 224 crop, flip, (3, 224, 224) uint8."""
    top = rng.randint(0, hwc.shape[0] - CROP)
    left = rng.randint(0, hwc.shape[1] - CROP)
    return _to_chw(hwc[top:top + CROP, left:left + CROP], rng.random() < 0.5)


def raw_from_bytes(data, rng=random) -> np.ndarray:
    """W_raw on a stored 256x256x3 buffer (bytes, memoryview or array)."""
    arr = np.frombuffer(data, dtype=np.uint8).reshape(RAW_SIZE, RAW_SIZE, 3)
    return raw_work(arr, rng)


def sample_work(mode: str):
    """The work function of a mode: jpeg -> jpeg_work(bytes), raw -> raw_from_bytes(buffer)."""
    if mode not in ("jpeg", "raw"):
        raise ValueError(f"mode must be 'jpeg' or 'raw', got {mode!r}")
    return jpeg_work if mode == "jpeg" else raw_from_bytes


def collate(samples) -> tuple:
    """[(chw uint8, label), ...] -> (uint8 NCHW tensor, int64 label tensor)."""
    import torch

    images = np.stack([s[0] for s in samples])
    labels = np.fromiter((int(s[1]) for s in samples), dtype=np.int64, count=len(samples))
    return torch.from_numpy(images), torch.from_numpy(labels)


def resize_center(data: bytes, size: int = RAW_SIZE) -> np.ndarray:
    """Decode, resize the shorter side to ``size`` (bilinear) and centre-crop: HWC uint8.

    How raw 256x256 stores are made for the peers (our packer's raw mode does the same).
    """
    from PIL import Image

    with Image.open(io.BytesIO(data)) as img:
        img = img.convert("RGB")
        scale = size / min(img.width, img.height)
        w, h = max(size, round(img.width * scale)), max(size, round(img.height * scale))
        img = img.resize((w, h), Image.BILINEAR)
        left, top = (w - size) // 2, (h - size) // 2
        return np.asarray(img.crop((left, top, left + size, top + size)))
