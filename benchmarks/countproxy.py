"""A counting HTTP proxy on loopback in front of the local SQS endpoint, so both benchmarked workers' requests are
counted the same way, whatever client library makes them (botocore/aiobotocore, kombu's pycurl client).

Each request is forwarded as is (keep-alive to the client and to the upstream) and counted by its action: the
``X-Amz-Target`` header of the JSON protocol (``AmazonSQS.ReceiveMessage``), else ``Action=`` of the query
protocol (form body or query string). For each action it keeps the count and the wall-clock (epoch) times of the
first request's start and the last response's end, which the benchmark uses to time a drain from the outside.

It can also inject faults (``rates=``): each request draws its fate from one seeded RNG, in arrival order, so a run's
mix of faults is repeatable:

- ``error``: answered at once with HTTP 500 and an AWS-style ``InternalError`` body (JSON or query protocol, as the
  request spoke), never forwarded;
- ``drop_before``: the connection is closed before the request is forwarded (nothing happened upstream);
- ``drop_after``: the request is forwarded and the upstream answers, then the connection is closed before the
  answer reaches the client: the dangerous case (a ReceiveMessage's messages are claimed but nobody holds them);
- ``delay``: forwarded after ``delay_s``;
- ``ok``: forwarded as is.

``CountingProxy(upstream)`` injects none (NO_FAULTS); the fault-free and the faulty proxy have the same overhead.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import socket
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from urllib.parse import parse_qs, urlsplit

HOP_BY_HOP = {
    "connection",
    "keep-alive",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailers",
    "transfer-encoding",
    "upgrade",
    "expect",
    "content-length",  # written from the body forwarded
}
UPSTREAM_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class FaultRates:
    """The share of requests that get each fault; the rest pass."""

    error: float = 0.0
    drop_before: float = 0.0
    drop_after: float = 0.0
    delay: float = 0.0
    delay_s: float = 2.0

    def draw(self, rng: random.Random) -> str:
        roll = rng.random()
        for kind, share in (
            ("error", self.error),
            ("drop_before", self.drop_before),
            ("drop_after", self.drop_after),
            ("delay", self.delay),
        ):
            if roll < share:
                return kind
            roll -= share
        return "ok"


NO_FAULTS = FaultRates()
#: The mix of issue 9 item 6: 10% HTTP 500, 5% dropped connections (half before, half after the upstream
#: answered), 5% delayed by 2 s.
ISSUE_MIX = FaultRates(error=0.10, drop_before=0.025, drop_after=0.025, delay=0.05, delay_s=2.0)


def action_of(headers: dict[str, str], body: bytes, path: str) -> str:
    """The SQS action a request asks for ("?" when it names none)."""
    target = headers.get("x-amz-target", "")
    if target:
        return target.rsplit(".", 1)[-1]
    for source in (body.decode("utf-8", "replace"), urlsplit(path).query):
        values = parse_qs(source).get("Action")
        if values:
            return values[0]
    return "?"


@dataclass
class Tally:
    counts: Counter[str] = field(default_factory=Counter)
    first_start: dict[str, float] = field(default_factory=dict)
    last_end: dict[str, float] = field(default_factory=dict)
    errors: int = 0


class _Closed(Exception):
    """The client closed its connection between requests."""


def _header_lines(block: bytes) -> tuple[str, list[tuple[str, str]]]:
    """The first line and the headers of a request's or response's head (the bytes before the blank line)."""
    lines = block.decode("latin-1").split("\r\n")
    headers = []
    for line in lines[1:]:
        if line:
            name, _, value = line.partition(":")
            headers.append((name.strip(), value.strip()))
    return lines[0], headers


async def _read_head(reader: asyncio.StreamReader) -> bytes:
    head = await reader.readuntil(b"\r\n\r\n")
    return head[:-4]


async def _read_body(reader: asyncio.StreamReader, headers: dict[str, str], *, until_eof: bool) -> bytes:
    """A message body: by Content-Length, chunked, or (a response that names neither) up to the end of the
    connection."""
    if headers.get("transfer-encoding", "").lower() == "chunked":
        chunks = []
        while size := int((await reader.readline()).split(b";")[0].strip() or b"0", 16):
            chunks.append(await reader.readexactly(size))
            await reader.readline()
        while await reader.readline() not in (b"\r\n", b"\n", b""):
            pass
        return b"".join(chunks)
    if "content-length" in headers:
        return await reader.readexactly(int(headers["content-length"]))
    return await reader.read() if until_eof else b""


def _head_bytes(first_line: str, headers: list[tuple[str, str]], body: bytes) -> bytes:
    lines = [first_line]
    lines.extend(f"{name}: {value}" for name, value in headers if name.lower() not in HOP_BY_HOP)
    lines.append(f"Content-Length: {len(body)}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


class _Upstream:
    """One client connection's kept-alive connection to the upstream."""

    def __init__(self, host: str, port: int) -> None:
        self.host = host
        self.port = port
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None

    async def exchange(self, request: bytes, method: str) -> tuple[str, list[tuple[str, str]], bytes]:
        """Send one request, return the answer's status line, headers and body; reconnect once when a kept-alive
        connection turns out closed."""
        for attempt in (1, 2):
            if self._writer is None:
                self._reader, self._writer = await asyncio.open_connection(self.host, self.port, limit=_LIMIT)
                sock = self._writer.get_extra_info("socket")
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            assert self._reader is not None
            try:
                self._writer.write(request)
                async with asyncio.timeout(UPSTREAM_TIMEOUT_S):
                    status_line, header_list = _header_lines(await _read_head(self._reader))
                    headers = {name.lower(): value for name, value in header_list}
                    code = int(status_line.split(" ", 2)[1])
                    no_body = method == "HEAD" or code in (204, 304) or 100 <= code < 200
                    body = b"" if no_body else await _read_body(self._reader, headers, until_eof=True)
                if headers.get("connection", "").lower() == "close" or not (
                    no_body or "content-length" in headers or "transfer-encoding" in headers
                ):
                    self.close()
                return status_line, header_list, body
            except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError, TimeoutError):
                self.close()
                if attempt == 2:
                    raise
        raise AssertionError("unreachable")

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
        self._reader = self._writer = None


#: Largest head or line read at once; SQS bodies (up to 1 MiB) are read by length, not by line.
_LIMIT = 1 << 21


class CountingProxy:
    """``start()`` it, point clients at ``endpoint_url``, read ``snapshot()`` (and ``by_fate()`` when it injects
    faults); ``stop()`` in a finally.

    One asyncio event loop in one thread serves every connection (a thread per connection cost the benchmark a
    fifth of a core at 3,000 jobs/s on the cores the workers share).
    """

    def __init__(self, upstream_url: str, *, rates: FaultRates = NO_FAULTS, seed: int = 0) -> None:
        parts = urlsplit(upstream_url)
        if parts.scheme != "http" or parts.hostname is None:
            raise ValueError(f"plain http upstream expected, got {upstream_url!r}")
        self.upstream_host = parts.hostname
        self.upstream_port = parts.port or 80
        self.rates = rates
        self._rng = random.Random(seed)
        self._lock = threading.Lock()
        self._tally = Tally()
        #: Requests by (action, fate), e.g. ("ReceiveMessage", "drop_after").
        self.faults: Counter[tuple[str, str]] = Counter()
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind(("127.0.0.1", 0))
        self._sock.listen(1024)
        self._sock.setblocking(False)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._server: asyncio.Server | None = None
        self._connections: set[asyncio.Task[None]] = set()

    @property
    def endpoint_url(self) -> str:
        return f"http://127.0.0.1:{self._sock.getsockname()[1]}"

    def start(self) -> None:
        loop = self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=loop.run_forever, name="count-proxy", daemon=True)
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._listen(), loop).result(timeout=10)

    async def _listen(self) -> None:
        self._server = await asyncio.start_server(self._serve_client, sock=self._sock, limit=_LIMIT)

    def stop(self) -> None:
        loop = self._loop
        if loop is None:
            self._sock.close()
            return
        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(self._close(), loop).result(timeout=10)
        loop.call_soon_threadsafe(loop.stop)
        if self._thread is not None:
            self._thread.join(timeout=10)
        if not loop.is_running():
            loop.close()
        self._loop = None

    async def _close(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in list(self._connections):
            task.cancel()
        if self._connections:
            await asyncio.wait(self._connections, timeout=5)

    def reset(self) -> None:
        with self._lock:
            self._tally = Tally()

    def snapshot(self) -> Tally:
        with self._lock:
            tally = self._tally
            return Tally(Counter(tally.counts), dict(tally.first_start), dict(tally.last_end), tally.errors)

    def record(self, action: str, started_at: float, ended_at: float, *, failed: bool) -> None:
        with self._lock:
            tally = self._tally
            tally.counts[action] += 1
            tally.first_start.setdefault(action, started_at)
            tally.last_end[action] = max(ended_at, tally.last_end.get(action, 0.0))
            tally.errors += int(failed)

    def draw(self, action: str) -> str:
        """This request's fate (always ``ok`` with NO_FAULTS, drawn all the same: the same overhead either way)."""
        with self._lock:
            fate = self.rates.draw(self._rng)
            self.faults[(action, fate)] += 1
            return fate

    def by_fate(self) -> Counter[str]:
        with self._lock:
            totals: Counter[str] = Counter()
            for (_, fate), count in self.faults.items():
                totals[fate] += count
            return totals

    async def _serve_client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Forward each request of one client connection over its own kept-alive upstream connection."""
        task = asyncio.current_task()
        assert task is not None
        self._connections.add(task)
        writer.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        upstream = _Upstream(self.upstream_host, self.upstream_port)
        try:
            while await self._forward(reader, writer, upstream):
                pass
        except (_Closed, OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError):
            pass  # a client that hangs up mid-request (its worker stopping) is not an error of the benchmark
        except asyncio.CancelledError:
            pass  # stop()
        finally:
            upstream.close()
            writer.close()
            self._connections.discard(task)

    async def _forward(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, upstream: _Upstream) -> bool:
        """One request; False when the client's connection is to be closed."""
        try:
            head = await _read_head(reader)
        except asyncio.IncompleteReadError as exc:
            if not exc.partial:
                raise _Closed from exc
            raise
        started_at = time.time()
        request_line, header_list = _header_lines(head)
        method, path, _ = request_line.split(" ", 2)
        lowered = {name.lower(): value for name, value in header_list}
        if lowered.get("expect", "").lower() == "100-continue":  # curl (kombu) waits for it before a large body
            writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        body = await _read_body(reader, lowered, until_eof=False)
        action = action_of(lowered, body, path)
        fault = self.draw(action)
        if fault == "error":
            self._answer_error(writer, json_protocol="json" in lowered.get("content-type", ""))
            await writer.drain()
            self.record(action, started_at, time.time(), failed=True)
            return True
        if fault == "drop_before":
            self._drop(writer)
            self.record(action, started_at, time.time(), failed=True)
            return False
        if fault == "delay":
            await asyncio.sleep(self.rates.delay_s)  # this connection's task: the fault itself
        request = _head_bytes(request_line, header_list, body) + body
        try:
            status_line, response_headers, data = await upstream.exchange(request, method)
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError, TimeoutError):
            self.record(action, started_at, time.time(), failed=True)
            message = b"upstream failed"
            writer.write(_head_bytes("HTTP/1.1 502 Bad Gateway", [("Content-Type", "text/plain")], message) + message)
            await writer.drain()
            return True
        if fault == "drop_after":
            self._drop(writer)
            self.record(action, started_at, time.time(), failed=True)
            return False
        status = int(status_line.split(" ", 2)[1])
        try:
            writer.write(_head_bytes(status_line, response_headers, data) + data)
            await writer.drain()
        except OSError:  # the client left (a long poll cut short when its worker stops)
            self.record(action, started_at, time.time(), failed=True)
            return False
        self.record(action, started_at, time.time(), failed=status >= 400)
        return lowered.get("connection", "").lower() != "close"

    @staticmethod
    def _answer_error(writer: asyncio.StreamWriter, *, json_protocol: bool) -> None:
        message = "We encountered an internal error. Please try again."
        if json_protocol:
            data = json.dumps({"__type": "com.amazon.coral.service#InternalError", "message": message}).encode()
            content_type = "application/x-amz-json-1.0"
        else:
            data = (
                "<ErrorResponse><Error><Type>Receiver</Type><Code>InternalError</Code>"
                f"<Message>{message}</Message></Error><RequestId>fault-proxy</RequestId></ErrorResponse>"
            ).encode()
            content_type = "text/xml"
        headers = [
            ("Content-Type", content_type),
            ("x-amzn-query-error", "InternalError;Receiver"),
            ("x-amzn-RequestId", "fault-proxy"),
        ]
        writer.write(_head_bytes("HTTP/1.1 500 Internal Server Error", headers, data) + data)

    @staticmethod
    def _drop(writer: asyncio.StreamWriter) -> None:
        """Close the client's connection without an answer."""
        sock = writer.get_extra_info("socket")
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)
        writer.close()
