"""Data sets from strangers (issue 16): crafted with the format module, checksums resealed,
opened by Dataset, Loader (serial, threads, processes), inspect and verify in a child
process under an address-space limit and a deadline. The only outcomes allowed: a clean
error naming the problem (DAMAGED in verify) within seconds; never a signal, a hang, a
MemoryError or a raw parser exception. Each crafting function says what happened before.

All cases run in one child process (one torch import); a child that dies is replaced for
the remaining cases, and the case that killed it fails with "DIED <status>".
"""
import io
import os
import shutil
import struct

import pytest

from dlpack_io.reader import format as fmt

from crafted import (MODES, assert_refused, load_manifest, one_record_shard, read_shard,
                     reseal_shard, run_consumers, write_manifest)


def _jpeg(progressive: bool = False) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (8, 8), (200, 30, 40)).save(buf, format="JPEG", progressive=progressive)
    return buf.getvalue()


def _claim_size(jpeg: bytes, height: int, width: int) -> bytes:
    """The same JPEG with its SOF header claiming height x width."""
    data = bytearray(jpeg)
    for marker in (b"\xff\xc0", b"\xff\xc2"):
        at = data.find(marker)
        if at > 0:
            data[at + 5:at + 9] = struct.pack(">HH", height, width)
            return bytes(data)
    raise AssertionError("no SOF marker")


def wrapping_index(ds):
    """Before: raw record 4278847826 x 1437049164 x 3 = 2^64 + 776 bytes wrapped to its
    776-byte length; verify called the set intact; the Loader read ~2^63 bytes past the map."""
    h, w = 4278847826, 1437049164
    assert (h * w * 3) % 2**64 == 776
    one_record_shard(ds, bytes(776), height=h, width=w, kind=fmt.KIND_RAW)


def huge_image(ds):
    """Before: a 300-byte JPEG claiming 65535 x 65535 allocated 12 GiB in Dataset[i],
    verify --decode and inspect --grid, and 16 GiB of Loader scratch."""
    one_record_shard(ds, _claim_size(_jpeg(), 65535, 65535), height=65535, width=65535,
                     kind=fmt.KIND_JPEG)


def header_larger_than_index(ds):
    """The index says 8 x 8, the progressive JPEG's header 40000 x 40000: libjpeg would
    size (and zero) a 9.6 GB coefficient buffer from the header."""
    one_record_shard(ds, _claim_size(_jpeg(progressive=True), 40000, 40000), height=8,
                     width=8, kind=fmt.KIND_JPEG)


def claimed_count(claim):
    def craft(ds):
        """Before: the Loader built the shuffle order for the claimed count first."""
        manifest = load_manifest(ds)
        manifest["shards"][0]["num_samples"] = manifest["num_samples"] = claim
        manifest["class_counts"] = [claim - 4, 4]
        write_manifest(ds, manifest)
    return craft


def not_a_file(target):
    def craft(ds):
        """Before: a FIFO hung Dataset, Loader and inspect forever; a manifest that is a
        symlink to /dev/zero was read without end (then MemoryError)."""
        path = ds / ("manifest.json" if target.startswith("manifest") else "shard-00000.rec")
        path.unlink()
        if target.endswith("fifo"):
            os.mkfifo(path)
        else:
            path.symlink_to("/dev/zero")
    return craft


def manifest_text(text):
    def craft(ds):
        """Before: RecursionError / the int digit-limit ValueError, tracebacks in verify."""
        (ds / "manifest.json").write_text(text)
    return craft


def label(value):
    def craft(ds):
        """Before: returned as if fine; -1 even mapped to the last class name."""
        _, data, index, meta = read_shard(ds / "shard-00000.rec")
        index["label"][3] = value
        reseal_shard(ds, 0, data, index, meta, counts=False)
    return craft


def overlap(ds):
    """Before: passed dlpack verify (FORMAT.md said every byte was checked)."""
    _, data, index, meta = read_shard(ds / "shard-00000.rec")
    index["offset"][2], index["crc"][2] = index["offset"][1], index["crc"][1]
    reseal_shard(ds, 0, data, index, meta, counts=False)


def uncovered_bytes(ds):
    """Before: 64 bytes of hidden content after the last record passed dlpack verify."""
    _, data, index, meta = read_shard(ds / "shard-00000.rec")
    reseal_shard(ds, 0, data + b"\x01" * 64, index, meta, counts=False)


def lmdb_node(ds):
    """Issue 13 item 6: the __index__ node's data size set to 4 GiB; liblmdb would hand
    out a buffer running 4 GiB past its map (SIGSEGV/SIGBUS in whoever reads it)."""
    shard = ds / "shard-00000.lmdb"
    data = bytearray(shard.read_bytes())
    at = data.find(b"__index__")
    assert at > 8
    data[at - 8:at - 4] = b"\xff\xff\xff\xff"  # node header: data size lo, hi
    shard.write_bytes(bytes(data))


JPEG_MODES = ("dataset", "serial", "threads", "processes", "verify")
# case: (base data set, crafting function, text every outcome must contain, modes)
CASES = {
    "wrapping-index": ("raw", wrapping_index, "height and width must be 1..65535", MODES),
    "huge-image": ("jpeg", huge_image, "more than the limit of 89478485", MODES),
    "header-larger-than-index": ("jpeg", header_larger_than_index, "40000 x 40000", JPEG_MODES),
    "count-1e12": ("raw", claimed_count(10**12), "holds 8 records, the manifest says 1000000000000",
                   MODES),
    "count-2e9": ("raw", claimed_count(2 * 10**9), "holds 8 records, the manifest says 2000000000",
                  MODES),
    "manifest-fifo": ("raw", not_a_file("manifest-fifo"), "a FIFO (named pipe)", MODES),
    "manifest-devzero": ("raw", not_a_file("manifest-devzero"), "a character device", MODES),
    "shard-fifo": ("raw", not_a_file("shard-fifo"), "a FIFO (named pipe)", MODES),
    "nested-brackets": ("raw", manifest_text("[" * 100_000), "nested too deeply", MODES),
    "5000-digits": ("raw", manifest_text('{"kind": ' + "7" * 5000 + "}"), "manifest.json: not valid",
                    MODES),
    "label-minus-1": ("raw", label(-1), "label -1 outside the classes", MODES),
    "label-2^31-1": ("raw", label(2**31 - 1), "label 2147483647 outside the classes", MODES),
    "overlap": ("raw", overlap, "the layout puts it at", MODES),
    "uncovered-bytes": ("raw", uncovered_bytes, "bytes no record covers", MODES),
    "lmdb-node": ("lmdb", lmdb_node, "damaged LMDB structure", MODES),
}


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory):
    """Pack three small data sets, craft every case from a copy, run them all."""
    from dlpack_io.packer import convert
    from dlpack_io.tools.synth import make_image_folder

    root = tmp_path_factory.mktemp("untrusted")
    make_image_folder(root / "src", 8, 2, seed=4, size=(24, 32))
    for name, kw in (("raw", dict(mode="raw", size=16)), ("jpeg", {}), ("lmdb", dict(format="lmdb"))):
        convert(root / "src", root / name, workers=1, progress=False, **kw)
    paths = {"intact": root / "raw"}
    for case, (base, craft, _, _) in CASES.items():
        paths[case] = root / "cases" / case
        shutil.copytree(root / base, paths[case])
        craft(paths[case])
    return run_consumers(paths, root)


@pytest.mark.slow
@pytest.mark.parametrize("case", sorted(CASES))
def test_crafted_data_set_is_refused_cleanly(outcomes, case):
    _, craft, match, modes = CASES[case]
    assert_refused(outcomes[case], match, modes)


@pytest.mark.slow
def test_an_intact_set_passes_the_same_harness(outcomes):
    """The harness itself: the untouched set gives OK everywhere, so the refusals above
    are the checks speaking."""
    assert all(outcomes["intact"].get(m) == "OK" for m in MODES), outcomes["intact"]
