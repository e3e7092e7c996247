"""The one accessor of the optional C extension ``dlpack_io.reader._jpeg`` (reader/_jpeg.c,
reader/_restarts.c, reader/_resize.c: libjpeg-turbo region decoding, restart-marker
rewriting, the antialiased bilinear resize).

Both sides of the format use it: the reader decodes JPEG records with it
(reader/jpegdecode.py), and the packer uses it to prove that a JPEG decodes the way the
reader will decode it and to add restart markers. It lives beside the spec, not in the
reader's core, because the packer may import only ``dlpack_io.reader.format`` and the storage
seam; keeping the rule here means ``DLPACK_IO_NO_JPEG_EXT=1`` means the same on both sides.
"""
from __future__ import annotations

import os

DISABLE_ENV = "DLPACK_IO_NO_JPEG_EXT"  # "1": behave as if the extension had not built


def native_jpeg():
    """The ``_jpeg`` extension module, or None where it did not build or
    ``DLPACK_IO_NO_JPEG_EXT=1`` (forces the PIL paths: tests, debugging).

    The variable is read on every call, not once at import, so a process (or a test) that
    sets it before packing is honoured; a successful import is cached by Python itself.
    """
    if os.environ.get(DISABLE_ENV) == "1":
        return None
    try:
        from dlpack_io.reader import _jpeg
    except ImportError:  # the optional extension did not build (no libjpeg headers)
        return None
    return _jpeg
