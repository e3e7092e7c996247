"""Opening image headers from several threads at once (the field blocks made ahead,
packer/fields.py) leaves PIL's process-wide decompression-bomb limit as it was."""
from __future__ import annotations

import io
import sys
import threading

from PIL import Image

from dlpack_io.packer.encode import open_image


def test_concurrent_opens_restore_pils_bomb_limit():
    buf = io.BytesIO()
    Image.new("L", (4, 4)).save(buf, "PNG")
    data, before = buf.getvalue(), Image.MAX_IMAGE_PIXELS
    ready = threading.Barrier(8)

    def opens():
        ready.wait()
        for _ in range(300):
            assert open_image(data, 100).size == (4, 4)

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads inside the save / restore window often
    try:
        threads = [threading.Thread(target=opens) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        sys.setswitchinterval(interval)
        limit_after, Image.MAX_IMAGE_PIXELS = Image.MAX_IMAGE_PIXELS, before
    assert limit_after == before is not None
