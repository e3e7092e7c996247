"""Response bodies read under a byte budget fixed before the request is sent.

obstore's ``GetResult.bytes()`` collects the whole body into a buffer sized from the
server's own Content-Range / Content-Length, so a hostile or broken server could make us
allocate whatever it claims (and an allocation failure in Rust aborts the process). Here the
body is streamed instead, in chunks of at least ``budget`` bytes (one chunk for a correct
response: no extra copy), and the stream is dropped as soon as more than ``budget`` bytes
arrived: at most one network chunk beyond the budget is ever held.
"""
from __future__ import annotations


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
