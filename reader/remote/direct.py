"""Ranges of s3:// objects read straight off the socket into a caller's buffer (a "sink"),
instead of through the client's body buffers: a plain HTTP GET of a URL obstore presigns
(SigV4, valid an hour), on kept-alive connections, one receiving thread per range. The sink
decides where the bytes go (growing.RangeSink: checked records into a growing shard;
shardfetch.PartSink: a whole shard's part into its file).

Anything unusual (a status but 206, another length or range, a short body, a network error,
a proxy in the environment, credentials that cannot sign, ``DLPACK_DIRECT_RECEIVE=0``, a
range not all received within ``request_timeout``) makes :meth:`DirectReceive.receive_range`
return False and the caller asks through the client, whose retries, deadline and messages
rule. ``Store`` (storage.py) is a DirectReceive.
"""
from __future__ import annotations

import contextlib
import datetime
import functools
import heapq
import http.client
import itertools
import logging
import os
import socket
import threading
import time
import urllib.parse
import weakref

log = logging.getLogger(__name__)


_SIGNED_FOR_S = 3600  # presigned URLs of receive_range are valid this long


class _Watchdog:
    """Calls each registered callback at its deadline unless it was cancelled first: one
    thread per process (started when first needed, again in a forked child), so a deadline
    costs a heap push, not a thread (a threading.Timer each was ~140 us of CPU here)."""

    def __init__(self):
        self._cond, self._heap, self._order = threading.Condition(), [], itertools.count()
        self._pid = None

    def watch(self, when: float, callback) -> list:
        """Call ``callback()`` at ``time.monotonic()`` ``when``; returns what cancel takes."""
        entry = [when, next(self._order), callback]
        with self._cond:
            if self._pid != os.getpid():
                self._pid, self._heap[:] = os.getpid(), []
                threading.Thread(target=self._run, name="dlpack-deadlines", daemon=True).start()
            heapq.heappush(self._heap, entry)
            if self._heap[0] is entry:
                self._cond.notify()
        return entry

    def cancel(self, entry: list) -> None:
        """The callback of ``entry`` is not called (if it has not been yet)."""
        entry[2] = None

    def _run(self) -> None:
        while True:
            with self._cond:
                while self._heap and self._heap[0][2] is None:  # cancelled
                    heapq.heappop(self._heap)
                if not self._heap:
                    self._cond.wait()
                    continue
                left = self._heap[0][0] - time.monotonic()
                if left > 0:
                    self._cond.wait(left)
                    continue
                callback = heapq.heappop(self._heap)[2]
            callback()  # (outside the lock: it may take its time)


_WATCHDOG = _Watchdog()


def _too_slow(start: int, end: int) -> str:
    """Why a direct receive was given up on: the server too slow for request_timeout."""
    return f"bytes {start}-{end - 1} did not all come within request_timeout"


def _close_all(idle: list) -> None:
    for _, conn in idle:
        conn.close()


class DirectReceive:
    """The direct way of a Store (mixed into storage.Store, which provides ``policy``,
    ``scheme``, ``key``, ``where`` and ``_client``)."""

    def _init_direct(self) -> None:
        self._direct, self._signatures = None, {}  # receive_range: open?, presigned URLs
        self._receiving: dict = {}  # id(sink) -> the connection receiving into it
        self._idle: list = []  # receive_range: ((scheme, host), connection) not in use
        self._lock, self._closer = threading.Lock(), None

    def receive_range(self, name: str, start: int, end: int, *, etag: str | None,
                      sink) -> bool:
        """Read bytes [start, end) of ``name`` into ``sink.space()`` (a writable view, not
        empty), telling ``sink.got(n)`` after each read of ``n`` bytes; True when all came.
        False when this way is closed (see :meth:`receives_directly`) or the request did not
        deliver exactly that range (a status but 206, another length or range, a network
        error): ask through :meth:`aget_range` then. What ``sink`` raises propagates.
        Blocking; :meth:`interrupt` ends it from another thread (False; not counted as a
        network error when ``sink.stopped()`` is then true)."""
        if end <= start or not self.receives_directly():
            return False
        url = self._signed(name)
        if url is None:
            return False
        headers = {"Range": f"bytes={start}-{end - 1}"} | ({"If-Match": etag} if etag else {})
        # the whole request within request_timeout, as through the client: a server that
        # drips a byte at a time never lets one read time out, so a timer shuts the socket
        # down at the deadline (the client path then rules, with its retries and words)
        expired = threading.Event()
        watch = _WATCHDOG.watch(time.monotonic() + self.policy.request_timeout,
                                functools.partial(self._expire, sink, expired))
        try:
            return self._receive(url, name, start, end, headers, sink, expired)
        finally:
            _WATCHDOG.cancel(watch)

    def _expire(self, sink, expired) -> None:
        """(The watchdog's thread) ``receive_range`` into ``sink`` ran out of time."""
        expired.set()
        self.interrupt(sink)

    def _receive(self, url, name, start, end, headers, sink, expired) -> bool:
        """receive_range's request and body (``expired``: its timer went off)."""
        for fresh in (False, True):  # a kept-alive connection the server closed: once more
            conn, reused = self._connection(url, fresh)
            self._receiving[id(sink)] = conn  # (the timer may shut it down from now on)
            try:
                conn.request("GET", f"{url.path}?{url.query}", headers=headers)
                response = conn.getresponse()
                break
            except (OSError, http.client.HTTPException) as exc:
                self._receiving.pop(id(sink), None)
                conn.close()
                stopped = getattr(sink, "stopped", None)
                if expired.is_set():
                    return self._direct_failed(TimeoutError(_too_slow(start, end)), name)
                if stopped and stopped():  # interrupt(): not a network error
                    return False
                if not reused or fresh:
                    return self._direct_failed(exc, name)
        expected = f"bytes {start}-{end - 1}/"
        if response.status != 206 or response.getheader("Content-Length") != str(end - start) \
                or not (response.getheader("Content-Range") or "").startswith(expected):
            if response.status == 403:  # a signature that expired (or credentials rotated)
                self._signatures.pop(name, None)
            self._receiving.pop(id(sink), None)
            conn.close()  # the body (if any) is not read: the connection is not reused
            return False
        at, whole = start, False
        try:
            while at < end:
                space = sink.space()
                try:
                    n = response.readinto(space[:end - at])
                except (OSError, http.client.HTTPException) as exc:
                    n, error = 0, exc
                else:
                    error = None
                if not n:  # a short body, a network error, interrupt() or the timer
                    stopped = getattr(sink, "stopped", None)
                    if expired.is_set():
                        return self._direct_failed(TimeoutError(_too_slow(start, end)), name)
                    if error is None or stopped and stopped():
                        return False
                    return self._direct_failed(error, name)
                sink.got(n)  # (what it raises propagates)
                at += n
            whole = True
            return True
        finally:  # kept alive for the next range only after a whole body, in time
            self._receiving.pop(id(sink), None)
            self._put_back(url, conn) if whole and not expired.is_set() else conn.close()

    def interrupt(self, sink) -> None:
        """End a :meth:`receive_range` into ``sink`` now, also one waiting for a stalled
        server (its socket is shut down); nothing when none runs."""
        conn = self._receiving.get(id(sink))
        sock = getattr(conn, "sock", None)
        if sock is not None:
            with contextlib.suppress(OSError):  # closed meanwhile
                sock.shutdown(socket.SHUT_RDWR)

    def receives_directly(self) -> bool:
        """Whether :meth:`receive_range` may be tried: s3://, no proxy in the environment,
        not ``DLPACK_DIRECT_RECEIVE=0``, no network error (or failed signing) that way yet."""
        if self._direct is None:
            proxies = {k.lower() for k in os.environ} & {"http_proxy", "https_proxy", "all_proxy"}
            self._direct = self.scheme == "s3" and not proxies and \
                os.environ.get("DLPACK_DIRECT_RECEIVE", "1") != "0"
        return self._direct

    def _direct_failed(self, exc: BaseException, name: str) -> bool:
        """A network error on the direct way: it closes for this store; False."""
        self._direct = False
        log.debug("%s: receiving directly failed (%s: %s); ranges go through the client "
                  "from now on", self.where(name), type(exc).__name__,
                  (str(exc).strip().splitlines() or [""])[0][:300])
        return False

    def _signed(self, name: str):
        """A presigned GET URL of ``name`` (urlsplit), kept until 10 minutes before it
        expires; None when this store cannot sign (the direct way closes)."""
        import obstore

        held = self._signatures.get(name)
        if held is not None and held[1] > time.monotonic():
            return held[0]
        client = self._client()  # (its StorageError, e.g. refused credentials, propagates)
        try:
            signed = obstore.sign(client, "GET", self.key(name),
                                  datetime.timedelta(seconds=_SIGNED_FOR_S))
        except Exception as exc:  # anonymous access, credentials that cannot sign
            self._direct_failed(exc, name)
            return None
        parts = urllib.parse.urlsplit(signed)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            self._direct_failed(ValueError(f"a signed URL of scheme {parts.scheme!r}"), name)
            return None
        self._signatures[name] = (parts, time.monotonic() + _SIGNED_FOR_S - 600)
        return parts

    def _connection(self, url, fresh: bool):
        """(a kept-alive connection to ``url``'s host not in use, or a new one; whether it
        was used before); ``fresh``: a new one."""
        key = (url.scheme, url.netloc)
        with self._lock:
            for i, (held, conn) in enumerate(self._idle if not fresh else ()):
                if held == key:
                    return self._idle.pop(i)[1], True
            if self._closer is None:  # the idle ones closed with the store, if not before
                self._closer = weakref.finalize(self, _close_all, self._idle)
        kind = http.client.HTTPSConnection if url.scheme == "https" else \
            http.client.HTTPConnection  # (https: the system's CAs, hostname checked)
        return kind(url.hostname, url.port, timeout=self.policy.request_timeout), False

    def _put_back(self, url, conn) -> None:
        with self._lock:
            self._idle.append(((url.scheme, url.netloc), conn))

    def close_connections(self) -> None:
        """Close receive_range's kept-alive connections not in use (a prefetch ends)."""
        with self._lock:
            idle, self._idle[:] = list(self._idle), []
        _close_all(idle)
