"""dlpack_io.reader.transforms: the Loader's transforms, with torchvision's names and meanings.

    transforms=[RandomResizedCrop(224), RandomHorizontalFlip(),
                ColorJitter(brightness=0.4, contrast=0.4, saturation=0.4),
                Normalize(mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225))]

Each op is a small frozen description that also holds the maths of its own step; the Loader
compiles the list once (reader/batch/plan.py) and fuses the ops into one pass per sample:

* ``geometry.py``: Resize, RandomResizedCrop, RandomCrop, CenterCrop, the two flips, and the
  rule by which boxes and masks follow them;
* ``colour.py``: ColorJitter and Normalize (the epilogue after the pixels; its maths is in
  ``dlpack_io.kernels``, the Triton kernels and their torch twin);
* recipe ops, imported only when a recipe holds them: ``autoaugment.py`` (AutoAugment,
  RandAugment, TrivialAugmentWide), ``erasing.py`` (RandomErasing), ``mixing.py`` (MixUp,
  CutMix);
* ``sample.py``: SampleTransform, a PIL or torchvision pipeline run per sample unchanged.

What an op declares (class attributes): ``role`` (its slot in the compiled recipe), ``stage``
(where it may stand in the list: ops of a lower stage come first) and ``stream`` (the id of
its random draws, fixed forever: see reader/batch/plan.py). docs/ARCHITECTURE.md, "Adding a
transform", lists the files a new op touches.
"""
__all__ = ["Resize", "RandomResizedCrop", "RandomCrop", "CenterCrop", "RandomHorizontalFlip",
           "RandomVerticalFlip", "ColorJitter", "Normalize", "RandomErasing", "MixUp", "CutMix",
           "AutoAugment", "RandAugment", "TrivialAugmentWide", "SampleTransform",
           "TransformError"]

_HOME = {**dict.fromkeys(("Resize", "RandomResizedCrop", "RandomCrop", "CenterCrop",
                          "RandomHorizontalFlip", "RandomVerticalFlip", "TransformError"),
                         "geometry"),
         **dict.fromkeys(("ColorJitter", "Normalize"), "colour"),
         **dict.fromkeys(("AutoAugment", "RandAugment", "TrivialAugmentWide"), "autoaugment"),
         "RandomErasing": "erasing", "MixUp": "mixing", "CutMix": "mixing",
         "SampleTransform": "sample"}


def __getattr__(name: str):
    if name in _HOME:
        import importlib

        value = getattr(importlib.import_module(f"{__name__}.{_HOME[name]}"), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(__all__))
