"""A server that answers, but too slowly (one byte every half second), is reported as a
timeout, with the advice to allow more time; not as an unreachable endpoint (that is a
closed port or a name that does not resolve: tests/remote/test_storage_failures.py)."""
from __future__ import annotations

import asyncio
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.dirname(__file__)))
from hostile_s3 import HostileS3  # noqa: E402

from dlpack_io.packer import convert  # noqa: E402
from dlpack_io.reader import format as fmt  # noqa: E402
from dlpack_io.reader.dataset import Dataset  # noqa: E402
from dlpack_io.reader.remote.storage import (EndpointUnreachableError,  # noqa: E402
                                             StorageTimeoutError, Store, classify, run_sync)
from dlpack_io.tools.synth import make_image_folder  # noqa: E402

URL = "s3://hostile-bucket/set"
PATIENCE = {"request_timeout": 1, "connect_timeout": 1, "retries": 1, "deadline": 3}
HINTS = {"endpoint": "AWS_ENDPOINT_URL", "bucket": "bucket", "credentials": "AWS_*",
         "service": "S3"}


@pytest.fixture(scope="module")
def packed(tmp_path_factory):
    root = tmp_path_factory.mktemp("slow")
    make_image_folder(root / "src", 6, 2, seed=7, size=(32, 40))
    convert(root / "src", root / "set", workers=1, progress=False)
    return root / "set"


@pytest.fixture
def server(packed, monkeypatch, tmp_path, hang_deadline):
    for key in list(os.environ):
        if key.startswith("AWS_"):
            monkeypatch.delenv(key)
    with HostileS3(packed) as srv:
        for key, value in srv.env().items():
            monkeypatch.setenv(key, value)
        monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
        monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
        yield srv


def _says_timeout(message: str) -> None:
    assert "timed out (the server answered too slowly)" in message, message
    assert "unreachable" not in message and "request_timeout" in message


def test_a_slow_manifest_is_a_timeout(server, tmp_path):
    server.faults[fmt.MANIFEST_NAME] = "slow"
    with pytest.raises(StorageTimeoutError) as caught:
        Dataset(URL, cache_dir=tmp_path / "c", storage_options=PATIENCE)
    _says_timeout(str(caught.value))
    assert f"{URL}/{fmt.MANIFEST_NAME}" in str(caught.value)


def test_a_slow_range_read_by_the_event_loop_is_a_timeout(server, packed):
    name = sorted(p.name for p in packed.iterdir() if p.name.startswith("shard-"))[0]
    server.faults[name] = "slow"
    store = Store(URL, storage_options=PATIENCE)
    with pytest.raises(StorageTimeoutError) as caught:
        run_sync(store.aget_range(name, 0, 4096))
    _says_timeout(str(caught.value))


def test_timeouts_and_refused_connections_are_told_apart():
    assert classify(asyncio.TimeoutError(), "GET", HINTS)[1] is StorageTimeoutError
    body = ("Generic S3 error: HTTP error: request or response body error\n\nDebug source:\n"
            "Generic { source: HttpError { kind: Timeout, source: reqwest::Error { kind: Body,"
            " source: TimedOut } } }")
    assert classify(Exception(body), "GET", HINTS)[:2] == (True, StorageTimeoutError)
    connect = ("Generic S3 error: HTTP error: error sending request\n\nDebug source:\n"
               "HttpError { kind: Timeout, source: reqwest::Error { kind: Request, source: "
               "hyper_util::client::legacy::Error(Connect, ConnectError(\"tcp connect error\", "
               "TimedOut)) } }")
    assert classify(Exception(connect), "GET", HINTS)[1] is EndpointUnreachableError
    refused = "error sending request for url: tcp connect error: Connection refused"
    assert classify(Exception(refused), "GET", HINTS)[1] is EndpointUnreachableError
