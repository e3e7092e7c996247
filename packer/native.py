"""The packer's one native dependency on the reader: the C extension ``dlpack_io.reader._jpeg``
(the reader's own JPEG decoder, which the packer uses to prove a JPEG decodes the way the
reader will decode it, and to add restart markers). Optional: None where it did not build
(or ``DLPACK_IO_NO_JPEG_EXT=1``, as for the reader)."""
from __future__ import annotations

import os


def native():
    """The ``_jpeg`` extension module, or None."""
    if os.environ.get("DLPACK_IO_NO_JPEG_EXT") == "1":
        return None
    try:
        from dlpack_io.reader import _jpeg
    except ImportError:
        return None
    return _jpeg
