"""The byte budget of every response holds for gs:// and az:// as for s3:// (issue 26's
hostile server, tests/hostile_s3.py, reached through each cloud's endpoint variables): a
body longer than asked, or endless, is cut off at once and named; a claimed size beyond the
manifest is refused before anything is read."""
from __future__ import annotations

import json
import time

import pytest

from dlpack_io.packer import convert
from dlpack_io.reader import format as fmt
from dlpack_io.reader.dataset import Dataset
from dlpack_io.reader.remote.storage import StorageError
from dlpack_io.tools.synth import make_image_folder

from emulators import AZURITE_ACCOUNT, AZURITE_KEY
from hostile_s3 import HostileS3

PATIENCE = {"request_timeout": 1, "connect_timeout": 1, "retries": 1, "deadline": 3}
URLS = {"gs": "gs://hostile-bucket/set", "az": "az://hostile-container/set"}


@pytest.fixture(scope="module")
def packed(tmp_path_factory):
    root = tmp_path_factory.mktemp("hostile-clouds")
    make_image_folder(root / "src", 12, 2, seed=7, size=(32, 40))
    convert(root / "src", root / "set", shard_size="20KB", workers=1, progress=False)
    return root / "set"


@pytest.fixture(params=sorted(URLS))
def hostile(request, packed, cloud_env, hang_deadline):
    """(URL, the hostile server) with the scheme's variables pointing at it."""
    with HostileS3(packed) as srv:
        base = f"http://127.0.0.1:{srv.port}"
        cloud_env({"STORAGE_EMULATOR_HOST": base} if request.param == "gs" else
                  {"AZURE_STORAGE_CONNECTION_STRING":
                   f"AccountName={AZURITE_ACCOUNT};AccountKey={AZURITE_KEY};"
                   f"BlobEndpoint={base}/{AZURITE_ACCOUNT}"})
        yield URLS[request.param], srv


@pytest.mark.parametrize("fault", ["long", "endless"])
def test_a_body_longer_than_asked_is_cut_off_and_named(hostile, packed, tmp_path, fault):
    url, server = hostile
    shard = json.loads((packed / fmt.MANIFEST_NAME).read_text())["shards"][0]["name"]
    server.faults[shard] = fault
    t0 = time.monotonic()
    with pytest.raises(StorageError) as info:
        Dataset(url, cache_dir=tmp_path / "cache", storage_options=PATIENCE)
    message = str(info.value)
    assert f"GET {url}/{shard} bytes 0-4095" in message, message
    assert "where 4096 were asked for" in message
    assert time.monotonic() - t0 < 10  # cut off at once, not after 1 TB (endless)


def test_a_claimed_size_beyond_the_manifest_is_refused(hostile, tmp_path):
    url, server = hostile
    server.faults[fmt.MANIFEST_NAME] = "huge-size"
    with pytest.raises(fmt.FormatError, match=f"{url}/manifest.json: 1125899906842624 bytes"):
        Dataset(url, cache_dir=tmp_path / "cache", storage_options=PATIENCE)
    assert [r for r in server.requests if r[0] == "GET"] == []  # nothing read
