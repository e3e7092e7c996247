"""dlpack_io.reader: read packed data sets.

    from dlpack_io.reader import (Dataset, Loader, RandomResizedCrop, RandomCrop, CenterCrop,
                                  Resize, RandomHorizontalFlip, RandomVerticalFlip,
                                  ColorJitter, Normalize)

Cheap to import: ``Loader`` and ``LoaderOptions`` (and with them torch) are imported on first
use, so the packer's worker processes, which import ``dlpack_io.reader.format``, do not pay
for torch.
"""
from dlpack_io.reader.dataset import Dataset
from dlpack_io.reader.batch.errors import LoaderError, LoaderTimeout, SampleError, WorkerError
from dlpack_io.reader.format import FormatError
from dlpack_io.reader.batch.transforms import (AutoAugment, CenterCrop, ColorJitter, CutMix,
                                               MixUp, Normalize, RandAugment, RandomCrop,
                                               RandomErasing, RandomHorizontalFlip,
                                               RandomResizedCrop, RandomVerticalFlip, Resize,
                                               TrivialAugmentWide)
from dlpack_io.reader.batch.sampleio import SampleTransform

__all__ = ["Dataset", "Loader", "LoaderOptions", "FormatError", "LoaderError", "LoaderTimeout",
           "SampleError", "WorkerError", "Resize", "RandomResizedCrop", "RandomCrop",
           "CenterCrop", "RandomHorizontalFlip", "RandomVerticalFlip", "ColorJitter",
           "Normalize", "RandomErasing", "MixUp", "CutMix", "SampleTransform",
           "AutoAugment", "RandAugment", "TrivialAugmentWide"]

_LAZY = {"Loader": "dlpack_io.reader.batch.loader", "LoaderOptions": "dlpack_io.reader.batch.options"}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'dlpack_io.reader' has no attribute {name!r}")
