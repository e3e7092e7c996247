"""A fetch that fails in several of the planner's requests at once (reader/remote/planner.py):
every wait raises the one error, and no failed request is left for asyncio to report later
as "Task exception was never retrieved" with a traceback in the user's log. Real SeaweedFS."""
from __future__ import annotations

import gc
import logging

import numpy as np
import pytest

from dlpack_io.reader.dataset import Dataset
from dlpack_io.reader.remote.storage import EndpointUnreachableError

from helpers import pack_and_upload

URL = "s3://dlpack-test/planner/errors"


@pytest.fixture(scope="module")
def packed(tmp_path_factory, s3_server):
    return pack_and_upload(tmp_path_factory.mktemp("plannererr"), URL, s3_server.env(),
                           count=24, classes=2, seed=5, size=(40, 48))


def test_requests_that_fail_together_leave_no_unretrieved_task(s3_env, s3_server, packed,
                                                              caplog):
    from urllib.parse import urlsplit

    from dlpack_io.tools.bench.latencyproxy import LatencyProxy

    target = urlsplit(s3_server.endpoint)
    proxy = LatencyProxy(target.hostname, target.port).start()
    options = {"endpoint": proxy.endpoint, "retries": 2, "deadline": 20}
    total = int(Dataset(URL)._remote.lengths.sum())  # below it: many small requests at once
    remote = Dataset(URL, fetch_mode="records", cache_limit=total // 2, storage_options=options)
    proxy.stop()  # the endpoint stops answering: every request of the epoch fails
    n = len(remote)
    with caplog.at_level(logging.DEBUG, logger="asyncio"):
        prefetch = remote.start_prefetch([np.arange(i, min(n, i + 4)) for i in range(0, n, 4)],
                                         mode="records")
        with pytest.raises(EndpointUnreachableError):
            prefetch.wait(0, timeout=60)
        with pytest.raises(EndpointUnreachableError):
            prefetch.wait(1, timeout=60)
        prefetch.close()
        del prefetch
        gc.collect()
    assert "never retrieved" not in caplog.text
