"""Remote data set URLs (``s3://bucket/prefix``, ``gs://bucket/prefix``,
``az://container/prefix``): recognised and parsed without importing the object-storage
client, so ``import dlpack_io.reader`` and the packer stay light. A URL of any other scheme
is refused naming the ones we support, never taken for a local folder."""
from __future__ import annotations

import os
import re

SCHEMES = ("s3://", "gs://", "az://")
_URL_RE = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")
# bucket (container) names, as each service allows them (checked before any request)
_NAMES = {"s3": (re.compile(r"^[A-Za-z0-9.-]{3,}$"), "S3 bucket",
                 "3+ characters: letters, digits, '-', '.'"),
          "gs": (re.compile(r"^[a-z0-9][a-z0-9._-]{1,220}[a-z0-9]$"), "GCS bucket",
                 "3-222 characters: lowercase letters, digits, '-', '_', '.'"),
          "az": (re.compile(r"^[a-z0-9](?:[a-z0-9]|-(?=[a-z0-9])){2,62}$"), "Azure container",
                 "3-63 characters: lowercase letters, digits, single '-' between them")}


_MISTYPED_RE = re.compile(r"^(s3|gs|az):/*(?!/)", re.IGNORECASE)  # S3://, s3:/b, gs:b...


def unsupported_scheme(path) -> str | None:
    """The refusal for a URL whose scheme we do not read (``gcs://``, ``https://``...) or
    one of ours mistyped (``S3://``, ``s3:/bucket``), or None for a supported URL or a
    local path."""
    if isinstance(path, os.PathLike):  # pathlib.Path("s3://b/p") is "s3:/b/p": a str is
        text = os.fspath(path)  # needed, said when the path looks like one of our URLs
        if isinstance(text, str) and _MISTYPED_RE.match(text):
            return f"{_mistyped(text)} (a pathlib.Path merges '//': pass the URL as a str)"
        return None
    if not isinstance(path, str) or path.startswith(SCHEMES):
        return None
    if _MISTYPED_RE.match(path):
        return _mistyped(path)
    match = _URL_RE.match(path)
    if match is None:
        return None
    return (f"{path}: the scheme {match.group(1)}:// is not supported; data sets in object "
            f"storage are read and written at {', '.join(s + '...' for s in SCHEMES)} (S3 "
            f"and S3-compatible stores, Google Cloud Storage, Azure Blob Storage; see "
            f"docs/remote.md), local ones at a folder path")


def _mistyped(path: str) -> str:
    """The refusal of ``path``, one of our URLs mistyped (``S3://b``, ``s3:/b``, ``s3:b``)."""
    mistyped = _MISTYPED_RE.match(path)
    meant = f"{mistyped.group(1).lower()}://{path[mistyped.end():]}"
    return (f"{path}: not a valid URL (a scheme is written lower case and followed by "
            f"'://'): did you mean {meant}? Supported: {', '.join(s + '...' for s in SCHEMES)}")


def is_remote(path) -> bool:
    """True for ``s3://``, ``gs://`` and ``az://`` URLs; ValueError for a URL of any other
    scheme (naming the supported ones); False for a local path."""
    refusal = unsupported_scheme(path)
    if refusal:
        raise ValueError(refusal)
    return isinstance(path, str) and path.startswith(SCHEMES)


def scheme_of(url: str) -> str:
    """"s3", "gs" or "az" of a remote URL."""
    if not is_remote(url):
        raise ValueError(f"{url!r} is not an s3:// URL (nor gs:// or az://)")
    return url.split("://", 1)[0]


def parse_url(url: str) -> tuple[str, str]:
    """(bucket, prefix) of ``s3://bucket[/prefix]`` (or gs://, az://container); the prefix
    ends with "/" unless empty."""
    scheme = scheme_of(url)
    if url != url.strip():  # pasted with a newline or a space: never a prefix of that name
        raise ValueError(f"{url!r}: white space around the URL; pass {url.strip()!r}")
    rest = url[len(scheme) + 3:]
    bucket, _, prefix = rest.partition("/")
    pattern, what, rule = _NAMES[scheme]
    if not bucket:
        raise ValueError(f"{url}: no {what} name; write {scheme}://{what.split()[-1]}/prefix "
                         f"(the prefix is the folder of the data set in it)")
    if not pattern.match(bucket):
        raise ValueError(f"{url}: {what} name {bucket!r} is not valid ({rule})")
    prefix = prefix.strip("/")
    if any(part in ("", ".", "..") for part in prefix.split("/")) and prefix:
        raise ValueError(f"{url}: prefix {prefix!r} has empty, '.' or '..' parts")
    return bucket, prefix + "/" if prefix else ""


def canonical(url: str) -> str:
    """``url`` checked (scheme, bucket name, prefix) and written without a trailing "/"
    (``s3://bucket/prefix``): checked first, so ``gs://`` is "no bucket name", never a
    mangled ``gs:``."""
    bucket, prefix = parse_url(url)
    return f"{scheme_of(url)}://{bucket}/{prefix}".rstrip("/")
