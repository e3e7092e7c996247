"""A manifest (checksum resealed) and a server's HEAD that both claim a shard of 2^50 bytes:
`dlpack verify` reports it at once, as damage (no shard of its samples can be that large),
and a Dataset refuses the manifest naming the shard; a claim a shard could make but this
machine cannot hold is "not checked", never a MemoryError or a disk filled up."""
from __future__ import annotations

import json
import os
import shutil
import sys
import time

import pytest

sys.path.insert(0, os.path.dirname(os.path.dirname(__file__)))
from hostile_s3 import HostileS3  # noqa: E402

from dlpack_io.packer import convert  # noqa: E402
from dlpack_io.reader import format as fmt  # noqa: E402
from dlpack_io.reader.dataset import Dataset  # noqa: E402
from dlpack_io.tools.remoteverify import verify_remote  # noqa: E402
from dlpack_io.tools.synth import make_image_folder  # noqa: E402

URL = "s3://hostile-bucket/set"


@pytest.fixture(scope="module")
def packed(tmp_path_factory):
    root = tmp_path_factory.mktemp("huge")
    make_image_folder(root / "src", 12, 2, seed=3, size=(32, 40))
    convert(root / "src", root / "set", shard_size="10KB", workers=1, progress=False)
    return root / "set"


def _forged(packed, tmp_path, num_samples=None):
    """A copy of ``packed`` whose manifest claims 2^50 bytes for shard 0 (``num_samples``:
    and that many samples in it), checksum resealed."""
    forged = tmp_path / "forged"
    shutil.copytree(packed, forged)
    manifest = json.loads((forged / fmt.MANIFEST_NAME).read_text())
    shard = manifest["shards"][0]
    shard["bytes"] = 2**50
    if num_samples is not None:
        grow = num_samples - shard["num_samples"]
        shard["num_samples"] = num_samples
        for later in manifest["shards"][1:]:
            later["first_sample"] += grow
        manifest["num_samples"] += grow
        manifest["class_counts"][0] += grow
    manifest["checksum"] = fmt.manifest_checksum(manifest)
    (forged / fmt.MANIFEST_NAME).write_bytes(fmt.encode_meta(manifest))
    return forged, shard["name"]


@pytest.fixture
def serve(monkeypatch, tmp_path, hang_deadline):
    def start(folder):
        for key in list(os.environ):
            if key.startswith("AWS_"):
                monkeypatch.delenv(key)
        srv = HostileS3(folder).__enter__()
        for key, value in srv.env().items():
            monkeypatch.setenv(key, value)
        monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
        monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
        servers.append(srv)
        return srv
    servers = []
    yield start
    for srv in servers:
        srv.__exit__(None, None, None)


def test_a_shard_larger_than_its_samples_can_be_is_damage_at_once(packed, tmp_path, serve):
    forged, name = _forged(packed, tmp_path)
    server = serve(forged)
    server.faults[name] = "huge-size"
    t0 = time.monotonic()
    report = verify_remote(URL, progress=False)
    assert time.monotonic() - t0 < 10
    assert report.exit_code == 1, report.problems
    assert f"claims {2**50} bytes, more than a shard of" in report.problems[0]["problem"]
    assert name in report.problems[0]["problem"]
    with pytest.raises(fmt.FormatError, match=rf"{name} claims {2**50} bytes"):
        Dataset(URL, cache_dir=tmp_path / "cache")


def test_a_claim_beyond_the_local_disk_is_not_checked_and_no_memory_is_spent(packed, tmp_path,
                                                                             serve):
    forged, name = _forged(packed, tmp_path, num_samples=200_000)
    server = serve(forged)
    server.faults[name] = "huge-size"
    t0 = time.monotonic()
    report = verify_remote(URL, progress=False)
    assert time.monotonic() - t0 < 20
    mine = [p for p in report.problems if name in p["where"]]
    assert mine and mine[0]["problem"].startswith(f"not checked: {2**50} bytes, more than the")
    assert "TMPDIR" in mine[0]["problem"] and mine[0]["kind"] == "storage"
    assert not [r for r in server.requests if r[0] == "GET" and r[1] == name]
