"""dlpack_io.reader: read packed data sets.

    from dlpack_io.reader import (Dataset, Mixture, Loader, Order, Workers, Output,
                                  RandomResizedCrop, RandomCrop, CenterCrop, Resize,
                                  RandomHorizontalFlip, RandomVerticalFlip, ColorJitter,
                                  Normalize)

Cheap to import: every public name is imported on first use, so a process that needs only
the byte spec (the packer's workers, the ``dlpack`` command's option lists: they import
``dlpack_io.reader.format``) does not pay for the Dataset, the Loader or torch.
"""
__all__ = ["Dataset", "Loader", "Order", "Workers", "Output", "AspectBuckets", "TokenBudget",
           "LoaderOptions", "LoaderStats",
           "FormatError", "LoaderError",
           "LoaderTimeout", "SampleError", "WorkerError", "Resize", "RandomResizedCrop",
           "RandomCrop", "CenterCrop", "RandomHorizontalFlip", "RandomVerticalFlip",
           "ColorJitter", "Normalize", "RandomErasing", "MixUp", "CutMix", "SampleTransform",
           "AutoAugment", "RandAugment", "TrivialAugmentWide", "Mixture"]

_TRANSFORMS = "dlpack_io.reader.transforms"
_OPTIONS = "dlpack_io.reader.batch.options"
_ERRORS = "dlpack_io.reader.batch.errors"
_LAZY = {"Dataset": "dlpack_io.reader.dataset", "FormatError": "dlpack_io.reader.format",
         "Mixture": "dlpack_io.reader.mixture",
         "Loader": "dlpack_io.reader.batch.loader",
         **dict.fromkeys(("LoaderOptions", "Order", "Workers", "Output"), _OPTIONS),
         "LoaderStats": "dlpack_io.reader.batch.stats",
         **dict.fromkeys(("AspectBuckets", "TokenBudget"), "dlpack_io.reader.batch.buckets"),
         **dict.fromkeys(("LoaderError", "LoaderTimeout", "SampleError", "WorkerError"), _ERRORS),
         **dict.fromkeys(("Resize", "RandomResizedCrop", "RandomCrop", "CenterCrop",
                          "RandomHorizontalFlip", "RandomVerticalFlip", "ColorJitter",
                          "Normalize", "RandomErasing", "MixUp", "CutMix", "AutoAugment",
                          "RandAugment", "TrivialAugmentWide", "SampleTransform"), _TRANSFORMS)}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'dlpack_io.reader' has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(__all__))
