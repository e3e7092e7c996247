"""A latency-injecting TCP proxy: forward a local port to a server, adding delay.

This machine's kernel cannot shape traffic (no netem), so the remote-storage benchmark puts
this proxy between the loader and the S3 server. Every chunk of bytes is held for
``delay_request`` seconds on its way to the server and ``delay_response`` seconds on its way
back, in order, like a link with that one-way latency and unlimited bandwidth; a new
connection waits one round trip before it is forwarded (the TCP handshake). An HTTP request
and its response therefore pay ``delay_request + delay_response`` more than without it.

Run it in its own process so its CPU cost can be measured apart from the loader's::

    python -m dlpack_io.tools.bench.latencyproxy --target 127.0.0.1:8333 --rtt-ms 20
    # prints "listening on 127.0.0.1:PORT", serves until SIGTERM

or from Python: ``with LatencyProxy("127.0.0.1", 8333, rtt=0.02) as proxy: proxy.endpoint``.
"""
from __future__ import annotations

import argparse
import asyncio
import os
import signal
import subprocess
import sys
import time

from dlpack_io.tools.bench.seaweed import die_with_parent

_CHUNK = 256 * 1024


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, delay: float) -> None:
    """Copy reader -> writer, each chunk released ``delay`` s after it arrived, in order."""
    queue: asyncio.Queue = asyncio.Queue()

    async def pump():
        while True:
            data = await reader.read(_CHUNK)
            queue.put_nowait((time.monotonic() + delay, data))
            if not data:
                return

    task = asyncio.ensure_future(pump())
    try:
        while True:
            due, data = await queue.get()
            wait = due - time.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)
            if not data:
                if writer.can_write_eof():
                    writer.write_eof()
                return
            writer.write(data)
            await writer.drain()
    finally:
        task.cancel()


async def _handle(client_r, client_w, target, delay_req: float, delay_resp: float) -> None:
    server_w = None
    try:
        if delay_req + delay_resp > 0:
            await asyncio.sleep(delay_req + delay_resp)  # the handshake's round trip
        server_r, server_w = await asyncio.open_connection(*target)
        await asyncio.gather(_pipe(client_r, server_w, delay_req),
                             _pipe(server_r, client_w, delay_resp))
    except (ConnectionError, OSError, asyncio.IncompleteReadError):
        pass  # one side went away: close both
    finally:
        for w in (client_w, server_w):
            if w is not None:
                w.close()


async def serve(listen_port: int, target: tuple[str, int], delay_req: float, delay_resp: float,
                ready=None) -> None:
    """Serve on 127.0.0.1:``listen_port`` (0: any free port) until cancelled; ``ready``
    is called with the bound port."""
    server = await asyncio.start_server(
        lambda r, w: _handle(r, w, target, delay_req, delay_resp), "127.0.0.1", listen_port)
    port = server.sockets[0].getsockname()[1]
    if ready is not None:
        ready(port)
    async with server:
        await server.serve_forever()


def process_cpu_seconds(pid: int) -> float:
    """User + system CPU seconds used so far by process ``pid`` (from /proc)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class LatencyProxy:
    """The proxy in a child process: ``rtt`` seconds split evenly into request and response
    delay unless ``delay_request`` / ``delay_response`` are given."""

    def __init__(self, host: str, port: int, *, rtt: float = 0.0, delay_request=None,
                 delay_response=None, start_timeout: float = 30.0):
        self.target = (host, int(port))
        self.delay_request = rtt / 2 if delay_request is None else float(delay_request)
        self.delay_response = rtt / 2 if delay_response is None else float(delay_response)
        self.start_timeout = start_timeout
        self.proc = None
        self.port = None

    @property
    def endpoint(self) -> str:
        """``http://127.0.0.1:PORT`` of the proxy."""
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> "LatencyProxy":
        """Start the child and return once it listens (its first output line says where)."""
        cmd = [sys.executable, "-m", "dlpack_io.tools.bench.latencyproxy",
               "--target", f"{self.target[0]}:{self.target[1]}",
               "--delay-request-ms", str(self.delay_request * 1000),
               "--delay-response-ms", str(self.delay_response * 1000)]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stdin=subprocess.DEVNULL,
                                     text=True, start_new_session=True,
                                     preexec_fn=die_with_parent)
        line = self.proc.stdout.readline()  # blocks until the child has bound or died
        if not line.startswith("listening on "):
            self.stop()
            raise RuntimeError(f"latency proxy did not start (said {line!r})")
        self.port = int(line.rsplit(":", 1)[1])
        return self

    def cpu_seconds(self) -> float:
        """CPU seconds the proxy process has used."""
        return process_cpu_seconds(self.proc.pid)

    def stop(self, grace: float = 5.0) -> None:
        """SIGTERM the child, SIGKILL after ``grace`` seconds."""
        proc, self.proc = self.proc, None
        if proc is None:
            return
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=grace)
        proc.stdout.close()

    def __enter__(self) -> "LatencyProxy":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def main(argv=None) -> None:
    """Command line: forward 127.0.0.1:--port to --target with the given delays."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--target", required=True, help="HOST:PORT of the server")
    p.add_argument("--port", type=int, default=0, help="port to listen on (0: any free one)")
    p.add_argument("--rtt-ms", type=float, default=None, help="added round trip, split evenly")
    p.add_argument("--delay-request-ms", type=float, default=0.0)
    p.add_argument("--delay-response-ms", type=float, default=0.0)
    args = p.parse_args(argv)
    host, port = args.target.rsplit(":", 1)
    req, resp = args.delay_request_ms / 1000, args.delay_response_ms / 1000
    if args.rtt_ms is not None:
        req = resp = args.rtt_ms / 2000
    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))  # stateless: just go

    def ready(bound):
        print(f"listening on 127.0.0.1:{bound}", flush=True)
    try:
        asyncio.run(serve(args.port, (host, int(port)), req, resp, ready))
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
