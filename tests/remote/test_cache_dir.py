"""A cache_dir that cannot be the cache folder (reader/remote/cache.py make_cache_dir): the
error names it as cache_dir and says what to pass, before any request is made."""
from __future__ import annotations

import pytest

from dlpack_io.reader.dataset import Dataset


@pytest.mark.parametrize("kind", ["a file", "under a file"])
def test_a_cache_dir_that_cannot_be_a_folder_is_named(tmp_path, monkeypatch, kind):
    (tmp_path / "afile").write_bytes(b"x")
    cache = tmp_path / "afile" if kind == "a file" else tmp_path / "afile" / "cache"
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:1")  # never asked
    with pytest.raises(OSError) as caught:
        Dataset("s3://bucket/prefix", cache_dir=cache)
    assert f"cache_dir {cache}: cannot be used as the cache folder (" in str(caught.value)
    assert "pass cache_dir= (or set DLPACK_CACHE_DIR) to a folder you can write" in \
        str(caught.value)
    monkeypatch.setenv("DLPACK_CACHE_DIR", str(cache))  # the default folder, named the same
    with pytest.raises(OSError, match=f"cache_dir {cache}: cannot be used"):
        Dataset("s3://bucket/prefix")
