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

import contextlib
import http.client
import json
import random
import socket
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
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
    "content-length",
    "server",  # send_response writes its own Server and Date
    "date",
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


class _ProxyServer(ThreadingHTTPServer):
    daemon_threads = True
    proxy: CountingProxy

    def handle_error(self, request: object, client_address: object) -> None:
        """A client that hangs up mid-request (its worker stopping) is not an error of the benchmark."""
        return None


class _Handler(BaseHTTPRequestHandler):
    """Forwards each request of one client connection over its own kept-alive upstream connection."""

    protocol_version = "HTTP/1.1"
    wbufsize = -1  # buffered: the status line, headers and body leave in one write (flushed below)
    server: _ProxyServer
    upstream: http.client.HTTPConnection | None = None

    def setup(self) -> None:
        super().setup()
        # Small writes + Nagle + the peer's delayed ACK cost 40 ms a request; loopback needs no Nagle.
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def log_message(self, format: str, *args: object) -> None:
        return None

    def do_POST(self) -> None:
        self._forward()

    def do_GET(self) -> None:
        self._forward()

    def _read_body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            chunks = []
            while size := int(self.rfile.readline().split(b";")[0].strip() or b"0", 16):
                chunks.append(self.rfile.read(size))
                self.rfile.readline()
            while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                pass
            return b"".join(chunks)
        return self.rfile.read(int(self.headers.get("Content-Length") or 0))

    def _connect(self) -> http.client.HTTPConnection:
        proxy = self.server.proxy
        upstream = http.client.HTTPConnection(proxy.upstream_host, proxy.upstream_port, timeout=UPSTREAM_TIMEOUT_S)
        upstream.connect()
        assert upstream.sock is not None
        upstream.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return upstream

    def _exchange(self, body: bytes, headers: dict[str, str]) -> tuple[http.client.HTTPResponse, bytes]:
        for attempt in (1, 2):  # a kept-alive upstream connection may have been closed: reconnect once
            if self.upstream is None:
                self.upstream = self._connect()
            try:
                self.upstream.request(self.command, self.path, body=body, headers=headers)
                response = self.upstream.getresponse()
                return response, response.read()
            except (http.client.HTTPException, OSError):
                self.upstream.close()
                self.upstream = None
                if attempt == 2:
                    raise
        raise AssertionError("unreachable")

    def _forward(self) -> None:
        proxy = self.server.proxy
        started_at = time.time()
        body = self._read_body()
        headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP_BY_HOP}
        headers["Content-Length"] = str(len(body))
        lowered = {k.lower(): v for k, v in headers.items()}
        action = action_of(lowered, body, self.path)
        fault = proxy.draw(action)
        if fault == "error":
            self._answer_error(json_protocol="json" in lowered.get("content-type", ""))
            proxy.record(action, started_at, time.time(), failed=True)
            return
        if fault == "drop_before":
            self._drop()
            proxy.record(action, started_at, time.time(), failed=True)
            return
        if fault == "delay":
            time.sleep(proxy.rates.delay_s)  # this connection's thread: the fault itself
        try:
            response, data = self._exchange(body, headers)
        except (http.client.HTTPException, OSError):
            proxy.record(action, started_at, time.time(), failed=True)
            self.send_error(502, "upstream failed")
            return
        if fault == "drop_after":
            self._drop()
            proxy.record(action, started_at, time.time(), failed=True)
            return
        self.send_response(response.status, response.reason)
        for key, value in response.getheaders():
            if key.lower() not in HOP_BY_HOP:
                self.send_header(key, value)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        try:
            self.wfile.write(data)
            self.wfile.flush()
        except OSError:  # the client left (a long poll cut short when its worker stops)
            self.close_connection = True
            proxy.record(action, started_at, time.time(), failed=True)
            return
        proxy.record(action, started_at, time.time(), failed=response.status >= 400)

    def _answer_error(self, *, json_protocol: bool) -> None:
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
        self.send_response(500, "Internal Server Error")
        self.send_header("Content-Type", content_type)
        self.send_header("x-amzn-query-error", "InternalError;Receiver")
        self.send_header("x-amzn-RequestId", "fault-proxy")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        with contextlib.suppress(OSError):
            self.wfile.write(data)
            self.wfile.flush()

    def _drop(self) -> None:
        """Close the client's connection without an answer."""
        self.close_connection = True
        with contextlib.suppress(OSError):
            self.connection.shutdown(socket.SHUT_RDWR)

    def finish(self) -> None:
        super().finish()
        if self.upstream is not None:
            self.upstream.close()


class CountingProxy:
    """``start()`` it, point clients at ``endpoint_url``, read ``snapshot()`` (and ``by_fate()`` when it injects
    faults); ``stop()`` in a finally."""

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
        self._server = _ProxyServer(("127.0.0.1", 0), _Handler)
        self._server.proxy = self
        self._thread: threading.Thread | None = None

    @property
    def endpoint_url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def start(self) -> None:
        self._thread = threading.Thread(target=self._server.serve_forever, name="count-proxy", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=10)

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
