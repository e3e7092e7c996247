"""Raw records resized on the host path (reader/batch/host.py): the C resize reads the
mapped record itself, under its SIGBUS guard, so the record is not copied first (the copy
was for PIL, which reads Python-land memory unguarded); the PIL filters still copy."""
import pytest
import torch

from helpers import pack_jpeg_and_raw

from dlpack_io.reader import CenterCrop, Dataset, Loader, RandomResizedCrop, Resize, jpegdecode
from dlpack_io.reader.batch import build as host

needs_c_resize = pytest.mark.skipif(jpegdecode.native_resize is None, reason="no C extension")


@pytest.fixture(scope="module")
def raw(tmp_path_factory):
    return Dataset(pack_jpeg_and_raw(tmp_path_factory.mktemp("hostraw"), 6, 2, seed=4,
                                     shard_size="64MB")["raw"])


def _epoch(ds, transforms):
    loader = Loader(ds, batch_size=3, transforms=transforms, device="cpu", num_workers=0,
                    seed=5, dtype=torch.uint8)
    return torch.cat([batch[0] for batch in loader])


@needs_c_resize
@pytest.mark.parametrize("transforms", [[RandomResizedCrop(17)], [Resize(23), CenterCrop(19)]])
def test_a_raw_record_resized_in_c_is_read_in_place(raw, transforms, monkeypatch):
    copies = []
    real = host.guarded_array
    monkeypatch.setattr(host, "guarded_array", lambda view: copies.append(1) or real(view))
    got = _epoch(raw, transforms)
    assert copies == []
    monkeypatch.setattr(jpegdecode, "native_resize", None)  # the PIL resize: copied first
    want = _epoch(raw, transforms)
    assert len(copies) == 6
    assert got.shape == want.shape
    assert int((got.int() - want.int()).abs().max()) <= 2  # Pillow-SIMD vs Pillow 13 rounding


CHILD = """
import os, sys
from dlpack_io.reader import Dataset, Loader, RandomResizedCrop
from dlpack_io.reader.batch.errors import LoaderError
from dlpack_io.reader.format import FormatError
ds = Dataset(sys.argv[1])
batches = 0
try:
    for images, labels in Loader(ds, batch_size=2, transforms=[RandomResizedCrop(17)],
                                 device="cpu", num_workers=0, shuffle=None):
        batches += 1
        if batches == 1:
            for shard in ds.shards:
                os.truncate(shard.path, 4096)
    print("COMPLETED", batches)
except (LoaderError, FormatError) as exc:
    print("RAISED", batches, str(exc).replace(chr(10), " ")[:600])
"""


@needs_c_resize
def test_a_raw_shard_truncated_under_the_c_resize_is_an_error_naming_it(raw, tmp_path):
    """The record read in place: the C resize's SIGBUS guard turns the fault into an error
    naming the shard (run in a child: a bus error that escaped would be its exit status)."""
    import shutil
    import subprocess
    import sys

    copy = tmp_path / "raw"
    shutil.copytree(raw.path, copy)
    done = subprocess.run([sys.executable, "-c", CHILD, str(copy)], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, f"the loader process died ({done.returncode}): {done.stderr[-2000:]}"
    assert done.stdout.startswith("RAISED 1 "), done.stdout
    # the bus error is reported as the shard's change on disk once the size check sees it
    assert "shard-0000" in done.stdout and ("resize: bus error reading" in done.stdout
                                            or "changed on disk" in done.stdout), done.stdout
