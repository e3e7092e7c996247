"""dlpack_io.reader: read packed data sets.

``from dlpack_io.reader import Dataset, Loader, RandomResizedCrop, RandomCrop, CenterCrop``.
``Loader`` (and with it torch) is imported on first use, so the packer's worker processes,
which import ``dlpack_io.reader.format``, do not pay for torch.
"""
from dlpack_io.reader.dataset import Dataset
from dlpack_io.reader.errors import LoaderError, SampleError, WorkerError
from dlpack_io.reader.format import FormatError
from dlpack_io.reader.transforms import CenterCrop, RandomCrop, RandomResizedCrop

__all__ = ["Dataset", "Loader", "FormatError", "LoaderError", "SampleError", "WorkerError",
           "RandomResizedCrop", "RandomCrop", "CenterCrop"]


def __getattr__(name: str):
    if name == "Loader":
        from dlpack_io.reader.loader import Loader

        globals()["Loader"] = Loader
        return Loader
    raise AttributeError(f"module 'dlpack_io.reader' has no attribute {name!r}")
