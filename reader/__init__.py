"""dlpack_io.reader: read packed data sets.

``from dlpack_io.reader import Dataset`` (and, once built, Loader and the crop transforms).
"""
from dlpack_io.reader.dataset import Dataset
from dlpack_io.reader.format import FormatError

__all__ = ["Dataset", "FormatError"]
