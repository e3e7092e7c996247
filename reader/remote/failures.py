"""What went wrong with a request to object storage, in words a user can act on.

Three failures are not damage and must never look like it (issue 30): an endpoint that
cannot be reached, credentials the server refuses (or none found), and a bucket or
container that does not exist. Each has its own class, so ``dlpack verify`` can exit with
its own code and callers can tell them apart; all are :class:`StorageError` (an OSError),
so code that catches StorageError keeps working.

:func:`classify` maps an exception raised by obstore (or by us) to (transient?, the class
to raise, what to check). Its advice names each cloud's own variables (``hints``, from
reader/remote/clouds.py), never secrets.
"""
from __future__ import annotations

import asyncio
import re


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


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [""])[0][:300]  # obstore appends debug dumps


def classify(exc: BaseException, op: str, hints: dict) -> tuple[bool, type, str]:
    """(transient?, StorageError class, what to check) for ``exc`` raised by request ``op``
    ("GET", "HEAD", "LIST", "PUT", "DELETE"). ``hints``: the cloud's words ("bucket",
    "credentials", "endpoint": what to check for each)."""
    import obstore.exceptions as ox

    from dlpack_io.reader.remote.bounded import BodyOverrun

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
    if isinstance(exc, ConnectionError) or _UNREACHABLE_RE.search(_first_line(exc)):
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
    return _first_line(exc)
