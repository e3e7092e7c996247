"""dlpack_io.packer: turn a folder of JPEGs into verified, resumable shards.

``convert(src, dst, **options)`` is what ``dlpack convert`` calls; ``Writer(dst)`` packs
samples that come from code (``w.write(image=..., label=..., **fields)``).
"""
from dlpack_io.packer.version import __version__  # noqa: F401 - the package's version


def convert(src, dst, **options):
    """Pack ``src`` into ``dst``; see dlpack_io.packer.conversion.convert for the options."""
    from dlpack_io.packer.conversion import convert as _convert

    return _convert(src, dst, **options)


def __getattr__(name):
    """``Writer`` imported on first use (PIL and the encoder stay out of a bare import)."""
    if name == "Writer":
        from dlpack_io.packer.writer import Writer

        return Writer
    raise AttributeError(f"module 'dlpack_io.packer' has no attribute {name!r}")
