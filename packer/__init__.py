"""dlpack_io.packer: turn a folder of JPEGs into verified, resumable shards.

``convert(src, dst, **options)`` is what ``dlpack convert`` calls.
"""
from dlpack_io.packer.version import __version__  # noqa: F401 - the package's version


def convert(src, dst, **options):
    """Pack ``src`` into ``dst``; see dlpack_io.packer.conversion.convert for the options."""
    from dlpack_io.packer.conversion import convert as _convert

    return _convert(src, dst, **options)
