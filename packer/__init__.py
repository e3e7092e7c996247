"""dlpack_io.packer: turn a folder of JPEGs into verified, resumable shards.

``convert(src, dst, ...)`` is what ``dlpack convert`` calls; ``Writer(dst)`` packs samples
that come from code (``w.write(image=..., label=..., **fields)``); both raise
``ConversionError`` naming the file and the fix. Each is imported on first use, so a bare
``import dlpack_io.packer`` pulls in neither PIL nor the encoder, and each shows its own
signature (``help(dlpack_io.packer.convert)``).
"""
from dlpack_io.packer.version import __version__  # noqa: F401 - the package's version

_LAZY = {"convert": "dlpack_io.packer.conversion", "Writer": "dlpack_io.packer.writer",
         "ConversionError": "dlpack_io.packer.records"}
__all__ = ["convert", "Writer", "ConversionError", "__version__"]


def __getattr__(name):
    """``convert``, ``Writer`` and ``ConversionError``, imported on first use."""
    if name in _LAZY:
        import importlib

        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value  # later lookups skip this function
        return value
    raise AttributeError(f"module 'dlpack_io.packer' has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(_LAZY))
