"""A small object store with timeouts, retries and a deadline, and what its failures mean.

    store = Store("s3://bucket/prefix")
    store.get_range("shard-00000.rec", 0, 4096)      # also: get, head, put, put_file,
    await store.aget_range(...)                       # list, delete; async get for the planner
    store.receive_range(name, start, end, etag=..., sink=...)  # s3://: straight to a file

Every request has a timeout (``Policy.request_timeout``); transient failures (network
errors, timeouts, 5xx) are retried with exponential backoff and jitter until
``Policy.retries`` attempts or ``Policy.deadline`` seconds have passed. Errors are
StorageError naming the URL, the key, the byte range and what to check. A range read can pin
the object's ETag (``etag=``): if the object was replaced since, that is ObjectChangedError,
never silently different bytes."""
from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import random
import re
import time
from dataclasses import dataclass

from dlpack_io.reader.remote import clouds
from dlpack_io.reader.remote.clouds import canonical, parse_url, scheme_of
from dlpack_io.reader.remote.direct import DirectReceive

log = logging.getLogger(__name__)

# Response bodies read under a byte budget fixed before the request is sent.
#
# obstore's ``GetResult.bytes()`` collects the whole body into a buffer sized from the
# server's own Content-Range / Content-Length, so a hostile or broken server could make us
# allocate whatever it claims (and an allocation failure in Rust aborts the process). Here the
# body is streamed instead, in chunks of at least ``budget`` bytes (one chunk for a correct
# response: no extra copy), and the stream is dropped as soon as more than ``budget`` bytes
# arrived: at most one network chunk beyond the budget is ever held.

class BodyOverrun(Exception):
    """The server sent more bytes than the request asked for."""

    def __init__(self, budget: int, received: int):
        super().__init__(f"the server sent at least {received} bytes where {budget} were "
                         f"asked for (a broken proxy or a hostile endpoint); the body was "
                         f"cut off, nothing beyond the budget was kept")
        self.budget, self.received = budget, received


def _chunk_size(budget: int) -> int:
    # obstore concatenates network chunks until this size: a correct body is one chunk.
    # At least 1 (an empty range), at most 64 MiB per chunk (larger bodies come in pieces).
    return max(1, min(int(budget), 64 * 2**20))


def _join(chunks: list, total: int):
    if len(chunks) == 1:
        return chunks[0]
    if not chunks:
        return b""
    return b"".join(bytes(c) for c in chunks)


def read_body(result, budget: int):
    """The body of obstore GetResult ``result``; BodyOverrun beyond ``budget`` bytes."""
    chunks, total = [], 0
    for chunk in result.stream(min_chunk_size=_chunk_size(budget)):
        total += len(chunk)
        if total > budget:
            raise BodyOverrun(budget, total)  # dropping the stream closes the connection
        chunks.append(chunk)
    return _join(chunks, total)


async def aread_body(result, budget: int):
    """Async :func:`read_body`."""
    chunks, total = [], 0
    async for chunk in result.stream(min_chunk_size=_chunk_size(budget)):
        total += len(chunk)
        if total > budget:
            raise BodyOverrun(budget, total)
        chunks.append(chunk)
    return _join(chunks, total)


# What went wrong with a request to object storage, in words a user can act on.
#
# Three failures are not damage and must never look like it (issue 30): an endpoint that
# cannot be reached, credentials the server refuses (or none found), and a bucket or
# container that does not exist. Each has its own class, so ``dlpack verify`` can exit with
# its own code and callers can tell them apart; all are :class:`StorageError` (an OSError),
# so code that catches StorageError keeps working.
#
# :func:`classify` maps an exception raised by obstore (or by us) to (transient?, the class
# to raise, what to check). Its advice names each cloud's own variables (``hints``, from
# reader/remote/clouds.py), never secrets.

class StorageError(OSError):
    """A request to object storage failed; the message names URL, key, range and a fix."""


class ObjectChangedError(StorageError):
    """An object differs from what we saw before (size, ETag or checksum)."""


class EndpointUnreachableError(StorageError):
    """The endpoint did not answer (connection refused, DNS, timeout) within the retries."""


class StorageTimeoutError(StorageError):
    """A request did not finish in the time allowed: the server answered too slowly (or
    stopped answering) after the connection was made. Not "unreachable": it answered."""


class CredentialsError(StorageError):
    """The server refused the credentials, or none could be found or exchanged for a token."""


class BucketNotFoundError(StorageError):
    """The bucket (S3, GCS) or container (Azure) of the URL does not exist."""


class WrongEndpointError(StorageError):
    """Something answered at the endpoint, but not object storage (a web page): the wrong
    host or port, never a missing bucket or damage."""


# An HTTP 403 or the error codes of refused credentials, as words: a bare "403" also occurs
# in a duration ("in 371.403µs"), which once made a refused connection look like refused
# credentials (no retries, the wrong advice).
_REFUSED_RE = re.compile(r"\b40[13] (?:Forbidden|Unauthorized)\b|\bstatus(?: code)?:? ?40[13]\b|"
                         r"\bForbidden\b|\bInvalidAccessKeyId\b|\bSignatureDoesNotMatch\b|"
                         r"\bAccessDenied\b|\bAuthenticationFailed\b|\bAuthorizationFailure\b|"
                         r"\bError performing token request\b|\bInvalidAuthenticationInfo\b")
# a missing bucket or container, in the words each server uses for it
_NO_BUCKET_RE = re.compile(r"\bNoSuchBucket\b|\bContainerNotFound\b|"
                           r"\bspecified (?:bucket|container) does not exist\b|"
                           r"\bno bucket named\b")  # the last: fake-gcs-server's words
# an answer from a web server that is not object storage (a wrong port or host): an HTML
# page where the service answers with XML or JSON; never a missing bucket or damage
_WEB_PAGE_RE = re.compile(r"status code: \d{3}[^:\n]*: *<(?:!DOCTYPE +html|html)\b", re.I)
# obstore's debug dump names the kind of an HTTP failure: a timeout that did not happen
# while connecting is a slow server, not an unreachable one
_TIMEOUT_KIND_RE = re.compile(r"\bkind: Timeout\b|\bsource: TimedOut\b")
_CONNECTING_RE = re.compile(r"[Cc]onnect(?:Error|ing| timeout|ion refused)|tcp connect|"
                            r"error trying to connect|kind: Connect\b")
# the connection itself failed: nobody answered at that address (or not in time)
_UNREACHABLE_RE = re.compile(r"error sending request|[Cc]onnection refused|dns error|"
                             r"failed to lookup address|[Tt]imed? ?out|connection reset|"
                             r"[Cc]onnection closed|tcp connect error", re.S)


def classify(exc: BaseException, op: str, hints: dict) -> tuple[bool, type, str]:
    """(transient?, StorageError class, what to check) for ``exc`` raised by request ``op``
    ("GET", "HEAD", "LIST", "PUT", "DELETE"). ``hints``: the cloud's words ("bucket",
    "credentials", "endpoint": what to check for each)."""
    import obstore.exceptions as ox


    text = str(exc)
    if isinstance(exc, ObjectChangedError):
        return False, ObjectChangedError, "The object was replaced while it was read"
    if _WEB_PAGE_RE.search(text):
        return False, WrongEndpointError, (f"Check the endpoint ({hints['endpoint']}): it "
                                           f"answered with a web page, not as "
                                           f"{hints['service']} does (the wrong host or port?)")
    if _NO_BUCKET_RE.search(text) or (
            op in ("LIST", "PUT") and isinstance(exc, (ox.NotFoundError, FileNotFoundError))) or (
            op == "LIST" and re.search(r"\b404 Not Found\b", text)):
        return False, BucketNotFoundError, f"Check the {hints['bucket']} name: it does not exist"
    if isinstance(exc, (ox.NotFoundError, FileNotFoundError)):
        return False, StorageError, (f"Check that the {hints['bucket']} and prefix exist and "
                                     f"the data set was uploaded completely")
    if isinstance(exc, (ox.PermissionDeniedError, ox.UnauthenticatedError, PermissionError)) \
            or _REFUSED_RE.search(text):
        return False, CredentialsError, f"Check the credentials ({hints['credentials']})"
    if isinstance(exc, BodyOverrun):
        return False, StorageError, (f"Check the endpoint ({hints['endpoint']}): it does not "
                                     f"answer like {hints['service']}")
    if isinstance(exc, ox.PreconditionError):
        return False, ObjectChangedError, ("The object was replaced since this data set was "
                                           "opened: open it again")
    if isinstance(exc, (asyncio.TimeoutError, TimeoutError)) or (
            _TIMEOUT_KIND_RE.search(text) and not _CONNECTING_RE.search(text)):
        return True, StorageTimeoutError, (
            f"The server did not finish answering in the time allowed: check that it is "
            f"healthy and not overloaded ({hints['endpoint']}), or allow more time with "
            f"storage_options request_timeout= and deadline=")
    if isinstance(exc, ConnectionError) or _UNREACHABLE_RE.search(first_line(exc)):
        return True, EndpointUnreachableError, (f"Check that the endpoint is reachable and the "
                                                f"server is up ({hints['endpoint']})")
    return True, StorageError, f"The server failed; check that it is healthy ({hints['endpoint']})"


def what_failed(cls: type) -> str:
    """The failure in a few words, for the first line of a message."""
    return {EndpointUnreachableError: "endpoint unreachable",
            StorageTimeoutError: "timed out (the server answered too slowly)",
            CredentialsError: "credentials refused (or none found)",
            BucketNotFoundError: "bucket or container does not exist",
            WrongEndpointError: "the endpoint is not object storage"}.get(cls, "failed")


def first_line(exc: BaseException) -> str:
    """The first line of ``exc``'s message, at most 300 characters (obstore appends
    multi-line debug dumps that would bury the point)."""
    return (str(exc).strip().splitlines() or [""])[0][:300]


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


class Store(DirectReceive):
    """One bucket + prefix; requests only from the process that created the client (the
    direct receive of s3:// ranges: direct.py)."""

    def __init__(self, url: str, *, storage_options: dict | None = None, policy: Policy | None = None):
        self.url = canonical(url)
        self.bucket, self.prefix = parse_url(url)
        self.scheme = scheme_of(url)  # "s3", "gs" or "az": see clouds.py
        self.backend = clouds.backend(self.scheme)
        clouds.import_obstore()  # the install hint, before anything else can fail
        self.options = self.backend.resolve(storage_options)
        problem = clouds.endpoint_problem(self.url, self.options, self.backend)
        if problem:  # before the client: a malformed endpoint made obstore panic
            raise StorageError(problem)
        self._given = dict(storage_options or {})
        self.policy = dataclasses.replace(policy or Policy(),
                                          **clouds.policy_values(storage_options))
        self._store, self._pid = None, None
        self._bucket_seen = False  # head() proved the bucket exists (see there)
        self._init_direct()

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

    # ---- a range received straight into its place -------------------------------------
    # obstore hands a body over as a new buffer the planner copies into the cache file; here
    # an HTTP GET of a URL obstore presigns (SigV4), on a kept-alive connection, reads it into
    # the caller's small buffer (it stays in the CPU's cache): -24% of the fetching CPU, no
    # range-sized buffers (docs/remote.md). Anything unusual goes the aget_range way.

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
