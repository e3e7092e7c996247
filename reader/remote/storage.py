"""Remote data set URLs and a small object store with timeouts, retries and a deadline.

    store = Store("s3://bucket/prefix")
    store.get_range("shard-00000.rec", 0, 4096)      # also: get, head, put, put_file,
    await store.aget_range(...)                       # list, delete; async get for the planner

Every request has a timeout (``Policy.request_timeout``); transient failures (network
errors, timeouts, 5xx) are retried with exponential backoff and jitter until
``Policy.retries`` attempts or ``Policy.deadline`` seconds have passed. Errors are
StorageError naming the URL, the key, the byte range and what to check. A range read can pin
the object's ETag (``etag=``): if the object was replaced since, that is ObjectChangedError,
never silently different bytes.
"""
from __future__ import annotations

import asyncio
import dataclasses
import os
import random
import time
from dataclasses import dataclass

from dlpack_io.reader.remote import clouds, s3client
from dlpack_io.reader.remote.bounded import aread_body, read_body
# the failure classes live in failures.py; importing them from here keeps working
from dlpack_io.reader.remote.failures import (BucketNotFoundError, CredentialsError,  # noqa: F401
                                              EndpointUnreachableError, ObjectChangedError,
                                              StorageError, StorageTimeoutError,
                                              WrongEndpointError, classify,
                                              first_line, what_failed)
from dlpack_io.reader.remote.urls import canonical, parse_url, scheme_of

def run_sync(coro):
    """Run ``coro`` to completion from synchronous code, even where an event loop is already
    running in this thread (Jupyter): then it runs on a short-lived thread of its own."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    import concurrent.futures

    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, coro).result()


@dataclass(frozen=True)
class Policy:
    """How patient requests are: per-request timeout, attempts, backoff and overall deadline."""

    request_timeout: float = 30.0
    connect_timeout: float = 10.0
    retries: int = 5
    backoff: float = 0.2
    max_backoff: float = 5.0
    deadline: float = 120.0

    def pause(self, attempt: int) -> float:
        """Backoff before retry number ``attempt`` (1-based): exponential, full jitter."""
        return random.uniform(0, min(self.max_backoff, self.backoff * 2 ** (attempt - 1)))


class Store:
    """One bucket + prefix; requests only from the process that created the client."""

    def __init__(self, url: str, *, storage_options: dict | None = None, policy: Policy | None = None):
        self.url = canonical(url)
        self.bucket, self.prefix = parse_url(url)
        self.scheme = scheme_of(url)  # "s3", "gs" or "az": see clouds.py
        self.backend = clouds.backend(self.scheme)
        s3client.import_obstore()  # the install hint, before anything else can fail
        self.options = self.backend.resolve(storage_options)
        clouds.check_endpoint(self.url, self.options, self.backend)  # before the client
        self._given = dict(storage_options or {})
        self.policy = dataclasses.replace(policy or Policy(),
                                          **s3client.policy_values(storage_options))
        self._store, self._pid = None, None
        self._bucket_seen = False  # head() proved the bucket exists (see there)

    @property
    def owner_pid(self) -> int | None:
        """The process whose client this is (None before the first request): only that one
        may talk to the network (the client is not fork-safe)."""
        return self._pid

    def _client(self):
        if self._store is None:
            try:
                self._store = clouds.open_client(self.scheme, self.bucket, self.options,
                                                 request_timeout=self.policy.request_timeout,
                                                 connect_timeout=self.policy.connect_timeout)
            except (ImportError, StorageError):
                raise
            except Exception as exc:  # settings obstore refuses: no request would help
                hints = self.backend.hints
                raise StorageError(f"{self.url}: cannot set up the {self.backend.service} "
                                   f"client: {first_line(exc)}. Check the credentials "
                                   f"({hints['credentials']}) and the endpoint "
                                   f"({hints['endpoint']})") from None
            self._pid = os.getpid()
        elif self._pid != os.getpid():
            raise StorageError(f"{self.url}: network access from a forked process (pid "
                               f"{os.getpid()}); the storage client is not fork-safe, so only the "
                               f"process that opened the data set fetches (Loader workers read "
                               f"the local cache the main process filled)")
        return self._store

    @property
    def explicit_options(self) -> dict:
        """What another machine needs to reach the same bucket (for Ray tasks): the
        explicit storage_options, plus the endpoint, region and allow_http this process
        resolved. Credentials found in this process's environment or files are left out:
        they are not sent over a cluster; each node uses its own."""
        shared = {k: self.options[k] for k in ("endpoint", "region", "allow_http",
                                               "account_name", "use_emulator", "anonymous")
                  if k in self.options}
        return {**shared, **self._given}

    def key(self, name: str) -> str:
        """Object key of ``name`` under the prefix."""
        return self.prefix + name

    def where(self, name: str, start=None, end=None) -> str:
        """``s3://bucket/key`` (or gs://, az://) plus the byte range, for messages."""
        rng = f" bytes {start}-{end - 1}" if start is not None else ""
        return f"{self.scheme}://{self.bucket}/{self.key(name)}{rng}"

    def _error(self, op, name, exc, attempts, t0, start=None, end=None) -> StorageError:
        transient, cls, check = classify(exc, op, self.backend.hints)
        tries = f" after {attempts} attempts over {time.monotonic() - t0:.1f} s" if transient else ""
        endpoint = self.options.get("endpoint") or f"{self.backend.service} default"
        return cls(f"{op} {self.where(name, start, end)} {what_failed(cls)}{tries}: "
                   f"{type(exc).__name__}: {first_line(exc)}. {check} (endpoint: {endpoint})")

    def _retry(self, op: str, name: str, fn, start=None, end=None):
        t0, attempt = time.monotonic(), 0
        while True:
            attempt += 1
            try:
                return fn()
            except StorageError:
                raise
            except Exception as exc:
                transient = classify(exc, op, self.backend.hints)[0]
                pause = self.policy.pause(attempt)
                if not transient or attempt > self.policy.retries or \
                        time.monotonic() + pause - t0 > self.policy.deadline:
                    raise self._error(op, name, exc, attempt, t0, start, end) from None
                time.sleep(pause)  # backoff between attempts

    async def _aretry(self, op: str, name: str, make, start=None, end=None):
        t0, attempt = time.monotonic(), 0
        while True:
            attempt += 1
            try:
                left = max(0.1, self.policy.deadline - (time.monotonic() - t0))  # never past it
                return await asyncio.wait_for(make(), min(self.policy.request_timeout + 1, left))
            except asyncio.TimeoutError as exc:
                error = exc
            except Exception as exc:
                error = exc
            transient = classify(error, op, self.backend.hints)[0]
            pause = self.policy.pause(attempt)
            if not transient or attempt > self.policy.retries or \
                    time.monotonic() + pause - t0 > self.policy.deadline:
                raise self._error(op, name, error, attempt, t0, start, end) from None
            await asyncio.sleep(pause)

    # ---- reads --------------------------------------------------------------------------
    def get(self, name: str, *, max_bytes: int = 256 * 2**20) -> bytes:
        """The whole object ``name``; StorageError when it has more than ``max_bytes``."""
        import obstore

        return self._retry("GET", name, lambda: bytes(read_body(
            obstore.get(self._client(), self.key(name)), max_bytes)))

    def get_range(self, name: str, start: int, end: int, *, etag: str | None = None) -> bytes:
        """Bytes [start, end) of ``name``; ObjectChangedError if its ETag is not ``etag``."""
        import obstore

        opts = {"range": (start, end)} | ({"if_match": etag} if etag else {})
        data = self._retry("GET", name, lambda: bytes(read_body(
            obstore.get(self._client(), self.key(name), options=opts), end - start)), start, end)
        return self._check_length(data, name, start, end)

    async def aget_range(self, name: str, start: int, end: int, *, etag: str | None = None,
                         with_etag: bool = False):
        """Async ``get_range`` (for the prefetch planner's event loop); ``with_etag``
        returns (bytes, the object's ETag)."""
        import obstore

        opts = {"range": (start, end)} | ({"if_match": etag} if etag else {})
        client = self._client()

        async def once():
            result = await obstore.get_async(client, self.key(name), options=opts)
            return await aread_body(result, end - start), result.meta.get("e_tag")
        data, tag = await self._aretry("GET", name, once, start, end)
        data = self._check_length(data, name, start, end)
        return (data, tag) if with_etag else data

    def _check_length(self, data, name, start, end):
        if len(data) != end - start:
            raise ObjectChangedError(f"GET {self.where(name, start, end)} returned {len(data)} "
                                     f"bytes, expected {end - start}: the object is shorter than "
                                     f"the manifest says (replaced or truncated)")
        return data

    def head(self, name: str) -> dict | None:
        """{"size", "etag"} of ``name``, or None when it does not exist; BucketNotFoundError
        when the bucket (container) itself does not exist: a missing object is then not
        the news (one LIST request, the first time an object is missing)."""
        import obstore
        import obstore.exceptions as ox

        def once():
            try:
                meta = obstore.head(self._client(), self.key(name))
            except (ox.NotFoundError, FileNotFoundError):
                return None
            return {"size": int(meta["size"]), "etag": meta.get("e_tag")}
        found = self._retry("HEAD", name, once)
        if found is None and not self._bucket_seen:
            try:
                self._retry("LIST", "", lambda: next(iter(obstore.list(
                    self._client(), self.prefix or None, chunk_size=1)), None))
            except CredentialsError:
                pass  # may read but not list: the missing object is all we can tell
            self._bucket_seen = True
        return found

    def list(self, sub: str = "") -> dict:
        """{name relative to the prefix: size} of every object under prefix + ``sub``."""
        import obstore

        def once():
            out = {}
            for chunk in obstore.list(self._client(), self.prefix + sub):
                for meta in chunk:
                    out[meta["path"][len(self.prefix):]] = int(meta["size"])
            return out
        return self._retry("LIST", sub, once)

    # ---- writes -------------------------------------------------------------------------
    def put(self, name: str, data: bytes) -> None:
        """Write ``data`` as object ``name`` (all or nothing)."""
        import obstore

        self._retry("PUT", name, lambda: obstore.put(self._client(), self.key(name), data,
                                                     use_multipart=False))

    def put_file(self, name: str, path, *, part_size: int = 16 * 2**20) -> None:
        """Upload local file ``path`` as ``name``; multipart when larger than ``part_size``."""
        import pathlib

        import obstore

        size = os.path.getsize(path)
        self._retry("PUT", name, lambda: obstore.put(
            self._client(), self.key(name), pathlib.Path(path), use_multipart=size > part_size,
            chunk_size=part_size, max_concurrency=4))
        found = self.head(name)
        if found is None or found["size"] != size:
            raise ObjectChangedError(f"PUT {self.where(name)}: uploaded {size} bytes but the "
                                     f"server holds {found and found['size']}: retry the upload")

    def delete(self, name: str) -> None:
        """Delete object ``name`` (missing is fine)."""
        import obstore

        self._retry("DELETE", name, lambda: obstore.delete(self._client(), self.key(name)))

    def __getstate__(self):
        raise TypeError("a Store holds a live client; pickle the URL and options instead")
