"""The object store layer against a real SeaweedFS: URLs, credentials, errors, retries."""
from __future__ import annotations

import asyncio
import os
import time

import pytest

from dlpack_io.reader.remote import clouds
from dlpack_io.reader.remote.clouds import is_remote, parse_url
from dlpack_io.reader.remote.storage import ObjectChangedError, Policy, StorageError, Store

BUCKET = "dlpack-test"


def test_parse_url():
    assert parse_url("s3://my-bucket/a/b/") == ("my-bucket", "a/b/")
    assert parse_url("s3://my-bucket") == ("my-bucket", "")
    assert is_remote("s3://x") and not is_remote("/data/s3://x") and not is_remote(b"s3://x")
    with pytest.raises(ValueError, match="bucket name 'ab'"):
        parse_url("s3://ab/x")
    with pytest.raises(ValueError, match=r"'\.\.' parts"):
        parse_url("s3://bucket/a/../b")
    with pytest.raises(ValueError, match="not an s3:// URL"):
        parse_url("/local/path")


def test_backoff_grows_and_is_capped():
    p = Policy(backoff=0.1, max_backoff=0.5)
    assert all(0 <= p.pause(1) <= 0.1 for _ in range(50))
    assert all(0 <= p.pause(10) <= 0.5 for _ in range(50))
    assert max(p.pause(3) for _ in range(200)) > 0.1  # up to 0.4: it does grow


def test_credentials_order_explicit_env_files(tmp_path, monkeypatch):
    for key in list(os.environ):
        if key.startswith("AWS_"):
            monkeypatch.delenv(key)
    creds, config = tmp_path / "credentials", tmp_path / "config"
    creds.write_text("[default]\naws_access_key_id = FILEKEY\naws_secret_access_key = FILESECRET\n"
                     "[other]\naws_access_key_id = OTHERKEY\naws_secret_access_key = OTHERSECRET\n")
    config.write_text("[profile other]\nregion = eu-west-3\nendpoint_url = http://files:9000\n")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(creds))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(config))
    assert clouds.resolve_options()["access_key_id"] == "FILEKEY"
    monkeypatch.setenv("AWS_PROFILE", "other")
    opts = clouds.resolve_options()
    assert (opts["access_key_id"], opts["region"], opts["endpoint"]) == \
        ("OTHERKEY", "eu-west-3", "http://files:9000")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "ENVKEY")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "ENVSECRET")
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://env:1")
    opts = clouds.resolve_options()
    assert (opts["access_key_id"], opts["endpoint"]) == ("ENVKEY", "http://env:1")
    opts = clouds.resolve_options({"access_key_id": "ARGKEY", "secret_access_key": "ARGSECRET"})
    assert (opts["access_key_id"], opts["secret_access_key"]) == ("ARGKEY", "ARGSECRET")
    shown = clouds.describe_s3(opts)
    assert "ARGSECRET" not in shown and "ARGKEY" not in shown and "endpoint=http://env:1" in shown
    with pytest.raises(ValueError, match="together"):
        clouds.resolve_options({"access_key_id": "only-the-id"})
    with pytest.raises(ValueError, match="unknown keys"):
        clouds.resolve_options({"password": "x"})


def test_get_head_list_put_delete_roundtrip(s3_env):
    store = Store(f"s3://{BUCKET}/storage/roundtrip")
    store.put("a.bin", b"0123456789")
    assert store.get("a.bin") == b"0123456789"
    assert store.get_range("a.bin", 2, 5) == b"234"
    assert asyncio.run(store.aget_range("a.bin", 7, 10)) == b"789"
    head = store.head("a.bin")
    assert head["size"] == 10 and head["etag"]
    assert store.head("nothing-here") is None
    assert store.list() == {"a.bin": 10}
    store.delete("a.bin")
    assert store.list() == {}


def test_multipart_upload_of_a_large_file(s3_env, tmp_path):
    data = os.urandom(11 * 2**20 + 123)
    path = tmp_path / "big"
    path.write_bytes(data)
    store = Store(f"s3://{BUCKET}/storage/multipart")
    store.put_file("big", path, part_size=5 * 2**20)   # 3 parts
    assert store.head("big")["size"] == len(data)
    assert store.get_range("big", 5 * 2**20 - 3, 5 * 2**20 + 3) == data[5 * 2**20 - 3:5 * 2**20 + 3]


def test_errors_name_url_key_range_and_what_to_check(s3_env):
    store = Store(f"s3://{BUCKET}/storage/errors")
    store.put("obj", b"x" * 100)
    with pytest.raises(StorageError, match=r"GET s3://dlpack-test/storage/errors/missing bytes "
                                           r"0-9 failed.*Check that the bucket and prefix exist"):
        store.get_range("missing", 0, 10)
    with pytest.raises(ObjectChangedError, match=r"bytes 90-109 returned 10 bytes, expected 20"):
        store.get_range("obj", 90, 110)
    bad = Store(f"s3://{BUCKET}/storage/errors", storage_options={
        "access_key_id": "nobody", "secret_access_key": "not-the-secret"})
    with pytest.raises(StorageError, match="Check the credentials") as info:
        bad.get("obj")
    assert "not-the-secret" not in str(info.value)


def test_a_replaced_object_is_detected_by_its_etag(s3_env):
    store = Store(f"s3://{BUCKET}/storage/etag")
    store.put("obj", b"a" * 64)
    etag = store.head("obj")["etag"]
    assert store.get_range("obj", 0, 8, etag=etag) == b"a" * 8
    store.put("obj", b"b" * 64)
    with pytest.raises(ObjectChangedError, match="replaced since this data set was opened"):
        store.get_range("obj", 0, 8, etag=etag)
    with pytest.raises(ObjectChangedError, match="replaced"):
        asyncio.run(store.aget_range("obj", 0, 8, etag=etag))


def test_unreachable_server_fails_after_retries_within_the_deadline(s3_env, monkeypatch):
    from dlpack_io.tools.bench.seaweed import free_ports

    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{free_ports(1)[0]}")
    store = Store(f"s3://{BUCKET}/x", policy=Policy(request_timeout=2, retries=3, backoff=0.05,
                                                    deadline=10))
    t0 = time.monotonic()
    with pytest.raises(StorageError, match=r"after 4 attempts .*Check that the endpoint"):
        store.get_range("obj", 0, 4)
    assert time.monotonic() - t0 < 120  # a hang guard: refused connections end it sooner


def test_a_forked_child_may_not_use_the_parents_client(s3_env):
    store = Store(f"s3://{BUCKET}/storage/fork")
    store.put("obj", b"abc")
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: must refuse at once (a real request would hang: not fork-safe)
        try:
            store.get("obj")
            os.write(w, b"no error")
        except StorageError as exc:
            os.write(w, str(exc).encode()[:500])
        finally:
            os._exit(0)
    os.close(w)
    message = os.read(r, 1000).decode()
    os.waitpid(pid, 0)
    assert "forked process" in message and "not fork-safe" in message


def test_missing_extra_gives_the_install_hint(monkeypatch):
    import builtins

    real = builtins.__import__

    def no_obstore(name, *args, **kwargs):
        if name.startswith("obstore"):
            raise ImportError("No module named 'obstore'")
        return real(name, *args, **kwargs)
    monkeypatch.setattr(builtins, "__import__", no_obstore)
    with pytest.raises(ImportError, match=r"pip install 'dlpack-io\[s3\]'"):
        Store(f"s3://{BUCKET}/x")


def test_a_refused_connection_is_transient_whatever_its_timing_says():
    """obstore's message for a refused connection carries its duration: "in 371.403µs"
    once read as HTTP 403, so the request was not retried and the advice named the
    credentials instead of the endpoint."""
    from dlpack_io.reader.remote.clouds import backend
    from dlpack_io.reader.remote.storage import CredentialsError, EndpointUnreachableError, classify

    hints = backend("s3").hints
    refused = RuntimeError("Generic S3 error: Error performing GET http://127.0.0.1:48907/b/x in "
                           "371.403µs - HTTP error: error sending request")
    assert classify(refused, "GET", hints) == (
        True, EndpointUnreachableError,
        "Check that the endpoint is reachable and the server is up (AWS_ENDPOINT_URL)")
    for text in ("Client error with status 403 Forbidden: <Error><Code>AccessDenied</Code>",
                 "<Code>SignatureDoesNotMatch</Code>", "<Code>InvalidAccessKeyId</Code>"):
        assert classify(RuntimeError(text), "GET", hints)[:2] == (False, CredentialsError), text
