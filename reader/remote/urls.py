"""Remote data set URLs (``s3://bucket/prefix``): recognised and parsed without importing
the object-storage client, so ``import dlpack_io.reader`` and the packer stay light."""
from __future__ import annotations

SCHEMES = ("s3://",)


def is_remote(path) -> bool:
    """True for ``s3://...`` URLs."""
    return isinstance(path, str) and path.startswith(SCHEMES)


def parse_url(url: str) -> tuple[str, str]:
    """(bucket, prefix) of ``s3://bucket[/prefix]``; the prefix ends with "/" unless empty."""
    if not is_remote(url):
        raise ValueError(f"{url!r} is not an s3:// URL")
    rest = url[len("s3://"):]
    bucket, _, prefix = rest.partition("/")
    if len(bucket) < 3 or not all(c.isalnum() or c in "-." for c in bucket):
        raise ValueError(f"{url}: bucket name {bucket!r} is not a valid S3 bucket name "
                         f"(3+ characters: letters, digits, '-', '.')")
    prefix = prefix.strip("/")
    if any(part in ("", ".", "..") for part in prefix.split("/")) and prefix:
        raise ValueError(f"{url}: prefix {prefix!r} has empty, '.' or '..' parts")
    return bucket, prefix + "/" if prefix else ""
